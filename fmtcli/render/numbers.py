"""Numbers as the tables write them: a format's figures exactly, stored and computed values
to a few significant digits, the user's inputs with every digit their float needs, and
relative errors as percentages.  Text only: no rich.
"""

from __future__ import annotations

import math


def exact_text(value: float) -> str:
    """A format figure written exactly and readably: 448; 65,504; 2^-9 over 0.001953125.

    Powers of two take two lines: the power, then its exact decimal (or an approximation
    when the decimal would be long)."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    mantissa, exponent = math.frexp(value)
    if value == int(value) and abs(value) < 1e7:
        return f"{int(value):,}"
    if abs(mantissa) == 0.5:  # a power of two
        power = exponent - 1
        if -16 <= power < 0:
            return f"2^{power}\n{value:.{-power}f}".rstrip("0")
        if 0 <= power < 24:
            return f"2^{power}\n{int(value):,}"
        return f"2^{power}\n≈ {value:.4g}"
    short = repr(value)
    return short if len(short) <= 12 else f"≈ {value:.6g}"


def value_text(value: float | None, digits: int = 5) -> str:
    """A stored or computed value to ``digits`` significant digits."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    return f"{value:.{digits}g}"


def input_text(value: float | None, float32: bool = False) -> str:
    """A value the user gave (or an input), with every digit its float needs: the shortest
    text that reads back as the same float64 (float32 with ``float32``), so 68.00000357
    shows as 68.00000357, not as 68, and its rounding can be checked by eye."""
    if value is None or not math.isfinite(value) or value == 0:
        return value_text(value)
    if float32:  # the inputs of check-backends are float32
        import numpy as np

        with np.errstate(over="ignore"):
            single = np.float32(value)
        text = np.format_float_positional(single, unique=True, trim="-") \
            if 1e-4 <= abs(value) < 1e16 else \
            np.format_float_scientific(single, unique=True, trim="-")
    else:
        text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if e:  # 1e-08 -> 1e-8
        text = f"{mantissa}e{int(exponent)}"
    return text.removesuffix(".0")


def percent_text(rel: float | None) -> str:
    """A relative error as a percentage with three significant digits."""
    if rel is None or math.isnan(rel):
        return "-"
    if math.isinf(rel):
        return "inf"
    if rel == 0:
        return "0"
    if 0.999 < rel < 1:  # enough digits not to round to 100%
        decimals = math.ceil(-math.log10(1 - rel)) - 2
        return f"{rel * 100:.{decimals}f}%"
    return f"{rel * 100:.3g}%"
