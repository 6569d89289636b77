"""A standard output that cannot take what fmt prints: closed at start (``>&-``), a full disk
(``/dev/full``), a reader that goes away (``| head -c 10``), an encoding without Unicode
(ASCII, the C locale).  One ``Error:`` line or a quiet end, never a traceback; through the
real command in a subprocess, where the failure needs one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_helpers import run_fmt

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


#: One interpreter per environment runs every command, each in a child forked from it before
#: any command ran (a fresh command's state, the streams Python set up at start-up for that
#: environment): one start-up per environment instead of one per command.  Each child's
#: stdout ends with SEPARATOR; the parent prints the exit codes on its stdout's last line.
SEPARATOR = "\n=== next command ===\n"
DRIVER = f"""
import json, os, sys
import fmtcli.cli
codes = []
for args in json.loads(sys.argv[1]):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        sys.argv = ["fmtcli", *args]
        code = 0
        try:
            fmtcli.cli.main(prog_name="fmtcli")
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    os.write(1, {SEPARATOR!r}.encode())
print(json.dumps(codes))
"""


@pytest.mark.parametrize("environment", [{"PYTHONIOENCODING": "ascii"},
                                         {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                          "PYTHONCOERCECLOCALE": "0",
                                          "PYTHONIOENCODING": ""}])
def test_output_degrades_to_ascii(environment):
    env = {**os.environ, "COLUMNS": "100", **environment}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(ASCII_COMMANDS)],
                          capture_output=True, env=env, timeout=240)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    *outputs, codes = proc.stdout.split(SEPARATOR.encode())
    assert json.loads(codes) == [0] * len(ASCII_COMMANDS), stderr
    assert len(outputs) == len(ASCII_COMMANDS)
    for args, stdout in zip(ASCII_COMMANDS, outputs):
        stdout.decode("ascii")  # nothing a C locale cannot show
        assert len(stdout) > 100, args
