"""How a command ends when something goes wrong inside it (cli.app's guard): a bug is one
``Error:`` line and exit 70 (``FMT_TRACEBACK=1``, set for the whole suite, re-raises it
instead), Ctrl-C is exit 130, a warning one ``Note:`` line, running out of memory a data error.
"""

from __future__ import annotations

import os
import warnings

from cli_helpers import assert_data_error, invoke, strict_loads


def injected_bug(*args, **kwargs):
    raise RuntimeError("injected bug\nwith a second line")


def test_an_internal_error_is_one_line_with_exit_code_70(monkeypatch):
    monkeypatch.setattr("fmtcli.underflow.underflow_table", injected_bug)
    result = invoke("underflow", "1", env={"FMT_TRACEBACK": None})
    assert result.exit_code == 70
    assert result.stdout == ""
    assert result.stderr == ("Error: internal error: RuntimeError: injected bug\\nwith a second "
                             "line (please report it; FMT_TRACEBACK=1 shows the traceback)\n")


def test_fmt_traceback_lets_the_internal_error_raise(monkeypatch):
    monkeypatch.setattr("fmtcli.underflow.underflow_table", injected_bug)
    result = invoke("underflow", "1", env={"FMT_TRACEBACK": "1"})
    assert isinstance(result.exception, RuntimeError)


def test_the_suite_runs_with_tracebacks_on():
    assert os.environ.get("FMT_TRACEBACK") == "1"


def test_ctrl_c_is_aborted_with_exit_code_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fmtcli.underflow.underflow_table", interrupted)
    result = invoke("underflow", "1")
    assert result.exit_code == 130
    assert result.stderr == "Aborted.\n"


def test_a_warning_becomes_one_note_line(monkeypatch):
    from fmtcli.underflow import underflow_table as real

    def warns(*args, **kwargs):
        warnings.warn("overflow encountered in multiply (injected)", RuntimeWarning,
                      stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr("fmtcli.underflow.underflow_table", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = invoke("underflow", "1", "--json")
    assert result.exit_code == 0
    strict_loads(result.stdout)
    assert result.stderr == ("Note: overflow encountered in multiply (injected) "
                             "(RuntimeWarning)\n")


def test_out_of_memory_is_a_data_error(monkeypatch):
    """A MemoryError (an input or options beyond this process's memory) is one line with
    exit 1, not an internal error."""

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("fmtcli.underflow.underflow_table", exhausted)
    monkeypatch.delenv("FMT_TRACEBACK", raising=False)
    assert_data_error(invoke("underflow", "1"), "Error: out of memory")
