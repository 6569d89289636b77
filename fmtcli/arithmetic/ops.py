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
- ``pairs``: the same rounding of a float64 value, or of an exact sum held as a TwoSum
  pair, in float arithmetic (scalar and numpy): what ``fmt sum`` runs.
- Stochastic rounding goes up (toward +inf) when a uniform u of the generator is below
  (x - lo) / (hi - lo), lo < x < hi the grid neighbours (as ``round_to_format``); here
  one u is drawn per inexact rounding.
- Special values follow IEEE 754 §6: inf - inf, 0 * inf, 0/0, inf/inf and sqrt of a
  negative are NaN; x/0 is a signed inf; an exact zero sum is +0 (-0 when rounding
  ``down``), -0 + -0 is -0; sqrt(-0) is -0.

float64 is the custom format e11m52 here (``arithmetic_spec("float64")``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fmtcli.arithmetic.pairs import finish, overflow_value
from fmtcli.base.choices import OverflowPolicy, RoundingMode
from fmtcli.base.errors import UsageError

# defined with the other format names; fmtcli.arithmetic exports it from here
from fmtcli.numerics.format_names import arithmetic_spec as arithmetic_spec
from fmtcli.numerics.format_names import parse_formats
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format

#: Bits of the square roots in "exact" references (a square root is rarely rational).
REFERENCE_BITS = 256

Number = Fraction | float


def _round_up(mode: RoundingMode, negative: bool, units: int, rest: int, den: int,
              rng) -> bool:
    """Whether the magnitude goes up to ``units + 1`` (what is left is ``rest / den`` units
    of the spacing, 0 < rest < den; integer comparisons, no Fraction to normalise)."""
    if mode is RoundingMode.NEAREST_EVEN:
        return 2 * rest > den or (2 * rest == den and units & 1 == 1)
    if mode is RoundingMode.NEAREST_AWAY:
        return 2 * rest >= den
    if mode is RoundingMode.TOWARD_ZERO:
        return False
    if mode is RoundingMode.UP:
        return not negative
    if mode is RoundingMode.DOWN:
        return negative
    if mode is RoundingMode.STOCHASTIC:  # on the real line: toward +inf when u < the rest
        if rng is None:
            raise UsageError("stochastic rounding needs a seeded generator")
        p, q = rng.random().as_integer_ratio()  # u = p / q, q a power of two
        if negative:  # magnitude up (toward -inf) when u >= 1 - rest / den
            return (q - p) * den <= rest * q
        return p * den < rest * q
    raise UsageError(f"unknown rounding mode {mode!r}")  # pragma: no cover - closed enum


def round_rational(q, spec: FormatSpec,
                   rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                   overflow: OverflowPolicy = OverflowPolicy.IEEE, rng=None,
                   negative_zero: bool = False) -> float:
    """The exact rational ``q`` (an int, a Fraction, or anything with an integer
    ``numerator`` and a positive ``denominator``, not necessarily in lowest terms: a
    ``calc.Ratio``) rounded once to ``spec`` by ``rounding``: a float holding a value of the
    format (or inf/NaN).  A zero ``q`` gives -0.0 with ``negative_zero`` (where the format
    has -0).  ``rng`` (a numpy Generator) draws stochastic rounding."""
    rounding, overflow = RoundingMode(rounding), OverflowPolicy(overflow)
    n, d = q.numerator, q.denominator
    if n == 0:
        return finish(0, 0, negative_zero, spec, rounding, overflow)
    negative = n < 0
    n = abs(n)
    e = n.bit_length() - d.bit_length()  # floor(log2(n / d)) is e or e - 1
    if e > spec.max_exponent + 1:  # at least 2**(max_exponent + 1): beyond max
        return overflow_value(spec, rounding, overflow, negative) if spec.signed or \
            not negative else math.nan
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1
    ulp = max(e, spec.min_exponent) - spec.mantissa_bits
    num, den = (n, d << ulp) if ulp >= 0 else (n << -ulp, d)
    units, rest = divmod(num, den)
    if rest and _round_up(rounding, negative, units, rest, den, rng):
        units += 1
    return finish(units, ulp, negative, spec, rounding, overflow)


def _sign(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def _infinite_product(a: float, b: float) -> float | None:
    """``a * b`` where an operand is infinite (neither NaN), as IEEE 754 has it: NaN for
    0 * inf, else inf signed by the operands; None where both are finite."""
    if not (math.isinf(a) or math.isinf(b)):
        return None
    if a == 0 or b == 0:
        return math.nan
    return -math.inf if _sign(a) != _sign(b) else math.inf


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

    def _zero_sum(self, zero_signs: tuple[bool, bool] | None = None) -> float:
        """The zero that an exact zero sum is (IEEE 754 §6.3): +0, -0 rounding down; but
        x + x = x where both terms are zeros of one sign (``zero_signs``: their signs)."""
        if zero_signs is not None and zero_signs[0] is zero_signs[1]:
            return self._special(-0.0 if zero_signs[0] else 0.0)
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
            zero = self._zero_sum((_sign(a), _sign(b)) if a == 0 and b == 0 else None)
            return zero, zero
        return exact, self._round(exact)

    def sub(self, a: float, b: float) -> tuple[Number, float]:
        return self.add(a, -b)

    def mul(self, a: float, b: float) -> tuple[Number, float]:
        if math.isnan(a) or math.isnan(b):
            return math.nan, self._special(math.nan)
        product = _infinite_product(a, b)
        if product is not None:
            return product, self._special(product)
        negative = _sign(a) != _sign(b)
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
        product = _infinite_product(a, b)
        if product is not None:  # NaN (0 * inf) plus c is NaN: add says so
            return self.add(product, c)
        product_negative = _sign(a) != _sign(b)
        if math.isinf(c):
            return c, self._special(c)
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        if exact == 0:
            product_zero = a == 0 or b == 0
            zero = self._zero_sum((product_negative, _sign(c)) if product_zero and c == 0
                                  else None)
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
    return parse_formats(names, default, example="e.g. bf16,fp16,fp32", float64=True)
