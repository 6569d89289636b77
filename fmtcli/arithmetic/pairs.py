"""Rounding of exact sums held as float64 pairs, in float arithmetic, scalar and array.

Knuth's TwoSum gives, for two float64 numbers a and b, ``t = fl64(a + b)`` and the exact
rest ``err = a + b - t`` (both float64, when t is finite).  The pair (t, err) is the exact
sum, so rounding it once to a format F (of at most float64's width and range: every value
of F is a float64) needs no rational arithmetic:

- in units of F's spacing at t (a power-of-two scaling: exact), ``y = |t| / spacing`` is
  ``units + f`` with f its fraction (exact); the exact sum is ``units + f + e'`` with
  ``e' = err / spacing`` (``|e'|`` at most half of one float64 unit of y);
- F's grid points and the midpoints between them are float64 numbers (p + 1 <= 53 bits;
  for float64 itself f is always 0 and e' alone holds the rest), so the exact sum lies on
  the same side of every grid point and midpoint as t does, except where t is one: then
  the sign of err decides (``f == 0`` and ``err`` pointing down: the sum lies just below
  the grid point t, in the binade below where t is a power of two);
- the mode compares the rest ``r = f + e'`` with 1/2 (nearest) or with a uniform u
  (stochastic) by the sign of ``(f - c) + e'``: ``f - c`` is exact (both are multiples of
  2^-53 in [0, 1]), and where it is not zero it outweighs any ``e'`` that underflowed.

Stochastic rounding is defined on the real line, as ``rounding.round_to_format`` does it:
with lo < x < hi the grid neighbours, x goes to hi when ``u < (x - lo) / (hi - lo)``; the
caller supplies u (one uniform of ``numpy.random.Generator.random`` per rounding).

``pair_rounder`` rounds one pair (~1 µs in a Python loop); ``round_pairs`` an array of them
(numpy, all modes); ``pair_adder`` / ``add_arrays`` are fl(a + b) for scalars and arrays
(TwoSum, the zero-sum and overflow rules of IEEE 754 §6.3 and §7.4), which ``fmt sum``
runs.  ``float_rounder`` is ``pair_rounder`` with err = 0, a draw per call.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.choices import OverflowPolicy, RoundingMode
from fmtcli.base.errors import UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format


def overflow_value(spec: FormatSpec, rounding: RoundingMode, overflow: OverflowPolicy,
                   negative: bool) -> float:
    """What a finite result beyond max becomes (IEEE 754 §7.4, as ``round_to_format``):
    directed modes that round toward zero give max, the others inf (NaN where the format
    has no inf); saturation, and formats without inf or NaN, give max."""
    top = spec.max
    if overflow is OverflowPolicy.SATURATE or not (spec.has_inf or spec.has_nan) \
            or rounding is RoundingMode.TOWARD_ZERO \
            or (rounding is RoundingMode.UP and negative) \
            or (rounding is RoundingMode.DOWN and not negative):
        magnitude = top
    else:
        magnitude = math.inf if spec.has_inf else math.nan
    return -magnitude if negative else magnitude


def finish(magnitude_units: int, ulp_exponent: int, negative: bool, spec: FormatSpec,
           rounding: RoundingMode, overflow: OverflowPolicy) -> float:
    """``magnitude_units * 2**ulp_exponent`` with the sign, then the format's range rules."""
    if not spec.signed and negative:
        return math.nan  # an unsigned format has no code for a negative number
    if magnitude_units == 0:
        if not spec.has_zero:  # E8M0: below the smallest value there is only the smallest
            return spec.smallest_normal
        return -0.0 if negative and spec.has_negative_zero else 0.0
    if ulp_exponent + int(magnitude_units).bit_length() > 1100:
        return overflow_value(spec, rounding, overflow, negative)
    try:
        value = math.ldexp(magnitude_units, ulp_exponent)  # exact: <= 2**(m+1) units
    except OverflowError:
        return overflow_value(spec, rounding, overflow, negative)
    if value > spec.max:
        return overflow_value(spec, rounding, overflow, negative)
    if not spec.has_zero and value < spec.smallest_normal:
        value = spec.smallest_normal
    return -value if negative else value


def two_sum(a: float, b: float) -> tuple[float, float]:
    """Knuth's TwoSum: ``s = fl64(a + b)`` and the exact ``a + b - s`` (finite a, b, s)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _sign_of_rest(f: float, ep: float, err: float, c: float) -> int:
    """The sign of ``f + e' - c`` (module docstring): exact, whatever e' lost."""
    d = f - c
    if d:
        return 1 if d > -ep else (-1 if d < -ep else 0)
    return (err > 0) - (err < 0)


def pair_rounder(spec: FormatSpec, rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                 overflow: OverflowPolicy | str = OverflowPolicy.IEEE):
    """``rounded(t, err=0.0, u=0.0)``: the exact ``t + err`` rounded once to ``spec``
    (t finite and nonzero, ``|err| <= ulp(t) / 2``, e.g. TwoSum's pair; u the uniform of
    stochastic rounding)."""
    mode = RoundingMode(rounding)
    overflow = OverflowPolicy(overflow)
    m1, emin1, top = spec.mantissa_bits + 1, spec.min_exponent + 1, spec.max
    plain = spec.signed and spec.has_zero
    frexp, ldexp, floor, sign_of = math.frexp, math.ldexp, math.floor, _sign_of_rest
    nearest_even = mode is RoundingMode.NEAREST_EVEN
    nearest_away = mode is RoundingMode.NEAREST_AWAY
    stochastic = mode is RoundingMode.STOCHASTIC
    up_if = {RoundingMode.UP: False, RoundingMode.DOWN: True}.get(mode)  # negative ==

    def rounded(t: float, err: float = 0.0, u: float = 0.0) -> float:
        negative = t < 0
        a, ea = (-t, -err) if negative else (t, err)
        mant, e = frexp(a)
        shift = m1 - (e if e > emin1 else emin1)
        y = ldexp(a, shift)
        units = floor(y)
        f = y - units
        if ea or f:
            if ea:
                if f == 0 and ea < 0:  # just below the grid point a
                    if mant == 0.5 and e > emin1:  # in the binade below: half the spacing
                        shift += 1
                        units = 2 * units - 1
                    else:
                        units -= 1
                    f = 1.0
                ep = ldexp(ea, shift)
            else:
                ep = 0.0
            if nearest_even:
                s = sign_of(f, ep, ea, 0.5)
                units += s > 0 or (s == 0 and units & 1)
            elif nearest_away:
                units += sign_of(f, ep, ea, 0.5) >= 0
            elif stochastic:
                units += sign_of(f, ep, ea, 1.0 - u) >= 0 if negative else \
                    sign_of(f, ep, ea, u) > 0
            elif up_if is not None:
                units += negative is up_if
        if units and plain:
            try:
                value = ldexp(units, -shift)  # exact: at most 2**(m+1) units
            except OverflowError:
                value = math.inf
            if value <= top:
                return -value if negative else value
        return finish(units, -shift, negative, spec, mode, overflow)

    return rounded


def float_rounder(spec: FormatSpec, rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                  overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None):
    """A function rounding a float64 value to ``spec`` as ``ops.round_rational`` does, in
    float arithmetic (``pair_rounder`` with err = 0; stochastic: one draw of ``rng`` a
    call, on the real line).  Zeros, inf and NaN go through ``round_to_format``."""
    rounding = RoundingMode(rounding)
    overflow = OverflowPolicy(overflow)
    if rounding is RoundingMode.STOCHASTIC and rng is None:
        raise UsageError("stochastic rounding needs a seeded generator")
    pair = pair_rounder(spec, rounding, overflow)
    draw = rng.random if rounding is RoundingMode.STOCHASTIC else float

    def rounded(x: float) -> float:
        if x == 0 or x - x != 0:  # zero, inf or NaN
            return float(round_to_format(np.array([x]), spec, rounding, overflow,
                                         rng=rng)[0])
        return pair(x, 0.0, draw())

    return rounded


def round_float(x: float, spec: FormatSpec,
                rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None) -> float:
    """A float64 value rounded once to ``spec`` (``float_rounder``)."""
    return float_rounder(spec, rounding, overflow, rng)(x)


def _format_zero(spec: FormatSpec, negative: bool) -> float:
    """The zero an exact zero sum is in the format (E8M0, without zero: its smallest)."""
    if not spec.has_zero:
        return spec.smallest_normal
    return -0.0 if negative and spec.has_negative_zero else 0.0


def pair_adder(spec: FormatSpec, rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
               overflow: OverflowPolicy | str = OverflowPolicy.IEEE):
    """``add(a, b, u=0.0)``: fl(a + b) in ``spec`` for a, b values of the format (or any
    finite float64), exact to the bit: TwoSum, then ``pair_rounder``.  An exact zero sum
    is +0 (-0 rounding ``down``), except that x + x = x (+0 + +0 = +0, -0 + -0 = -0); a
    sum beyond float64 overflows; an inf or
    NaN operand gives IEEE's float64 result (a value of the format)."""
    mode, overflow = RoundingMode(rounding), OverflowPolicy(overflow)
    rounded = pair_rounder(spec, mode, overflow)
    zero = _format_zero(spec, mode is RoundingMode.DOWN)
    positive_zero, negative_zero = _format_zero(spec, False), _format_zero(spec, True)
    copysign, frexp, ldexp = math.copysign, math.frexp, math.ldexp
    m1, emin1, top = spec.mantissa_bits + 1, spec.min_exponent + 1, spec.max
    # the fast path of an exact float64 sum: the mode's integer rounding of the signed
    # units (as rounding.round_unbounded), in range and nonzero, else ``rounded``
    integer = {RoundingMode.NEAREST_EVEN: round, RoundingMode.TOWARD_ZERO: math.trunc,
               RoundingMode.UP: math.ceil, RoundingMode.DOWN: math.floor}.get(mode)
    stochastic = mode is RoundingMode.STOCHASTIC
    fast = integer is not None or stochastic
    fast &= spec.signed and spec.has_zero

    def add(a: float, b: float, u: float = 0.0) -> float:
        t = a + b
        if t != 0 and t - t == 0:
            bb = t - a
            err = (a - (t - bb)) + (b - bb)
            if err or not fast:
                return rounded(t, err, u)
            e = frexp(t)[1]
            shift = m1 - (e if e > emin1 else emin1)
            y = ldexp(t, shift)  # exact: the sum in units of the spacing, signed
            if stochastic:
                units = math.floor(y)
                units += u < y - units
            else:
                units = integer(y)
            if units:
                value = ldexp(units, -shift)
                if -top <= value <= top:
                    return value
            return rounded(t, 0.0, u)
        if t == 0:
            if a == 0 and b == 0 and copysign(1.0, a) == copysign(1.0, b):
                return negative_zero if copysign(1.0, a) < 0 else positive_zero  # x + x = x
            return zero
        if a - a == 0 and b - b == 0:  # finite operands, a sum beyond float64
            return overflow_value(spec, mode, overflow, t < 0)
        return t

    return add


def round_pairs(t: np.ndarray, err: np.ndarray, spec: FormatSpec,
                rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                overflow: OverflowPolicy | str = OverflowPolicy.IEEE,
                u: np.ndarray | None = None) -> np.ndarray:
    """``pair_rounder`` elementwise (float64 arrays; t finite and nonzero; ``u`` the
    uniforms of stochastic rounding, one per element)."""
    mode, overflow = RoundingMode(rounding), OverflowPolicy(overflow)
    m1, emin1 = spec.mantissa_bits + 1, spec.min_exponent + 1
    negative = t < 0
    a = np.abs(t)
    ea = np.where(negative, -err, err)
    mant, e = np.frexp(a)
    shift = m1 - np.maximum(e, emin1)
    y = np.ldexp(a, shift)
    units = np.floor(y)
    f = y - units
    below = (f == 0) & (ea < 0)
    binade = below & (mant == 0.5) & (e > emin1)
    shift += binade
    units = np.where(below, np.where(binade, 2 * units - 1, units - 1), units)
    f = np.where(below, 1.0, f)
    inexact = (f != 0) | (ea != 0)
    with np.errstate(under="ignore"):
        ep = np.ldexp(ea, shift)

    def sign_of_rest(c) -> np.ndarray:
        d = f - c
        return np.where(d != 0, (d > -ep).astype(np.int8) - (d < -ep), np.sign(ea))

    if mode is RoundingMode.NEAREST_EVEN:
        s = sign_of_rest(0.5)
        up = (s > 0) | ((s == 0) & (np.fmod(units, 2) == 1))
    elif mode is RoundingMode.NEAREST_AWAY:
        up = sign_of_rest(0.5) >= 0
    elif mode is RoundingMode.STOCHASTIC:
        if u is None:
            raise UsageError("stochastic rounding needs uniforms")
        up = np.where(negative, sign_of_rest(1.0 - u) >= 0, sign_of_rest(u) > 0)
    elif mode is RoundingMode.UP:
        up = ~negative
    elif mode is RoundingMode.DOWN:
        up = negative.copy()
    else:
        up = np.zeros(t.shape, dtype=bool)
    units += up & inexact
    with np.errstate(over="ignore"):
        value = np.ldexp(units, -shift)
    if not spec.has_zero:
        value = np.where(value < spec.smallest_normal, spec.smallest_normal, value)
    out = np.where(negative, -value, value)
    if not spec.has_negative_zero:
        out[(units == 0) & negative] = 0.0
    big = value > spec.max
    if big.any():
        out[big & ~negative] = overflow_value(spec, mode, overflow, False)
        out[big & negative] = overflow_value(spec, mode, overflow, True)
    if not spec.signed:
        out[negative] = math.nan
    return out


def add_arrays(a: np.ndarray, b: np.ndarray, spec: FormatSpec,
               rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
               overflow: OverflowPolicy | str = OverflowPolicy.IEEE,
               u: np.ndarray | None = None) -> np.ndarray:
    """``pair_adder`` elementwise: fl(a + b) for float64 arrays of the format's values."""
    mode = RoundingMode(rounding)
    with np.errstate(over="ignore", invalid="ignore"):
        t = a + b
        bb = t - a
        err = (a - (t - bb)) + (b - bb)
    out = t.copy()  # inf/NaN operands: IEEE's float64 result, a value of the format
    plain = np.isfinite(t) & (t != 0)
    if plain.all():
        return round_pairs(t, err, spec, mode, overflow, u)
    if plain.any():
        out[plain] = round_pairs(t[plain], err[plain], spec, mode, overflow,
                                 None if u is None else u[plain])
    zero = t == 0
    same = zero & (a == 0) & (b == 0) & (np.signbit(a) == np.signbit(b))  # x + x = x
    out[zero] = _format_zero(spec, mode is RoundingMode.DOWN)
    out[same & ~np.signbit(a)] = _format_zero(spec, False)
    out[same & np.signbit(a)] = _format_zero(spec, True)
    beyond = np.isinf(t) & np.isfinite(a) & np.isfinite(b)
    out[beyond & (t > 0)] = overflow_value(spec, mode, OverflowPolicy(overflow), False)
    out[beyond & (t < 0)] = overflow_value(spec, mode, OverflowPolicy(overflow), True)
    return out
