"""Hostile inputs, round 3: names that carry rich markup or terminal escapes, a stdout that
cannot be written (a full disk, a closed pipe), memory exhaustion.  Each through the real
command, in a subprocess where the failure needs one."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fmtcli.cli import app

RUNNER = CliRunner()


def safetensors(path, tensors: dict) -> str:
    header, data, offset = {}, b"", 0
    for key, array in tensors.items():
        raw = np.ascontiguousarray(array, np.float32).tobytes()
        header[key] = {"dtype": "F32", "shape": list(array.shape),
                       "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + data)
    return str(path)


def fmt(*args, stdout=subprocess.PIPE, env=None):
    environment = {**os.environ, "COLUMNS": "80", **(env or {})}
    environment.pop("FMT_TRACEBACK", None)  # as a user runs it
    return subprocess.run([sys.executable, "-m", "fmtcli", *args], stdout=stdout,
                          stderr=subprocess.PIPE, env=environment, timeout=120)


MARKUP_KEYS = {"[/bad]": np.zeros(4), "[bold red]x": np.ones(4), "ok": np.arange(8.0)}


@pytest.mark.parametrize("command", [["quantize"], ["scale-search"],
                                     ["loss-scale"],
                                     ["quantize", "--per", "column"]])
def test_names_with_rich_markup_are_shown_as_written(tmp_path, command):
    """A checkpoint key like '[/bad]' is text, not markup (it crashed scale-search's caption
    with MarkupError)."""
    path = safetensors(tmp_path / "m.safetensors", MARKUP_KEYS)
    result = RUNNER.invoke(app, [*command, path], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    if command == ["quantize"]:
        assert "[/bad]" in result.stdout and "[bold red]x" in result.stdout


def test_control_characters_in_names_are_escaped_in_tables(tmp_path):
    """A key holding an escape sequence, a newline or a bidi override cannot drive the
    terminal or break the table's lines: it is shown escaped, as Python writes it."""
    path = safetensors(tmp_path / "k.safetensors", {
        "a\x1b[31mred": np.ones(4), "b\nnewline": np.ones(4), "c\u202eRTL": np.ones(4),
        "k" * 5000: np.ones(4)})
    result = RUNNER.invoke(app, ["quantize", path], env={"COLUMNS": "80"})
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
        done = fmt(*args, stdout=full)
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
    result = RUNNER.invoke(app, ["underflow", "1"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: out of memory") and result.stderr.count("\n") == 1


def test_stdin_given_twice_is_a_usage_error():
    result = RUNNER.invoke(app, ["quantize", "-", "-"], input="1 2 3\n")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: '-' (standard input) is given more than once")


def test_a_table_of_many_values_renders_once(table_renders):
    """A layout that fits is rendered once, not once to check and again to print (a table of
    thousands of rows took twice as long)."""
    result = RUNNER.invoke(app, ["underflow", "1,2,3", "--format", "fp16"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert len(table_renders) == 1, table_renders


def test_plain_fmt_lists_every_command_without_cutting_its_summary():
    """Click cuts a command's first sentence at ~45 characters with '...'; each command
    has a summary of its own that the listing shows whole (wrapped where narrow)."""
    result = RUNNER.invoke(app, [], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    listing = result.stdout.split("Commands:")[1]
    assert "..." not in listing and "\u2026" not in listing
    for name in ("range", "underflow", "quantize", "scale-search", "check-backends"):
        assert f"  {name} " in listing
