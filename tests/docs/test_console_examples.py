"""The examples of README.md and docs/*.md are the program's real output.

Every ```console block whose first line is ``$ fmt ...``, on README.md and on every page of
docs/, is run through CliRunner at 80 columns, in a directory holding the files that
``examples/make_example_files.py`` writes (``model_files``), and its output compared with
the block (trailing spaces and blank lines aside) **at the precision it prints**: the text
between numbers must be the same, integers equal, and numbers with a fraction or an
exponent agree to 6 significant digits (``same_at_printed_precision``), since float32 sums
and BLAS products differ in the last digits between CPUs (AVX2, AVX-512, ARM) and kernels.
A comment at the end of the command line says how to compare (the shell ignores it, so the
command stays copy-pasteable); several are joined by ``;``:

- ``# json: PATH`` -- only that part of the JSON document (PATH: keys and list indices
  joined by dots, e.g. ``tensors.0.schemes.0``), written as ``--json`` writes it;
- ``# first N lines`` / ``# last N lines`` -- only the first / last N lines of the output;
- ``# needs torch`` -- skipped, with that reason, where torch is not installed;
- ``# not run: REASON`` -- not run here (a GPU, another machine's torch; last if joined).

After a change of output, rewrite the blocks of every page from the program and review the
diff:

    python tests/docs/test_console_examples.py --update
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fmtcli.cli import app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WIDTH = "80"
BLOCK = re.compile(r"^```console\n(\$ fmt [^\n]*)\n(.*?)^```$", re.S | re.M)
COMMENT = re.compile(r"\s+#\s*(?P<text>(?:json: |first |last |needs |not run: ).*?)\s*$")
PART = re.compile(r"json: (?P<path>\S+)|(?P<end>first|last) (?P<lines>\d+) lines|"
                  r"needs (?P<needs>torch)|not run: (?P<reason>.+)")
#: a number as the program prints it (an integer, a decimal, an exponent; not inside a word)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")
SIGNIFICANT = 6
UPDATE = "python tests/docs/test_console_examples.py --update"


def pages() -> list[Path]:
    """README.md and every page of the manual: the files whose examples are checked."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def model_files(directory: Path) -> None:
    """The files the examples name (``model.safetensors``, ``bert.safetensors``, their FP8
    round trips, ``logits.npy``...): written by ``examples/make_example_files.py``, the
    script the README points users to, so that every example can be reproduced."""
    from report_files import example_files_module

    example_files_module().write_example_files(directory)


def examples(text: str) -> list[tuple[str, str, re.Match]]:
    """(command line, expected output, match) of every console block."""
    return [(m.group(1), m.group(2), m) for m in BLOCK.finditer(text)]


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


class Directive:
    """The comment at the end of an example's command line (``COMMENT``), parsed."""

    def __init__(self, command: str) -> None:
        match = COMMENT.search(command)
        self.start = match.start() if match else len(command)
        self.path = self.end = self.lines = self.needs = self.reason = None
        text = match.group("text") if match else ""
        while text:
            part = PART.match(text)
            assert part, f"unknown directive {text!r} in {command!r}"
            for key, value in part.groupdict().items():
                if value is not None:
                    setattr(self, key, int(value) if key == "lines" else value)
            text = text[part.end():].lstrip()
            if text:
                assert text.startswith(";"), f"directives are joined by ';': {command!r}"
                text = text[1:].lstrip()

    def missing(self) -> str | None:
        """Why the example cannot run here (a package it needs is not installed), or None."""
        if self.needs and importlib.util.find_spec(self.needs) is None:
            return f"needs {self.needs} (pip install 'fmtcli[torch]')"
        return None


def _number(token: str) -> float | int:
    token = token.replace(",", "")
    return float(token) if any(c in token for c in ".eE") else int(token)


def same_at_printed_precision(actual: str, expected: str) -> bool:
    """The same text, with integers equal and other numbers agreeing to ``SIGNIFICANT``
    significant digits (JSON's 17 digits of a float32 sum differ between CPUs)."""
    actual, expected = normalise(actual), normalise(expected)
    if actual == expected:
        return True
    if NUMBER.split(actual) != NUMBER.split(expected):
        return False
    for a, b in zip(NUMBER.findall(actual), NUMBER.findall(expected)):
        x, y = _number(a), _number(b)
        if isinstance(x, int) or isinstance(y, int):
            if x != y:
                return False
        elif not math.isclose(x, y, rel_tol=0.5 * 10.0 ** (1 - SIGNIFICANT), abs_tol=1e-300):
            return False
    return True


def select(document, path: str):
    for part in path.split("."):
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


def run_example(command: str, directory: Path) -> str:
    """The output a page should show for ``command`` (directives applied)."""
    directive = Directive(command)
    args = shlex.split(command[:directive.start])[1:]
    assert args[0] == "fmt", command
    old = os.getcwd()
    os.chdir(directory)
    try:
        result = CliRunner().invoke(app, args[1:], env={"COLUMNS": WIDTH})
    finally:
        os.chdir(old)
    assert result.exit_code == 0, (command, result.stdout, result.stderr)
    out = result.stdout
    if directive.path:
        out = json.dumps(select(json.loads(out), directive.path), indent=2)
    elif directive.lines:
        n = directive.lines
        lines = normalise(out).splitlines()
        out = "\n".join(lines[:n] if directive.end == "first" else lines[-n:])
    return normalise(out) + "\n"


def skipped(command: str) -> bool:
    return Directive(command).reason is not None


def runnable() -> list[tuple[str, str]]:
    """(page relative to the repository, command line) of every example that runs here."""
    return [(page.relative_to(ROOT).as_posix(), command)
            for page in pages() for command, _, _ in examples(page.read_text())
            if not skipped(command)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("examples")
    model_files(directory)
    return directory


def test_the_readme_has_examples_of_every_command():
    commands = [command for page, command in runnable() if page == "README.md"]
    assert len(commands) >= 6
    for command in app.registered_commands:
        assert any(c.startswith(f"$ fmt {command.name}") for c in commands), command.name


def test_every_page_of_the_manual_is_checked():
    checked = {page for page, _ in runnable()}
    assert "README.md" in checked
    assert {"docs/quantize.md", "docs/range.md", "docs/underflow.md"} <= checked


@pytest.mark.parametrize(("page", "command"), runnable())
def test_example_is_the_program_output(page, command, model_dir):
    missing = Directive(command).missing()
    if missing:
        pytest.skip(f"{page}: {missing}")
    expected = {c: normalise(out) + "\n" for c, out, _ in examples((ROOT / page).read_text())}
    actual = run_example(command, model_dir)
    assert same_at_printed_precision(actual, expected[command]), (
        f"{page}: block '{command}' differs from the program's output; "
        f"run `{UPDATE}` and review the diff", actual)


def test_directives_are_understood(tmp_path):
    model_files(tmp_path)
    first = run_example("$ fmt range fp16 --json    # json: 0.max", tmp_path)
    assert first == "65504.0\n"
    four = run_example("$ fmt range    # first 4 lines", tmp_path)
    assert four.count("\n") == 4 and four.startswith("Number formats\n\n")
    last = run_example("$ fmt range    # last 1 lines", tmp_path)
    assert last.count("\n") == 1 and last.strip()
    assert Directive("$ fmt x    # not run: needs a GPU").reason == "needs a GPU"
    both = Directive("$ fmt check-backends e4m3fn    # needs torch; last 7 lines")
    assert (both.needs, both.end, both.lines) == ("torch", "last", 7)
    assert both.start == len("$ fmt check-backends e4m3fn")
    assert Directive("$ fmt range fp16").start == len("$ fmt range fp16")


def test_numbers_are_compared_at_the_precision_printed():
    assert same_at_printed_precision("0.0013317678855527884\n", "0.0013317678855528")
    assert same_at_printed_precision('{"kl": 0.0017944253452944763}',
                                     '{"kl": 0.0017944267789606616}')  # AVX-512 vs AVX2
    assert not same_at_printed_precision('{"kl": 0.0017944}', '{"kl": 0.0017954}')
    assert not same_at_printed_precision("count 167,454", "count 167,455")  # integers exact
    assert not same_at_printed_precision("SQNR 31.7 dB", "SQNR 31.8 dB")
    assert not same_at_printed_precision("SQNR 31.7 dB", "SNR 31.7 dB")
    assert same_at_printed_precision("1.5e-05 x", "1.50000001e-05 x")
    assert not same_at_printed_precision("e4m3fn 448", "e4m3fn 449")  # digits in words too


def test_examples_that_need_torch_say_so():
    marked = [c for _, c in runnable() if Directive(c).needs == "torch"]
    assert any("--backend torch" in c for c in marked)
    for _, command in runnable():
        if "--backend torch" in command:
            assert Directive(command).needs == "torch", command


def test_update_rewrites_a_stale_block_and_keeps_the_rest(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n\n```console\n$ fmt range fp16 --json    # json: 0.max\n1.0\n```\n"
                    "\n```console\n$ fmt x    # not run: a GPU\nkept as written\n```\nend\n")
    assert update(page) == 1
    assert page.read_text() == (
        "intro\n\n```console\n$ fmt range fp16 --json    # json: 0.max\n65504.0\n```\n"
        "\n```console\n$ fmt x    # not run: a GPU\nkept as written\n```\nend\n")
    assert update(page) == 0


def update(path: Path) -> int:
    """Rewrite every runnable block of ``path`` from the program's output; the number changed."""
    import tempfile

    text = path.read_text()
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        model_files(directory)
        pieces, last = [], 0
        for command, old, match in examples(text):
            keep = skipped(command) or Directive(command).missing()
            new = old if keep else run_example(command, directory)
            if same_at_printed_precision(new, old):
                new = old  # a CPU's last digits are no change
            changed += normalise(new) != normalise(old)
            pieces += [text[last:match.start(2)], new]
            last = match.end(2)
        pieces.append(text[last:])
    new_text = "".join(pieces)
    if new_text != text:
        path.write_text(new_text)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    for page in pages():
        print(f"{page.relative_to(ROOT)}: {update(page)} block(s) rewritten")
