"""Values past a format's max (issue 9, items 4 and 4b): one vocabulary of counts and fractions;
the ml_dtypes and torch backends saturate exactly as the engine does when the scheme says so,
and under ``overflow='ieee'`` show their own inf/NaN; an inf or NaN made from a finite input is
an unbounded error (RMSE inf, SQNR -inf), never a better figure than saturating.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import heavy, source, stats

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize


def test_one_vocabulary_count_and_fraction():
    # a margin of -1 doubles the amax scale: 500 saturates, 1e-9 flushes, 0 is a zero input
    x = np.array([500.0, 1.0, 1e-9, 0.0], np.float32)
    d = stats(x, per=Granularity.TENSOR, scale_rule=ScaleRule.AMAX, margin=-1)
    assert d["saturated"] == 1 and d["saturated_fraction"] == 1 / 4
    assert d["flushed"] == 1 and d["flushed_fraction"] == 1 / 3
    for key in ("overflowed", "nan_produced"):
        assert d[key] == 0 and d[f"{key}_fraction"] == 0.0
    assert abs(d["mse"] - d["rmse"] ** 2) <= 1e-12 * d["mse"]


# -- backends saturate when the scheme says so ------------------------------------------------

@pytest.mark.parametrize("backend", ["ml_dtypes", "torch"])
def test_backend_saturates_like_the_engine(backend, tmp_path):
    if backend == "torch":
        pytest.importorskip("torch")
    x = heavy()
    runs = {}
    for name in ("numpy", backend):
        scheme = build_scheme(recipe="mxfp8", overflow="saturate")
        out = str(tmp_path / f"{name}.npy")
        result = quantize([source(x)], [scheme], backend=name, out=out, workers=1)
        runs[name] = (result.tensors[0].schemes[0].to_dict(), np.load(out))
    (ref, ref_q), (got, got_q) = runs["numpy"], runs[backend]
    assert np.isfinite(got_q).all()
    np.testing.assert_array_equal(got_q, ref_q)
    assert got["saturated"] == ref["saturated"] > 0
    assert got["nan_produced"] == got["overflowed"] == 0
    assert got["rmse"] == pytest.approx(ref["rmse"], rel=1e-12)


def test_backend_ieee_shows_the_backends_own_overflow():
    x = np.array([500, 1], np.float32)
    d = quantize([source(x)], [build_scheme(recipe="mxfp8", overflow="ieee")],
                 backend="ml_dtypes", workers=1).tensors[0].schemes[0].to_dict()
    assert d["nan_produced"] == 1 and d["overflowed"] == 1 and d["saturated"] == 0


def test_underflow_backend_saturates():
    from fmtcli.numerics.rounding import OverflowPolicy
    from fmtcli.underflow import underflow_table

    spec = get_format("float8_e4m3fn")
    for overflow, expected in ((OverflowPolicy.SATURATE, 448.0), (OverflowPolicy.IEEE, None)):
        row = underflow_table([500.0], [spec], overflow=overflow, backend="ml_dtypes").rows[0]
        if expected is None:
            assert np.isnan(row.plain.stored)
        else:
            assert row.plain.stored == expected


# -- inf/NaN results of finite inputs are unbounded errors ------------------------------------

@pytest.mark.parametrize("recipe", ["mxfp8", "tensorwise"])
def test_ieee_never_reports_a_better_error_than_saturate(recipe):
    x = heavy()
    kwargs = dict(margin=-3) if recipe == "tensorwise" else {}
    d = {p: stats(x, recipe=recipe, overflow=p, **kwargs) for p in ("saturate", "ieee")}
    assert d["ieee"]["nan_produced"] > 0 and d["saturate"]["nan_produced"] == 0
    assert d["ieee"]["sqnr_db"] == -np.inf < d["saturate"]["sqnr_db"]
    assert d["ieee"]["rmse"] == d["ieee"]["mse"] == d["ieee"]["max_abs_error"] == np.inf
    assert np.isnan(d["ieee"]["bias"])
    assert np.isfinite(d["saturate"]["rmse"]) and np.isfinite(d["saturate"]["bias"])


def test_unbounded_errors_in_the_total_and_json():
    import json

    from fmtcli.render.jsonsafe import dumps  # the JSON writer of --json

    x = np.array([500.0, 1.0], np.float32)
    y = np.array([1.0, 2.0], np.float32)
    scheme = build_scheme(recipe="mxfp8", overflow="ieee")
    result = quantize([source(x, name="a"), source(y, name="b")], [scheme], workers=1)
    total = result.total[0].to_dict()
    assert total["rmse"] == np.inf and total["sqnr_db"] == -np.inf
    assert result.tensors[1].schemes[0].rmse < np.inf  # the clean tensor keeps its figures
    doc = json.loads(dumps(result.to_dict()))
    assert doc["total"][0]["rmse"] == "inf" and doc["total"][0]["sqnr_db"] == "-inf"


def test_inf_inputs_are_not_unbounded_errors():
    # amax rule: the inf block's scale is 0 and inf * 0 is NaN; a finite value sharing
    # that block would come out 0 / 0 = NaN too, which is an unbounded error
    x = np.array([np.inf, 1.0, 3.0, 5.0], np.float32)
    d = stats(x, block=1, overflow="ieee")
    assert d["nonfinite_inputs"] == 1 and d["nan_produced"] == 1
    assert d["rmse"] == 0 and d["sqnr_db"] == np.inf  # the finite inputs are exact
    d = stats(x, block=2, overflow="ieee")
    assert d["nan_produced"] == 2 and d["rmse"] == np.inf


def test_formats_without_zero_do_not_count_the_padding():
    x = np.array([1.0, 2.0, 4.0, 8.0], np.float32)  # blocks of 3: two padded elements
    d = stats(x, format=get_format("float8_e8m0fnu"), block=3, overflow="saturate")
    assert d["nan_produced"] == 0 and d["count"] == 4
    assert np.isfinite(d["rmse"])
