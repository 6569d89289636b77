"""The exact softmax-weighted averages behind ``fmt softmax``'s reference, vectorised.

``weighted_averages(s, columns)`` is ``sum_i exp(s_i - max s) c_i / sum_i exp(s_i - max s)``
for every column: exponentials and products in ``np.longdouble``; each sum exact to well
below longdouble's rounding, with numpy, by error-free pairwise additions (Knuth's TwoSum;
Ogita, Rump & Oishi 2005, "Accurate sum and dot product", SIAM J. Sci. Comput. 26(6));
products near float64's max scaled by a power of two first, so a sum past float64's range
(1e308 + 1e308) is computed too.  ``magnitude`` is the yardstick of the relative error, to
a few digits, in float64.
"""

from __future__ import annotations

import numpy as np

#: Columns of terms summed at once by ``_column_sums`` (longdouble: 64 MiB of them).
SUM_CHUNK = 1 << 22
#: Terms are scaled by a power of two so that no partial sum passes this (float64's max is
#: just below 2**1024): sums of values near float64's max do not overflow.
SUM_CEILING = 2.0 ** 1000


def _two_sum_tree(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column sums of float64 ``x`` (terms, columns) as two parts, ``high + low``: pairwise
    additions, each with its rounding error recovered exactly (Knuth's TwoSum, the
    error-free transformation of Ogita, Rump & Oishi 2005, "Accurate sum and dot product"),
    the errors summed in float64.  ``high + low`` is the exact sum but for the rounding of
    the errors' sum: within (log2(n) * 2**-53)**2 of the sum of |x|, far below longdouble's
    2**-64, provided no partial sum overflows (``_column_sums`` scales for that)."""
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


def _column_sums(weights: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of ``weights * c`` (longdouble products) for each column ``c`` of ``columns``
    (keys, k), to longdouble precision, as ``(sums, exponents)``: the sum is ``sums *
    2**exponents``.  Each column's products are scaled by a power of two (exact) where the
    largest times the number of terms would pass ``SUM_CEILING``, so sums beyond float64's
    range (two values of 1e308) are computed too; each product is split into float64 high
    and low parts (the low part is zero where longdouble is float64) and the parts summed
    by ``_two_sum_tree``.  Columns go a few at a time (``SUM_CHUNK`` products)."""
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
        total, error = _two_sum_tree(high)
        sums[c0:c0 + step] = total.astype(np.longdouble) + (error + low).astype(np.longdouble)
        exponents[c0:c0 + step] = scale
    return sums, exponents


def weighted_averages(scores: np.ndarray, columns: np.ndarray
                      ) -> tuple[np.ndarray, np.longdouble]:
    """``sum_i exp(s_i - max s) c_i / sum_i exp(s_i - max s)`` for each column ``c`` of
    ``columns`` (keys, k), as longdouble, and the denominator: exponentials and products
    in longdouble, each sum to longdouble precision (``_column_sums``), one division, the
    power-of-two scale put back after it (an average never passes its largest value)."""
    s = scores.astype(np.longdouble)
    with np.errstate(over="ignore"):  # -1e308 - 1e308 where longdouble is float64: -inf
        e = np.exp(s - s.max())  # and a weight of 0, as exactly
    denominator = _column_sums(e, np.ones((e.size, 1)))[0][0]  # <= 2**20 terms <= 1
    sums, exponents = _column_sums(e, columns)
    return np.ldexp(sums / denominator, exponents), denominator


def magnitude(scores: np.ndarray, matrix: np.ndarray) -> float:
    """The largest softmax-weighted average of ``|v|`` over the components: the yardstick
    of ``rel_error``, needed to a few digits only, so in float64 (one matrix product), with
    the values divided by their largest first (no overflow)."""
    top = float(np.max(np.abs(matrix)))
    if top == 0:
        return 0.0
    with np.errstate(over="ignore"):  # -1e308 - 1e308 is -inf: a weight of 0, as exactly
        e = np.exp(scores - scores.max())
    return float(np.max(e @ (np.abs(matrix) / top))) / float(np.sum(e)) * top
