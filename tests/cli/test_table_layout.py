"""Tables as the terminal shows them: above ``PLAIN_ROWS`` rows fmtcli lays a table out itself,
byte for byte as rich would, and thousands of rows never go through rich's Table; a table is
rendered once; every table fits the console; names that hold rich markup or terminal escapes
are shown as written, escaped.
"""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import invoke
from oracle import write_safetensors

# -- tables of many rows ----------------------------------------------------------------------

VALUES = "1e-8,3,70000,-0,nan,inf,68.00000357,1e-300,2**-24,448,-65504"


@pytest.mark.slow
@pytest.mark.parametrize("args", [["underflow", VALUES], ["underflow", VALUES, "-s", "1,4096"],
                                  ["underflow", VALUES, "--format", "e2m1,bf16,e11m52"],
                                  ["underflow", "1"]])
@pytest.mark.parametrize("columns", [20, 40, 80, 120, 200])
@pytest.mark.parametrize("colour", [{}, {"FORCE_COLOR": "1", "TERM": "xterm"}])
def test_large_tables_are_drawn_exactly_as_rich_draws_them(monkeypatch, args, columns, colour):
    """Above render.PLAIN_ROWS rows a table of one-line cells (or its records) is laid out
    by fmtcli, not by rich; every byte (padding, rules, sections, styles) is the same."""
    from fmtcli import render

    env = {"COLUMNS": str(columns), **colour}
    monkeypatch.setattr(render, "PLAIN_ROWS", 10**9)
    by_rich = invoke(*args, env=env)
    monkeypatch.setattr(render, "PLAIN_ROWS", 0)
    by_us = invoke(*args, env=env)
    assert by_rich.exit_code == by_us.exit_code == 0
    assert by_us.stdout == by_rich.stdout


@pytest.mark.slow
@pytest.mark.parametrize("columns", ["200", "80", "40"])
def test_a_table_of_thousands_of_values_is_not_laid_out_by_rich(table_renders, columns):
    """rich lays a table out at ~0.1 ms a row: 100,000 values in six formats took minutes
    (and as records, at 40 columns, longer).  Thousands of rows skip rich's Table."""
    values = ",".join(str(i) for i in range(1, 501))
    result = invoke("underflow", values, env={"COLUMNS": columns})
    assert result.exit_code == 0
    assert table_renders == []
    lines = result.stdout.splitlines()
    assert "500" in result.stdout and max(map(len, lines)) <= int(columns)


def test_a_table_of_many_values_renders_once(table_renders):
    """A layout that fits is rendered once, not once to check and again to print (a table of
    thousands of rows took twice as long)."""
    result = invoke("underflow", "1,2,3", "--format", "fp16")
    assert result.exit_code == 0
    assert len(table_renders) == 1, table_renders


# -- widths -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [
    ["range"], ["range", "--all"], ["underflow", "1e-8", "68.00000357", "--scale", "1024"],
    ["underflow", "1e-8", "2**-24"], ["quantize"], ["quantize", "--compare", "all"],
    ["check-backends", "e2m1"],
])
def test_every_table_fits_the_console(args, columns):
    result = invoke(*args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= columns
    assert "\u2026" not in result.stdout


# -- names that are not text to a terminal ----------------------------------------------------

def safetensors(path, tensors: dict) -> str:
    """``tensors`` as float32 in a .safetensors file (oracle's writer); its path as text."""
    write_safetensors(path, {k: np.asarray(v, np.float32) for k, v in tensors.items()})
    return str(path)


MARKUP_KEYS = {"[/bad]": np.zeros(4), "[bold red]x": np.ones(4), "ok": np.arange(8.0)}


@pytest.mark.slow
@pytest.mark.parametrize("command", [["quantize"], ["scale-search"],
                                     ["loss-scale"],
                                     ["quantize", "--per", "column"]])
def test_names_with_rich_markup_are_shown_as_written(tmp_path, command):
    """A checkpoint key like '[/bad]' is text, not markup (it crashed scale-search's caption
    with MarkupError)."""
    path = safetensors(tmp_path / "m.safetensors", MARKUP_KEYS)
    result = invoke(*command, path, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    if command == ["quantize"]:
        assert "[/bad]" in result.stdout and "[bold red]x" in result.stdout


def test_control_characters_in_names_are_escaped_in_tables(tmp_path):
    """A key holding an escape sequence, a newline or a bidi override cannot drive the
    terminal or break the table's lines: it is shown escaped, as Python writes it."""
    path = safetensors(tmp_path / "k.safetensors", {
        "a\x1b[31mred": np.ones(4), "b\nnewline": np.ones(4), "c\u202eRTL": np.ones(4),
        "k" * 5000: np.ones(4)})
    result = invoke("quantize", path, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "\x1b" not in out and "\u202e" not in out
    assert "a\\x1b[31mred" in out and "b\\nnewline" in out and "c\\u202eRTL" in out
    assert "characters]" in out  # the 5,000-character key cut in the middle, with a count
    assert max(len(line) for line in out.splitlines()) <= 80
