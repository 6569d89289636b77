"""Hostile inputs, round 2 of the independent battery: a stdout closed at start (``>&-``),
tables of very many rows, and other corners found by /tmp/battery2.  Through the real
command, in a subprocess where the failure needs one."""

from __future__ import annotations

import os

import pytest
from cli_helpers import invoke, run_fmt


@pytest.mark.parametrize("args", [["range"], ["underflow", "1", "--json"], ["quantize"],
                                  ["--version"], [], ["range", "--help"]])
def test_a_closed_stdout_is_one_error_line(args):
    """Python starts with sys.stdout = None when descriptor 1 is closed; writing the results
    crashed with AttributeError (exit 70, 'internal error')."""
    done = run_fmt(*args, close_stdout=True)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1, lines
    assert lines == ["Error: standard output is closed: nothing could be printed (redirect "
                     "it to a file or to /dev/null)"]


def test_a_closed_stdout_writes_no_out_file(tmp_path):
    """Refused before any work: --out is not written (and no file can take descriptor 1)."""
    done = run_fmt("quantize", "--out", str(tmp_path / "x.npy"), close_stdout=True)
    assert done.returncode == 1
    assert os.listdir(tmp_path) == []


VALUES = "1e-8,3,70000,-0,nan,inf,68.00000357,1e-300,2**-24,448,-65504"


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
