"""``fmt calc`` and ``fmtcli.arithmetic.ops``/``calc``: arithmetic rounded once per operation.

Checked against ``arith_oracle`` (no fmtcli): every operation of a few formats, on values
at their edges (subnormals, the smallest normal, 1 and its neighbours, max) in every
directed and nearest mode, against the exact rational result rounded from the definition;
float32 sqrt against numpy's (IEEE, correctly rounded) and float32 fma against the exact
value.  Then the article's 1 + 2^-9, the grammar and its refusals (hostile expressions end
in one usage error, fast), the JSON keys and the table at 80 and 120 columns.
"""

from __future__ import annotations

import itertools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from arith_oracle import FLOAT32, OVERFLOW, round_binary, round_listed
from cli_helpers import (
    assert_fits,
    assert_usage_error,
    invoke,
    json_of,
    run_fmt,
    strict_loads,
    succeeds,
)

from fmtcli.arithmetic.calc import calculate, exact_text, parse_expression
from fmtcli.arithmetic.ops import Arithmetic, arithmetic_spec, round_rational
from fmtcli.arithmetic.pairs import round_float
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import UsageError

MODES = ["nearest-even", "nearest-away", "toward-zero", "up", "down"]
LISTED = {"bfloat16": "bfloat16", "float16": "float16", "e4m3fn": "float8_e4m3fn",
          "e5m2": "float8_e5m2"}


def edges(name: str) -> list[float]:
    """Values of the format at its edges, both signs."""
    spec = arithmetic_spec(name)[0]
    tiny, normal, eps = spec.smallest_subnormal, spec.smallest_normal, spec.eps
    points = [tiny, 2 * tiny, 3 * tiny, normal - tiny, normal, 1.0, 1 + eps, 1 - eps / 2,
              1.5, 3.0, spec.max / 2, spec.max, 0.1]
    stored = [float(Arithmetic(spec).store(Fraction(p))) for p in points]
    return sorted({*stored, *(-x for x in stored)})


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LISTED))
@pytest.mark.parametrize("mode", MODES)
def test_every_operation_at_the_edges_is_the_exact_result_rounded_once(name, mode):
    spec = arithmetic_spec(name)[0]
    arithmetic = Arithmetic(spec, mode)
    ops = {"+": (arithmetic.add, lambda a, b: a + b), "-": (arithmetic.sub, lambda a, b: a - b),
           "*": (arithmetic.mul, lambda a, b: a * b), "/": (arithmetic.div, lambda a, b: a / b)}
    checked = 0
    for a, b in itertools.product(edges(name), repeat=2):
        for op, (method, exact_op) in ops.items():
            exact = exact_op(Fraction(a), Fraction(b))
            expected = round_listed(exact, LISTED[name], mode)
            if expected == OVERFLOW or (expected == 0 and exact != 0):
                continue  # beyond max / underflow to zero: tested apart
            got = method(a, b)[1]
            assert Fraction(got) == expected, (name, mode, a, op, b, got, expected)
            checked += 1
        c = a / 4 if a else 1.0
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        expected = round_listed(exact, LISTED[name], mode)
        if expected != OVERFLOW and not (expected == 0 and exact != 0) and \
                Fraction(c) == Fraction(arithmetic.store(Fraction(c))):
            assert Fraction(arithmetic.fma(a, b, c)[1]) == expected, (a, b, c)
    assert checked > 1000


@pytest.mark.parametrize("name", list(LISTED))
@pytest.mark.parametrize("mode", MODES)
def test_sqrt_at_the_edges_is_the_root_rounded_once(name, mode):
    """The oracle brackets the irrational root by squares: lo^2 <= a < hi^2."""
    import bisect

    from arith_oracle import choose, finite_values

    arithmetic = Arithmetic(arithmetic_spec(name)[0], mode)
    values = finite_values(LISTED[name])
    for a in [x for x in edges(name) if x > 0]:
        q = Fraction(a)
        i = bisect.bisect_left(values, Fraction(math.sqrt(a)))  # near the root, then exact:
        while values[i] * values[i] > q:
            i -= 1
        while values[i + 1] * values[i + 1] <= q:
            i += 1
        lo = values[i]  # lo^2 <= a < hi^2
        got = Fraction(arithmetic.sqrt(a)[1])
        if lo * lo == q:
            assert got == lo
            continue
        hi = values[i + 1]
        mid = (lo + hi) / 2
        # where the root lies against the midpoint, by squares (it is never equal to it)
        root_side = hi if q > mid * mid else lo
        if mode in ("nearest-even", "nearest-away"):
            expected = root_side
        else:
            expected = choose(Fraction(1), lo, hi, mode, True)  # a positive root
        assert got == expected, (name, mode, a, got, expected)


def test_float32_sqrt_is_numpy_s_correctly_rounded_root():
    rng = np.random.default_rng(3)
    xs = np.abs(rng.standard_normal(3000).astype(np.float32)) * \
        np.float32(2.0) ** rng.integers(-140, 120, 3000).astype(np.float32)
    xs = xs[np.isfinite(xs) & (xs > 0)]
    arithmetic = Arithmetic(arithmetic_spec("float32")[0])
    got = np.array([arithmetic.sqrt(float(x))[1] for x in xs], dtype=np.float32)
    assert np.array_equal(got, np.sqrt(xs))


@pytest.mark.parametrize("mode", MODES)
def test_float32_fma_is_one_rounding_of_the_exact_value(mode):
    rng = np.random.default_rng(4)
    arithmetic = Arithmetic(arithmetic_spec("float32")[0], mode)
    for _ in range(400):
        a, b = (float(np.float32(x)) for x in rng.standard_normal(2))
        c = float(np.float32(-a * b * (1 + rng.standard_normal() * 2.0 ** -20)))
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        got = arithmetic.fma(a, b, c)[1]
        assert Fraction(got) == round_binary(exact, **FLOAT32, mode=mode), (a, b, c)


def test_fma_rounds_once_where_a_product_and_a_sum_round_twice():
    a, b = 1 + 2.0 ** -23, 1 - 2.0 ** -23  # a * b = 1 - 2**-46 exactly
    f32 = Arithmetic(arithmetic_spec("fp32")[0])
    assert f32.fma(a, b, -1.0)[1] == -(2.0 ** -46)
    assert f32.add(f32.mul(a, b)[1], -1.0)[1] == 0.0  # the product rounds to 1 first


@pytest.mark.slow
def test_rational_and_float_rounding_agree_in_every_mode():
    rng = np.random.default_rng(5)
    xs = rng.standard_normal(500) * 10.0 ** rng.integers(-45, 40, 500)
    for name in ["bfloat16", "float16", "e4m3fn", "e2m1", "tf32", "e8m0", "e4m3fnuz"]:
        spec = arithmetic_spec(name)[0]
        for mode in MODES:
            for x in xs.tolist():
                a = round_rational(Fraction(x), spec, mode)
                b = round_float(x, spec, mode)
                assert a == b or (math.isnan(a) and math.isnan(b)), (name, mode, x, a, b)


def test_overflow_underflow_and_special_values_follow_ieee():
    bf16 = Arithmetic(arithmetic_spec("bf16")[0])
    big = arithmetic_spec("bf16")[0].max
    assert bf16.add(big, big)[1] == math.inf
    assert Arithmetic(arithmetic_spec("bf16")[0], "toward-zero").add(big, big)[1] == big
    assert math.isnan(Arithmetic(arithmetic_spec("e4m3fn")[0]).mul(448.0, 2.0)[1])
    assert Arithmetic(arithmetic_spec("e2m1")[0]).mul(6.0, 6.0)[1] == 6.0  # saturates
    assert math.isnan(bf16.add(math.inf, -math.inf)[1])
    assert math.isnan(bf16.mul(0.0, math.inf)[1])
    assert bf16.div(-1.0, 0.0)[1] == -math.inf
    assert math.copysign(1, bf16.add(-0.0, -0.0)[1]) == -1
    assert math.copysign(1, bf16.add(1.0, -1.0)[1]) == 1
    assert math.copysign(1, Arithmetic(arithmetic_spec("bf16")[0], "down")
                         .add(1.0, -1.0)[1]) == -1
    assert math.copysign(1, bf16.sqrt(-0.0)[1]) == -1
    assert math.isnan(bf16.sqrt(-1.0)[1])
    tiny = arithmetic_spec("fp16")[0].smallest_subnormal
    assert Arithmetic(arithmetic_spec("fp16")[0]).mul(tiny, 0.25)[1] == 0.0


# -- the article -----------------------------------------------------------------------

def test_a_zero_plus_a_zero_of_its_sign_keeps_it_in_every_mode():
    """IEEE 754 §6.3: x + x = x for zeros (+0 + +0 = +0 even rounding down); only a sum of
    opposite signs is -0 rounding down, +0 otherwise."""
    for mode in MODES:
        bf16 = Arithmetic(arithmetic_spec("bf16")[0], mode)
        assert math.copysign(1, bf16.add(0.0, 0.0)[1]) == 1
        assert math.copysign(1, bf16.add(-0.0, -0.0)[1]) == -1
        opposite = -1 if mode == "down" else 1
        assert math.copysign(1, bf16.add(0.0, -0.0)[1]) == opposite
        assert math.copysign(1, bf16.add(1.0, -1.0)[1]) == opposite
        assert math.copysign(1, bf16.fma(0.0, 1.0, 0.0)[1]) == 1


def test_one_plus_two_to_the_minus_nine_is_one_in_bf16():
    """The article: "1 + 2^-9 is exactly 1 in BF16"; FP16 and FP32 hold 1.001953125."""
    doc = json_of("calc", "1 + 2^-9")
    values = {r["format"]: r["value"] for r in doc["results"]}
    assert values == {"bfloat16": 1.0, "float16": 1.001953125, "float32": 1.001953125,
                      "float64": 1.001953125}
    assert doc["exact"] == 1.001953125 and doc["exact_text"] == "1.001953125"
    bf16 = doc["results"][0]
    assert set(bf16) >= {"format", "value", "exact", "error", "steps"}
    assert bf16["error"] == -(2.0 ** -9)
    (step,) = bf16["steps"]
    assert step["note"] == "2^-9 absorbed" and step["exact"] == 1 + 2.0 ** -9
    assert doc["results"][1]["steps"][0]["note"] == "exact"


def test_rounding_up_keeps_the_term_in_bf16():
    doc = json_of("calc", "1 + 2^-9", "--format", "bf16", "--rounding", "up")
    assert doc["results"][0]["value"] == 1 + 2.0 ** -7


def test_the_table_names_the_absorbed_term():
    out = succeeds("calc", "1 + 2^-9", env={"COLUMNS": "80"}).stdout
    assert "2^-9 absorbed" in out and "1.001953125" in out


def test_steps_store_literals_and_round_each_operation():
    result = calculate("0.1 + 0.2", ["bf16"])
    (r,) = result.results
    assert [s.expression for s in r.steps] == ["0.1", "0.2", "0.1 + 0.2"]
    assert [s.kind for s in r.steps] == ["literal", "literal", "operation"]
    assert r.steps[0].value == 0.10009765625 and r.steps[0].exact_text == "0.1"
    assert r.steps[2].exact == 0.10009765625 + 0.2001953125
    assert r.value == 0.30078125 and result.exact_text == "0.3"
    assert r.error == float(Fraction(0.30078125) - Fraction(3, 10))


def test_syntax_of_numbers_as_fmt_underflow_reads_them():
    value = calculate("0x1p-24 + 3*2**-10 + 1_000 + -2^2 + 1e-8", ["float64"]).results[0]
    expected = Fraction(1, 2 ** 24) + Fraction(3, 1024) + 1000 - 4 + Fraction(1, 10 ** 8)
    assert value.exact == float(expected)
    assert calculate("\u0661 + 1", ["fp16"]).results[0].value == 2.0  # Arabic-Indic 1
    assert math.isnan(calculate("inf - inf", ["fp16"]).results[0].value)
    assert calculate("sqrt(2)", ["float64"]).results[0].value == math.sqrt(2)
    assert calculate("1/3", ["float64"]).results[0].value == 1 / 3


def test_exact_text_is_exact_where_short():
    assert exact_text(Fraction(1, 10 ** 8)) == "1e-8"
    assert exact_text(Fraction(513, 512)) == "1.001953125"
    assert exact_text(Fraction(1, 3)) == "1/3"
    assert exact_text(Fraction(2) ** 99999) == "2^99999"  # exact, beyond float64


def leading_digits(q: Fraction, digits: int = 17) -> str:
    """q's first significant digits, rounded, by decimal arithmetic (independent of fmt)."""
    import decimal

    with decimal.localcontext(decimal.Context(prec=digits)):
        value = decimal.Decimal(q.numerator) / decimal.Decimal(q.denominator)
    return f"{value:.{digits - 1}e}".replace("e+", "e+").replace("e", "e")


@pytest.mark.slow
@pytest.mark.parametrize(("expression", "text"), [
    ("2^-99999", "2^-99999"), ("2^-13000", "2^-13000"), ("3 * 2^-13000", "3*2^-13000"),
    ("-(2^99999)", "-2^99999"), ("3 * 10^-5000", "3e-5000"), ("10^-4400 * 7", "7e-4400")])
def test_exact_values_past_python_s_4300_digits_are_written_exactly_and_bounded(
        expression, text):
    """Python refuses to write an int of more than 4,300 digits (exit 70 from 2^-13000):
    a power of two is written as one, a short decimal as one, in a fresh process."""
    result = run_fmt("calc", "--json", "--", expression)
    assert result.returncode == 0, result.stderr
    doc = strict_loads(result.stdout)
    assert doc["exact_text"] == text


@pytest.mark.slow
def test_long_exact_values_are_seventeen_significant_digits():
    """0.7^99999 (about 10^-15491): its 17 leading digits, and an exponent."""
    doc = json_of("calc", "0.7^99999 * 3", "--format", "fp32")
    q = Fraction(7, 10) ** 99999 * 3
    mantissa, exponent = leading_digits(q).split("e")
    assert doc["exact_text"] == f"≈ {mantissa}e{int(exponent):+d}"
    assert doc["results"][0]["value"] == 0.0 and doc["results"][0]["rel_error"] == 1.0
    step = doc["results"][0]["steps"][0]
    assert step["exact_text"].startswith("≈ 9.09710873365768") and step["note"] == \
        "underflow to 0"


def test_many_formats_of_a_long_expression_are_refused_at_once():
    """140 formats x 255 steps: the table took 147 s; refused with the count (8 formats of
    the longest expression pass)."""
    formats = ",".join(f"e{e}m{m}" for e in range(2, 12) for m in range(0, 53, 4))
    terms = ["0.1"] * 128
    while len(terms) > 1:
        terms = [f"({terms[i]}+{terms[i + 1]})" for i in range(0, len(terms), 2)]
    start = time.perf_counter()
    assert_usage_error(invoke("calc", terms[0], "--format", formats), "35,700 steps",
                       "at most 4,000")
    assert time.perf_counter() - start < 5
    assert len(json_of("calc", "1 + 2^-9", "--format", formats)["results"]) == 140


@pytest.mark.parametrize("width", [80, 120])
def test_values_beyond_float64_are_shown_to_the_table_s_digits(width):
    out = succeeds("calc", "0.7^99999 * 3", "--format", "bf16",
                   env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    assert "≈9.097109e-15491" in out and "≈2.729133e-15490" in out


@pytest.mark.slow
def test_exact_values_that_would_take_minutes_are_refused_at_once():
    """12 factors of 0.7^99999 took 193 s (gcds of million-bit numbers); the estimate of
    the exact value's work refuses it, and the 2,000-character expression of 200 factors,
    before any work; 4 factors run (products of odd parts, no gcd)."""
    for count in (12, 199):
        start = time.perf_counter()
        expression = "*".join(["0.7^99999"] * count)
        assert len(expression) <= 2000
        assert_usage_error(invoke("calc", expression), "exact value needs ~", "at most")
        assert time.perf_counter() - start < 5
    doc = json_of("calc", " * ".join(["0.7^99999"] * 4), "--format", "bf16")
    assert doc["exact_text"].startswith("≈ 6.8487851547068") and doc["exact_text"].endswith(
        "e-61961")
    assert_usage_error(invoke("calc", " * ".join(["2^99999"] * 100) + " + 1"), "bits")


# -- refusals ----------------------------------------------------------------------------

HOSTILE = ["__import__('os').system('true')", "().__class__.__bases__", "x + 1", "abs(1)",
           "1 % 2", "1 // 2", "1 << 2", "'a'", "[1]", "1j", "1 if 1 else 2", "lambda: 1",
           "sqrt(1, 2)", "fma(1, 2)", "sqrt(x=1)", "fma(*[1, 2, 3])", "(1+2)^2", "2^0.5",
           "9^9^9", "2^99999999", "7^99999 ^ 2", "1e99999", "0^-1",
           "", "   ", "1 +", "1;2", "(" * 300 + "1" + ")" * 300, "-" * 5000 + "1",
           "+".join(["1"] * 400), "sqrt(" * 250 + "2" + ")" * 250, "1 == 1", "a.b",
           "\x00", "f'{1}'", "\u00bd"]


@pytest.mark.slow
@pytest.mark.parametrize("expression", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_expressions_are_one_usage_error_quickly(expression):
    start = time.perf_counter()
    assert_usage_error(invoke("calc", "--", expression))
    assert time.perf_counter() - start < 5


def test_large_but_bounded_powers_overflow_without_hanging():
    start = time.perf_counter()
    doc = json_of("calc", "2^99999 - 10^99999")
    assert {r["value"] for r in doc["results"]} == {"nan"}  # inf - inf
    assert time.perf_counter() - start < 5
    with pytest.raises(UsageError):
        parse_expression("7^100001")
    overflow = json_of("calc", "-2^99999", "--format", "bf16")["results"][0]
    assert overflow["value"] == overflow["error"] == "-inf"
    assert overflow["steps"][0]["note"] == "overflow"


def test_other_refusals():
    assert_usage_error(invoke("calc", "1+1", "--format", "nope"), "unknown format")
    assert_usage_error(invoke("calc", "1+1", "--format", ""), "--format")
    assert_usage_error(invoke("calc", "--bogus"), "No such option: --bogus")
    assert_usage_error(invoke("calc"), "EXPR")
    assert_usage_error(invoke("calc", "1", "--rounding", "sideways"))


def test_a_leading_minus_is_an_expression_not_an_option():
    assert json_of("calc", "-1 + 2^-9", "--format", "fp16")["results"][0]["value"] == \
        -1 + 2.0 ** -9


def test_stochastic_rounding_is_reproducible_from_the_seed():
    a = json_of("calc", "1 + 2^-9", "-r", "stochastic", "--seed", "7")
    assert a == json_of("calc", "1 + 2^-9", "-r", "stochastic", "--seed", "7")
    assert a["rounding"] == "stochastic"


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", [["1 + 2^-9"], ["fma(0.1, 10, -1) + sqrt(2)/3 - 1e-8"],
                                  ["0.1 + 0.2", "--format", "e4m3,e5m2,fp32,fp64"],
                                  ["2^99999 / 3 + 1e-300", "--format", "e2m1,e8m0,tf32"]])
def test_the_table_fits_uncut(width, args):
    out = succeeds("calc", *args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    assert "float" in out or "tfloat" in out


def test_json_is_strict_with_inf_and_nan_as_strings():
    doc = json_of("calc", "1/0 + 0/0", "--format", "bf16")
    assert doc["results"][0]["value"] == "nan"
    assert doc["results"][0]["steps"][0]["value"] == "inf"
    assert RoundingMode(doc["rounding"]) is RoundingMode.NEAREST_EVEN
