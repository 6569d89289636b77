"""fmt's rounding and MX block quantization against gfloat (graphcore-research/gfloat), a
peer library that rounds by the formats' definitions.

Element rounding (every code point, the midpoints and their float64 neighbours, values past
max, zeros, infinities, NaN, fractions of the smallest subnormal; five rounding modes; both
overflow policies) and MX blocks agree exactly, except where the two part on purpose:

- E8M0 is unsigned and has no zero (OCP MX v1.0): fmt gives NaN for negatives and 0, and
  the smallest value 2**-127 below it, as ml_dtypes does; gfloat 0.5.2 returns negative
  values, 0, and powers of two below 2**-127.
- E8M0 has no mantissa bit, so "ties to even" has no even digit to pick: fmt rounds a tie up
  in magnitude (as ml_dtypes and torch do; documented), gfloat to the even code.
- FP6/FP4 have no inf or NaN: fmt saturates under either overflow policy (documented);
  gfloat raises unless asked to saturate, and raises on NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from fmtcli import get_format, round_to_format
from fmtcli.numerics.rounding import all_values

gfloat = pytest.importorskip("gfloat")
formats = pytest.importorskip("gfloat.formats")

PEERS = {
    "float8_e4m3fn": "format_info_ocp_e4m3", "float8_e5m2": "format_info_ocp_e5m2",
    "float6_e2m3fn": "format_info_ocp_e2m3", "float6_e3m2fn": "format_info_ocp_e3m2",
    "float4_e2m1fn": "format_info_ocp_e2m1", "float16": "format_info_binary16",
    "bfloat16": "format_info_bfloat16",
}
MODES = {"nearest-even": "TiesToEven", "nearest-away": "TiesToAway",
         "toward-zero": "TowardZero", "up": "TowardPositive", "down": "TowardNegative"}


def candidates(spec, seed=0) -> np.ndarray:
    """Every finite code point, the midpoints between neighbours and the float64 values
    just beside them, values past max, signed zeros, infinities, fractions of the smallest
    subnormal, and random values over the whole range (float64)."""
    values = all_values(spec)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[:-1] + finite[1:]) / 2  # exact: these formats have few digits
    tiny, top = spec.smallest_subnormal, spec.max
    rng = np.random.default_rng(seed)
    spread = np.exp(rng.uniform(np.log(tiny / 4), np.log(top * 4), 4000))
    x = np.concatenate([
        finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
        [top * 1.01, top * 1.5, top * 2, -top * 1.01, 1e300, -1e300, np.inf, -np.inf, 0.0,
         -0.0, tiny / 2, np.nextafter(tiny / 2, 0), np.nextafter(tiny / 2, 1), tiny / 4,
         tiny * 0.75, 1e-300, -1e-300],
        spread * rng.choice([-1.0, 1.0], spread.size)])
    if x.size > 30000:  # float16, bfloat16: a sample of their 2**16 codes and midpoints
        x = x[rng.choice(x.size, 30000, replace=False)]
    return x


@pytest.mark.slow
@pytest.mark.parametrize("saturate", [False, True], ids=["ieee", "saturate"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PEERS)
def test_element_rounding_agrees_with_gfloat(name, mode, saturate):
    spec = get_format(name)
    info = getattr(formats, PEERS[name])
    no_specials = not (spec.has_inf or spec.has_nan)
    if no_specials and not saturate:
        pytest.skip("gfloat refuses to overflow a format without inf/NaN; fmt saturates")
    x = candidates(spec)
    x = np.concatenate([x, [np.nan]]) if not no_specials else x
    ours = round_to_format(x, spec, mode, "saturate" if saturate else "ieee")
    theirs = gfloat.round_ndarray(info, x, getattr(gfloat.RoundMode, MODES[mode]), saturate)
    same = (ours == theirs) & (np.signbit(ours) == np.signbit(theirs)) | (
        np.isnan(ours) & np.isnan(theirs))
    differ = np.flatnonzero(~same)
    assert differ.size == 0, list(zip(x[differ][:5], ours[differ][:5], theirs[differ][:5]))


def test_nearest_away_below_half_the_smallest_subnormal():
    """Just below half of FP4's smallest subnormal (0.5) the nearest value is 0 (gfloat
    0.5.2's scalar ``round_float`` gives 0.5 there; its ``round_ndarray`` gives 0)."""
    spec = get_format("float4_e2m1fn")
    x = np.array([np.nextafter(0.25, 0), -np.nextafter(0.25, 0), 0.25, np.nextafter(0.25, 1)])
    ours = round_to_format(x, spec, "nearest-away", "saturate")
    np.testing.assert_array_equal(ours, [0.0, -0.0, 0.5, 0.5])
    theirs = gfloat.round_ndarray(formats.format_info_ocp_e2m1, x, gfloat.RoundMode.TiesToAway,
                                  True)
    np.testing.assert_array_equal(theirs, ours)


@pytest.mark.parametrize("mode", MODES)
def test_e8m0_against_gfloat(mode):
    """E8M0 (unsigned, no zero, no mantissa): equal on positive values from 2**-127 up,
    except ties under nearest-even (fmt: up in magnitude); below 2**-127 fmt gives 2**-127
    and negatives and zero give NaN, where gfloat leaves the format."""
    spec = get_format("float8_e8m0fnu")
    rng = np.random.default_rng(1)
    x = np.concatenate([np.exp2(rng.uniform(-127, 128, 20000)),
                        np.exp2(np.arange(-127, 128)) * 1.5,  # the ties
                        np.exp2(np.arange(-127, 128.0))])
    ours = round_to_format(x, spec, mode, "saturate")
    theirs = gfloat.round_ndarray(formats.format_info_ocp_e8m0, x,
                                  getattr(gfloat.RoundMode, MODES[mode]), True)
    tie = np.frexp(x)[0] == 0.75
    if mode == "nearest-even":
        up = np.minimum(2 * x[tie] / 1.5, spec.max)  # up in magnitude (2**128: saturated)
        np.testing.assert_array_equal(ours[tie], up)
        np.testing.assert_array_equal(ours[~tie], theirs[~tie])
    else:
        np.testing.assert_array_equal(ours, theirs)
    below = np.array([2.0 ** -128, 2.0 ** -140, 1e-300, 0.0, -1.0, -2.0 ** -127])
    ours = round_to_format(below, spec, mode, "saturate")
    np.testing.assert_array_equal(ours[:3], [2.0 ** -127] * 3)
    assert np.isnan(ours[3:]).all()


MX = {"mxfp8": ("float8_e4m3fn", "format_info_mxfp8_e4m3"),
      "mxfp6": ("float6_e2m3fn", "format_info_mxfp6_e2m3"),
      "mxfp4": ("float4_e2m1fn", "format_info_mxfp4_e2m1")}


def mx_blocks(seed=0) -> np.ndarray:
    """Rows of 32-element blocks: normal data, an outlier block, zeros, subnormal-range
    data, amax exactly a power of two and just below one, values that pass max once scaled
    by the floor rule (amax 500 or 460 in E4M3: scale 1; 460 rounds past max only in the
    directed modes)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((12, 32)) * 0.02).astype(np.float32)
    x[1, 3] = 300.0
    x[2] = 0.0
    x[3] *= np.float32(1e-30)
    x[4, 0] = 2.0
    x[5, 0] = np.nextafter(np.float32(2.0), np.float32(0))
    x[6, :2] = 500.0, -460.0
    x[7] = rng.uniform(-7, 7, 32).astype(np.float32)
    x[8, :2] = 460.0, 1.0  # scaled amax below E4M3's nearest-even threshold (464), above max
    x[9, :2] = -460.0, 1.0
    return x


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", MX)
def test_mx_blocks_agree_with_gfloat(recipe, mode, tmp_path):
    """fmt quantize --recipe mx* (E8M0 floor scale per block of 32, saturation) gives the
    values gfloat's quantize_block gives with its compute_scale_amax (the OCP MX rule)."""
    from fmtcli.inputs.tensors import TensorSource
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    x = mx_blocks()
    fmt, info = MX[recipe]
    block_info = getattr(formats, info)
    out = str(tmp_path / "xq.npy")
    scheme = build_scheme(recipe=recipe, rounding=mode)
    source = TensorSource("x", None, x.shape, "float32", lambda: x)
    quantize([source], [scheme], out=out, workers=1)
    ours = np.load(out)
    theirs = np.stack([gfloat.quantize_block(block_info, row.astype(np.float64),
                                             gfloat.compute_scale_amax,
                                             getattr(gfloat.RoundMode, MODES[mode]))
                       for row in x])
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))
