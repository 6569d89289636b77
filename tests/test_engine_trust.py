"""Engine trust: the defects of issue 9 (wrong numbers reported silently), one test each."""

from __future__ import annotations

import numpy as np

from fmtcli.quantize import quantize
from fmtcli.scaling import ScaleRule
from fmtcli.schemes import Granularity, build_scheme
from fmtcli.tensors import TensorSource


def source(x, key=None, name="mem") -> TensorSource:
    x = np.asarray(x)
    return TensorSource(name, key, x.shape, str(x.dtype), lambda: x)


def stats(x, workers=1, **kwargs) -> dict:
    """The JSON statistics of one scheme on one in-memory tensor."""
    scheme = build_scheme(**kwargs)
    result = quantize([source(x)], [scheme], workers=workers)
    return result.tensors[0].schemes[0].to_dict()


def test_one_vocabulary_count_and_fraction():
    # a margin of -1 doubles the amax scale: 500 saturates, 1e-9 flushes, 0 is a zero input
    x = np.array([500.0, 1.0, 1e-9, 0.0], np.float32)
    d = stats(x, per=Granularity.TENSOR, scale_rule=ScaleRule.AMAX, margin=-1)
    assert d["saturated"] == 1 and d["saturated_fraction"] == 1 / 4
    assert d["flushed"] == 1 and d["flushed_fraction"] == 1 / 3
    for key in ("overflowed", "nan_produced"):
        assert d[key] == 0 and d[f"{key}_fraction"] == 0.0
    assert abs(d["mse"] - d["rmse"] ** 2) <= 1e-12 * d["mse"]
