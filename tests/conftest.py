"""Shared test set-up, and the map of the tests' helper modules.

Helpers are plain modules the tests import (``from cli_helpers import invoke``; pytest puts
tests/ on sys.path); fixtures live here.

- tests/cli_helpers.py: how the tests drive ``fmt`` (``invoke`` through CliRunner at
  COLUMNS=200, ``run_fmt`` in a subprocess as a user runs it, ``succeeds``) and judge what it
  printed (``strict_loads``/``json_of``/``quantize_json``; ``assert_usage_error`` exit 2,
  ``assert_data_error`` exit 1, ``assert_error``: one ``Error:`` line, nothing on stdout);
- tests/oracle.py: the independent reference (brute-force scaled quantization and its float64
  statistics, NVFP4 from its definition, a hand-written .safetensors writer/reader); it does
  not import fmtcli, so it can disagree with it;
- tests/inputs.py: the same arrays written as every input kind fmt reads (``write_input``).
- tests/engine_helpers.py: one in-memory tensor through ``fmtcli.quantize.quantize``
  (``source``, ``stats``: one scheme's JSON statistics; ``heavy``: data past E4M3's max).

FMT_TRACEBACK=1 for the whole suite: the CLI's internal-error guard (any exception that
escapes a command becomes one line and exit code 70) re-raises instead, so a bug shows up as
a failing test with its traceback and no test can pass through the guard.  The guard's own
test (tests/cli/test_error_guard.py) unsets the variable for its one invocation.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ["FMT_TRACEBACK"] = "1"
# Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), pytest does not cache
# the assert-rewritten test modules and rewrites all of them on every run: ~10 s of each run
# (collection 17 s -> 7 s).  Caching them in the git-ignored __pycache__ folders changes no
# test; only this process writes them (subprocesses of the tests keep the environment's).
sys.dont_write_bytecode = False


@pytest.fixture
def table_renders(monkeypatch) -> list:
    """The titles of the rich Tables rendered while the test runs (a list that fills as
    they render): tests count how often fmt lays a table out through rich."""
    from rich.table import Table

    calls: list = []
    original = Table.__rich_console__

    def counting(self, console, options):
        calls.append(self.title)
        return original(self, console, options)

    monkeypatch.setattr(Table, "__rich_console__", counting)
    return calls


@pytest.fixture(scope="session")
def scheduler():
    """A Dask LocalCluster of 2 single-thread worker processes, started once for the whole
    session (each start and stop costs seconds; the modules that use it only submit scans to
    it, none stops or kills its workers); its address (skips without ``distributed``)."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")
    yield cluster.scheduler_address
    cluster.close()
