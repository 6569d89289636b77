"""cli_helpers.run_fmt_each, the tests' way of running several commands as ``python -m
fmtcli`` does in one interpreter: each command's exit code, stdout and stderr its own, a
command's COLUMNS applied in its child alone, each child starting from the state before any
command ran."""

from __future__ import annotations

import pytest
from cli_helpers import run_fmt_each


@pytest.mark.slow
def test_each_command_gets_its_own_code_streams_and_columns():
    ran = run_fmt_each([["range", "--bogus"], (["underflow", "1"], {"COLUMNS": "40"}),
                        ["underflow", "1"], ["--version"]], env={"PYTHONIOENCODING": "utf-8"})
    (bad, _, error), (narrow, small, _), (plain, wide, quiet), (version, line, _) = ran
    assert (bad, narrow, plain, version) == (2, 0, 0, 0)
    assert error.decode().startswith("Error: No such option: --bogus")
    assert max(map(len, small.decode().splitlines())) <= 40
    assert 40 < max(map(len, wide.decode().splitlines())) <= 80  # the interpreter's 80
    assert quiet == b""
    assert line.decode().startswith("fmtcli ")
