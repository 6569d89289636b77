"""Every command has --help and a README section; the README's first commands are the ones
CI runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fmtcli.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
COMMANDS = sorted(command.name for command in app.registered_commands)


def test_commands_are_registered():
    assert {"quantize", "range", "underflow"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_a_readme_section(command):
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.stdout
    assert f"## `fmt {command}" in README


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    blocks = [block.split("```")[0].strip() for block in README.split("```bash")[1:3]]
    assert blocks[0].endswith("fmt quantize")
    test_command = blocks[1]
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci
