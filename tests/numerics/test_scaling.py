"""Scale rules (``fmtcli.numerics.scaling.amax_to_scale``) and NVFP4's two-level scales.

Direction everywhere: ``x_q = cast(x * scale) / scale``.  Expected values are worked out by
hand from the rules as published (Transformer Engine / torchao amax scaling, OCP MX v1.0
§6.3, NVIDIA's RCEIL) or from ``oracle``'s independent formulas.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, parallel_kwargs
from oracle import (
    FORMATS,
    assert_matches_reference,
    assert_scales_match,
    heavy_tailed,
    ref_nvfp4,
    ref_quantize,
    ref_scale,
)

from fmtcli.base.errors import UsageError
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import ScaleRule, amax_to_scale
from fmtcli.numerics.schemes import Granularity, ScaleFormat, build_scheme
from fmtcli.quantize import quantize

E4M3 = get_format("float8_e4m3fn")
FP4 = get_format("float4_e2m1fn")
# the rules that compute a scale from a block's amax (percentile takes the block's
# percentile in its place and is tested on its own; fixed takes no statistic)
ALL_RULES = [r.value for r in ScaleRule if r not in (ScaleRule.PERCENTILE, ScaleRule.FIXED)]
MX = ["mx-floor", "mx-ceil", "mx-even", "mx-rceil"]


def scale(amax, rule="amax", spec=E4M3, margin=0):
    out = amax_to_scale(np.asarray(amax, dtype=np.float64), spec, rule, margin)
    assert out.dtype == np.float32
    return out


def source(x, key=None) -> TensorSource:
    x = np.asarray(x)
    return TensorSource("mem", key, x.shape, str(x.dtype), lambda: x)


def stats_of(x, scheme, key=None) -> dict:
    result = quantize([source(x, key)], [scheme], **parallel_kwargs(1))
    return result.to_dict()["tensors"][0]["schemes"][0]


# -- amax and margins --------------------------------------------------------------------

def test_amax_rule_maps_the_block_max_onto_the_format_max():
    amax = np.array([1.0, 2.0, 448.0, 1e-3, 3.0e5], dtype=np.float32)
    got = scale(amax)
    assert got.shape == amax.shape
    np.testing.assert_array_equal(got, (448.0 / amax.astype(np.float64)).astype(np.float32))
    assert got[2] == 1.0


@pytest.mark.parametrize("margin", [1, 2, 5])
def test_margin_divides_the_scale_by_a_power_of_two(margin):
    amax = np.array([0.37, 5.0, 1234.5])
    for rule in ("amax", "pow2-floor", "mx-floor"):
        np.testing.assert_array_equal(scale(amax, rule, margin=margin),
                                      scale(amax, rule) / np.float32(2 ** margin), err_msg=rule)


def test_negative_and_fractional_margins_multiply_the_scale():
    # the library allows them (scale-search's MSE search); the command line keeps margin >= 0
    assert amax_to_scale(np.array([1.0]), E4M3, "amax", margin=-1)[0] == 896
    assert amax_to_scale(np.array([448.0]), E4M3, "amax", margin=0.5)[0] == np.float32(2 ** -0.5)


def test_negative_margin_is_refused_on_the_command_line():
    assert_usage_error(invoke("quantize", "--margin", "-1", "--json"), "--margin")


def test_scale_keeps_the_shape_of_the_amax_grid():
    amax = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    for rule in ALL_RULES:
        assert scale(amax, rule).shape == (3, 4), rule


# -- powers of two ------------------------------------------------------------------------

@pytest.mark.parametrize("amax, floor, ceil, nearest", [
    (1.0, 256.0, 512.0, 512.0),       # 448 / 1 = 448 = 2**8.807
    (1.75, 256.0, 256.0, 256.0),      # 448 / 1.75 = 256 exactly
    (3.0, 128.0, 256.0, 128.0),       # 149.3 = 2**7.22
    (0.5, 512.0, 1024.0, 1024.0),     # 896 = 2**9.807
    (448.0, 1.0, 1.0, 1.0),
])
def test_pow2_rules_by_hand(amax, floor, ceil, nearest):
    assert scale([amax], "pow2-floor")[0] == floor
    assert scale([amax], "pow2-ceil")[0] == ceil
    assert scale([amax], "pow2-nearest")[0] == nearest


def test_pow2_floor_never_pushes_amax_past_max_and_ceil_can():
    amax = np.exp(np.random.default_rng(0).uniform(-20, 20, 5000))
    for rule in ("pow2-floor", "pow2-ceil", "pow2-nearest"):
        s = scale(amax, rule).astype(np.float64)
        assert np.all(np.frexp(s)[0] == 0.5), rule  # powers of two
        np.testing.assert_array_equal(s, ref_scale(amax, rule=rule), err_msg=rule)
    assert np.all(amax * scale(amax, "pow2-floor") <= 448.0)
    assert np.any(amax * scale(amax, "pow2-ceil") > 448.0)


# -- OCP MX --------------------------------------------------------------------------------

def test_mx_floor_is_the_ocp_rule_and_can_saturate():
    # X = 2**(floor(log2 amax) - emax_elem), emax_elem(E4M3) = 8; scale = 1 / X
    assert scale([500.0], "mx-floor")[0] == 1.0     # 500 > 448: it saturates
    assert scale([448.0], "mx-floor")[0] == 1.0
    assert scale([256.0], "mx-floor")[0] == 1.0
    assert scale([255.9], "mx-floor")[0] == 2.0
    assert scale([1.0], "mx-floor")[0] == 256.0
    assert scale([1.0], "mx-floor", FP4)[0] == 4.0  # emax_elem(E2M1) = 2
    assert scale([6.0], "mx-floor", FP4)[0] == 1.0
    assert scale([7.9], "mx-floor", FP4)[0] == 1.0  # 7.9 > 6: saturates


def test_amax_500_in_e4m3_under_mx_floor_saturates_to_448():
    x = np.array([[500.0, 1.0, -3.0, 0.25]], dtype=np.float32)
    scheme = build_scheme(per=Granularity.ROW, scale_rule=ScaleRule.MX_FLOOR)
    assert scheme.scale_format is ScaleFormat.E8M0
    stats = stats_of(x, scheme)
    assert stats["saturated"] == 1
    assert stats["max_abs_error"] == 52.0
    assert stats["scales"]["min"] == stats["scales"]["max"] == 1.0
    xq, grid, saturated, _ = ref_quantize(x, (1, 4), rule="mx-floor")
    assert xq[0, 0] == 448.0 and saturated == 1
    assert_matches_reference(stats, x, xq, saturated, 0, "mx-floor 500")


@pytest.mark.parametrize("amax, expected", [(500.0, 0.5), (256.0, 1.0), (257.0, 0.5),
                                            (1.0, 256.0), (448.0, 0.5)])
def test_mx_ceil_by_hand(amax, expected):
    # X = 2**(ceil(log2 amax) - 8)
    assert scale([amax], "mx-ceil")[0] == expected


@pytest.mark.parametrize("amax, expected", [(500.0, 0.5), (448.0, 1.0), (449.0, 0.5),
                                            (1.0, 256.0), (224.0, 2.0), (225.0, 1.0)])
def test_mx_rceil_by_hand(amax, expected):
    # X = 2**ceil(log2(amax / 448))
    assert scale([amax], "mx-rceil")[0] == expected


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_mx_rceil_never_saturates_and_others_match_the_reference(fmt):
    spec = get_format(fmt)
    fmax = FORMATS[fmt][1]
    amax = np.exp(np.random.default_rng(1).uniform(-30, 30, 4000)).astype(np.float32)
    amax = np.concatenate([amax, 2.0 ** np.arange(-20, 21, dtype=np.float64).astype(np.float32)])
    s = scale(amax, "mx-rceil", spec).astype(np.float64)
    assert np.all(amax * s <= fmax), fmt
    assert np.all(amax * s * 2 > fmax), fmt  # and it is the largest power of two that fits
    for rule in ("mx-floor", "mx-ceil", "mx-rceil", "amax", "pow2-floor", "pow2-ceil"):
        np.testing.assert_array_equal(scale(amax, rule, spec), ref_scale(amax, fmt, rule),
                                      err_msg=f"{fmt} {rule}")


def test_mx_even_rounds_amax_to_the_element_mantissa_first():
    # E4M3 has 3 mantissa bits: 480 = 1.875 * 256 is exact there -> floor -> X = 1;
    # 496 = 1.9375 * 256 rounds (half up) to 2.0 * 256 = 512 -> X = 2 -> scale 1/2.
    assert scale([480.0], "mx-even")[0] == 1.0
    assert scale([496.0], "mx-even")[0] == 0.5
    assert scale([500.0], "mx-even")[0] == 0.5
    # half-up at the tie: 1.9375 has a 4th mantissa bit exactly half an ulp -> carries
    amax = np.exp(np.random.default_rng(2).uniform(-15, 15, 3000)).astype(np.float32)
    sig, exp = np.frexp(amax.astype(np.float64))  # amax = sig * 2**exp, sig in [0.5, 1)
    rounded = np.floor(sig * 2 ** 4 + 0.5) / 2 ** 4 * 2.0 ** exp  # 1 + 3 bits, half up
    expected = 2.0 ** -(np.floor(np.log2(rounded)) - 8)
    np.testing.assert_array_equal(scale(amax, "mx-even"), expected.astype(np.float32))


def test_mx_exponents_are_clamped_to_the_e8m0_range():
    assert scale([2.0 ** -140], "mx-floor")[0] == np.float32(2.0 ** 127)
    assert scale([2.0 ** -149], "mx-floor", FP4)[0] == np.float32(2.0 ** 127)
    big = float(np.finfo(np.float32).max)
    assert scale([big], "mx-floor")[0] == np.float32(2.0 ** -119)


# -- special amax values -----------------------------------------------------------------

@pytest.mark.parametrize("rule", ALL_RULES)
def test_zero_amax_gives_scale_one_and_nan_gives_nan(rule):
    s = scale([0.0, np.nan, -0.0], rule)
    assert s[0] == 1.0 and s[2] == 1.0
    assert math.isnan(s[1])


@pytest.mark.parametrize("rule", ALL_RULES)
def test_infinite_amax(rule):
    s = scale([np.inf], rule)[0]
    if rule.startswith("mx"):
        assert math.isnan(s)
    else:
        assert s == 0.0


def test_mx_rules_store_e8m0_scales_and_others_float32():
    for rule in map(ScaleRule, ALL_RULES):
        scheme = build_scheme(scale_rule=rule)
        expected = ScaleFormat.E8M0 if rule.value in MX else ScaleFormat.FLOAT32
        assert scheme.scale_format is expected, rule


@pytest.mark.parametrize("rule", ["amax", "pow2-floor", "pow2-ceil", "mx-floor", "mx-ceil",
                                  "mx-rceil"])
def test_each_rule_end_to_end_matches_the_reference(rule):
    x = heavy_tailed(np.random.default_rng(3), (64, 200), spread=1.5)
    stats = stats_of(x, build_scheme(block=32, scale_rule=ScaleRule(rule)))
    xq, grid, saturated, overflowed = ref_quantize(x, (1, 32), rule=rule)
    assert_matches_reference(stats, x, xq, saturated, overflowed, rule)
    assert_scales_match(stats["scales"], grid, rule)
    if rule in ("amax", "pow2-floor", "mx-rceil"):  # these never push amax past max
        assert stats["saturated"] == 0


# -- NVFP4 -------------------------------------------------------------------------------

def nvfp4_data():
    rng = np.random.default_rng(4)
    x = heavy_tailed(rng, (40, 96), spread=2.0)
    x[0, :16] = 0.0                     # an all-zero block: scale 1, no error
    x[1, :16] = 1e-9 * rng.standard_normal(16).astype(np.float32)  # decode scale underflows
    x[2, 0] = 50.0 * float(np.abs(x).max())  # the tensor amax sits in one block
    return x


def test_nvfp4_two_level_scales_match_the_definition():
    x = nvfp4_data()
    scheme = build_scheme(recipe="nvfp4")
    assert scheme.scale_format is ScaleFormat.E4M3_FP32 and scheme.block == 16
    assert scheme.format.name == "float4_e2m1fn"
    stats = stats_of(x, scheme)
    xq, grid = ref_nvfp4(x)
    assert_matches_reference(stats, x, xq, what="nvfp4")
    assert_scales_match(stats["scales"], grid, "nvfp4")
    assert stats["scales"]["count"] == 40 * 96 // 16
    # the block that holds the tensor amax: amax * scale lands exactly on 6
    assert xq[2, 0] == x[2, 0]
    # the all-zero block comes out exactly zero
    assert np.all(xq[0, :16] == 0)


def test_nvfp4_block_scales_are_e4m3_values_times_one_tensor_scale():
    x = nvfp4_data()
    _, grid = ref_nvfp4(x)
    stats = stats_of(x, build_scheme(recipe="nvfp4"))
    g = np.float32(6 * 448) / np.float32(np.abs(x).max())
    finite = grid[np.isfinite(grid) & (grid != 1)]
    decode = (g / finite).astype(np.float32)
    # every decode scale g / scale is (to float32 rounding) an E4M3 value
    as_e4m3 = decode.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_allclose(decode, as_e4m3, rtol=2e-7)
    assert stats["scales"]["max"] == float(np.nanmax(grid))


def test_nvfp4_with_an_explicit_non_amax_rule_is_refused():
    with pytest.raises(UsageError):
        build_scheme(recipe="nvfp4", scale_rule=ScaleRule.POW2_FLOOR)
