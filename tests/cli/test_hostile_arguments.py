"""Hostile command-line arguments (issue 9, items 8, 15, 16 and the battery): numbers with
thousands of digits, empty names, paths with newlines, standard input given twice or empty,
and ~70 malformed options.  Each is refused with exit 2 (usage) or 1 (data), exactly one
``Error:`` line on stderr, nothing on stdout and nothing written.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_error, assert_usage_error, invoke, strict_loads

BIG = "9" * 5000


LONG = "x" * 100_000


@pytest.fixture
def data(tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(-3, 3, 256, dtype=np.float32))
    return tmp_path / "x.npy"


# -- numbers with thousands of digits ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["underflow", BIG], ["underflow", "0." + "1" * 5000], ["underflow", "1e999999999999"],
    ["underflow", "1", "--scale", BIG], ["underflow", "1", "--scale", "0." + "1" * 5000],
    ["underflow", "1e" + BIG], ["underflow", "2**" + BIG], ["underflow", "0x1p" + BIG],
    ["range", f"e{BIG}m1"], ["range", "e1m999999"], ["range", f"e5m2_b{BIG}"],
    ["range", f"e5m{BIG}"], ["quantize", "--fixed-scale", BIG],
])
def test_huge_numbers_in_arguments_are_usage_errors(args):
    assert_usage_error(invoke(*args))


def test_a_long_exact_decimal_is_still_read():
    # 2**-1074 written out exactly has 751 significant digits: a number, not an attack
    exact = format(np.ldexp(1.0, -1074), ".1100f").rstrip("0")
    result = invoke("underflow", exact, "--format", "fp64" if False else "fp32", "--json")
    assert result.exit_code == 0, result.stderr
    assert strict_loads(result.stdout)[0]["value"] == 5e-324


# -- paths with newlines, empty names ---------------------------------------------------------

def test_a_path_with_a_newline_makes_a_one_line_error(tmp_path):
    message = assert_usage_error(invoke("quantize", "--out", str(tmp_path / "a\nb.txt")))
    assert "a\\nb.txt" in message


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["quantize", "--format", ""], ["quantize", "--format", " "], ["quantize", "--recipe", ""],
    ["quantize", "--tile", ""], ["scale-search", "--format", ""], ["scale-search", "--tile", ""],
    ["loss-scale", "--format", ""], ["underflow", "1", "--format", ""],
    ["underflow", "1", "--scale", ""], ["underflow", ""], ["range", ""],
    ["check-backends", ""], ["check-backends", "--format", ""],
    ["quantize", "--format", "e4m3,"], ["range", "e4m3,,e5m2"], ["underflow", "1,,2"],
])
def test_empty_names_are_refused_everywhere(args):
    assert_usage_error(invoke(*args))


def test_an_empty_key_is_refused(data):
    assert "--key" in assert_usage_error(invoke("quantize", data, "--key", ""))


# -- standard input ---------------------------------------------------------------------------

def test_stdin_given_twice_is_a_usage_error():
    assert_usage_error(invoke("quantize", "-", "-", input="1 2 3\n"),
                       "Error: '-' (standard input) is given more than once")


def test_quantize_of_empty_stdin_is_a_data_error():
    assert_data_error(invoke("quantize", "-", input=""))


# -- a battery of hostile arguments -----------------------------------------------------------

HOSTILE = [
    ["underflow", "--5"], ["underflow", "1e"], ["underflow", "0x"], ["underflow", "2**"],
    ["underflow", "2^-1e3"], ["underflow", "1e-400"], ["underflow", "0x1p-2000"],
    ["underflow", "--bogus"], ["underflow", "abc"], ["underflow", "1", "--format", "nope"],
    ["underflow", "1", "--format", "e4m3\u2603"], ["underflow", "1", "-r", "sideways"],
    ["underflow", "1", "--overflow", ""], ["underflow", "1", "--backend", "cupy"],
    ["underflow", "1", "--scale", "0**-1"], ["underflow", "1", "--scale", "nan"],
    ["underflow", LONG], ["range", LONG], ["range", "e0m3"], ["range", "e12m3"],
    ["range", "e4m3_b9999"], ["range", "\u0661"], ["range", "e4m3\nx"],
    ["quantize", "--block", "0"], ["quantize", "--block", "-1"], ["quantize", "--block", BIG],
    ["quantize", "--block", "2**40"], ["quantize", "--tile", "0x5"],
    ["quantize", "--tile", "1x1x1"], ["quantize", "--tile", "x"], ["quantize", "--tile", LONG],
    ["quantize", "--chunk", "0"], ["quantize", "--chunk", BIG], ["quantize", "--workers", "0"],
    ["quantize", "--workers", "100000"], ["quantize", "--margin", str(10**30)],
    ["quantize", "--margin", "-1"], ["quantize", "--margin", "nan"],
    ["quantize", "--format", LONG], ["quantize", "--format", "e4m3,e5m2"],
    ["quantize", "--recipe", "nope"], ["quantize", "--recipe", LONG],
    ["quantize", "--key", "w"], ["quantize", "--compare", "most"],
    ["quantize", "--axis", "1"], ["quantize", "--axis", BIG], ["quantize", "--per", ""],
    ["quantize", "--block", "32", "--per", "row"], ["quantize", "--out", "x.txt"],
    ["quantize", "--out", LONG + ".npy"], ["quantize", "--out", ""],
    ["quantize", "--compare", "all", "--out", "x.npy"], ["quantize", "/nonexistent.npy"],
    ["quantize", LONG], ["quantize", "--recipe", "nvfp4", "--scale-rule", "pow2-floor"],
    ["quantize", "--backend", "torch", "--format", "e2m1"],
    ["scale-search", "--history", "0"], ["scale-search", "--history", BIG],
    ["scale-search", "--metric", "vibes"], ["scale-search", "--histogram"],
    ["scale-search", "--loss-scale", "--block", "32"], ["scale-search", "--seed", "1"],
    ["scale-search", "--format", "e4m3,e5m2"], ["scale-search", "--workers", "-3"],
    ["check-backends", "nope"], ["check-backends", "--seed", "x"], ["--bogus"], ["nope"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", HOSTILE, ids=[" ".join(a)[:40] for a in HOSTILE])
def test_hostile_arguments_are_refused_in_one_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_error(invoke(*args), (1, 2))
    assert os.listdir(tmp_path) == []
