"""Hostile inputs, round 2 of the independent battery: a stdout closed at start (``>&-``),
tables of very many rows, and other corners found by /tmp/battery2.  Through the real
command, in a subprocess where the failure needs one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def fmt(*args, env=None, close_stdout=False, timeout=120):
    """Run ``python -m fmtcli`` as a user would (no FMT_TRACEBACK)."""
    environment = {**os.environ, "COLUMNS": "80", **(env or {})}
    environment.pop("FMT_TRACEBACK", None)
    command = [sys.executable, "-m", "fmtcli", *args]
    if close_stdout:  # the shell's '>&-': the program starts without descriptor 1
        command = ["bash", "-c", 'exec "$@" >&-', "fmt", *command]
    return subprocess.run(command, capture_output=True, env=environment, timeout=timeout)


@pytest.mark.parametrize("args", [["range"], ["underflow", "1", "--json"], ["quantize"],
                                  ["--version"], [], ["range", "--help"]])
def test_a_closed_stdout_is_one_error_line(args):
    """Python starts with sys.stdout = None when descriptor 1 is closed; writing the results
    crashed with AttributeError (exit 70, 'internal error')."""
    done = fmt(*args, close_stdout=True)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1, lines
    assert lines == ["Error: standard output is closed: nothing could be printed (redirect "
                     "it to a file or to /dev/null)"]


def test_a_closed_stdout_writes_no_out_file(tmp_path):
    """Refused before any work: --out is not written (and no file can take descriptor 1)."""
    done = fmt("quantize", "--out", str(tmp_path / "x.npy"), close_stdout=True)
    assert done.returncode == 1
    assert os.listdir(tmp_path) == []
