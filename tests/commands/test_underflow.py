"""``fmt underflow``: what a value becomes in each format, with and without ``x * scale``.

Figures are checked against the article ("Try it: will it underflow?") and, where possible,
against an independent oracle (numpy/ml_dtypes casts, hand-computed grid points) rather than
against fmtcli's own library: the rows' shape, value syntaxes, ``--format``, ``--rounding``,
``--seed``, ``--overflow``, every fate, and the errors.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_no_traceback, assert_usage_error, invoke, json_of, strict_loads

from fmtcli.numerics.fates import Fate

ARTICLE_SIX = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
               "float8_e5m2"]


ROW_KEYS = {"value", "format", "scale", "stored", "rel_error", "status", "survives"}


SCALED_KEYS = {"scaled_stored", "recovered", "recovered_rel_error", "scaled_status"}


# -- helpers ----------------------------------------------------------------------------------

def rows_of(*args: str):
    return json_of("underflow", *args)


def one_row(*args: str) -> dict:
    rows = rows_of(*args)
    assert len(rows) == 1, rows
    return rows[0]


# -- the article's example --------------------------------------------------------------------

def test_underflow_article_example():
    rows = rows_of("1e-8", "--scale", "4096")
    assert [r["format"] for r in rows] == ARTICLE_SIX
    by = {r["format"]: r for r in rows}
    for row in rows:
        assert row["value"] == 1e-8 and row["scale"] == 4096

    f16 = by["float16"]
    assert f16["status"] == "flushed" and f16["stored"] == 0
    assert f16["scaled_status"] == "subnormal"
    assert f16["scaled_stored"] == 687 * 2.0 ** -24  # nearest multiple of 2^-24 to 4.096e-5
    assert f16["scaled_stored"] == pytest.approx(4.0948e-5, rel=1e-4)
    assert f16["recovered"] == 687 * 2.0 ** -24 / 4096
    assert f16["recovered"] == pytest.approx(9.997e-9, rel=1e-3)
    assert f16["survives"] is True

    bf16 = by["bfloat16"]
    assert bf16["status"] == "rounded"
    assert bf16["stored"] == 172 * 2.0 ** -34  # 1e-8 in [2^-27, 2^-26): spacing 2^-34
    assert bf16["stored"] == float(ml_dtypes.bfloat16(1e-8))
    assert bf16["stored"] == pytest.approx(1.0012e-8, rel=1e-4)
    assert bf16["survives"] is True

    e4m3 = by["float8_e4m3fn"]
    assert e4m3["status"] == "flushed" and e4m3["scaled_status"] == "flushed"
    assert e4m3["scaled_stored"] == 0 and e4m3["survives"] is False

    assert by["float32"]["stored"] == float(np.float32(1e-8))


def test_underflow_article_example_table():
    result = invoke("underflow", "1e-8", "--scale", "4096")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "x * scale" in out
    for text in ("flushed", "subnormal", "4.0948e-05", "9.9972e-09", "1.0012e-08", "4096"):
        assert text in out, text


def test_underflow_table_without_scale_has_no_scale_columns():
    result = invoke("underflow", "1e-8", "--format", "fp16")
    assert result.exit_code == 0
    assert "flushed" in result.stdout
    assert "recovered" not in result.stdout and "survives" not in result.stdout


def test_the_input_value_is_shown_with_all_its_digits():
    result = invoke("underflow", "68.00000357", "--format", "e4m3fn")
    assert "68.00000357" in result.stdout


# -- row shape --------------------------------------------------------------------------------

def test_underflow_rows_without_scale():
    rows = rows_of("1e-8,2**-24")
    assert len(rows) == 2 * 6
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["scale"] is None
    # grouped by value, then the formats in order
    assert [r["value"] for r in rows] == [1e-8] * 6 + [2.0 ** -24] * 6
    assert [r["format"] for r in rows[:6]] == ARTICLE_SIX


def test_underflow_rows_with_scales_count_and_order():
    rows = rows_of("1e-8", "2**-30", "--scale", "1024,4096", "--scale", "2**16",
                   "--format", "fp16", "--format", "bf16")
    assert len(rows) == 2 * 2 * 3  # values x formats x scales
    for row in rows:
        assert ROW_KEYS | SCALED_KEYS <= row.keys()
    assert [(r["value"], r["format"], r["scale"]) for r in rows] == [
        (v, f, s) for v in (1e-8, 2.0 ** -30) for f in ("float16", "bfloat16")
        for s in (1024.0, 4096.0, 65536.0)]


def test_underflow_short_scale_option_and_scaled_values():
    (row,) = rows_of("2**-30", "-s", "2^10", "--format", "fp16")
    assert row["scale"] == 1024
    assert row["status"] == "flushed"  # 2^-30 < 2^-25, half the smallest subnormal
    # 2^-20 lies in fp16's subnormal range, held exactly: "subnormal" wins over "exact"
    assert row["scaled_stored"] == 2.0 ** -20 and row["scaled_status"] == "subnormal"
    assert row["recovered"] == 2.0 ** -30 and row["recovered_rel_error"] == 0
    assert row["survives"] is True


# -- value syntaxes ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("text, expected", [
    ("1e-8", 1e-8),
    ("2**-24", 2.0 ** -24),
    ("2^-24", 2.0 ** -24),
    ("0x1p-24", 2.0 ** -24),
    ("3*2^-10", 3 / 1024),
    ("-1e-8", -1e-8),
    ("-2**-24", -(2.0 ** -24)),
    ("-3*2^-10", -3 / 1024),
    ("0.1*3", 0.3),  # exact product, not 0.1 * 3.0 == 0.30000000000000004
    ("1_000", 1000.0),
])
def test_underflow_value_syntaxes(text, expected):
    row = one_row(text, "--format", "float32")
    assert row["value"] == expected
    assert row["stored"] == float(np.float32(expected))


def test_underflow_negative_value_given_directly():
    result = invoke("underflow", "-1e-8", "--format", "fp16", "--json")
    assert result.exit_code == 0, result.stderr
    (row,) = strict_loads(result.stdout)
    assert row["value"] == -1e-8 and row["status"] == "flushed"


def test_underflow_special_values_are_json_strings():
    rows = rows_of("inf,1,-inf,nan", "--format", "fp16", "--format", "e4m3fn")
    by = {(str(r["value"]), r["format"]): r for r in rows}
    assert by[("inf", "float16")]["stored"] == "inf"
    assert by[("-inf", "float16")]["stored"] == "-inf"
    assert by[("nan", "float16")]["stored"] == "nan"
    assert by[("nan", "float16")]["rel_error"] == "nan"
    assert by[("inf", "float16")]["status"] == "exact"
    # e4m3fn has no inf: inf becomes NaN
    assert by[("inf", "float8_e4m3fn")]["stored"] == "nan"
    assert by[("inf", "float8_e4m3fn")]["status"] == "overflow"
    assert by[("-inf", "float8_e4m3fn")]["stored"] == "nan"


def test_underflow_json_is_strict_with_inf_and_nan_everywhere():
    result = invoke("underflow", "inf,nan,1e6,0", "--scale", "2", "--json")
    assert result.exit_code == 0
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout
    rows = strict_loads(result.stdout)
    assert any(r["recovered"] == "inf" for r in rows)
    assert any(r["recovered_rel_error"] == "nan" for r in rows)
    assert any(r["rel_error"] == "inf" for r in rows)  # 1e6 became inf in fp16


def test_underflow_minus_inf_after_double_dash():
    result = invoke("underflow", "--format", "fp16", "--json", "--", "-inf", "-0x1fp-3")
    assert result.exit_code == 0, result.stderr
    rows = strict_loads(result.stdout)
    assert [r["value"] for r in rows] == ["-inf", -31 / 8]
    assert rows[0]["stored"] == "-inf" and rows[1]["stored"] == -3.875


def test_underflow_minus_inf_given_directly():
    result = invoke("underflow", "-inf", "--format", "fp16", "--json")
    assert result.exit_code == 0, result.stderr
    (row,) = strict_loads(result.stdout)
    assert row["value"] == "-inf"


def test_underflow_negative_hex_with_f_digit_given_directly():
    result = invoke("underflow", "-0x1fp-3", "--format", "fp16", "--json")
    assert result.exit_code == 0, result.stderr
    (row,) = strict_loads(result.stdout)
    assert row["value"] == -31 / 8


# -- --format ---------------------------------------------------------------------------------

def test_underflow_format_repeatable_and_comma_lists():
    rows = rows_of("0.1", "--format", "fp16", "--format", "bf16,e4m3fn", "--format", "e5m2")
    assert [r["format"] for r in rows] == ["float16", "bfloat16", "float8_e4m3fn",
                                           "float8_e5m2"]
    expected = [float(np.float16(0.1)), float(ml_dtypes.bfloat16(0.1)),
                float(np.asarray(0.1).astype(ml_dtypes.float8_e4m3fn)),
                float(np.asarray(0.1).astype(ml_dtypes.float8_e5m2))]
    assert [r["stored"] for r in rows] == expected


def test_underflow_custom_format_e5m10_matches_float16():
    values = "1e-8,2**-24,3*2**-26,0.1,65519,65520,1e6,-0.3,inf,nan"
    custom = rows_of(values, "--format", "e5m10", "--scale", "4096")
    half = rows_of(values, "--format", "float16", "--scale", "4096")
    assert len(custom) == len(half) == 10
    for c, h in zip(custom, half):
        assert c["format"] == "e5m10" and h["format"] == "float16"
        assert {k: v for k, v in c.items() if k != "format"} == \
               {k: v for k, v in h.items() if k != "format"}
    # 3*2^-26 is 0.75 of fp16's smallest subnormal and rounds up to it; 65520 is the tie
    # between max and the next (nonexistent) step and rounds to inf, as numpy does
    assert [h["stored"] for h in half] == [
        0.0, 2.0 ** -24, 2.0 ** -24, float(np.float16(0.1)), 65504.0, "inf", "inf",
        float(np.float16(-0.3)), "inf", "nan"]


def test_underflow_bare_e4m3_format_notes_on_stderr_only():
    result = invoke("underflow", "1", "--format", "e4m3", "--json")
    assert result.exit_code == 0
    (row,) = strict_loads(result.stdout)
    assert row["format"] == "float8_e4m3fn"
    assert len(result.stderr.splitlines()) == 1 and "e4m3fnuz" in result.stderr


# -- --rounding, --seed, --overflow -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode, pos, neg", [
    # e4m3fn spacing at 1 is 2^-3 = 0.125, so 1.0625 is a tie between 1.0 and 1.125
    ("nearest-even", 1.0, -1.0),
    ("nearest-away", 1.125, -1.125),
    ("toward-zero", 1.0, -1.0),
    ("up", 1.125, -1.0),
    ("down", 1.0, -1.125),
    ("UP", 1.125, -1.0),  # case-insensitive
])
def test_underflow_rounding_modes_on_a_tie(mode, pos, neg):
    rows = rows_of("1.0625,-1.0625", "--format", "e4m3fn", "--rounding", mode)
    assert [r["stored"] for r in rows] == [pos, neg]
    assert all(r["status"] == "rounded" for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("mode, expected", [
    # 1.1875 = 1.125 + 0.0625: the tie rounds to the even 1.25 (mantissa 010)
    ("nearest-even", 1.25), ("nearest-away", 1.25), ("toward-zero", 1.125),
    ("up", 1.25), ("down", 1.125),
])
def test_underflow_rounding_modes_tie_to_even_upward(mode, expected):
    assert one_row("1.1875", "--format", "e4m3fn", "-r", mode)["stored"] == expected


def test_underflow_default_rounding_is_nearest_even():
    assert one_row("1.0625", "--format", "e4m3fn")["stored"] == 1.0
    assert one_row("1.1875", "--format", "e4m3fn")["stored"] == 1.25


def test_underflow_stochastic_rounding_is_reproducible_and_picks_a_neighbour():
    values = ",".join(["1.0625"] * 64)
    first = rows_of(values, "--format", "e4m3fn", "-r", "stochastic", "--seed", "7")
    again = rows_of(values, "--format", "e4m3fn", "-r", "stochastic", "--seed", "7")
    other = rows_of(values, "--format", "e4m3fn", "-r", "stochastic", "--seed", "8")
    stored = [r["stored"] for r in first]
    assert stored == [r["stored"] for r in again]
    assert set(stored) == {1.0, 1.125}  # only the two neighbours, both drawn (p = 2^-63 miss)
    assert stored != [r["stored"] for r in other]


def test_underflow_stochastic_rounding_keeps_exact_values():
    rows = rows_of("1.125,0.5,448", "--format", "e4m3fn", "-r", "stochastic", "--seed", "3")
    assert [r["stored"] for r in rows] == [1.125, 0.5, 448.0]
    assert {r["status"] for r in rows} == {"exact"}


@pytest.mark.parametrize("seed", ["0", "1", "12345"])
def test_underflow_stochastic_neighbours_are_the_grid_points(seed):
    # 0.3 in e4m3fn: neighbours 0.28125 and 0.3125 (spacing 2^-5 in [0.25, 0.5))
    rows = rows_of(",".join(["0.3"] * 16), "--format", "e4m3fn", "-r", "stochastic", "--seed", seed)
    assert {r["stored"] for r in rows} <= {0.28125, 0.3125}


def test_underflow_overflow_ieee_vs_saturate():
    ieee = one_row("500", "--format", "e4m3fn")
    assert ieee["stored"] == "nan" and ieee["status"] == "overflow"
    assert ieee["survives"] is False
    explicit = one_row("500", "--format", "e4m3fn", "--overflow", "ieee")
    assert explicit == ieee
    sat = rows_of("500,-500,inf", "--format", "e4m3fn", "--overflow", "saturate")
    assert [r["stored"] for r in sat] == [448.0, -448.0, 448.0]
    assert {r["status"] for r in sat} == {"saturated"}
    assert all(r["survives"] for r in sat)


def test_underflow_overflow_float16_to_inf_and_saturated():
    row = one_row("1e6", "--format", "fp16")
    assert row["stored"] == "inf" and row["status"] == "overflow"
    row = one_row("1e6", "--format", "fp16", "--overflow", "SATURATE")
    assert row["stored"] == 65504 and row["status"] == "saturated"
    row = one_row("-1e6", "--format", "fp16")
    assert row["stored"] == "-inf" and row["status"] == "overflow"


def test_underflow_toward_zero_never_overflows():
    row = one_row("1e6", "--format", "fp16", "-r", "toward-zero")
    assert row["stored"] == 65504 and row["status"] == "saturated"


# -- fates ------------------------------------------------------------------------------------

FATE_CASES = [
    ("1", "fp16", (), "exact"),
    ("0.1", "fp16", (), "rounded"),
    ("1e-6", "fp16", (), "subnormal"),
    ("1e-8", "fp16", (), "flushed"),
    ("1e6", "fp16", (), "overflow"),
    ("500", "e4m3fn", (), "overflow"),
    ("500", "e4m3fn", ("--overflow", "saturate"), "saturated"),
    ("100", "fp4", (), "saturated"),  # FP4 has neither inf nor NaN: always clips
    ("nan", "fp4", (), "invalid"),
    ("-1", "e8m0", (), "invalid"),
    ("0", "e8m0", (), "invalid"),
    ("nan", "fp16", (), "exact"),
    ("-0", "fp16", (), "exact"),
]


@pytest.mark.slow
@pytest.mark.parametrize("value, fmt, extra, fate", FATE_CASES)
def test_underflow_fates(value, fmt, extra, fate):
    row = one_row(value, "--format", fmt, *extra)
    assert row["status"] == fate
    if fate == "invalid":
        assert row["stored"] == "nan"
        assert row["survives"] is False


def test_underflow_every_fate_is_produced():
    assert {fate for *_, fate in FATE_CASES} == {f.value for f in Fate}


def test_underflow_subnormal_fate_after_scaling_and_flushed_when_not_enough():
    # 1e-12 * 4096 ~ 4.1e-9 is below half fp16's smallest subnormal (2^-25 ~ 3e-8)
    row = one_row("1e-12", "--format", "fp16", "-s", "4096")
    assert row["scaled_status"] == "flushed" and row["survives"] is False
    row = one_row("1e-12", "--format", "fp16", "-s", "2**20")
    assert row["scaled_status"] == "subnormal" and row["survives"] is True


# -- errors -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, starts", [
    (("abc",), "Error: cannot read 'abc'"),
    (("1e-8,abc",), "Error: cannot read 'abc'"),
    (("1e999",), "Error: '1e999' is outside float64's range"),
    (("2**-5000",), "Error: '2**-5000' is outside float64's range"),
    (("2**-1080",), "Error: '2**-1080' is outside float64's range"),
    (("1e-8", "--scale", "0"), "Error: a scale must be a positive finite number"),
    (("1e-8", "--scale", "-2"), "Error: a scale must be a positive finite number"),
    (("1e-8", "--scale", "inf"), "Error: a scale must be a positive finite number"),
    (("1e-8", "--scale", "4096,nan"), "Error: a scale must be a positive finite number"),
    (("1e-8", "--scale", "x4"), "Error: cannot read 'x4'"),
    (("1e-8", "--format", "fp99"), "Error: unknown format 'fp99'"),
    (("1e-8", "-x"), "Error: cannot read '-x'"),
])
def test_underflow_errors_one_line(args, starts):
    result = invoke("underflow", *args, "--json")
    assert_usage_error(result)
    assert result.stderr.startswith(starts), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, mention", [
    (("1e-8", "--rounding", "nearest"), "--rounding"),
    (("1e-8", "-r", "bogus"), "--rounding"),
    (("1e-8", "--overflow", "clip"), "--overflow"),
    (("1e-8", "--seed", "abc"), "--seed"),
    ((), "Missing argument"),
    (("1e-8", "--scal", "3"), "--scal"),
    (("1e-8", "--jsn"), "--jsn"),
    (("1e-8", "--scale"), "--scale"),
])
def test_underflow_click_usage_errors(args, mention):
    result = invoke("underflow", *args)
    assert_usage_error(result, mention)


def test_underflow_negative_seed_is_a_usage_error():
    result = invoke("underflow", "1.0625", "--format", "e4m3fn", "-r", "stochastic", "--seed", "-1")
    assert_no_traceback(result)
    assert result.exit_code in (0, 2)


@pytest.mark.parametrize("text", ["0x", "0x1p2000"])
def test_underflow_bad_hex_value_is_a_usage_error(text):
    result = invoke("underflow", text, "--json")
    assert_usage_error(result)


def test_underflow_hex_value_below_float64_is_a_usage_error():
    result = invoke("underflow", "0x1p-2000", "--format", "fp16", "--json")
    assert_usage_error(result)


def test_underflow_empty_value_list_is_a_usage_error():
    result = invoke("underflow", ",", "--json")
    assert_usage_error(result)


def test_underflow_scaled_value_overflowing_float64_does_not_survive():
    row = one_row("1e308", "--format", "fp32", "--scale", "4096")
    assert row["recovered"] == "inf"
    assert row["survives"] is False


def test_underflow_scaled_value_underflowing_float64_does_not_survive():
    row = one_row("1e-30", "--format", "fp32", "--scale", "1e-300")
    assert row["recovered"] == 0 and row["recovered_rel_error"] == 1
    assert row["survives"] is False


def test_underflow_repeated_scale_keeps_one_row_per_scale():
    rows = rows_of("1e-8", "--format", "fp16", "--scale", "4096", "--scale", "2**12")
    assert len(rows) == 2


def test_underflow_repeated_values_keep_one_row_each():
    rows = rows_of("1e-8,1e-8", "--format", "fp16")
    assert len(rows) == 2
