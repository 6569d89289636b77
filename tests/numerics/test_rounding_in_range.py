"""Every rounding mode keeps a scaled value inside the format, whatever the chunk's peak (issue 9,
item 1): a peak one float32 ulp above max after the amax scale, an MX block of 460 in E4M3;
the statistics, the ``.npy`` values and the ``.npz`` codes describe the same output.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import source

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.rounding import RoundingMode
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize

FORMATS_1 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float4_e2m1fn", "float6_e2m3fn",
             "float6_e3m2fn", "e4m5"]


MODES = ["nearest-even", "nearest-away", "toward-zero", "up", "down", "stochastic"]


def just_above_max_amaxes(spec, count=2, seed=0) -> list[float]:
    """float32 amaxes whose amax-rule scale puts fl32(amax * scale) one float32 ulp above
    max: max * (1 + 2**-23) (found by scanning random significands)."""
    rng = np.random.default_rng(seed)
    target = np.nextafter(np.float32(spec.max), np.float32(np.inf))
    a = rng.uniform(1, 2, 400_000).astype(np.float32)
    scale = np.float32(spec.max) / a
    found = a[a * scale == target]
    assert found.size >= count, spec.name
    return [float(v) for v in found[:count]]


def quantize_three_ways(x, tmp_path, **kwargs):
    """(statistics, .npy values, decoded .npz codes / scales, scales) of one scheme."""
    from fmtcli.numerics.rounding import decode

    scheme = build_scheme(**kwargs)
    stats_ = quantize([source(x)], [scheme], workers=1).tensors[0].schemes[0]
    npy, npz = str(tmp_path / "q.npy"), str(tmp_path / "q.npz")
    quantize([source(x)], [scheme], workers=1, out=npy)
    quantize([source(x)], [scheme], workers=1, out=npz)
    with np.load(npz) as archive:
        codes, scales = archive["mem.codes"], archive["mem.scales"]
    tile = scheme.tile_shape(1, x.size, 1)
    per_element = np.repeat(scales.reshape(-1), tile[1])[:x.size]
    grid = decode(codes, scheme.format)
    with np.errstate(all="ignore"):
        from_codes = (grid / per_element).astype(np.float32)
    return stats_, np.load(npy), grid, from_codes


@pytest.mark.slow
@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS_1)
def test_directed_rounding_stays_in_range(fmt, mode, overflow, tmp_path):
    from fmtcli.numerics.rounding import round_unbounded

    spec = get_format(fmt)
    amaxes = just_above_max_amaxes(spec)
    x = np.zeros(512, np.float32)
    x[0], x[1], x[128] = amaxes[0], 1, 1  # the shape: a peak, and small values
    x[256], x[257] = -amaxes[1], -1  # the same below zero (down rounds -max*(1+u) past)
    x[384] = 3
    stats_, npy, grid, from_codes = quantize_three_ways(
        x, tmp_path, format=spec, block=128, rounding=mode, overflow=overflow)
    d = stats_.to_dict()
    finite = np.isfinite(grid)
    assert np.all(np.abs(grid[finite]) <= spec.max), (fmt, mode, overflow)
    np.testing.assert_array_equal(npy, from_codes)  # .npy and .npz agree, NaN included
    # the statistics describe that output
    nonfinite = int(np.count_nonzero(~np.isfinite(npy)))
    assert d["overflowed"] == nonfinite and d["nan_produced"] == np.isnan(npy).sum()
    if nonfinite == 0:
        assert d["max_abs_error"] == pytest.approx(float(np.max(np.abs(npy - x))), rel=1e-6)
    if mode != "stochastic":  # which values round past max is known: count them
        scale = np.float32(spec.max) / np.float32(np.abs(x[[0, 256]]))
        scaled = np.float32(x[[0, 256]]) * scale
        past = np.abs(round_unbounded(scaled, spec, RoundingMode(mode))) > spec.max
        assert d["saturated"] + d["overflowed"] == int(past.sum()), (fmt, mode, overflow)
        if overflow == "saturate" or not (spec.has_inf or spec.has_nan):
            assert d["overflowed"] == 0


@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
def test_mx_block_of_460_rounds_in_range(mode, overflow, tmp_path):
    """mx-floor gives a block of 460 and ones the scale 1: 460 lies above E4M3's 448."""
    x = np.ones(64, np.float32)
    x[0], x[32] = 460, -460
    stats_, npy, grid, from_codes = quantize_three_ways(
        x, tmp_path, block=32, scale_rule=ScaleRule.MX_FLOOR, rounding=mode, overflow=overflow)
    finite = np.isfinite(grid)
    assert np.all(np.abs(grid[finite]) <= 448)
    np.testing.assert_array_equal(npy, from_codes)
    d = stats_.to_dict()
    assert d["saturated"] + d["overflowed"] == (
        {"nearest-even": 0, "toward-zero": 0, "up": 1, "down": 1}.get(mode, d["saturated"]
                                                                      + d["overflowed"]))
    assert d["overflowed"] == int(np.count_nonzero(~np.isfinite(npy)))
