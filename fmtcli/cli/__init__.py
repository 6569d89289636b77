"""The ``fmt`` command line: a thin layer that parses options, calls the library and
prints its result (a rich table, or JSON with ``--json``).

- ``app``     -- the Typer group: one ``Error:`` line and an exit code for every way a
  command ends, ``--version``, the entry point ``main``;
- ``output``  -- stdout and stderr: ``emit`` (the one way a result is printed), notes,
  progress;
- ``options`` -- option types and checks shared by several commands, and the option of
  each library parameter: library errors said as options (``as_options``);
- one module per command (``range``, ``underflow``, ``quantize``, ``scale_search``,
  ``loss_scale``, ``check_backends``, ``softmax``, ``attention``, ``dot``,
  ``compare``, ``kv``, ``audit``, ``train``): its options, then library calls, then ``emit``.

Only ``fmtcli.base.choices`` and ``fmtcli.base.errors`` are imported at start-up; each command
imports the library modules it needs when it runs (``fmt --version`` loads no numpy).
"""

from __future__ import annotations

import importlib

from fmtcli.cli.app import app, main
from fmtcli.cli.options import as_options

#: The command modules; each registers its command on ``app`` when imported, in this order
#: (the order of ``fmt --help``).
COMMANDS = ("range", "underflow", "quantize", "scale_search", "loss_scale", "check_backends",
            "softmax", "attention", "calc", "sum_command", "dot", "compare", "kv", "audit",
            "train")
for _module in COMMANDS:
    importlib.import_module(f".{_module}", __name__)

__all__ = ["app", "as_options", "main"]
