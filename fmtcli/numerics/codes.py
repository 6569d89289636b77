"""The bit patterns of a format's values: ``encode`` (values to codes), ``decode`` (codes to
values) and ``all_values`` (every code's value, formats of at most 16 bits).

Codes are unsigned integers of the smallest width that holds them (uint8 for FP8/6/4):
sign, exponent field, mantissa field, as the format lays them out (``FormatSpec``: bias,
subnormals, and where inf and NaN live: IEEE, ``fn`` with one NaN code and no inf,
``fnuz`` with NaN at the negative-zero code); a tapered format's codes are its own layout's
(``numerics.tapered``).  ``encode`` takes values the format holds exactly (what
``rounding.round_to_format`` returns).
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.errors import UsageError
from fmtcli.numerics import tapered
from fmtcli.numerics.formats import FormatSpec, Specials


def _code_dtype(spec: FormatSpec):
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if spec.bits <= np.dtype(dtype).itemsize * 8:
            return dtype
    raise AssertionError("formats have at most 64 bits")


def encode(values, spec: FormatSpec) -> np.ndarray:
    """Bit patterns of values that the format holds exactly (the output of round_to_format).

    Codes are unsigned integers of the smallest width that fits (uint8 for FP8/6/4).  NaN
    becomes the format's NaN code (sign kept where NaN has one); in formats without NaN it
    becomes the negative-zero code, as ml_dtypes does.
    """
    if spec.taper is not None:  # a tapered format's own layout (HiFloat8's dot field)
        return tapered.encode(values, spec.taper)
    with np.errstate(invalid="ignore", over="ignore"):
        return _encode(np.asarray(values, dtype=np.float64), spec)


def _encode(v: np.ndarray, spec: FormatSpec) -> np.ndarray:
    m, bias = spec.mantissa_bits, spec.bias
    a = np.abs(v)
    a = np.where(np.isfinite(a), a, 0.0)
    _, exponent = np.frexp(a)
    e = exponent.astype(np.int64) - 1
    normal = (a >= spec.smallest_normal) | (not spec.subnormals)
    mant_normal = np.ldexp(a, m - e) - float(1 << m)  # (significand - 1) * 2**m
    mant_sub = np.ldexp(a, m - spec.min_exponent)  # a / smallest_subnormal
    exp_field = np.where(normal, e + bias, 0).astype(np.uint64)
    mant_field = np.where(normal, mant_normal, mant_sub).astype(np.uint64)
    codes = (exp_field << np.uint64(m)) | mant_field
    sign = np.signbit(v).astype(np.uint64) << np.uint64(spec.bits - 1) if spec.signed \
        else np.uint64(0)
    codes |= sign
    top = np.uint64((1 << spec.exponent_bits) - 1) << np.uint64(m)
    if spec.has_inf:
        codes = np.where(np.isinf(v), top | sign, codes)
    if spec.specials is Specials.FNUZ:  # no -0: a zero is the +0 code, never the NaN code
        codes = np.where(v == 0, np.uint64(0), codes)
    if spec.specials is Specials.IEEE and m > 0:
        nan_code = top | np.uint64(1 << (m - 1)) | sign
    elif spec.specials is Specials.FN:
        nan_code = np.uint64((1 << (spec.exponent_bits + m)) - 1) | sign
    elif spec.specials is Specials.FNUZ:  # the negative-zero code
        nan_code = np.uint64(1) << np.uint64(spec.bits - 1)
    else:  # no NaN code (FP6, FP4, IEEE-style with m = 0): ml_dtypes writes a zero with
        # the NaN's sign bit flipped
        nan_code = (~np.signbit(v)).astype(np.uint64) << np.uint64(spec.bits - 1)
    codes = np.where(np.isnan(v), nan_code, codes)
    return codes.astype(_code_dtype(spec))


def decode(codes, spec: FormatSpec) -> np.ndarray:
    """Values (float64) of bit patterns of the format; the inverse of ``encode``."""
    if spec.taper is not None:
        return tapered.decode(codes, spec.taper)
    c = np.asarray(codes).astype(np.uint64)
    m, e_bits = spec.mantissa_bits, spec.exponent_bits
    mant = (c & np.uint64((1 << m) - 1)).astype(np.float64)
    exp_field = ((c >> np.uint64(m)) & np.uint64((1 << e_bits) - 1)).astype(np.int64)
    negative = ((c >> np.uint64(spec.bits - 1)) & np.uint64(1)).astype(bool) if spec.signed \
        else np.zeros(c.shape, bool)
    if spec.subnormals:
        sub = exp_field == 0
        magnitude = np.where(
            sub,
            np.ldexp(mant, np.int32(spec.min_exponent - m)),
            np.ldexp(1.0 + np.ldexp(mant, -m), (exp_field - spec.bias).astype(np.int32)))
    else:
        magnitude = np.ldexp(1.0 + np.ldexp(mant, -m), (exp_field - spec.bias).astype(np.int32))
    v = np.where(negative, -magnitude, magnitude)
    top = exp_field == (1 << e_bits) - 1
    if spec.specials is Specials.IEEE:
        v = np.where(top & (mant == 0), np.where(negative, -np.inf, np.inf), v)
        v = np.where(top & (mant != 0), np.nan, v)
    elif spec.specials is Specials.FN:
        v = np.where(top & (mant == (1 << m) - 1), np.nan, v)
    elif spec.specials is Specials.FNUZ:
        v = np.where(negative & (exp_field == 0) & (mant == 0), np.nan, v)
    return v


def all_values(spec: FormatSpec) -> np.ndarray:
    """Every code point's value in code order (formats of at most 16 bits)."""
    if spec.bits > 16:
        raise UsageError(f"{spec.name} has 2**{spec.bits} codes; enumerating needs <= 16 bits")
    return decode(np.arange(1 << spec.bits, dtype=np.uint64), spec)
