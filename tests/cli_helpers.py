"""How the tests drive ``fmt`` and judge what it printed (not a test module itself).

- ``invoke``: the command in-process through typer's CliRunner (stdout and stderr apart),
  wide (COLUMNS=200) unless ``env`` says otherwise; ``run_fmt``: the real program in a
  subprocess, as a user runs it (no FMT_TRACEBACK, COLUMNS=80 unless ``env`` says otherwise);
  ``run_fmt_each``: several commands so, in one interpreter, each in a child forked from it;
- ``succeeds``: a run that must exit 0 without a traceback; ``strict_loads``/``json_of``/
  ``quantize_json``: a ``--json`` document, parsed strictly (the non-standard NaN/Infinity
  literals fail the test);
- ``assert_usage_error``/``assert_data_error``/``assert_error``: the shape of every refusal
  (exit 2 or 1, nothing on stdout, exactly one ``Error: ...`` line on stderr, no traceback);
- ``assert_fits``: a table at a terminal width: nothing cut with "…", no line wider;
  ``cuda_available``: whether torch sees a CUDA GPU (tests that need one skip without);
- the engine's parallelism option under either of its names.

The independent reference the figures are checked against is tests/oracle.py.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from fmtcli.cli import app
from fmtcli.cli.app import command_name

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
# An error line this long echoes a hostile argument whole (a 100 kB value is cut).
MAX_ERROR_LINE = 2500


# -- running fmt ---------------------------------------------------------------------------

def invoke(*args, env: dict | None = None, input: str | None = None):
    """``fmt ARGS`` through CliRunner; ``env`` is merged over COLUMNS=200 (a value of None
    unsets a variable); arguments are passed as str() (paths welcome).

    As fmt's entry point (``fmtcli.cli.app.main``) does, typer is handed only the command
    asked for (the whole group for ``fmt``, ``--help``, a mistyped command): it builds the
    parser of every registered command otherwise, ~25 ms of each invocation here."""
    words = [str(a) for a in args]
    every = app.registered_commands
    asked = [info for info in every if words[:1] == [command_name(info)]]
    app.registered_commands = asked or every
    try:
        return runner.invoke(app, words, env={**WIDE, **(env or {})}, input=input)
    finally:
        app.registered_commands = every


def run_fmt(*args, env: dict | None = None, stdout=subprocess.PIPE, close_stdout: bool = False,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m fmtcli ARGS`` in a subprocess as a user runs it: no FMT_TRACEBACK, COLUMNS=80
    merged under ``env``; stderr captured as bytes.  ``close_stdout`` starts it without
    descriptor 1 (the shell's ``>&-``); ``stdout`` may be a file (e.g. /dev/full)."""
    environment = {**os.environ, "COLUMNS": "80", **(env or {})}
    environment.pop("FMT_TRACEBACK", None)
    command = [sys.executable, "-m", "fmtcli", *map(str, args)]
    if close_stdout:
        command = ["bash", "-c", 'exec "$@" >&-', "fmt", *command]
    return subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, env=environment,
                          timeout=timeout)


#: the end of each command's output in run_fmt_each's streams
SEPARATOR = "\n=== next command ===\n"
_EACH = f"""
import importlib, json, os, sys
import fmtcli.cli
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
codes = []
for args, env in json.loads(sys.argv[1]):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for name, value in env.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
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
    os.write(2, {SEPARATOR!r}.encode())
print(json.dumps(codes))
"""


def run_fmt_each(commands: list, env: dict | None = None, timeout: float = 240,
                 preload: tuple[str, ...] = ()) -> list[tuple[int, bytes, bytes]]:
    """(exit code, stdout, stderr) of each command of ``commands`` (lists of arguments, or
    (arguments, environment) pairs), run as ``python -m fmtcli`` does in ONE interpreter
    started with ``env`` merged over the environment (no FMT_TRACEBACK, COLUMNS=80 unless
    ``env`` says otherwise; a value of None unsets a variable): each command in a child forked
    before any ran, so each starts from a fresh command's state and from the streams Python
    set up at start-up.  A command's own environment (None unsets) is applied in its child:
    only for what is read while a command runs (COLUMNS), not at start-up (the locale,
    PYTHONIOENCODING).  One interpreter start instead of one per command.  ``preload``:
    modules that interpreter imports before the first fork, so that no child imports them
    again (third-party libraries slow to import: ml_dtypes takes ~1.3 s on this project's
    machines, most of a small command's time); fmt's own modules are still imported by each
    command as it runs.  What a preload prints lands in the first command's streams."""
    environment = {**os.environ, "COLUMNS": "80", **(env or {})}
    environment.pop("FMT_TRACEBACK", None)
    environment = {k: v for k, v in environment.items() if v is not None}
    pairs = [(list(map(str, c)), {}) if isinstance(c, list) else (list(map(str, c[0])), c[1])
             for c in commands]
    done = subprocess.run([sys.executable, "-c", _EACH, json.dumps(pairs), json.dumps(preload)],
                          capture_output=True, env=environment, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    *outputs, codes = done.stdout.split(SEPARATOR.encode())
    errors = done.stderr.split(SEPARATOR.encode())[:-1]
    assert len(outputs) == len(errors) == len(pairs), done.stderr.decode(errors="replace")
    return list(zip(json.loads(codes), outputs, errors))


# -- JSON ----------------------------------------------------------------------------------

def strict_loads(text: str):
    """json.loads that refuses the non-standard NaN/Infinity/-Infinity literals."""
    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant!r}")

    return json.loads(text, parse_constant=refuse)


def succeeds(*args, env: dict | None = None, input: str | None = None):
    """``invoke(ARGS)``, which must exit 0 without a traceback; the result."""
    result = invoke(*args, env=env, input=input)
    assert_no_traceback(result)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def json_of(*args, env: dict | None = None, input: str | None = None):
    """Run ``fmt ARGS --json``: it must succeed; the strictly parsed document."""
    return strict_loads(succeeds(*args, "--json", env=env, input=input).stdout)


def quantize_json(*args, input: str | None = None) -> dict:
    """Run ``fmt quantize ARGS --json``: it must succeed; the strictly parsed document."""
    return json_of("quantize", *args, input=input)


def only_scheme(doc: dict, tensor: int = 0) -> dict:
    """The one scheme of ``fmt quantize --json``'s tensor (fails if there are several)."""
    schemes = doc["tensors"][tensor]["schemes"]
    assert len(schemes) == 1, [s["label"] for s in schemes]
    return schemes[0]


# -- tables --------------------------------------------------------------------------------

ELLIPSIS = "\u2026"


def assert_fits(out: str, width: int) -> None:
    """A table printed at ``width`` columns: nothing cut with "…", no line wider."""
    assert ELLIPSIS not in out, out
    too_wide = [line for line in out.splitlines() if len(line) > width]
    assert not too_wide, too_wide


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# -- refusals ------------------------------------------------------------------------------

def assert_no_traceback(result) -> None:
    """No traceback printed and no exception other than the exit itself."""
    assert "Traceback" not in result.stdout
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)


def assert_error(result, code: int | tuple[int, ...], *fragments: str) -> str:
    """A refusal: exit ``code`` (or one of them), nothing on stdout, exactly one line
    'Error: ...' on stderr (of bounded length) holding every fragment, no traceback.
    Returns that line."""
    assert_no_traceback(result)
    codes = code if isinstance(code, tuple) else (code,)
    assert result.exit_code in codes, (result.exit_code, result.stdout[:300], result.stderr[:300])
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr[:500]
    assert lines[0].startswith("Error: "), result.stderr[:500]
    assert len(lines[0]) < MAX_ERROR_LINE, len(lines[0])
    for fragment in fragments:
        assert fragment in lines[0], (fragment, result.stderr[:500])
    return lines[0]


def assert_usage_error(result, *fragments: str) -> str:
    """A usage error (exit 2) in one 'Error: ...' line holding every fragment."""
    return assert_error(result, 2, *fragments)


def assert_data_error(result, *fragments: str) -> str:
    """A data error (exit 1) in one 'Error: ...' line holding every fragment."""
    return assert_error(result, 1, *fragments)


# -- the engine's parallelism option was renamed (threads -> workers); accept either --------

def parallel_kwargs(n: int) -> dict:
    """``quantize()``'s keyword for n workers, under the name this version uses."""
    from fmtcli.quantize import quantize

    params = inspect.signature(quantize).parameters
    return {"workers": n} if "workers" in params else {"threads": n}


def parallel_option() -> str:
    """``fmt quantize``'s option for the number of workers, under this version's name."""
    from fmtcli.quantize import quantize

    return "--workers" if "workers" in inspect.signature(quantize).parameters else "--threads"
