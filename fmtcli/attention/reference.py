"""The exact softmax-weighted averages behind ``fmt softmax``'s reference, vectorised.

``weighted_averages(s, columns)`` is ``sum_i exp(s_i - max s) c_i / sum_i exp(s_i - max s)``
for every column: exponentials and products in ``np.longdouble``, each sum to longdouble
precision by ``numerics.exactsum.column_sums`` (error-free pairwise additions; products
near float64's max scaled by a power of two first, so a sum past float64's range is
computed too), one division.  ``magnitude`` is the yardstick of the relative error, to a
few digits, in float64.
"""

from __future__ import annotations

import numpy as np

from fmtcli.numerics.exactsum import column_sums


def weighted_averages(scores: np.ndarray, columns: np.ndarray
                      ) -> tuple[np.ndarray, np.longdouble]:
    """``sum_i exp(s_i - max s) c_i / sum_i exp(s_i - max s)`` for each column ``c`` of
    ``columns`` (keys, k), as longdouble, and the denominator: exponentials and products
    in longdouble, each sum to longdouble precision (``column_sums``), one division, the
    power-of-two scale put back after it (an average never passes its largest value)."""
    s = scores.astype(np.longdouble)
    with np.errstate(over="ignore"):  # -1e308 - 1e308 where longdouble is float64: -inf
        e = np.exp(s - s.max())  # and a weight of 0, as exactly
    denominator = column_sums(e, np.ones((e.size, 1)))[0][0]  # <= 2**20 terms <= 1
    sums, exponents = column_sums(e, columns)
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
