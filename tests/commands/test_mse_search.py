"""scale-search's MSE search ranks its ~46 margins by the squared errors alone
(``quantize_tensor(mse_only=True)``): the MSE it ranks by must be, bit for bit, the MSE the
full statistics report, on every kind of data, so the choice and the output cannot change."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fmtcli.base.choices import Granularity, Product, ScaleRule
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.schemes import build_scheme
from fmtcli.scale_search.candidates import evaluate, mse_values


def source(x, key=None):
    return TensorSource("t.npy", key, x.shape, str(x.dtype), lambda: x)


def kinds():
    rng = np.random.default_rng(11)
    normal = (rng.standard_normal((64, 300)) * 0.02).astype(np.float32)
    heavy = (rng.standard_normal((64, 300)) * np.exp(rng.normal(0, 4, (64, 300)))
             ).astype(np.float32)
    special = normal.copy()
    special[1, :5] = [np.nan, np.inf, -np.inf, 0, -0.0]
    tiny = (normal * 1e-30).astype(np.float32)
    wide = (rng.standard_normal(4000) * 1e200)  # float64 beyond float32
    return {"normal": [normal], "heavy": [heavy], "nan and inf": [special],
            "tiny": [tiny], "several tensors": [normal, heavy, tiny], "float64": [wide]}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(kinds()))
@pytest.mark.parametrize("build", [dict(per=Granularity.TENSOR), dict(block=32),
                                   dict(block=128, scale_rule=ScaleRule.POW2_CEIL),
                                   dict(per=Granularity.ROW, format="float4_e2m1fn")])
def test_the_ranked_mse_is_the_reported_mse(kind, build):
    from fmtcli import get_format

    if "format" in build:
        build = {**build, "format": get_format(build["format"])}
    sources = [source(x, f"w{i}") for i, x in enumerate(kinds()[kind])]
    product = Product.EXACT if kind == "float64" else Product.FLOAT32
    schemes = [replace(build_scheme(**build), margin=m, product=product)
               for m in (-1.0, 0.0, 0.75, 3.25)]
    full = [s.mse for s in evaluate(sources, schemes, chunk_elements=4096, workers=2)]
    fast = mse_values(sources, schemes, chunk_elements=4096, workers=2)
    assert [repr(v) for v in fast] == [repr(v) for v in full]
