"""Exact rationals that never take a gcd: ``n / d * 2^e`` (``Ratio``), and their text.

``fractions.Fraction`` reduces every result to lowest terms, and a gcd of numbers of a
million bits takes seconds (quadratic): ``fmt calc "0.7^99999 * 0.7^99999 * ..."`` spent
minutes there.  A Ratio keeps its powers of two apart (``e``; n and d odd) and is otherwise
not reduced, so + - * / cost big-integer products only, and what the reports need of an
exact value -- its float64 (``float``), its sign, an error against a float, a rounding
(``ops.round_rational`` reads ``numerator`` / ``denominator``), 17 significant digits
(``ratio_text``) -- costs one product by a power of ten or two and a division whose
quotient is small (linear time).  ``work`` estimates the cost of a product, so that
``calc`` can refuse an expression before it starts.
"""

from __future__ import annotations

import math
from fractions import Fraction

from fmtcli.numerics.exactsum import ratio_to_float


def _twos(x: int) -> int:
    """The exponent of the largest power of two dividing x != 0."""
    return (x & -x).bit_length() - 1


class Ratio:
    """The exact number ``n / d * 2^e``: d > 0 and odd, n odd (or 0, then d = 1, e = 0);
    not otherwise reduced."""

    __slots__ = ("n", "d", "e")

    def __init__(self, n: int, d: int = 1, e: int = 0) -> None:
        if d < 0:
            n, d = -n, -d
        if n == 0:
            self.n, self.d, self.e = 0, 1, 0
            return
        t, u = _twos(n), _twos(d)
        self.n, self.d, self.e = n >> t, d >> u, e + t - u

    @classmethod
    def of(cls, x) -> Ratio:
        """An int, a Fraction, a finite float or a Ratio as a Ratio."""
        if isinstance(x, Ratio):
            return x
        if isinstance(x, float):
            if not math.isfinite(x):
                raise ValueError(f"{x} is not a finite number")
            n, d = x.as_integer_ratio()
            return cls(n, 1, -(d.bit_length() - 1))
        q = Fraction(x)
        return cls(q.numerator, q.denominator)

    # -- what round_rational and float() read ------------------------------------------

    @property
    def numerator(self) -> int:
        return self.n << self.e if self.e > 0 else self.n

    @property
    def denominator(self) -> int:
        return self.d << -self.e if self.e < 0 else self.d

    def __float__(self) -> float:
        """Correctly rounded to float64; +-inf beyond its range."""
        size = self.n.bit_length() - self.d.bit_length() + self.e  # log2 |q|, within one
        if size > 1100:
            return math.inf if self.n > 0 else -math.inf
        if size < -1200:
            return 0.0 if self.n > 0 else -0.0
        return ratio_to_float(self.numerator, self.denominator)

    @property
    def bits(self) -> int:
        """The size of the exact value: bits of n and d."""
        return self.n.bit_length() + self.d.bit_length()

    def sign(self) -> int:
        return (self.n > 0) - (self.n < 0)

    # -- arithmetic ----------------------------------------------------------------------

    def __neg__(self) -> Ratio:
        return Ratio(-self.n, self.d, self.e)

    def __abs__(self) -> Ratio:
        return self if self.n >= 0 else -self

    def __add__(self, other) -> Ratio:
        b = Ratio.of(other)
        if self.n == 0 or b.n == 0:
            return b if self.n == 0 else self
        e = min(self.e, b.e)
        if self.d == b.d:
            return Ratio((self.n << (self.e - e)) + (b.n << (b.e - e)), self.d, e)
        return Ratio((self.n * b.d << (self.e - e)) + (b.n * self.d << (b.e - e)),
                     self.d * b.d, e)

    __radd__ = __add__

    def __sub__(self, other) -> Ratio:
        return self + -Ratio.of(other)

    def __rsub__(self, other) -> Ratio:
        return Ratio.of(other) - self

    def __mul__(self, other) -> Ratio:
        b = Ratio.of(other)
        return Ratio(self.n * b.n, self.d * b.d, self.e + b.e)

    __rmul__ = __mul__

    def __truediv__(self, other) -> Ratio:
        b = Ratio.of(other)
        if b.n == 0:
            raise ZeroDivisionError("Ratio division by zero")
        return Ratio(self.n * b.d, self.d * b.n, self.e - b.e)

    def __rtruediv__(self, other) -> Ratio:
        return Ratio.of(other) / self

    def __pow__(self, power: int) -> Ratio:
        if power < 0:
            return Ratio(self.d ** -power, self.n ** -power, self.e * power)
        return Ratio(self.n ** power, self.d ** power, self.e * power)

    def compare(self, other) -> int:
        """The sign of self - other (other: a number, or a float of any kind)."""
        if isinstance(other, float) and not math.isfinite(other):
            return -1 if other > 0 else 1  # NaN: treated as above (never equal)
        return (self - Ratio.of(other)).sign()

    def __eq__(self, other) -> bool:
        if isinstance(other, float) and not math.isfinite(other):
            return False
        return self.compare(other) == 0

    def __lt__(self, other) -> bool:
        return self.compare(other) < 0

    def __gt__(self, other) -> bool:
        return self.compare(other) > 0

    __hash__ = None

    def __repr__(self) -> str:
        return f"Ratio({self.n.bit_length()}-bit n, {self.d.bit_length()}-bit d, e={self.e})"


def relative(a: Ratio, b: Ratio) -> Ratio:
    """|a / b| (b != 0), in linear time where a and b share their denominator (an error
    against an exact value: (float - q) over q's denominator)."""
    if a.d == b.d:
        return Ratio(abs(a.n), abs(b.n), a.e - b.e)
    return abs(a / b)


def sqrt_ratio(q: Ratio, bits: int) -> Ratio:
    """sqrt(q) >= 0: the root itself where it is rational over d, else truncated to at
    least ``bits`` significant bits."""
    if q.n == 0:
        return q
    n, e = q.n, q.e
    if e % 2:
        n, e = n << 1, e - 1
    radicand = n * q.d  # sqrt(n / d) = sqrt(n * d) / d
    k = max(0, bits - radicand.bit_length() // 2 + 1)
    root = math.isqrt(radicand << (2 * k))
    return Ratio(root, q.d, e // 2 - k)


def work(a_bits: int, b_bits: int) -> float:
    """A product's cost in bit operations: Karatsuba's max * min^0.585 (CPython splits an
    unbalanced product into balanced ones)."""
    small, large = sorted((max(a_bits, 1), max(b_bits, 1)))
    return large * small ** 0.585


def _decimal(digits: str, exponent: int) -> str:
    """Significant ``digits`` (d.ddd) times 10**exponent: positional from 1e-7 to 1e21 (as
    Python's repr), scientific outside."""
    if -7 < exponent < 21:
        if exponent < 0:
            return "0." + "0" * (-exponent - 1) + digits
        whole = digits[:exponent + 1].ljust(exponent + 1, "0")
        frac = digits[exponent + 1:]
        return whole + ("." + frac if frac else "")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{exponent:+d}".replace("e+", "e")


def _log10(q: Ratio) -> float:
    """log10 |q| (q != 0) to about 1e-10 (from the leading 64 bits of n and d)."""
    n, d = abs(q.n), q.d
    tn, td = max(0, n.bit_length() - 64), max(0, d.bit_length() - 64)
    return math.log10((n >> tn) / (d >> td)) + (q.e + tn - td) * math.log10(2)


def _scaled(q: Ratio, digits: int) -> tuple[int, int, int, int]:
    """(units, remainder, den, exponent): |q| * 10^(digits - 1 - exponent) = units +
    remainder / den, with 10^(digits-1) <= units < 10^digits, exponent q's decimal
    exponent (linear time apart from one product by a power of ten: the quotient is
    small)."""
    guess = math.floor(_log10(q))
    for exponent in (guess, guess - 1, guess + 1):  # the guess is off only near a power
        shift = digits - 1 - exponent  # units = |q| * 10^shift
        num, den = abs(q.n), q.d
        if shift >= 0:
            num *= 10 ** shift
        else:
            den *= 10 ** -shift
        if q.e >= 0:
            num <<= q.e
        else:
            den <<= -q.e
        units, remainder = divmod(num, den)
        if 10 ** (digits - 1) <= units < 10 ** digits:
            return units, remainder, den, exponent
    raise AssertionError("one of three exponents fits")  # pragma: no cover


def ratio_text(q: Ratio, max_digits: int = 20) -> str:
    """An exact value written exactly where short: a terminating decimal of at most
    ``max_digits`` significant digits (1e-8, 0.1, 1.001953125); else a fraction of small
    terms (1/3); else ``≈`` and 17 significant digits -- or, beyond float64's range, a
    power of two times a small odd number (2^-13000, 3*2^-1100), else ``≈ 1.0144e-3914``
    (17 digits).  Never the decimal string of a huge integer: every form is bounded."""
    if q.n == 0:
        return "0"
    sign = "-" if q.n < 0 else ""
    units, remainder, den, exponent = _scaled(q, max_digits)
    if remainder == 0:
        return sign + _decimal(str(units).rstrip("0"), exponent)
    if q.bits <= 4000 and abs(q.e) <= 4000:
        f = Fraction(q.numerator, q.denominator)
        if f.denominator < 10 ** 6 and abs(f.numerator) < 10 ** 6:
            return f"{f.numerator}/{f.denominator}"
    value = float(q)
    if math.isfinite(value) and value != 0:
        return f"≈ {value:.17g}"
    if q.d == 1 and abs(q.n) < 1 << 20:
        return sign + (f"{abs(q.n)}*" if abs(q.n) != 1 else "") + f"2^{q.e}"
    # 17 of the 20 digits, to nearest (ties up): an approximation
    cut = 10 ** (max_digits - 17)
    units, rest = divmod(units, cut)
    if 2 * rest >= cut:
        units += 1
        if units == 10 ** 17:
            units, exponent = 10 ** 16, exponent + 1
    text = str(units)
    return f"{sign}≈ {text[0]}.{text[1:]}e{exponent:+d}"
