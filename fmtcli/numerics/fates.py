"""What happened to each value when it was stored in a format: its *fate*.

The fixed set of words, checked in this order (the first that applies wins):

- ``invalid``   the format has no code for the input (NaN in FP6/FP4; zero or a negative
                number in the unsigned E8M0): the result is NaN.
- ``overflow``  a finite input became inf or NaN, or an infinite input became NaN.
- ``saturated`` the input lies beyond the format's range and was clipped to +-max
                (overflow policy ``saturate``, a format without inf/NaN, or a directed
                rounding mode that stops at max); in a format without zero (E8M0), a
                positive input too small to round to its smallest value, raised to it.
- ``flushed``   a nonzero input became zero.
- ``subnormal`` stored below the smallest normal value, with reduced precision (even when
                the value happens to be held exactly).
- ``exact``     the format holds the input exactly (NaN stays NaN, inf stays inf).
- ``rounded``   stored as a nearby normal value.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from fmtcli.numerics.formats import FormatSpec


class Fate(str, Enum):
    """What became of a value stored in a format (see the module docstring)."""

    INVALID = "invalid"
    OVERFLOW = "overflow"
    SATURATED = "saturated"
    FLUSHED = "flushed"
    EXACT = "exact"
    SUBNORMAL = "subnormal"
    ROUNDED = "rounded"


FATES: tuple[Fate, ...] = tuple(Fate)


def classify(x: np.ndarray, unbounded: np.ndarray, stored: np.ndarray,
             spec: FormatSpec) -> np.ndarray:
    """Fate of every element, as indices into ``FATES`` (int8 array of x's shape).

    ``unbounded`` is x rounded on the format's grid before range limits
    (``rounding.round_unbounded``) and ``stored`` the final result (``apply_range``).
    """
    x = np.asarray(x, dtype=np.float64)
    stored = np.asarray(stored, dtype=np.float64)
    unbounded = np.asarray(unbounded, dtype=np.float64)
    code = np.full(x.shape, FATES.index(Fate.ROUNDED), dtype=np.int8)
    a = np.abs(stored)
    # Assigned from the lowest priority up, so that higher ones overwrite.
    code[(stored == x) | (np.isnan(stored) & np.isnan(x))] = FATES.index(Fate.EXACT)
    if spec.subnormals:
        code[(a < spec.smallest_normal) & (a > 0)] = FATES.index(Fate.SUBNORMAL)
    code[(stored == 0) & (x != 0) & ~np.isnan(x)] = FATES.index(Fate.FLUSHED)
    beyond = (np.abs(unbounded) > spec.max) & np.isfinite(stored)
    if not spec.has_zero:  # raised to the smallest value: the bottom end of saturation
        beyond |= (unbounded == 0) & (x > 0)
    code[beyond & (stored != x)] = FATES.index(Fate.SATURATED)
    became_special = ~np.isfinite(stored) & (stored != x) & ~np.isnan(x)
    code[became_special] = FATES.index(Fate.OVERFLOW)
    cannot_hold = np.zeros(x.shape, dtype=bool)
    if not spec.has_nan:
        cannot_hold |= np.isnan(x)
    if not spec.signed:
        cannot_hold |= np.signbit(x) & ~np.isnan(x)
    if not spec.has_zero:
        cannot_hold |= x == 0
    code[cannot_hold] = FATES.index(Fate.INVALID)
    return code


def classify_scaled(x: np.ndarray, scaled: np.ndarray, fates: np.ndarray) -> np.ndarray:
    """Fates of ``x * scale`` corrected for float64 itself: a product that overflowed
    float64 is an overflow, one that underflowed to 0 a flush, whatever the format did."""
    x = np.asarray(x, dtype=np.float64)
    fates = fates.copy()
    finite_x = np.isfinite(x)
    fates[finite_x & np.isinf(scaled)] = FATES.index(Fate.OVERFLOW)
    fates[finite_x & (x != 0) & (scaled == 0)] = FATES.index(Fate.FLUSHED)
    return fates


def relative_error(x: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """|stored - x| / |x| in float64: 0 where equal (inf included), inf where x is 0 and
    stored is not, or where x is infinite and stored finite; NaN where either is NaN."""
    x = np.asarray(x, dtype=np.float64)
    stored = np.asarray(stored, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(stored - x) / np.abs(x)
    rel = np.where(stored == x, 0.0, rel)
    rel = np.where((x == 0) & (stored != 0) & ~np.isnan(stored), np.inf, rel)
    rel = np.where(np.isinf(x) & np.isfinite(stored), np.inf, rel)
    return rel
