"""Tests of fmtcli.numerics.formats: derived figures, code-point census, custom grammar, name resolution.

Reference points are independent of the code under test: ``ml_dtypes.finfo`` / ``np.finfo``
for the figures, ml_dtypes' own decoding of raw bit patterns for ``decode``, and a census of
every code point for the counts and flags.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from fmtcli.base.errors import UnknownFormatError, UsageError
from fmtcli.numerics.formats import (
    REGISTRY,
    FormatSpec,
    Specials,
    get_format,
    parse_custom,
    resolve_format,
)
from fmtcli.numerics.rounding import all_values, decode

ML_FORMATS = sorted(name for name, spec in REGISTRY.items() if spec.ml_dtype is not None)
SMALL_REGISTERED = sorted(name for name, spec in REGISTRY.items() if spec.bits <= 16)
ML_SMALL = sorted(name for name in ML_FORMATS if REGISTRY[name].bits <= 16)

#: Custom formats (parsed by the grammar, not looked up) for the census; all <= 16 bits.
CUSTOM_NAMES = [
    "e5m10", "e3m2fn", "e2m1fn", "e4m3fnuz", "e5m0", "e5m0fn", "e5m1fnu", "e3m1", "e2m3fnuz",
    "e1m2fn", "e3m0fnuz", "e4m3_b11", "e4m3b11fnuz", "e6m9", "e2m1fnu", "e1m1fnu", "e8m7",
    "e2m0fn", "e4m3fn_b5",
]


def params(spec: FormatSpec) -> tuple:
    """The defining parameters of a spec (everything but its name, aliases and description)."""
    return (spec.exponent_bits, spec.mantissa_bits, spec.bias, spec.specials, spec.signed,
            spec.subnormals)


def figures(spec: FormatSpec) -> dict:
    """Every derived figure of a spec."""
    return {
        "bits": spec.bits, "exponent_bits": spec.exponent_bits,
        "mantissa_bits": spec.mantissa_bits, "bias": spec.bias, "max": spec.max, "min": spec.min,
        "smallest_normal": spec.smallest_normal, "smallest_subnormal": spec.smallest_subnormal,
        "eps": spec.eps, "min_exponent": spec.min_exponent, "max_exponent": spec.max_exponent,
        "finite_values": spec.finite_values, "has_inf": spec.has_inf, "has_nan": spec.has_nan,
        "has_zero": spec.has_zero, "has_negative_zero": spec.has_negative_zero,
        "nan_codes": spec.nan_codes,
    }


# -- registry against ml_dtypes.finfo ------------------------------------------------------

def test_registry_has_the_expected_ml_dtypes_formats():
    # Guards the parametrisations below against silently shrinking.
    assert set(ML_FORMATS) == {
        "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
        "float8_e5m2fnuz", "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz",
        "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
    }
    assert REGISTRY["tfloat32"].ml_dtype is None


@pytest.mark.parametrize("name", ML_FORMATS)
def test_ml_dtype_is_the_dtype_of_that_name(name):
    native = name in ("float32", "float16")
    expected = np.dtype(name) if native else np.dtype(getattr(ml_dtypes, name))
    assert REGISTRY[name].ml_dtype == expected


@pytest.mark.parametrize("name", ML_FORMATS)
def test_figures_equal_ml_dtypes_finfo(name):
    spec = REGISTRY[name]
    fi = ml_dtypes.finfo(spec.ml_dtype)
    assert_figures_equal_finfo(spec, fi)
    assert spec.min == float(fi.min)


def assert_figures_equal_finfo(spec, fi) -> None:
    """The derived figures against an ml_dtypes or numpy finfo."""
    assert spec.bits == fi.bits
    assert spec.exponent_bits == fi.nexp
    assert spec.mantissa_bits == fi.nmant
    assert spec.max == float(fi.max)
    assert spec.smallest_normal == float(fi.smallest_normal)
    assert spec.smallest_subnormal == float(fi.smallest_subnormal)
    assert spec.eps == float(fi.eps)
    assert spec.max_exponent + 1 == fi.maxexp
    assert spec.min_exponent == fi.minexp


def test_figures_are_python_floats_and_ints():
    spec = REGISTRY["float8_e4m3fn"]
    for key in ("max", "min", "smallest_normal", "smallest_subnormal", "eps"):
        assert type(getattr(spec, key)) is float, key
    for key in ("bits", "min_exponent", "max_exponent", "finite_values", "nan_codes"):
        assert type(getattr(spec, key)) is int, key


@pytest.mark.parametrize("name", ["e4m3_b0", "e1m2fn"])
def test_eps_is_the_relative_spacing_even_when_one_is_subnormal(name):
    # eps is defined as numpy.finfo defines it, 2**-mantissa_bits (the relative spacing of
    # normal values); where 1.0 is subnormal the spacing just above 1 is larger.
    spec = get_format(name)
    values = all_values(spec)
    values = values[np.isfinite(values)]
    assert 1.0 in values
    assert spec.eps == 2.0 ** -spec.mantissa_bits
    assert values[values > 1.0].min() - 1.0 > spec.eps


def test_tfloat32_figures():
    spec = REGISTRY["tfloat32"]
    f32, f16 = np.finfo(np.float32), np.finfo(np.float16)
    assert spec.bits == 19
    assert spec.eps == float(f16.eps)
    assert spec.smallest_normal == float(f32.smallest_normal)
    assert spec.max == math.ldexp(2 - 2 ** -10, 127)
    assert spec.smallest_subnormal == 2.0 ** (-126 - 10)
    assert (spec.min_exponent, spec.max_exponent) == (f32.minexp, f32.maxexp - 1)


# -- census of code points ---------------------------------------------------------------

def _census_specs():
    specs = [REGISTRY[name] for name in SMALL_REGISTERED]
    specs += [parse_custom(name) for name in CUSTOM_NAMES]
    return specs


@pytest.mark.parametrize("spec", _census_specs(), ids=str)
def test_counts_and_flags_agree_with_code_point_census(spec):
    assert spec.bits <= 16
    v = all_values(spec)
    assert v.shape == (1 << spec.bits,)
    assert v.dtype == np.float64
    finite = v[np.isfinite(v)]
    distinct = np.unique(finite)  # -0.0 == 0.0, so they count once
    assert spec.finite_values == distinct.size
    assert spec.has_inf == bool(np.isinf(v).any())
    assert spec.has_nan == bool(np.isnan(v).any())
    assert spec.nan_codes == int(np.isnan(v).sum())
    assert spec.has_zero == bool((v == 0).any())
    assert spec.has_negative_zero == bool(((v == 0) & np.signbit(v)).any())
    if spec.has_inf:
        assert np.isposinf(v).sum() == 1
        assert np.isneginf(v).sum() == (1 if spec.signed else 0)
    # figures against the enumeration
    assert spec.max == distinct.max()
    assert spec.min == distinct.min()
    positive = distinct[distinct > 0]
    assert spec.smallest_subnormal == positive.min()
    below_normal = int((positive < spec.smallest_normal).sum())
    assert below_normal == ((1 << spec.mantissa_bits) - 1 if spec.subnormals else 0)
    assert spec.smallest_normal in positive
    assert spec.max_exponent == math.floor(math.log2(spec.max))
    if spec.signed:
        assert (distinct < 0).any()
        np.testing.assert_array_equal(np.sort(-distinct[distinct < 0]), positive)
    else:
        assert not (v < 0).any()
    if spec.min_exponent <= 0 and spec.max > 1.0:  # 1.0 is a normal value
        assert 1.0 in distinct
        above_one = distinct[distinct > 1.0].min()
        assert spec.eps == above_one - 1.0


@pytest.mark.parametrize("name", ML_SMALL)
def test_decode_all_codes_matches_ml_dtypes(name):
    spec = REGISTRY[name]
    n = 1 << spec.bits
    code_dtype = np.uint16 if spec.bits == 16 else np.uint8  # 6-/4-bit: one code per byte
    codes = np.arange(n).astype(code_dtype)
    with np.errstate(invalid="ignore"):
        expected = codes.view(spec.ml_dtype).astype(np.float64)
    got = decode(codes, spec)
    assert got.dtype == np.float64
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint64), expected[~nan].view(np.uint64))
    # all_values is decode in code order
    np.testing.assert_array_equal(all_values(spec), got)


def test_all_values_refuses_wide_formats():
    with pytest.raises(UsageError):
        all_values(REGISTRY["float32"])
    with pytest.raises(UsageError):
        all_values(REGISTRY["tfloat32"])


# -- custom grammar ----------------------------------------------------------------------

@pytest.mark.parametrize("custom, registered", [
    ("e5m10", "float16"), ("e8m7", "bfloat16"), ("e8m10", "tfloat32"), ("e8m23", "float32"),
])
def test_custom_ieee_names_equal_registered_figures(custom, registered):
    spec, note = resolve_format(custom)
    assert note is None
    assert spec.name == custom  # the grammar built it; it is not an alias
    assert figures(spec) == figures(REGISTRY[registered])
    assert params(spec) == params(REGISTRY[registered])


@pytest.mark.parametrize("custom, registered", [
    ("e4m3fn", "float8_e4m3fn"),
    ("e4m3fnuz", "float8_e4m3fnuz"),
    ("e5m2fnuz", "float8_e5m2fnuz"),
    ("e5m2", "float8_e5m2"),
    ("e4m3", "float8_e4m3"),  # the grammar alone (not resolve_format) reads e4m3 as IEEE-style
    ("e3m4", "float8_e3m4"),
    ("e4m3b11fnuz", "float8_e4m3b11fnuz"),
    ("e4m3_b11fnuz", "float8_e4m3b11fnuz"),
    ("e4m3fnuz_b11", "float8_e4m3b11fnuz"),
    ("e8m0fnu", "float8_e8m0fnu"),
])
def test_parse_custom_rebuilds_registered_formats(custom, registered):
    spec = parse_custom(custom)
    assert spec is not None
    assert params(spec) == params(REGISTRY[registered])
    assert figures(spec) == figures(REGISTRY[registered])
    dtype = REGISTRY[registered].ml_dtype
    fi = ml_dtypes.finfo(dtype)
    assert (spec.max, spec.smallest_subnormal, spec.min_exponent) == (
        float(fi.max), float(fi.smallest_subnormal), fi.minexp)


def test_custom_suffixes_set_specials_sign_and_bias():
    assert params(parse_custom("e4m3")) == (4, 3, 7, Specials.IEEE, True, True)
    assert params(parse_custom("e4m3fn")) == (4, 3, 7, Specials.FN, True, True)
    assert params(parse_custom("e4m3fnuz")) == (4, 3, 8, Specials.FNUZ, True, True)
    assert params(parse_custom("e5m1fnu")) == (5, 1, 15, Specials.FN, False, False)
    assert params(parse_custom("e4m3_b11")) == (4, 3, 11, Specials.IEEE, True, True)
    assert params(parse_custom("e4m3b11")) == (4, 3, 11, Specials.IEEE, True, True)
    assert params(parse_custom("e4m3fn_b5")) == (4, 3, 5, Specials.FN, True, True)
    assert parse_custom("e4m3_b11").max == 15.0  # 1.875 * 2**(14 - 11)
    assert parse_custom("e4m3_b11").smallest_subnormal == 2.0 ** -13
    assert parse_custom("float16") is None
    assert parse_custom("e4") is None
    assert parse_custom("e4m3x") is None


def test_e8m0fnu_name_resolves_to_registered_spec():
    spec, note = resolve_format("e8m0fnu")
    assert spec is REGISTRY["float8_e8m0fnu"]
    assert note is None
    assert not spec.signed and not spec.has_zero and spec.has_nan and not spec.has_inf
    assert spec.max == 2.0 ** 127 and spec.smallest_subnormal == 2.0 ** -127


@pytest.mark.parametrize("name", ["e1m2fn", "e1m52fn", "e11m0", "e11m52", "e2m0fn",
                                  "e2m52", "e5m0", "e5m52", "e10m1fnu", "e1m1fnu"])
def test_custom_bounds_accepted_at_the_edges(name):
    spec, _ = resolve_format(name)
    assert 1 <= spec.exponent_bits <= 11 and 0 <= spec.mantissa_bits <= 52
    assert spec.max > 0 and spec.smallest_subnormal <= 1


def test_e11m52_equals_float64_finfo():
    assert_figures_equal_finfo(get_format("e11m52"), np.finfo(np.float64))


@pytest.mark.parametrize("name", ["e0m3", "e12m3", "e99m1", "e5m53", "e8m100", "e0m0",
                                  "e12m3fn", "e0m2fnuz", "e4m3_b7_b7", "e4m3b7_b7"])
def test_custom_out_of_range_raises_unknown_format(name):
    with pytest.raises(UnknownFormatError) as info:
        resolve_format(name)
    assert isinstance(info.value, UsageError)
    assert info.value.exit_code == 2
    with pytest.raises(UnknownFormatError):
        parse_custom(name)


def test_unknown_format_error_is_a_usage_error():
    assert issubclass(UnknownFormatError, UsageError)


def test_impossible_custom_formats_raise_usage_error():
    with pytest.raises(UsageError):
        resolve_format("e1m2")  # IEEE-style needs a top exponent besides the subnormal one
    with pytest.raises(UsageError):
        resolve_format("e4m3_b-3")  # cannot represent 1
    with pytest.raises(UsageError):
        resolve_format("e11m52fn")  # range beyond float64
    with pytest.raises(UsageError):
        resolve_format("e11m1fnu")  # top exponent 2047 - 1023 = 1024: beyond float64
    with pytest.raises(UsageError):
        resolve_format("e1m0fn")  # the only finite value would be 0
    with pytest.raises(UsageError):
        FormatSpec("x", 12, 3, 7)
    with pytest.raises(UsageError):
        FormatSpec("x", 4, 53, 7)
    with pytest.raises(UsageError):
        FormatSpec("x", 4, 3, 8, Specials.FNUZ, signed=False)


# -- names and aliases -------------------------------------------------------------------

@pytest.mark.parametrize("alias, canonical", [
    ("fp32", "float32"), ("FP32", "float32"), ("float", "float32"), ("single", "float32"),
    ("fp16", "float16"), ("half", "float16"), ("HALF", "float16"), ("f16", "float16"),
    ("bf16", "bfloat16"), ("BF16", "bfloat16"), ("BFloat16", "bfloat16"),
    ("tf32", "tfloat32"), ("TF32", "tfloat32"),
    ("e4m3fn", "float8_e4m3fn"), ("E4M3FN", "float8_e4m3fn"), ("fp8_e4m3fn", "float8_e4m3fn"),
    ("e4m3fnuz", "float8_e4m3fnuz"), ("e5m2", "float8_e5m2"), ("E5M2", "float8_e5m2"),
    ("e5m2fnuz", "float8_e5m2fnuz"), ("e4m3b11fnuz", "float8_e4m3b11fnuz"),
    ("e8m0", "float8_e8m0fnu"), ("e8m0fnu", "float8_e8m0fnu"), ("E8M0", "float8_e8m0fnu"),
    ("e2m3", "float6_e2m3fn"), ("fp6_e2m3", "float6_e2m3fn"), ("e2m3fn", "float6_e2m3fn"),
    ("e3m2", "float6_e3m2fn"), ("fp6_e3m2", "float6_e3m2fn"), ("FP6_E3M2", "float6_e3m2fn"),
    ("e2m1", "float4_e2m1fn"), ("fp4", "float4_e2m1fn"), ("FP4", "float4_e2m1fn"),
    ("e2m1fn", "float4_e2m1fn"),
    ("torch.float8_e4m3fn", "float8_e4m3fn"), ("torch.float16", "float16"),
    ("torch.bfloat16", "bfloat16"), ("Torch.Float8_E5M2", "float8_e5m2"),
    ("FLOAT8_E4M3FNUZ", "float8_e4m3fnuz"), ("  fp16  ", "float16"),
])
def test_aliases_resolve_to_canonical(alias, canonical):
    spec, note = resolve_format(alias)
    assert spec is REGISTRY[canonical]
    assert spec.name == canonical
    assert note is None
    assert get_format(alias) is REGISTRY[canonical]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_name_and_alias_resolves(name):
    spec = REGISTRY[name]
    assert resolve_format(name) == (spec, None)
    assert resolve_format(name.upper())[0] is spec
    for alias in spec.aliases:
        assert resolve_format(alias)[0] is spec, alias


@pytest.mark.parametrize("name", ["e4m3", "E4M3", " e4m3 "])
def test_bare_e4m3_is_ocp_with_a_note(name):
    spec, note = resolve_format(name)
    assert spec is REGISTRY["float8_e4m3fn"]
    assert spec.max == 448.0
    assert note is not None
    assert "e4m3fnuz" in note
    assert "240" in note
    assert get_format(name) is REGISTRY["float8_e4m3fn"]


@pytest.mark.parametrize("name, suggestion", [
    ("float8_e4m3f", "float8_e4m3fn"),
    ("bfloat61", "bfloat16"),
    ("flaot16", "float16"),
    ("tfloat23", "tfloat32"),
])
def test_unknown_name_suggests_close_matches(name, suggestion):
    with pytest.raises(UnknownFormatError) as info:
        resolve_format(name)
    text = str(info.value)
    assert name in text
    assert suggestion in text
    assert info.value.exit_code == 2


def test_unknown_name_without_close_match_still_raises():
    with pytest.raises(UnknownFormatError) as info:
        get_format("xyzzy-quux")
    assert "xyzzy-quux" in str(info.value)
