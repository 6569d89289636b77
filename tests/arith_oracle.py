"""An independent reference for ``fmt calc`` and ``fmt sum`` (imports nothing from fmtcli):
rounding of an exact rational to a binary format by each IEEE mode, written from the
definition -- the two grid neighbours of the value, found by comparing Fractions, and the
mode's choice between them -- and, for formats of at most 16 bits, by searching the sorted
list of every finite value ml_dtypes / numpy decode."""

from __future__ import annotations

import bisect
import functools
from fractions import Fraction

import ml_dtypes
import numpy as np

OVERFLOW = "overflow"


@functools.cache
def finite_values(dtype_name: str) -> tuple[Fraction, ...]:
    """Every finite value of a numpy / ml_dtypes type of at most 16 bits, sorted."""
    dtype = np.dtype(getattr(ml_dtypes, dtype_name, None) or dtype_name)
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint64).astype(
        np.uint8 if dtype.itemsize == 1 else np.uint16)
    with np.errstate(invalid="ignore"):
        values = bits.view(dtype).astype(np.float64)
    # every value is a float64 exactly, so sorting the floats sorts the Fractions (-0 == 0)
    return tuple(Fraction(float(v)) for v in np.unique(values[np.isfinite(values)]))


@functools.cache
def _finite_floats(dtype_name: str) -> tuple[float, ...]:
    """finite_values as floats (the same numbers exactly): a quick first guess of the place."""
    return tuple(float(v) for v in finite_values(dtype_name))


def _place(q: Fraction, dtype_name: str) -> int:
    """bisect_left(finite_values, q), exactly: a bisection of the floats by float(q), which is
    within a place or two of it (float(q) is q correctly rounded, the floats are the values),
    then moved by exact comparisons of Fractions until values[i - 1] < q <= values[i]."""
    values = finite_values(dtype_name)
    i = bisect.bisect_left(_finite_floats(dtype_name), float(q))
    while i > 0 and values[i - 1] >= q:
        i -= 1
    while i < len(values) and values[i] < q:
        i += 1
    return i


def choose(q: Fraction, lo: Fraction, hi: Fraction, mode: str, lo_even: bool,
           u: float | None = None) -> Fraction:
    """The mode's pick between neighbours lo < q < hi (lo_even: lo has an even last bit);
    stochastic: hi when the uniform u is below (q - lo) / (hi - lo)."""
    mid = (lo + hi) / 2
    if mode == "stochastic":
        return hi if Fraction(u) < (q - lo) / (hi - lo) else lo
    if mode == "nearest-even":
        return lo if q < mid or (q == mid and lo_even) else hi
    if mode == "nearest-away":
        away = hi if q > 0 else lo
        return lo if q < mid else hi if q > mid else away
    if mode == "toward-zero":
        return lo if q > 0 else hi
    if mode == "up":
        return hi
    if mode == "down":
        return lo
    raise ValueError(mode)


def round_listed(q: Fraction, dtype_name: str, mode: str, u: float | None = None):
    """q rounded to the listed format; OVERFLOW past its largest finite value."""
    values = finite_values(dtype_name)
    if q < values[0] or q > values[-1]:
        return OVERFLOW
    i = _place(q, dtype_name)
    if values[i] == q:
        return q
    lo, hi = values[i - 1], values[i]
    return choose(q, lo, hi, mode, _even_code(lo, dtype_name), u)


def _even_code(v: Fraction, dtype_name: str) -> bool:
    """Whether v's bit pattern ends in 0 (neighbouring values have consecutive codes)."""
    dtype = np.dtype(getattr(ml_dtypes, dtype_name, None) or dtype_name)
    code = np.array([float(v)]).astype(dtype).view(np.uint8 if dtype.itemsize == 1
                                                   else np.uint16)[0]
    return int(code) % 2 == 0


def round_binary(q: Fraction, p: int, emin: int, emax: int, mode: str,
                 u: float | None = None):
    """q rounded to the binary format of p significand bits, smallest normal 2**emin and
    largest binade 2**emax (IEEE-style: max = (2 - 2**(1-p)) * 2**emax); OVERFLOW past it
    (nearest modes round to max up to half a spacing above)."""
    if q == 0:
        return Fraction(0)
    a = abs(q)
    e = max(emin, a.numerator.bit_length() - a.denominator.bit_length() - 1)  # <= log2 a
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (e - p + 1)
    k = a // quantum  # floor
    lo, hi = k * quantum, (k + 1) * quantum
    if lo == a:
        magnitude = a
    else:
        # the lower neighbour of a negative q is -hi, of k + 1 units
        pick = choose(q, -hi, -lo, mode, (k + 1) % 2 == 0, u) if q < 0 else \
            choose(q, lo, hi, mode, k % 2 == 0, u)
        magnitude = abs(pick)
    top = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if magnitude > top:
        return OVERFLOW
    return magnitude if q > 0 else -magnitude


FLOAT32 = dict(p=24, emin=-126, emax=127)
FLOAT64 = dict(p=53, emin=-1022, emax=1023)
