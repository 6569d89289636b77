"""Arithmetic in a format, each operation computed exactly and rounded once.

The article's second lesson is about arithmetic, not storage: "1 + 2^-9 is exactly 1 in
BF16" (the small term is lost), which "is why accumulation still happens in FP32".  To show
such effects faithfully every operation here is what IEEE 754 asks of a format's
arithmetic: the exact result of +, -, *, /, fused multiply-add or square root of the
operands (which are values of the format), rounded once to the format by the chosen mode.

How exactly:
- ``round_rational``: a nonzero rational (``fractions.Fraction``) to the format, with integer
  arithmetic only: its binade, the format's spacing there (the subnormal range included),
  one integer division and the mode's decision on the remainder; then the format's range
  (overflow to inf/NaN or saturation, no -0 in ``fnuz``, no zero in E8M0, no negatives in
  unsigned formats), as ``rounding.round_to_format`` does (tests check they agree).
- ``Arithmetic``: the operations on floats (every value of a format of at most float64's
  width is a Python float exactly).  +, -, *, / and fma are exact rationals; sqrt of a
  format value (a dyadic rational ``n / 2^j``) is rounded from an integer square root with
  enough extra bits that no rounding boundary lies between the truncated root and the true
  one (``_sqrt_rounded``).  No double rounding anywhere: going through float64 would be safe
  only for +, -, *, / into formats of at most 25 significand bits (53 >= 2p + 2, Figueroa
  1995), not for float32 fma or sqrt, nor for directed modes.
- ``float_rounder`` / ``round_float``: the same rounding of a float64 value in plain float
  arithmetic (about half a microsecond in a loop): what ``fmt sum``'s serial loops use,
  with TwoSum (Knuth) to know when a float64 sum was itself inexact (then the exact path
  decides).
- Special values follow IEEE 754 §6: inf - inf, 0 * inf, 0/0, inf/inf and sqrt of a
  negative are NaN; x/0 is a signed inf; an exact zero sum is +0 (-0 when rounding
  ``down``), -0 + -0 is -0; sqrt(-0) is -0.

float64 is the custom format e11m52 here (``arithmetic_spec("float64")``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..choices import OverflowPolicy, RoundingMode
from ..errors import UsageError, shown
from ..formats import FormatSpec, Specials, resolve_format
from ..rounding import round_to_format

FLOAT64_NAMES = ("float64", "fp64", "f64", "double", "torch.float64")
#: Bits of the square roots in "exact" references (a square root is rarely rational).
REFERENCE_BITS = 256

Number = Fraction | float


def arithmetic_spec(name: str) -> tuple[FormatSpec, str | None]:
    """The spec of a format name and its note (``formats.resolve_format``), with float64
    (fp64, double) as e11m52: arithmetic may be done in float64 here."""
    if name.strip().lower() in FLOAT64_NAMES:
        return resolve_format("e11m52")[0], None
    return resolve_format(name)


def is_float64(spec: FormatSpec) -> bool:
    return (spec.exponent_bits, spec.mantissa_bits, spec.bias) == (11, 52, 1023) \
        and spec.signed and spec.subnormals and spec.specials is Specials.IEEE


def format_label(spec: FormatSpec) -> str:
    """The name results show: float64 for e11m52."""
    return "float64" if is_float64(spec) else spec.name


def _overflow_value(spec: FormatSpec, rounding: RoundingMode, overflow: OverflowPolicy,
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


def _finish(magnitude_units: int, ulp_exponent: int, negative: bool, spec: FormatSpec,
            rounding: RoundingMode, overflow: OverflowPolicy) -> float:
    """``magnitude_units * 2**ulp_exponent`` with the sign, then the format's range rules."""
    if not spec.signed and negative:
        return math.nan  # an unsigned format has no code for a negative number
    if magnitude_units == 0:
        if not spec.has_zero:  # E8M0: below the smallest value there is only the smallest
            return spec.smallest_normal
        return -0.0 if negative and spec.has_negative_zero else 0.0
    if ulp_exponent + magnitude_units.bit_length() > 1100:
        return _overflow_value(spec, rounding, overflow, negative)
    try:
        value = math.ldexp(magnitude_units, ulp_exponent)  # exact: <= 2**(m+1) units
    except OverflowError:
        return _overflow_value(spec, rounding, overflow, negative)
    if value > spec.max:
        return _overflow_value(spec, rounding, overflow, negative)
    if not spec.has_zero and value < spec.smallest_normal:
        value = spec.smallest_normal
    return -value if negative else value


def _round_up(mode: RoundingMode, negative: bool, units: int, remainder: Fraction | float,
              rng) -> bool:
    """Whether the magnitude goes up to ``units + 1`` (``remainder``: what is left, in
    units of the spacing, 0 < remainder < 1)."""
    if mode is RoundingMode.NEAREST_EVEN:
        return remainder > 0.5 or (remainder == 0.5 and units & 1 == 1)
    if mode is RoundingMode.NEAREST_AWAY:
        return remainder >= 0.5
    if mode is RoundingMode.TOWARD_ZERO:
        return False
    if mode is RoundingMode.UP:
        return not negative
    if mode is RoundingMode.DOWN:
        return negative
    if mode is RoundingMode.STOCHASTIC:  # up with probability ``remainder``
        if rng is None:
            raise UsageError("stochastic rounding needs a seeded generator")
        return Fraction(rng.random()) < remainder
    raise UsageError(f"unknown rounding mode {mode!r}")  # pragma: no cover - closed enum


def round_rational(q: Fraction | int, spec: FormatSpec,
                   rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                   overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None,
                   negative_zero: bool = False) -> float:
    """The exact rational ``q`` rounded once to ``spec`` by ``rounding``: a float holding a
    value of the format (or inf/NaN).  A zero ``q`` gives -0.0 with ``negative_zero`` (where
    the format has -0).  ``rng`` (a numpy Generator) draws stochastic rounding."""
    q = Fraction(q)
    rounding, overflow = RoundingMode(rounding), OverflowPolicy(overflow)
    if q == 0:
        return _finish(0, 0, negative_zero, spec, rounding, overflow)
    negative = q < 0
    n, d = abs(q.numerator), q.denominator
    e = n.bit_length() - d.bit_length()  # floor(log2(n / d)) is e or e - 1
    if e > spec.max_exponent + 1:  # at least 2**(max_exponent + 1): beyond max
        return _overflow_value(spec, rounding, overflow, negative) if spec.signed or \
            not negative else math.nan
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1
    ulp = max(e, spec.min_exponent) - spec.mantissa_bits
    num, den = (n, d << ulp) if ulp >= 0 else (n << -ulp, d)
    units, rest = divmod(num, den)
    if rest and _round_up(rounding, negative, units, Fraction(rest, den), rng):
        units += 1
    return _finish(units, ulp, negative, spec, rounding, overflow)


def float_rounder(spec: FormatSpec, rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                  overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None):
    """A function rounding a float64 value to ``spec`` as ``round_rational`` does, in float
    arithmetic with every step exact: a power-of-two scaling to units of the format's
    spacing, an integer rounding (Python's ``round`` is ties-to-even), the scaling back.
    The format's figures are looked up once, so a serial loop pays ~0.5 µs a value.
    Zeros, inf and NaN go through ``round_to_format``."""
    rounding = RoundingMode(rounding)
    overflow = OverflowPolicy(overflow)
    m1, emin1, top = spec.mantissa_bits + 1, spec.min_exponent + 1, spec.max
    plain = spec.signed and spec.has_zero
    frexp, ldexp = math.frexp, math.ldexp
    if rounding is RoundingMode.NEAREST_AWAY:
        def integer(y: float) -> int:
            units = math.trunc(y)
            if abs(y - units) >= 0.5:
                units += 1 if y > 0 else -1
            return units
    elif rounding is RoundingMode.STOCHASTIC:  # magnitude up with probability = the rest
        if rng is None:
            raise UsageError("stochastic rounding needs a seeded generator")

        def integer(y: float) -> int:
            units = math.floor(y)
            return units + (rng.random() < y - units)
    else:
        integer = {RoundingMode.NEAREST_EVEN: round, RoundingMode.TOWARD_ZERO: math.trunc,
                   RoundingMode.UP: math.ceil, RoundingMode.DOWN: math.floor}[rounding]

    def rounded(x: float) -> float:
        if x == 0 or x - x != 0:  # zero, inf or NaN
            return float(round_to_format(np.array([x]), spec, rounding, overflow,
                                         rng=rng)[0])
        e = frexp(x)[1]
        shift = m1 - (e if e > emin1 else emin1)
        units = integer(ldexp(x, shift))  # x in units of the spacing (signed): exact
        if units and plain:
            try:
                value = ldexp(units, -shift)  # exact: at most 2**(m+1) units
            except OverflowError:  # 2**1024 and beyond: _finish says what it becomes
                value = math.inf
            if -top <= value <= top:
                return value
        return _finish(abs(units), -shift, x < 0, spec, rounding, overflow)

    return rounded


def round_float(x: float, spec: FormatSpec,
                rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None) -> float:
    """``round_rational`` of a float64 value, in float arithmetic (``float_rounder``)."""
    return float_rounder(spec, rounding, overflow, rng)(x)


def two_sum(a: float, b: float) -> tuple[float, float]:
    """Knuth's TwoSum: ``s = fl64(a + b)`` and the exact ``a + b - s`` (finite a, b, s)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _sign(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def as_fraction(x: Number) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x)


def _sqrt_dyadic(n: int, j: int, bits: int) -> tuple[int, int, bool]:
    """(root, shift, exact) for q = n / 2**j (n > 0): ``root / 2**shift`` is sqrt(q)
    truncated to at least ``bits`` significant bits; ``exact``: it is the root itself."""
    if j % 2:
        n, j = n << 1, j + 1
    k = max(0, bits - n.bit_length() // 2 + 1)
    radicand = n << (2 * k)
    root = math.isqrt(radicand)
    return root, j // 2 + k, root * root == radicand


def _is_power_of_two(d: int) -> bool:
    return d & (d - 1) == 0


def sqrt_reference(q: Fraction) -> Fraction:
    """sqrt(q) >= 0 for an "exact" reference: the root itself where it is rational, else
    truncated to REFERENCE_BITS significant bits (a relative error below 2**-250)."""
    if q == 0:
        return Fraction(0)
    n, d = q.numerator, q.denominator
    if _is_power_of_two(d):
        root, shift, _ = _sqrt_dyadic(n, d.bit_length() - 1, REFERENCE_BITS)
        return Fraction(root, 1 << shift)
    # sqrt(n / d) = sqrt(n * d) / d
    root, shift, _ = _sqrt_dyadic(n * d, 0, REFERENCE_BITS)
    return Fraction(root, d << shift)


def _sqrt_rounded(q: Fraction, spec: FormatSpec, rounding: RoundingMode,
                  overflow: OverflowPolicy, rng) -> float:
    """sqrt(q) for a dyadic q > 0, rounded once: the root truncated to 2**-shift with
    shift past the format's spacing (and its half), plus half a unit when inexact -- no
    boundary of the rounding (a multiple of half the spacing) lies strictly between a
    truncated root r and r + 1, so r + 1/2 rounds as the irrational root does."""
    bits = spec.mantissa_bits + 8
    while True:
        root, shift, exact = _sqrt_dyadic(q.numerator, q.denominator.bit_length() - 1, bits)
        e = root.bit_length() - 1 - shift  # binade of the root
        ulp = max(e, spec.min_exponent) - spec.mantissa_bits
        if -shift < ulp - 1:  # finer than half the spacing: enough
            break
        bits += ulp - 1 + shift + 8
    value = Fraction(root, 1 << shift) if exact else Fraction(2 * root + 1, 1 << (shift + 1))
    return round_rational(value, spec, rounding, overflow, rng)


class Arithmetic:
    """+, -, *, /, fma and sqrt in one format and rounding mode, IEEE 754 style.

    Operands are floats holding values of the format; each method returns ``(exact,
    value)``: the exact result (a Fraction; a float for zeros, inf and NaN; for sqrt a
    256-bit truncation where the root is irrational) and its rounding to the format.
    ``store`` rounds a number given exactly (a literal) to the format."""

    def __init__(self, spec: FormatSpec, rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                 overflow: OverflowPolicy | str = OverflowPolicy.IEEE, seed: int = 0) -> None:
        self.spec = spec
        self.rounding = RoundingMode(rounding)
        self.overflow = OverflowPolicy(overflow)
        self.rng = np.random.default_rng(seed) if self.rounding is RoundingMode.STOCHASTIC \
            else None

    def _round(self, q: Fraction, negative_zero: bool = False) -> float:
        return round_rational(q, self.spec, self.rounding, self.overflow, self.rng,
                              negative_zero)

    def _special(self, x: float) -> float:
        """A zero, inf or NaN result as the format holds it."""
        return float(round_to_format(np.array([x]), self.spec, self.rounding, self.overflow,
                                     rng=self.rng)[0])

    def store(self, exact: Fraction | float) -> float:
        """A number given exactly, rounded to the format (the literal as stored)."""
        if isinstance(exact, float):
            if math.isfinite(exact) and exact != 0:
                return self._round(Fraction(exact))
            return self._special(exact)
        return self._round(exact)

    def _zero_sum(self, a_negative: bool, b_negative: bool) -> float:
        """The zero that an exact zero sum is (IEEE 754 §6.3)."""
        if a_negative and b_negative:
            return self._special(-0.0)
        return self._special(-0.0 if self.rounding is RoundingMode.DOWN else 0.0)

    def add(self, a: float, b: float) -> tuple[Number, float]:
        if math.isnan(a) or math.isnan(b):
            return math.nan, self._special(math.nan)
        if math.isinf(a) or math.isinf(b):
            if math.isinf(a) and math.isinf(b) and a != b:
                return math.nan, self._special(math.nan)
            total = a if math.isinf(a) else b
            return total, self._special(total)
        exact = Fraction(a) + Fraction(b)
        if exact == 0:
            zero = self._zero_sum(_sign(a), _sign(b)) if a == 0 and b == 0 else \
                self._zero_sum(False, False)
            return zero, zero
        return exact, self._round(exact)

    def sub(self, a: float, b: float) -> tuple[Number, float]:
        return self.add(a, -b)

    def mul(self, a: float, b: float) -> tuple[Number, float]:
        if math.isnan(a) or math.isnan(b):
            return math.nan, self._special(math.nan)
        negative = _sign(a) != _sign(b)
        if math.isinf(a) or math.isinf(b):
            if a == 0 or b == 0:
                return math.nan, self._special(math.nan)
            product = -math.inf if negative else math.inf
            return product, self._special(product)
        if a == 0 or b == 0:
            zero = -0.0 if negative else 0.0
            return zero, self._special(zero)
        exact = Fraction(a) * Fraction(b)
        return exact, self._round(exact, negative)

    def div(self, a: float, b: float) -> tuple[Number, float]:
        if math.isnan(a) or math.isnan(b) or (a == 0 and b == 0) or \
                (math.isinf(a) and math.isinf(b)):
            return math.nan, self._special(math.nan)
        negative = _sign(a) != _sign(b)
        if math.isinf(a) or b == 0:
            quotient = -math.inf if negative else math.inf
            return quotient, self._special(quotient)
        if math.isinf(b) or a == 0:
            zero = -0.0 if negative else 0.0
            return zero, self._special(zero)
        exact = Fraction(a) / Fraction(b)
        return exact, self._round(exact, negative)

    def fma(self, a: float, b: float, c: float) -> tuple[Number, float]:
        """a * b + c with one rounding (IEEE 754 fusedMultiplyAdd)."""
        if any(math.isnan(x) for x in (a, b, c)):
            return math.nan, self._special(math.nan)
        product_negative = _sign(a) != _sign(b)
        if math.isinf(a) or math.isinf(b):
            if a == 0 or b == 0:
                return math.nan, self._special(math.nan)
            product = -math.inf if product_negative else math.inf
            return self.add(product, c)
        if math.isinf(c):
            return c, self._special(c)
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        if exact == 0:
            product_zero = a == 0 or b == 0
            zero = self._zero_sum(product_negative, _sign(c)) if product_zero and c == 0 \
                else self._zero_sum(False, False)
            return zero, zero
        return exact, self._round(exact)

    def sqrt(self, a: float) -> tuple[Number, float]:
        if math.isnan(a) or a < 0:
            return math.nan, self._special(math.nan)
        if a == 0 or math.isinf(a):
            return a, self._special(a)
        q = Fraction(a)
        return sqrt_reference(q), _sqrt_rounded(q, self.spec, self.rounding, self.overflow,
                                                self.rng)


def arithmetic_specs(names, default: tuple[str, ...] = ()) -> tuple[list[FormatSpec], list[str]]:
    """Specs for format names (each may be a comma list; float64 allowed; duplicates
    dropped, order kept) and the notes of ambiguous names.  An empty name is a UsageError."""
    specs: list[FormatSpec] = []
    notes: list[str] = []
    for name in names or default:
        parts = [part.strip() for part in name.split(",")]
        if not all(parts):
            raise UsageError(f"empty format name in {shown(name)}", "e.g. bf16,fp16,fp32")
        for part in parts:
            spec, note = arithmetic_spec(part)
            if note:
                notes.append(note)
            if spec not in specs:
                specs.append(spec)
    if not specs:
        raise UsageError("no formats given", "e.g. bf16,fp16,fp32")
    return specs, notes
