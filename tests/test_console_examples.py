"""The examples of README.md and docs/*.md are the program's real output.

Every ```console block whose first line is ``$ fmt ...``, on README.md and on every page of
docs/, is run through CliRunner at 80 columns, in a directory holding the small checkpoint
that ``model_files`` writes, and its output compared with the block (trailing spaces and
blank lines aside).  A comment at the end of the command line says how to compare (the
shell ignores it, so the command stays copy-pasteable):

- ``# json: PATH`` -- only that part of the JSON document (PATH: keys and list indices
  joined by dots, e.g. ``tensors.0.schemes.0``), written as ``--json`` writes it;
- ``# first N lines`` / ``# last N lines`` -- only the first / last N lines of the output;
- ``# not run: REASON`` -- not run here (a GPU, another machine's torch).

After a change of output, rewrite the blocks of every page from the program and review the
diff:

    python tests/test_console_examples.py --update
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fmtcli.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
WIDTH = "80"
BLOCK = re.compile(r"^```console\n(\$ fmt [^\n]*)\n(.*?)^```$", re.S | re.M)
DIRECTIVE = re.compile(r"\s+#\s*(json: (?P<path>\S+)|(?P<end>first|last) (?P<lines>\d+) lines|"
                       r"not run: (?P<reason>.+))\s*$")
UPDATE = "python tests/test_console_examples.py --update"


def pages() -> list[Path]:
    """README.md and every page of the manual: the files whose examples are checked."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def model_files(directory: Path) -> None:
    """``model.safetensors``: a checkpoint shaped like a real one -- an int64 first tensor
    (skipped), an embedding, attention weights and a bias -- from a fixed seed; and
    ``bert.safetensors``, an 86-tensor BERT-like one for the checkpoint report
    (tests/report_files.py)."""
    from report_files import bert_like
    from safetensors.numpy import save_file

    bert_like(directory)

    rng = np.random.default_rng(2024)
    tensors = {
        "embeddings.position_ids": np.arange(512, dtype=np.int64)[None, :],
        "embeddings.word_embeddings.weight": (rng.standard_normal((1000, 64)) * 0.05),
        "layer.0.attention.query.weight": rng.standard_normal((64, 64)) * 0.1,
        "layer.0.attention.query.bias": rng.standard_normal(64) * 0.01,
    }
    tensors["layer.0.attention.query.weight"][3, 7] = 4.0  # an outlier
    save_file({k: v.astype(np.float32) if v.dtype == np.float64 else v
               for k, v in tensors.items()}, str(directory / "model.safetensors"))
    compare_files(directory, tensors)


def compare_files(directory: Path, tensors: dict) -> None:
    """``fmt compare``'s examples (docs/compare.md): ``model-fp8.safetensors`` and
    ``bert-fp8.safetensors``, the models after an E4M3 round trip with one amax scale per
    row, and the logits of a small LM head
    (64 tokens, a vocabulary of 512) with its float32 and its round-tripped weights."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    def fp8_rows(w: np.ndarray) -> np.ndarray:
        """w after E4M3 with one amax scale per row, in w's dtype (float32 for float64)."""
        x = w.astype(np.float32)
        amax = np.abs(x).max(axis=-1, keepdims=True)
        scale = np.where(amax > 0, np.float32(448) / np.where(amax > 0, amax, 1), 1)
        scale = scale.astype(np.float32)
        x_q = (x * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / scale
        return x_q.astype(np.float32 if w.dtype == np.float64 else w.dtype)

    save_file({k: fp8_rows(v) if v.dtype.kind == "f" else v for k, v in tensors.items()},
              str(directory / "model-fp8.safetensors"))
    bert = load_file(str(directory / "bert.safetensors"))
    save_file({k: fp8_rows(v) if v.dtype.kind == "f" else v for k, v in bert.items()},
              str(directory / "bert-fp8.safetensors"))
    rng = np.random.default_rng(16)
    hidden = rng.standard_normal((64, 64)).astype(np.float32)
    head = (rng.standard_normal((512, 64)) * 0.3).astype(np.float32)
    np.save(directory / "logits.npy", hidden @ head.T)
    np.save(directory / "logits-fp8.npy", hidden @ fp8_rows(head).T)


def examples(text: str) -> list[tuple[str, str, re.Match]]:
    """(command line, expected output, match) of every console block."""
    return [(m.group(1), m.group(2), m) for m in BLOCK.finditer(text)]


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def select(document, path: str):
    for part in path.split("."):
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


def run_example(command: str, directory: Path) -> str:
    """The output a page should show for ``command`` (directives applied)."""
    directive = DIRECTIVE.search(command)
    args = shlex.split(command[:directive.start()] if directive else command)[1:]
    assert args[0] == "fmt", command
    old = os.getcwd()
    os.chdir(directory)
    try:
        result = CliRunner().invoke(app, args[1:], env={"COLUMNS": WIDTH})
    finally:
        os.chdir(old)
    assert result.exit_code == 0, (command, result.stdout, result.stderr)
    out = result.stdout
    if directive and directive.group("path"):
        out = json.dumps(select(json.loads(out), directive.group("path")), indent=2)
    elif directive and directive.group("lines"):
        n = int(directive.group("lines"))
        lines = normalise(out).splitlines()
        out = "\n".join(lines[:n] if directive.group("end") == "first" else lines[-n:])
    return normalise(out) + "\n"


def skipped(command: str) -> bool:
    directive = DIRECTIVE.search(command)
    return bool(directive and directive.group("reason"))


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
    expected = {c: normalise(out) + "\n" for c, out, _ in examples((ROOT / page).read_text())}
    assert run_example(command, model_dir) == expected[command], (
        f"{page}: block '{command}' differs from the program's output; "
        f"run `{UPDATE}` and review the diff")


def test_directives_are_understood(tmp_path):
    model_files(tmp_path)
    first = run_example("$ fmt range fp16 --json    # json: 0.max", tmp_path)
    assert first == "65504.0\n"
    four = run_example("$ fmt range    # first 4 lines", tmp_path)
    assert four.count("\n") == 4 and four.startswith("Number formats\n\n")
    last = run_example("$ fmt range    # last 1 lines", tmp_path)
    assert last.count("\n") == 1 and last.strip()
    assert DIRECTIVE.search("$ fmt x    # not run: needs a GPU").group("reason") == "needs a GPU"


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
            new = old if skipped(command) else run_example(command, directory)
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
