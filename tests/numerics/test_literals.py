"""fmtcli.numerics.literals: numbers typed on the command line, parsed exactly into float64."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import pytest

from fmtcli.base.errors import BadValueError, FmtError, UsageError
from fmtcli.numerics.literals import parse_value, parse_values

SMALLEST_SUBNORMAL = math.ulp(0.0)  # 2**-1074
HALFWAY_ABOVE_1 = "1.00000000000000011102230246251565404236316680908203125"  # 1 + 2**-53


def is_negative_zero(x: float) -> bool:
    return x == 0 and math.copysign(1.0, x) < 0


# -- exactness --------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("2**-1074", SMALLEST_SUBNORMAL),
    ("2^-1074", SMALLEST_SUBNORMAL),
    ("0x1p-1074", SMALLEST_SUBNORMAL),
    ("0x1p-24", 2.0 ** -24),
    ("0X1P-24", 2.0 ** -24),
    ("0x1.8p1", 3.0),
    ("-0x1p-1074", -SMALLEST_SUBNORMAL),
    ("1e-8", float("1e-8")),
    ("-0.001", -0.001),
    (".5", 0.5),
    ("5.", 5.0),
    ("2**1023", 2.0 ** 1023),
    ("2**+3", 8.0),
    ("2**-0", 1.0),
    ("10**-8", float("1e-8")),
    ("1.1**2", 1.21),  # exact power: float 1.1**2 is 1.2100000000000002
    ("0.5**3", 0.125),
    ("3*2^-10", 3 / 1024),
    ("1.5 * 2**7", 192.0),
    ("2**-24*3", 3 * 2.0 ** -24),
    ("0.1*3", 0.3),  # exact product: float 0.1*3 is 0.30000000000000004
    ("10**-400*10**400", 1.0),  # exact intermediates far outside float64
    ("3*2**-1076", SMALLEST_SUBNORMAL),  # 0.75 * 2**-1074 rounds up to the smallest
    ("3*2**-1075", 2 * SMALLEST_SUBNORMAL),  # 1.5 * 2**-1074: tie, to even (2)
    ("-2**10", -1024.0),  # -(2**10), as in Python
    ("-2^-1", -0.5),
    ("-3*2^-10", -3 / 1024),
    ("0**0", 1.0),
])
def test_exact_values(text, expected):
    value = parse_value(text)
    assert type(value) is float
    assert value == expected


@pytest.mark.parametrize("text", [
    "0.1",
    "0.3333333333333333333333333333333333333333333333333",
    "123456789012345678901234567890.123456789e-20",
    HALFWAY_ABOVE_1,
    HALFWAY_ABOVE_1 + "0000000000001",
    "9007199254740993",  # 2**53 + 1: a tie between two doubles
    "9007199254740993.0000000000000000001",
    # 2**-1075 = 5**1075 / 10**1075 exactly (half the smallest subnormal), nudged upward
    "0." + str(5 ** 1075).rjust(1075, "0") + "000001",
])
def test_decimal_is_rounded_once_like_the_exact_fraction(text):
    assert parse_value(text) == float(Fraction(text))


def test_decimal_ties_and_just_above_ties():
    assert parse_value(HALFWAY_ABOVE_1) == 1.0  # tie to even
    assert parse_value(HALFWAY_ABOVE_1 + "0000000000001") == 1.0 + 2.0 ** -52
    assert parse_value("9007199254740993") == 2.0 ** 53
    assert parse_value("9007199254740993.0000000000000000001") == 2.0 ** 53 + 2
    assert parse_value("2**-1075*1.000000000001") == SMALLEST_SUBNORMAL  # just above the tie


def test_power_rounded_once():
    # 3**-40 rounded once from the exact fraction (float 3.0**-40 may differ in the last bit)
    assert parse_value("3**-40") == float(Fraction(1, 3 ** 40))
    assert parse_value("0.1**5") == float(Fraction(1, 10 ** 5))


# -- signs and special values -----------------------------------------------------------

@pytest.mark.parametrize("text", ["-0", "-0.0", "-0e5", "-0x0p0", "-0**1", " -0 "])
def test_negative_zero(text):
    assert is_negative_zero(parse_value(text))


@pytest.mark.parametrize("text", ["0", "0.0", "+0", "0x0p0", "0*5"])
def test_positive_zero(text):
    value = parse_value(text)
    assert value == 0 and math.copysign(1.0, value) > 0


@pytest.mark.parametrize("text, expected", [
    ("inf", math.inf), ("+inf", math.inf), ("-inf", -math.inf), ("INF", math.inf),
    ("Infinity", math.inf), ("-infinity", -math.inf), (" inf ", math.inf),
])
def test_infinities(text, expected):
    assert parse_value(text) == expected


@pytest.mark.parametrize("text", ["nan", "NaN", "NAN", " nan "])
def test_nan(text):
    assert math.isnan(parse_value(text))


# -- underscores and whitespace ---------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1_000", 1000.0),
    ("1_000_000", 1e6),
    ("2**-2_4", 2.0 ** -24),
    ("0x1_0p0", 16.0),
    ("1e-0_8", 1e-8),
    ("  1e-8  ", 1e-8),
    ("\t2**-24\n", 2.0 ** -24),
    ("3 * 2 ^ -10", 3 / 1024),
    ("2 ** 10", 1024.0),
    ("1.5 *2**7", 192.0),
])
def test_underscores_and_whitespace(text, expected):
    assert parse_value(text) == expected


# -- parse_values -----------------------------------------------------------------------

def test_parse_values_comma_lists_in_order():
    assert parse_values(["1e-8,2**-24", "3", " -1 , 0x1p-1 "]) == [1e-8, 2.0 ** -24, 3.0, -1.0, 0.5]


@pytest.mark.parametrize("items", [["1,,2"], ["1,"], [" , "], [""], ["1", ""]])
def test_parse_values_refuses_empty_parts(items):
    # an empty entry is a mistake (a stray comma, an empty variable), not something to skip
    with pytest.raises(BadValueError, match="empty value"):
        parse_values(items)


def test_parse_values_of_nothing_is_nothing():
    assert parse_values([]) == []


def test_parse_values_keeps_duplicates():
    assert parse_values(["1,1", "1"]) == [1.0, 1.0, 1.0]


def test_parse_values_propagates_errors():
    with pytest.raises(BadValueError, match="cannot read 'abc'"):
        parse_values(["1", "2,abc"])


# -- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "", "   ", "abc", "1e", ".", "-", "+", "e5", "1e-8e2", "1.2.3", "--1", "+-1", "1,2",
    "2**", "**2", "2^", "^2", "2**0.5", "2^^3", "2***3", "*3", "3*", "3**", "2**x",
    "0x1q5", "1/2", "(2)**3", "two",
])
def test_unreadable_text_raises_bad_value_error(text):
    with pytest.raises(BadValueError) as info:
        parse_value(text)
    assert f"'{text}'" in str(info.value)


@pytest.mark.parametrize("text", [
    "1e999", "-1e999", "1e-999", "2**1024", "-2**1024", "2**-1075", "2**-5000", "2**5000",
    "10**400", "0.5**1075", "1e300*1e300", "1e-300*1e-300", "2**99999999999",
])
def test_values_outside_float64_raise(text):
    with pytest.raises(BadValueError, match="outside float64's range"):
        parse_value(text)


def test_decimal_tie_at_half_the_smallest_subnormal_is_outside_float64():
    # exactly 2**-1075 rounds (to even) to 0: a nonzero value float64 cannot hold
    with pytest.raises(BadValueError, match="outside float64's range"):
        parse_value("0." + str(5 ** 1075).rjust(1075, "0"))


def test_division_by_zero_raises():
    with pytest.raises(BadValueError, match="divides by zero"):
        parse_value("0**-1")


def test_bad_value_error_is_a_usage_error_with_exit_code_2():
    with pytest.raises(BadValueError) as info:
        parse_value("abc")
    error = info.value
    assert isinstance(error, UsageError) and isinstance(error, FmtError)
    assert error.exit_code == 2
    assert error.suggestion and "2**-24" in error.suggestion
    assert str(error).startswith("cannot read 'abc' as a number (write e.g.")


@pytest.mark.parametrize("text", ["0x", "0x.", "0xp1"])
def test_malformed_hex_raises_bad_value_error(text):
    with pytest.raises(BadValueError):
        parse_value(text)


def test_hex_above_float64_raises_bad_value_error():
    with pytest.raises(BadValueError, match="outside float64's range"):
        parse_value("0x1p2000")


def test_hex_below_float64_raises_bad_value_error():
    with pytest.raises(BadValueError, match="outside float64's range"):
        parse_value("0x1p-2000")


def test_huge_decimal_exponent_fails_fast():
    code = ("from fmtcli.numerics.literals import parse_value\n"
            "try:\n    parse_value('1e99999999')\n"
            "except Exception as e:\n    print(type(e).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=3)
    assert proc.stdout.strip() == "BadValueError"
