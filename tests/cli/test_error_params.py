"""Library errors carry the parameters they are about (errors.Param); the command line says
each as its option from the parameter (cli.options.OPTIONS), never by reading the text."""

from __future__ import annotations

import ast
import pathlib
import pickle
import re

import pytest
import typer
from cli_helpers import invoke

from fmtcli.base.errors import DataError, FmtError, Message, Param, UsageError
from fmtcli.cli import app, as_options
from fmtcli.cli.options import OPTIONS
from fmtcli.numerics.schemes import build_scheme
from fmtcli.streaming import parallel

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "fmtcli"


def test_a_library_error_carries_its_parameter_and_keeps_its_wording():
    with pytest.raises(UsageError) as caught:
        build_scheme(block=0)
    error = caught.value
    assert error.params == {"block": 0}
    assert str(error) == error.message == "block=0: a block size must be >= 1"
    assert as_options(error) == "--block 0: a block size must be >= 1"


def test_the_option_comes_from_the_parameter_not_from_the_text():
    class Unwritten(UsageError):  # a library wording with no ``name=`` in it at all
        def __str__(self) -> str:
            return "the block size is not a size"

    error = Unwritten(Param("block", 0) + ": a block size must be >= 1")
    assert "block=" not in str(error) and "=" not in str(error)
    assert as_options(error) == "--block 0: a block size must be >= 1"


def test_text_that_only_looks_like_a_keyword_is_left_as_written():
    error = FmtError("x=1 and force=True", "use product='exact' or block=2")
    assert as_options(error) == str(error) == \
        "x=1 and force=True (use product='exact' or block=2)"
    in_a_path = UsageError(Param("out", "block=3.npy") + " is a directory")
    assert str(in_a_path) == "out='block=3.npy' is a directory"
    assert as_options(in_a_path) == "--out 'block=3.npy' is a directory"


@pytest.mark.parametrize("param, library, command_line", [
    (Param("out", "a b.txt"), "out='a b.txt'", "--out 'a b.txt'"),
    (Param("product", "exact"), "product='exact'", "--product exact"),
    (Param("force", True), "force=True", "--force"),
    (Param("first_axis", True), "first_axis=True", "--over-first-axis"),
    (Param("count", 10_000_001, "10,000,001"), "count=10,000,001", "--count 10,000,001"),
    (Param("outliers", 1.5, repr), "outliers=1.5", "--outliers 1.5"),
    (Param("group", 0), "group=0", "group=0"),  # no option sets it: the library's wording
])
def test_each_parameter_is_said_as_its_option(param, library, command_line):
    error = UsageError("use " + param, "or " + Param("block", 32))
    assert str(error) == f"use {library} (or block=32)"
    assert as_options(error) == f"use {command_line} (or --block 32)"


def test_messages_join_text_and_parameters_in_order():
    message = Message.joined([Param("block", 4), Param("tile", "2x2")], " and ") + " clash"
    assert str(message) == "block=4 and tile='2x2' clash"
    assert [p.name for p in message.params()] == ["block", "tile"]
    assert str("a " + Param("seed", 1) + " b") == "a seed=1 b"


def test_an_error_keeps_its_parameters_through_pickle():
    error = UsageError(Param("dask", "local:99") + ": too many", "use " + Param("workers", 2))
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is UsageError and back.exit_code == 2
    assert back.params == {"dask": "local:99", "workers": 2}
    assert str(back) == str(error) == "dask='local:99': too many (use workers=2)"
    assert as_options(back) == "--dask 'local:99': too many (use --workers 2)"


@pytest.mark.skipif(not parallel.can_fork(), reason="needs os.fork")
def test_a_worker_process_error_arrives_with_its_parameters():
    def task(item: int, worker: int) -> int:
        raise UsageError("a value lies beyond float32's range", "use " + Param("product", "exact"))

    with pytest.raises(DataError) as caught:
        parallel.run_tasks(task, 2, 2)
    assert caught.value.params == {"product": "exact"}
    assert as_options(caught.value) == \
        "a value lies beyond float32's range (use --product exact)"


def test_the_command_line_names_the_option():
    result = invoke("quantize", "--block", "4", "--per", "row")
    assert result.exit_code == 2
    assert result.stderr == "Error: --block 4 and --per row are alternatives: give one\n"


def test_every_mapped_option_is_an_option_of_fmt():
    command = typer.main.get_command(app)
    flags = {opt for sub in command.commands.values() for p in sub.params
             for opt in p.opts}
    assert set(OPTIONS.values()) <= flags, set(OPTIONS.values()) - flags


# -- no raise site writes name=value for a parameter into its text -------------------------

KEYWORD = re.compile(r"\b(?P<name>[a-z_]+)=(?=[^\s=]|$)")
ERRORS = {"FmtError", "UsageError", "UnknownFormatError", "BadValueError", "DataError",
          "TinyScale"}


def _written_keywords(path: pathlib.Path) -> list[str]:
    """``name=`` for a parameter an option sets, written into the text of an error raised
    in ``path`` (a string piece, or ``f"{name}=..."``), as 'file:line: name='."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ERRORS):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                names = [m["name"] for m in KEYWORD.finditer(inner.value)]
                found += [f"{path.name}:{inner.lineno}: {n}=" for n in names if n in OPTIONS]
            if isinstance(inner, ast.JoinedStr):
                for a, b in zip(inner.values, inner.values[1:]):
                    if isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant) \
                            and str(b.value).startswith("="):
                        found.append(f"{path.name}:{inner.lineno}: {{...}}=")
    return found


def test_the_keyword_scan_finds_a_written_parameter(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('raise UsageError(f"block={b}: bad", "use product=\'exact\'")\n'
                      'raise DataError(f"{name}={value} must be >= 1")\n'
                      'raise UsageError("the percentile rule and percentile= go together")\n')
    assert sorted(_written_keywords(sample)) == ["sample.py:1: block=", "sample.py:1: product=",
                                                 "sample.py:2: {...}="]


@pytest.mark.slow
def test_no_raise_site_writes_a_parameter_into_its_text():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _written_keywords(path)]
    assert found == []
