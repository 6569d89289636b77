"""A standard output that cannot take what fmt prints: closed at start (``>&-``), a full disk
(``/dev/full``), a reader that goes away (``| head -c 10``), an encoding without Unicode
(ASCII, the C locale).  One ``Error:`` line or a quiet end, never a traceback; through the
real command in a subprocess, where the failure needs one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_helpers import run_fmt, run_fmt_each

pytestmark = pytest.mark.slow

# -- a closed stdout --------------------------------------------------------------------------

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


# -- a full disk, a closed pipe ---------------------------------------------------------------

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


# -- streams that cannot encode Unicode -------------------------------------------------------

ASCII_COMMANDS = [["range"], ["range", "--all"], ["underflow", "1e-8", "68.00000357"],
                  ["underflow", "1e-8", "--scale", "1024"], ["quantize"],
                  ["scale-search"], ["loss-scale", "--histogram"],
                  ["check-backends", "e2m1"]]


@pytest.mark.parametrize("environment", [{"PYTHONIOENCODING": "ascii"},
                                         {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                          "PYTHONCOERCECLOCALE": "0",
                                          "PYTHONIOENCODING": ""}])
def test_output_degrades_to_ascii(environment):
    """One interpreter per environment, each command in a child forked from it
    (cli_helpers.run_fmt_each): the streams are the ones Python set up for the environment."""
    ran = run_fmt_each(ASCII_COMMANDS, env={"COLUMNS": "100", **environment})
    for args, (code, stdout, stderr) in zip(ASCII_COMMANDS, ran):
        stderr = stderr.decode(errors="replace")
        assert code == 0, (args, stderr)
        assert "Traceback" not in stderr
        stdout.decode("ascii")  # nothing a C locale cannot show
        assert len(stdout) > 100, args
