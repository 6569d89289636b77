"""Hostile inputs, round 3: names that carry rich markup or terminal escapes, a stdout that
cannot be written (a full disk, a closed pipe), memory exhaustion.  Each through the real
command, in a subprocess where the failure needs one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_usage_error, invoke, run_fmt
from oracle import write_safetensors


def safetensors(path, tensors: dict) -> str:
    """``tensors`` as float32 in a .safetensors file (oracle's writer); its path as text."""
    write_safetensors(path, {k: np.asarray(v, np.float32) for k, v in tensors.items()})
    return str(path)


MARKUP_KEYS = {"[/bad]": np.zeros(4), "[bold red]x": np.ones(4), "ok": np.arange(8.0)}


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


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["range"], ["quantize", "--json"], ["--version"], [],
                                  ["quantize", "--help"], ["loss-scale"]])
def test_a_full_disk_on_stdout_is_one_error_line(args):
    with open("/dev/full", "w") as full:
        done = run_fmt(*args, stdout=full)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1, lines
    assert len(lines) == 1 and lines[0].startswith("Error:") and "space" in lines[0], lines


def test_a_closed_pipe_ends_quietly():
    """``fmt range --all | head -c 10``: the reader goes away; no traceback, no
    'Exception ignored' line, exit 0 or 1."""
    environment = {**os.environ, "COLUMNS": "80"}
    environment.pop("FMT_TRACEBACK", None)
    process = subprocess.Popen([sys.executable, "-m", "fmtcli", "underflow",
                                ",".join(["1e-8"] * 3000), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
    process.stdout.read(10)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) in (0, 1)
    assert stderr == "", stderr


def test_out_of_memory_is_a_data_error(monkeypatch):
    """A MemoryError (an input or options beyond this process's memory) is one line with
    exit 1, not an internal error."""

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("fmtcli.underflow.underflow_table", exhausted)
    monkeypatch.delenv("FMT_TRACEBACK", raising=False)
    assert_data_error(invoke("underflow", "1"), "Error: out of memory")


def test_stdin_given_twice_is_a_usage_error():
    assert_usage_error(invoke("quantize", "-", "-", input="1 2 3\n"),
                       "Error: '-' (standard input) is given more than once")


def test_a_table_of_many_values_renders_once(table_renders):
    """A layout that fits is rendered once, not once to check and again to print (a table of
    thousands of rows took twice as long)."""
    result = invoke("underflow", "1,2,3", "--format", "fp16")
    assert result.exit_code == 0
    assert len(table_renders) == 1, table_renders


def test_plain_fmt_lists_every_command_without_cutting_its_summary():
    """Click cuts a command's first sentence at ~45 characters with '...'; each command
    has a summary of its own that the listing shows whole (wrapped where narrow)."""
    result = invoke(env={"COLUMNS": "80"})
    assert result.exit_code == 0
    listing = result.stdout.split("Commands:")[1]
    assert "..." not in listing and "\u2026" not in listing
    for name in ("range", "underflow", "quantize", "scale-search", "check-backends"):
        assert f"  {name} " in listing
