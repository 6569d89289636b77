"""fmt against peer libraries on what ``tests/numerics/test_gfloat_oracle.py`` leaves out: formats
gfloat does not name (the fnuz family, IEEE-style E4M3/E3M4, tfloat32, custom eXmY up to
e11m52) described to gfloat by their defining parameters, float32 inputs as well as float64,
and formats whose max lies beyond float32's (``e8m4fn``: 2**128 * 1.9375), which float32
data must reach without writing inf.

Departures by design (checked, not skipped): in formats with no mantissa bit a
nearest-even tie goes up in magnitude (as ml_dtypes/torch do for E8M0; gfloat picks the
code with an even exponent field).
"""

from __future__ import annotations

import numpy as np
import pytest

from fmtcli import get_format, round_to_format
from fmtcli.numerics.formats import Specials

gfloat = pytest.importorskip("gfloat")
gtypes = pytest.importorskip("gfloat.types")

MODES = {"nearest-even": "TiesToEven", "nearest-away": "TiesToAway",
         "toward-zero": "TowardZero", "up": "TowardPositive", "down": "TowardNegative"}
F32_MAX = float(np.finfo(np.float32).max)


def format_info(spec):
    """gfloat's description of a FormatSpec, from the same defining parameters."""
    s = spec.specials
    return gtypes.FormatInfo(
        spec.name, k=spec.bits, precision=spec.mantissa_bits + 1, bias=spec.bias,
        is_signed=spec.signed,
        domain=gtypes.Domain.Extended if s is Specials.IEEE else gtypes.Domain.Finite,
        has_nz=s is not Specials.FNUZ,
        num_high_nans={Specials.IEEE: (1 << spec.mantissa_bits) - 1, Specials.FN: 1}.get(s, 0),
        has_subnormals=spec.subnormals, is_twos_complement=False)


def candidates(spec, seed=0) -> np.ndarray:
    """Grid points (all of them for few mantissa bits, a sample otherwise), the midpoints
    between neighbours and their float64 neighbours, max and beyond, fractions of the
    smallest subnormal, random magnitudes over the range, both signs, NaN."""
    rng = np.random.default_rng(seed)
    m = spec.mantissa_bits
    e = np.arange(spec.min_exponent, spec.max_exponent + 1)
    if e.size > 200:
        e = np.unique(np.concatenate([e[:60], e[-60:], rng.choice(e, 60)]))
    f = np.arange(1 << m) if m <= 6 else np.unique(np.concatenate(
        [np.arange(4), (1 << m) - np.arange(1, 5), rng.integers(0, 1 << m, 16)]))
    v = ((1 + f[None, :] / 2.0 ** m) * np.exp2(e[:, None].astype(float))).ravel()
    v = v[v <= spec.max]
    if spec.subnormals and m:
        v = np.concatenate([v, f[f > 0] * 2.0 ** (spec.min_exponent - m)])
    v = np.unique(v)
    mids = v[:-1] + np.diff(v) / 2
    tiny, top = spec.smallest_subnormal, spec.max
    spread = np.exp(rng.uniform(max(np.log(tiny) - 1.4, -744), min(np.log(top) + 1.4, 709), 1500))
    with np.errstate(over="ignore"):
        x = np.concatenate([v, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), [
            np.nextafter(top, np.inf), top * 1.01, top * 2, 1e300, np.inf, 0.0, tiny / 2,
            np.nextafter(tiny / 2, 0), np.nextafter(tiny / 2, 1), tiny / 4, tiny * 0.75,
            1e-300, 5e-324, F32_MAX], spread])
    return np.concatenate([x, -x, [np.nan]])


def same(a, b) -> np.ndarray:
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


NAMES = ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4",
         "float8_e4m3", "tfloat32", "e2m5", "e3m3fnuz", "e5m7_b3", "e6m9fn", "e4m3_b20fn",
         "e5m2_b30fnuz", "e8m4fn", "e8m23fn", "e9m3", "e11m4", "e11m52"]


@pytest.mark.slow
@pytest.mark.parametrize("width", ["float64", "float32"])
@pytest.mark.parametrize("name", NAMES)
def test_rounding_agrees_with_gfloat_on_described_formats(name, width):
    """Every mode, both overflow policies, float64 and float32 inputs: fmt's value equals
    gfloat's rounding of the same (float64) number.  float32 inputs of a format reaching
    past float32's max (e8m4fn, e8m23fn, e9m3, e11m*) come back as float64: before, F32_MAX
    rounded to e8m4fn's 2**128 gave inf, and an inf input to e8m23fn (no inf) stayed inf."""
    spec = get_format(name)
    info = format_info(spec)
    x = candidates(spec)
    if width == "float32":
        with np.errstate(over="ignore"):
            x32 = x.astype(np.float32)
        x = x32[np.isfinite(x32) | ~np.isfinite(x)].astype(np.float64)
    for mode, peer_mode in MODES.items():
        for saturate in (False, True):
            data = x.astype(np.float32) if width == "float32" else x
            ours = round_to_format(data, spec, mode, "saturate" if saturate else "ieee")
            with np.errstate(over="ignore"):  # gfloat's ldexp near float64's top
                theirs = gfloat.round_ndarray(info, x, getattr(gfloat.RoundMode, peer_mode),
                                              saturate)
            differ = np.flatnonzero(~same(ours.astype(np.float64), theirs))
            assert differ.size == 0, (mode, saturate, list(zip(
                x[differ][:4], ours[differ][:4], theirs[differ][:4])))


@pytest.mark.parametrize("name", ["e3m0", "e5m0fnuz", "e7m0fn"])
def test_no_mantissa_ties_go_up_where_gfloat_picks_the_even_exponent(name):
    """Formats with no mantissa bit: fmt and gfloat agree everywhere but on nearest-even
    ties between two powers of two, where fmt goes up in magnitude (ml_dtypes' E8M0 rule,
    documented in rounding.py) and gfloat to the code with an even exponent field."""
    spec = get_format(name)
    info = format_info(spec)
    x = candidates(spec)
    ours = round_to_format(x, spec, "nearest-even", "saturate")
    theirs = gfloat.round_ndarray(info, x, gfloat.RoundMode.TiesToEven, True)
    mantissa = np.frexp(np.abs(x))[0]
    tie = (mantissa == 0.75) & (np.abs(x) > spec.smallest_normal) & (np.abs(x) < spec.max)
    assert tie.any()
    assert same(ours[~tie], theirs[~tie]).all()
    np.testing.assert_array_equal(np.abs(ours[tie]), np.abs(x[tie]) * 4 / 3)  # up


@pytest.mark.parametrize("name", ["e8m4fn", "e8m7fn", "e9m3"])
@pytest.mark.parametrize("rule", ["amax", "pow2-floor"])
def test_quantize_formats_past_float32(name, rule, tmp_path):
    """float32 data quantized to a format whose max is beyond float32's: the float32 scale
    cannot map amax onto max, so amax lands on 2**127 (amax rule); x_q is what gfloat gives
    for the float32 product, divided back.  Before: float32(max) was inf, every scale
    clamped to 3.4e38, every product rounded to 2**128 = inf: RMSE inf on plain data."""
    from fmtcli.inputs.tensors import TensorSource
    from fmtcli.numerics.scaling import ScaleRule
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    spec = get_format(name)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    x[0, 0] = F32_MAX  # a block whose product F32_MAX rounds to 2**128 (pow2-floor: scale 1)
    x[0, 1] = 3e38
    out = str(tmp_path / "xq.npy")
    scheme = build_scheme(format=spec, block=32, scale_rule=ScaleRule(rule))
    source = TensorSource("x", None, x.shape, "float32", lambda: x)
    result = quantize([source], [scheme], out=out, workers=1)
    stats = result.tensors[0].schemes[0].to_dict()
    xq = np.load(out)
    assert np.isfinite(xq[1:]).all()
    info = format_info(spec)
    blocks = x.reshape(4, 2, 32)
    amax = np.abs(blocks[1:]).max(axis=2, keepdims=True)
    if rule == "amax":
        scale = np.float32(2.0 ** 127) / amax
    else:
        scale = np.exp2(np.floor(np.log2(2.0 ** 127 / amax.astype(np.float64))))
        scale = scale.astype(np.float32)
    product = (blocks[1:] * scale).astype(np.float64)
    expected = gfloat.round_ndarray(info, product, gfloat.RoundMode.TiesToEven, True) / scale
    np.testing.assert_array_equal(xq[1:], expected.reshape(3, 64).astype(np.float32))
    if rule == "amax":  # the product never overflows float32 (amax lands on 2**127)
        assert np.isfinite(xq).all() and np.isfinite(stats["rmse"])
        assert stats["saturated"] == 0 and stats["rmse"] < 1e-2 * float(np.sqrt(np.mean(
            x.astype(np.float64) ** 2)))


def _mx_even_decode_exponent(amax: float, mantissa_bits: int, emax: int) -> int:
    """torchao's EVEN rule from its definition, in float64: amax's significand rounded
    half-up to the element's mantissa width (a carry raises the exponent), floor(log2),
    minus emax_elem, clamped to E8M0's -127..127."""
    if amax < 2.0 ** -126:
        amax = 2.0 ** -126  # float32 subnormal amaxes: the exponent of the smallest normal
    significand, exponent = np.frexp(amax)  # amax = significand * 2**exponent, [0.5, 1)
    rounded = np.floor(significand * 2.0 ** (mantissa_bits + 1) + 0.5)
    if rounded == 2.0 ** (mantissa_bits + 1):
        exponent += 1
    return int(np.clip(exponent - 1 - emax, -127, 127))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                                  "float6_e3m2fn", "float4_e2m1fn"])
def test_mx_even_scale_near_float32_max(name):
    """mx-even: an amax whose rounding carries past float32's top exponent (3e38 in FP4:
    1.76 * 2**127 rounds to 2**128) gives decode scale 2**(128 - emax_elem), as torchao's
    EVEN mode.  Before, the carry made the float32 pattern inf, floor(log2) read -1, and
    the scale 2**(1 + emax) sent 3e38 to inf, saturated: x_q = 0.75."""
    from fmtcli.numerics.scaling import amax_to_scale, emax_elem

    spec = get_format(name)
    rng = np.random.default_rng(3)
    amax = np.concatenate([np.float32([3e38, F32_MAX, 1.0, 1.74, 1.76, 448, 500, 1e-40,
                                       2.0 ** -140, 2.0 ** -126]),
                           np.exp2(rng.uniform(-140, 128, 3000)).astype(np.float32)])
    amax = amax[np.isfinite(amax)]
    ours = amax_to_scale(amax, spec, "mx-even")
    expected = [2.0 ** -_mx_even_decode_exponent(float(a), spec.mantissa_bits, emax_elem(spec))
                for a in amax]
    np.testing.assert_array_equal(ours.astype(np.float64), expected)


def test_mxfp4_even_block_with_a_value_near_float32_max(tmp_path):
    """The block [3e38, -0.0754, 1, ...] under mxfp4 + mx-even: decode scale 2**126, so
    3e38 / 2**126 = 3.53 -> 4 and x_q = 2**128, which float32 writes as inf (torchao's
    decoded value is 2**128 too); the small values flush to 0 as in torchao."""
    from fmtcli.inputs.tensors import TensorSource
    from fmtcli.numerics.scaling import ScaleRule
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    x = np.zeros((1, 32), np.float32)
    x[0, :3] = 3e38, -0.0754, 1.0
    out = str(tmp_path / "xq.npy")
    scheme = build_scheme(recipe="mxfp4", scale_rule=ScaleRule.MX_EVEN)
    source = TensorSource("x", None, x.shape, "float32", lambda: x)
    quantize([source], [scheme], out=out, workers=1)
    xq = np.load(out)
    assert np.isposinf(xq[0, 0]) and xq[0, 1] == 0 and xq[0, 2] == 0
