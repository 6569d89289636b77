"""Shared test set-up.

FMT_TRACEBACK=1 for the whole suite: the CLI's internal-error guard (any exception that
escapes a command becomes one line and exit code 70) re-raises instead, so a bug shows up as
a failing test with its traceback and no test can pass through the guard.  The guard's own
test (tests/test_cli_trust.py) unsets the variable for its one invocation.
"""

from __future__ import annotations

import os

import pytest

os.environ["FMT_TRACEBACK"] = "1"



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
