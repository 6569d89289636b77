"""Parse numbers typed on the command line exactly into float64.

Accepted: decimal (``1e-8``, ``-0.001``), powers (``2**-24``, ``2^-24``, ``-2**10``),
products with a power (``3*2^-10``, ``1.5 * 2**7``), hex floats (``0x1p-24``),
``inf``, ``-inf``, ``nan``.  Decimals and powers are evaluated as exact fractions and
rounded once to float64 (no detour through float32).  Digits may be any Unicode decimal
digits (as Python's ``float`` reads them) and ``_`` may group them (``1_000``).  A literal
longer than MAX_LITERAL characters is refused (exact arithmetic on thousands of digits is
slow, and Python refuses int strings of more than 4,300 digits).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from fmtcli.base.errors import BadValueError, shown

_POWER = re.compile(r"^(?P<base>[0-9.eE+-]+)\s*(?:\*\*|\^)\s*(?P<exp>[+-]?\d+)$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE](?P<exp>[+-]?\d+))?$")
_HEX = re.compile(r"^(?P<sign>[+-]?)0x(?P<int>[0-9a-f]*)(?:\.(?P<frac>[0-9a-f]*))?"
                  r"(?:p(?P<exp>[+-]?\d+))?$", re.IGNORECASE)
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
            "+infinity": math.inf, "-infinity": -math.inf, "nan": math.nan, "+nan": math.nan,
            "-nan": -math.nan}
_MAX_EXPONENT = 4096  # beyond this every power is outside float64 anyway
MAX_LITERAL = 4000  # characters: an exact float64 decimal needs up to ~1,100; Python ints 4,300
_HINT = "write e.g. 1e-8, 2**-24, 2^-24, 3*2^-10, 0x1p-24, inf or nan"


def _bounded_exponent(exponent: int, whole: str) -> int:
    if abs(exponent) > _MAX_EXPONENT:
        raise BadValueError(f"{shown(whole)} is outside float64's range")
    return exponent


def _decimal(text: str, whole: str) -> Fraction:
    match = _NUMBER.match(text)
    if match["exp"] is not None:
        _bounded_exponent(int(match["exp"]), whole)
    return Fraction(text)


def _hex(match: re.Match, whole: str) -> Fraction:
    """A hex float, exactly: hex digits times a power of two (no float detour)."""
    digits, frac = match["int"] or "", match["frac"] or ""
    if not digits and not frac:
        raise BadValueError(f"cannot read {shown(whole)} as a number", _HINT)
    exponent = _bounded_exponent(int(match["exp"] or 0), whole) - 4 * len(frac)
    value = Fraction(int(digits + frac, 16)) * Fraction(2) ** exponent
    return -value if match["sign"] == "-" else value


def _exact(text: str, whole: str) -> Fraction:
    """An exact fraction for one factor: a decimal, a hex float, or a power."""
    text = text.strip()
    if _NUMBER.match(text):
        return _decimal(text, whole)
    hex_match = _HEX.match(text)
    if hex_match:
        return _hex(hex_match, whole)
    power = _POWER.match(text)
    if power and _NUMBER.match(power["base"]):
        exponent = _bounded_exponent(int(power["exp"]), whole)
        base = _decimal(power["base"].lstrip("+"), whole)
        negative = power["base"].startswith("-")
        value = abs(base) ** exponent if base != 0 or exponent >= 0 else None
        if value is None:
            raise BadValueError(f"{shown(whole)} divides by zero")
        return -value if negative else value  # -2**10 means -(2**10), as in Python
    raise BadValueError(f"cannot read {shown(whole)} as a number", _HINT)


def parse_exact(text: str) -> Fraction | float:
    """Parse one literal exactly, with no rounding and no range check: a Fraction for a
    finite value (+0 included), a float for inf, nan and -0 (``fmt calc`` rounds it to each
    format itself).  Raises BadValueError for text that is not a number."""
    if len(text) > MAX_LITERAL:
        raise BadValueError(f"{shown(text)} is too long to be a number (at most "
                            f"{MAX_LITERAL:,} characters)")
    cleaned = re.sub(r"(?<=[0-9a-fA-F])_(?=[0-9a-fA-F])", "", text.strip())
    if cleaned.lower() in _SPECIAL:
        return _SPECIAL[cleaned.lower()]
    factors = re.split(r"(?<!\*)\*(?!\*)", cleaned)
    if not cleaned or any(not f.strip() for f in factors):
        raise BadValueError(f"cannot read {shown(text)} as a number", _HINT)
    exact = Fraction(1)
    negative = False
    for factor in factors:
        value = _exact(factor, text)
        negative ^= value < 0 or (value == 0 and factor.strip().startswith("-"))
        exact *= value
    if exact == 0 and negative:
        return -0.0
    return exact


def parse_value(text: str) -> float:
    """Parse one literal into the float64 nearest its exact value.

    Raises BadValueError for text that is not a number, and for a nonzero value that
    float64 cannot hold (it would silently become 0 or inf).
    """
    exact = parse_exact(text)
    if isinstance(exact, float):  # inf, nan, -0
        return exact
    try:
        value = float(exact)  # correctly rounded
    except OverflowError:
        value = math.inf
    if exact != 0 and (value == 0 or math.isinf(value)):
        raise BadValueError(f"{shown(text)} is outside float64's range")
    return value


def parse_values(items: list[str]) -> list[float]:
    """Parse several literals; each item may itself be a comma-separated list.  An empty
    item or list entry (``''``, ``'1,,2'``, ``'1,'``) is an error, not skipped."""
    values = []
    for item in items:
        for part in item.split(","):
            if not part.strip():
                raise BadValueError(f"empty value in {shown(item)}", _HINT)
            values.append(parse_value(part))
    return values
