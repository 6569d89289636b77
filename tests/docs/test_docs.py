"""The manual is complete and current: every command has --help, a page in docs/ and an
example in README.md; the README is a short front page whose first commands are the ones CI
runs; the contents page and every relative link lead somewhere; the Python sessions of the
pages run; the CLI reference is what ``--help`` prints today."""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fmtcli.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
COMMANDS = [command.name for command in app.registered_commands]
README_MAX_LINES = 200
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SESSION = re.compile(r"^```pycon\n(.*?)^```$", re.S | re.M)


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def first_heading(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("# "))


def relative_links(text: str) -> list[str]:
    """Targets of the markdown links that are not URLs or in-page anchors, anchors dropped."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#")[0])
    return out


def test_commands_are_registered():
    assert {"quantize", "range", "underflow", "scale-search", "check-backends"} <= set(COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_page_whose_first_heading_names_it(command):
    page = DOCS / f"{command}.md"
    assert page.exists(), f"docs/{command}.md is missing"
    assert first_heading(page.read_text()).startswith(f"# `fmt {command}"), (
        f"docs/{command}.md: the first heading should name `fmt {command} ...`")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_an_example_in_the_readme(command):
    assert re.search(rf"^```console\n\$ fmt {re.escape(command)}\b", README, re.M), (
        f"README.md has no ```console example of `fmt {command}`")


def test_the_readme_is_a_front_page_of_at_most_200_lines():
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/")


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second_first_without_torch():
    assert README.index("```bash") < README.index("```console")
    blocks = [block.split("```")[0].strip() for block in README.split("```bash")[1:3]]
    assert blocks[0].endswith("fmt quantize")
    test_command = blocks[1]
    assert "pytest" in test_command
    # CI's first step is exactly that command, before anything installs torch (whose
    # requirements would hide an import the test extra does not declare)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    first = next(i for i, line in enumerate(ci) if "pytest" in line)
    assert ci[first].strip() == f"({test_command})"
    assert not any("torch" in line and "pip" in line for line in ci[:first])


def test_the_contents_page_links_every_page_of_the_manual():
    linked = set(relative_links((DOCS / "index.md").read_text()))
    missing = [page.name for page in DOCS.glob("*.md")
               if page.name != "index.md" and page.name not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_points_at_a_file_that_exists(page):
    broken = [target for target in relative_links(page.read_text())
              if target and not (page.parent / target).exists()]
    assert not broken, f"{page_id(page)}: links to missing files {broken}"


def test_links_are_told_apart_from_urls_and_anchors():
    text = ("[a](docs/x.md) [b](https://example.org/y.md) [c](#conventions) "
            "[d](quantize.md#json) [e](mailto:me@example.org)")
    assert relative_links(text) == ["docs/x.md", "quantize.md"]


def sessions() -> list[tuple[str, int, str]]:
    """(page, number, source) of every ```pycon block of README.md and docs/*.md."""
    return [(page_id(page), n, match.group(1)) for page in PAGES
            for n, match in enumerate(SESSION.finditer(page.read_text()))]


def test_the_readme_and_the_library_page_have_python_sessions():
    pages = {page for page, _, _ in sessions()}
    assert {"README.md", "docs/python-api.md"} <= pages


@pytest.mark.slow
@pytest.mark.parametrize(("page", "number", "source"), sessions(),
                         ids=[f"{p}-{n}" for p, n, _ in sessions()])
def test_python_session_runs_as_written(page, number, source, tmp_path):
    from report_files import example_files_module

    example_files_module().write_example_files(tmp_path)
    test = doctest.DocTestParser().get_doctest(source, {}, f"{page}[{number}]", page, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        runner.run(test, out=lambda text: pytest.fail(f"{page}: session {number}:\n{text}"))
    finally:
        os.chdir(old)
    assert runner.failures == 0 and runner.tries > 0


def cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference",
                                                  ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_cli_reference_is_current():
    reference = cli_reference()
    shown = reference.generated_with(reference.PAGE.read_text())
    if shown != reference.renderers():  # typer's and rich's layout, not fmt's text
        pytest.skip(f"the page shows the help as {shown} lay it out; here: "
                    f"{reference.renderers()}")
    assert reference.PAGE.read_text() == reference.render(), (
        f"docs/cli-reference.md is stale: run `{reference.COMMAND}` and commit it")


@pytest.mark.slow
def test_the_cli_reference_has_every_command_and_no_other():
    reference = cli_reference()
    assert reference.commands() == [c.name for c in app.registered_commands if not c.hidden]
    headings = re.findall(r"^## `fmt (\S+)`$", reference.render(), re.M)
    assert headings == reference.commands()
    assert reference.main(["--check", "extra"]) == 2
