"""Write docs/cli-reference.md from the program's own ``--help``, so that it cannot drift.

    python scripts/cli_reference.py           # (re)write docs/cli-reference.md
    python scripts/cli_reference.py --check   # exit 1 if the page is stale

The page holds ``fmt --help`` and then ``fmt COMMAND --help`` for every command registered
on the Typer app (``fmtcli.cli.app.registered_commands``, in the order ``fmt --help`` lists
them; nothing is hard-coded here), each run in-process through typer's CliRunner at a
fixed width of ``WIDTH`` columns, so the page is the same on every machine and terminal.
``tests/docs/test_docs.py`` regenerates it and compares.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli-reference.md"
WIDTH = "80"
COMMAND = "python scripts/cli_reference.py"

HEADER = f"""\
# CLI reference

Generated from `--help` at {WIDTH} columns by `{COMMAND}`; do not edit by hand
(`tests/docs/test_docs.py` fails when this page is stale). The manual explains each command,
with examples: see [index.md](index.md).
"""


def renderers() -> str:
    """The versions of the two libraries that lay out ``--help`` (typer and rich): another
    release draws the same help in other words and boxes, so the page says which it shows."""
    from importlib.metadata import version

    return f"typer {version('typer')}, rich {version('rich')}"


def generated_with(text: str) -> str | None:
    """The ``renderers()`` a page says it was generated with, or None."""
    match = re.search(r"^Help as typer and rich lay it out: (.+)\.$", text, re.M)
    return match[1] if match else None


def commands() -> list[str]:
    """Names of the commands registered on the app, in registration order."""
    from fmtcli.cli import app

    return [command.name for command in app.registered_commands if not command.hidden]


def help_text(args: list[str]) -> str:
    """``fmt ARGS --help`` as a user sees it at ``WIDTH`` columns (trailing spaces dropped)."""
    from typer.testing import CliRunner

    from fmtcli.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": WIDTH}, prog_name="fmt")
    if result.exit_code != 0:
        raise RuntimeError(f"fmt {' '.join(args)} --help exited {result.exit_code}")
    return "\n".join(line.rstrip() for line in result.stdout.rstrip().splitlines())


def render() -> str:
    """The whole page."""
    sections = [HEADER + f"\nHelp as typer and rich lay it out: {renderers()}.\n"]
    sections.append("## `fmt`\n\n```text\n" + help_text([]) + "\n```\n")
    for name in commands():
        sections.append(f"## `fmt {name}`\n\n```text\n" + help_text([name]) + "\n```\n")
    return "\n".join(sections)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    text = render()
    if argv == ["--check"]:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(commands())} commands)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
