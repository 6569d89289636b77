"""Shared test set-up.

FMT_TRACEBACK=1 for the whole suite: the CLI's internal-error guard (any exception that
escapes a command becomes one line and exit code 70) re-raises instead, so a bug shows up as
a failing test with its traceback and no test can pass through the guard.  The guard's own
test (tests/test_cli_trust.py) unsets the variable for its one invocation.
"""

from __future__ import annotations

import os

os.environ["FMT_TRACEBACK"] = "1"
