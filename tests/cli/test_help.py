"""What ``fmt``, ``fmt --help``, ``fmt COMMAND --help`` and ``--version`` print: the help on
stdout, every command's summary whole, usage lines that mark repeatable arguments, the choices
an option takes and what an option says it does.
"""

from __future__ import annotations

import re

import pytest
from cli_helpers import assert_usage_error, invoke

from fmtcli import __version__


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"fmtcli {__version__}"


@pytest.mark.slow
@pytest.mark.parametrize("args, mentions", [
    (("--help",), ("range", "underflow", "--version")),
    (("-h",), ("range", "underflow")),
    (("range", "--help"), ("--all", "--json", "eps")),
    (("range", "-h"), ("--all",)),
    (("underflow", "--help"), ("x * scale", "--scale", "--format", "--rounding",
                               "--overflow", "--seed", "--json", "nearest-away",
                               "stochastic", "saturate", "flushed")),
    (("underflow", "-h"), ("x * scale",)),
])
def test_help(args, mentions):
    result = invoke(*args)
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    for text in mentions:
        assert text in result.stdout, text


def test_plain_fmt_prints_the_help_on_stdout():
    result = invoke()
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: ") and "quantize" in result.stdout
    assert result.stderr == ""


def test_plain_fmt_lists_every_command_without_cutting_its_summary():
    """Click cuts a command's first sentence at ~45 characters with '...'; each command
    has a summary of its own that the listing shows whole (wrapped where narrow)."""
    result = invoke(env={"COLUMNS": "80"})
    assert result.exit_code == 0
    listing = result.stdout.split("Commands:")[1]
    assert "..." not in listing and "\u2026" not in listing
    for name in ("range", "underflow", "quantize", "scale-search", "check-backends"):
        assert f"  {name} " in listing


@pytest.mark.slow
@pytest.mark.parametrize("command, usage", [
    ("underflow", "[OPTIONS] VALUE..."), ("quantize", "[OPTIONS] [FILE]..."),
    ("range", "[OPTIONS] [FORMAT]..."), ("scale-search", "[OPTIONS] [FILE]..."),
    ("check-backends", "[OPTIONS] [FORMAT]...")])
def test_usage_lines_mark_repeatable_arguments(command, usage):
    assert invoke(command, "--help").stdout.splitlines()[0].endswith(f"{command} {usage}")


def test_per_offers_only_what_it_takes():
    help_text = invoke("quantize", "--help").stdout
    # typer 0.26 writes a choice as [a|b], later releases as <a|b>
    assert re.search(r"[<\[]tensor\|row\|column[>\]]", help_text), help_text
    assert "block|tile" not in help_text
    assert "'block' is not one of" in assert_usage_error(invoke("quantize", "--per", "block"))


def test_check_backends_seed_help_says_what_it_seeds():
    help_text = " ".join(invoke("check-backends", "--help").stdout.split())
    assert "random sample of float32" in help_text
    assert "stochastic" not in help_text
