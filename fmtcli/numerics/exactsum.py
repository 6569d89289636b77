"""Exact sums of float64 values: as an integer, whatever their size, and as column sums
to longdouble precision, vectorised.

Exact, as an integer (``fmt sum``'s reference).  Every float64 value is an integer multiple
of 2^-1074 (the smallest subnormal), so a sum of them is ``N * 2^-1074`` for an integer N --
which may lie far beyond float64's range (1e308 + 1e308) where ``math.fsum`` raises
``OverflowError`` ("intermediate overflow").  ``exact_units`` finds N with numpy: each value
is ``M * 2^k`` with an integer significand ``|M| < 2^53`` (read from its bits); M is split
in 26-bit halves, and the halves are summed by exponent k with ``numpy.bincount`` (at most
2^24 values a pass: every partial sum is an integer below 2^51, exact in float64); Python's
integers then add the 2,046 exponent classes.  ``to_float`` rounds N * 2^-1074 correctly
to float64 (inf beyond it), ``difference`` gives a float64 result's error against it
exactly.

To longdouble precision, many sums at once (``fmt softmax``'s reference).
``column_sums(weights, columns)`` is the sum of ``weights * c`` for every column ``c``:
products in ``np.longdouble``, each sum exact to well below longdouble's rounding, by
error-free pairwise additions (Knuth's TwoSum; Ogita, Rump & Oishi 2005, "Accurate sum and
dot product", SIAM J. Sci. Comput. 26(6)); products near float64's max scaled by a power of
two first, so a sum past float64's range (1e308 + 1e308) is computed too.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

#: 2^1074: float64 values times this are integers.
SCALE = 1 << 1074
_PASS = 1 << 18  # values a pass: in cache (and at most 2^24: 26-bit halves sum below 2^51)
_HALF = 26
#: Columns of terms summed at once by ``column_sums`` (longdouble: 64 MiB of them).
SUM_CHUNK = 1 << 22
#: Terms are scaled by a power of two so that no partial sum passes this (float64's max is
#: just below 2**1024): sums of values near float64's max do not overflow.
SUM_CEILING = 2.0 ** 1000


# -- exact, as an integer count of 2^-1074 -------------------------------------------------

def exact_units(values: np.ndarray) -> int:
    """N with ``sum(values) == N * 2^-1074`` exactly (finite float64 values)."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    total = 0
    for start in range(0, x.size, _PASS):
        total += _pass(x[start:start + _PASS])
    return total


def _pass(x: np.ndarray) -> int:
    bits = np.ascontiguousarray(x).view(np.uint64)
    biased = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    # |x| = M * 2^(k - 1074): M the 53-bit significand with its leading bit and k = the
    # biased exponent - 1; subnormals (biased 0): M the fraction field and k = 0
    significand = (bits & np.uint64((1 << 52) - 1)).astype(np.int64)
    significand |= (biased != 0).astype(np.int64) << 52
    np.negative(significand, out=significand, where=(bits >> np.uint64(63)) != 0)
    k = np.maximum(biased - 1, 0)
    high = (significand >> _HALF).astype(np.float64)  # floor: the low half is >= 0
    low = (significand & ((1 << _HALF) - 1)).astype(np.float64)
    highs = np.bincount(k, weights=high)
    lows = np.bincount(k, weights=low)
    total = 0
    for shift in np.flatnonzero((highs != 0) | (lows != 0)).tolist():
        total += ((int(highs[shift]) << _HALF) + int(lows[shift])) << shift
    return total


def ratio_to_float(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` correctly rounded to float64, +-inf beyond it."""
    try:
        return numerator / denominator
    except OverflowError:
        return math.inf if (numerator < 0) == (denominator < 0) else -math.inf


def to_float(units: int) -> float:
    """``units * 2^-1074`` correctly rounded to float64 (+-inf beyond its range)."""
    return ratio_to_float(units, SCALE)


def float_units(x: float) -> int:
    """A finite float64 value as a count of 2^-1074."""
    n, d = Fraction(x).as_integer_ratio()
    return n * (SCALE // d)


def difference(total: float, units: int) -> tuple[float, float]:
    """(total - exact, |total - exact| / |exact|) for the exact sum ``units * 2^-1074``,
    both from the exact difference; an infinite total's error is the inf itself (relative
    error inf), a NaN's NaN."""
    if math.isnan(total):
        return math.nan, math.nan
    if math.isinf(total):
        return total, math.inf
    diff = float_units(total) - units
    if diff == 0:
        return 0.0, 0.0
    if units == 0:
        return to_float(diff), math.inf
    return to_float(diff), ratio_to_float(abs(diff), abs(units))


def units_text(units: int) -> str:
    """The exact sum written shortly: float64's repr when it fits, else ``≈ d.ddde+N`` with
    17 significant digits (beyond float64's range)."""
    value = to_float(units)
    if math.isfinite(value):
        return repr(value)
    exponent = int((abs(units).bit_length() - 1075) * math.log10(2))  # > 300 here
    for guess in (exponent - 1, exponent, exponent + 1):  # |sum| = m * 10^guess, 1 <= m < 10
        scaled = abs(units) * 10 ** 16 // (SCALE * 10 ** guess)  # 17 digits, truncated
        if 10 ** 16 <= scaled < 10 ** 17:
            text = str(scaled)
            return f"{'-' if units < 0 else ''}≈ {text[0]}.{text[1:]}e+{guess}"
    raise AssertionError("one of three exponents fits")  # pragma: no cover


# -- to longdouble precision, column by column --------------------------------------------

def two_sum_tree(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column sums of float64 ``x`` (terms, columns) as two parts, ``high + low``: pairwise
    additions, each with its rounding error recovered exactly (Knuth's TwoSum, the
    error-free transformation of Ogita, Rump & Oishi 2005, "Accurate sum and dot product"),
    the errors summed in float64.  ``high + low`` is the exact sum but for the rounding of
    the errors' sum: within (log2(n) * 2**-53)**2 of the sum of |x|, far below longdouble's
    2**-64, provided no partial sum overflows (``column_sums`` scales for that)."""
    low = np.zeros(x.shape[1])
    if x.shape[0] & (x.shape[0] - 1):  # zeros up to a power of two: every level pairs up
        x = np.concatenate([x, np.zeros((-x.shape[0] % (1 << x.shape[0].bit_length()),
                                         x.shape[1]))])
    while x.shape[0] > 1:
        a, b = x[0::2], x[1::2]
        total = a + b
        b_virtual = total - a
        low += ((a - (total - b_virtual)) + (b - b_virtual)).sum(axis=0)
        x = total
    return x[0], low


def column_sums(weights: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of ``weights * c`` (longdouble products) for each column ``c`` of ``columns``
    (keys, k), to longdouble precision, as ``(sums, exponents)``: the sum is ``sums *
    2**exponents``.  Each column's products are scaled by a power of two (exact) where the
    largest times the number of terms would pass ``SUM_CEILING``, so sums beyond float64's
    range (two values of 1e308) are computed too; each product is split into float64 high
    and low parts (the low part is zero where longdouble is float64) and the parts summed
    by ``two_sum_tree``.  Columns go a few at a time (``SUM_CHUNK`` products)."""
    n, k = columns.shape
    sums = np.empty(k, dtype=np.longdouble)
    exponents = np.zeros(k, dtype=np.int32)
    split = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant
    step = max(1, SUM_CHUNK // max(1, n))
    ceiling = int(np.log2(SUM_CEILING))
    w = np.asarray(weights, dtype=np.longdouble)[:, None]
    for c0 in range(0, k, step):
        part = w * columns[:, c0:c0 + step].astype(np.longdouble)
        _, top = np.frexp(np.max(np.abs(part), axis=0))  # the largest is below 2**top
        scale = np.maximum(0, top.astype(np.int32) + (2 * n).bit_length() - ceiling)
        if scale.any():
            part = np.ldexp(part, -scale[None, :])
        high = part.astype(np.float64)
        # the low parts are below 2**-53 of the high ones: summed plainly, they are off by
        # 2**-106 of the whole at most; the high parts are summed without error
        low = (part - high).astype(np.float64).sum(axis=0) if split else 0.0
        del part
        total, error = two_sum_tree(high)
        sums[c0:c0 + step] = total.astype(np.longdouble) + (error + low).astype(np.longdouble)
        exponents[c0:c0 + step] = scale
    return sums, exponents
