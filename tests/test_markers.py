"""The ``slow`` marker and the quick subset, ``python -m pytest -q -m "not slow"``: the marker
is registered (an unregistered one only warns, and ``-m "not slow"`` would then select
everything silently), it marks tests, docs/development.md gives the command, and the quick
subset still runs every command of ``fmt`` (read from the test files' source with ``ast``:
the command's name as a string in a test that is not marked slow)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import typer

from fmtcli.cli import app

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
QUICK = 'python -m pytest -q -m "not slow"'


def is_slow(node: ast.AST) -> bool:
    """Whether ``node`` (a decorator or the value of ``pytestmark``) names ``pytest.mark.slow``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "slow"
               and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
               for n in ast.walk(node))


@functools.cache
def marked_test_files() -> tuple:
    """(path, module tree, [(test function, slow?)]) for each tests/**/test_*.py."""
    files = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module_slow = any(isinstance(node, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                  for t in node.targets) and is_slow(node.value)
                          for node in tree.body)
        functions = [(node, module_slow or any(map(is_slow, node.decorator_list)))
                     for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
        files.append((path, tree, functions))
    return tuple(files)


def strings_in(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_the_slow_marker_is_registered(pytestconfig):
    names = [line.split(":")[0].strip() for line in pytestconfig.getini("markers")]
    assert "slow" in names, names


def test_some_tests_are_slow_and_most_are_not():
    slow = quick = 0
    for _path, _tree, functions in marked_test_files():
        for _function, marked in functions:
            slow += marked
            quick += not marked
    assert slow > 0, "no test is marked slow"
    assert quick > slow, (quick, slow)


def test_the_quick_subset_runs_every_command():
    """Every command's name is a string in some quick test, or in a module constant that a
    quick test names (the parameter lists written above the tests)."""
    commands = set(typer.main.get_command(app).commands)
    seen: set[str] = set()
    for _path, tree, functions in marked_test_files():
        quick = [function for function, marked in functions if not marked]
        if not quick:
            continue
        used = {n.id for function in quick for n in ast.walk(function) if isinstance(n, ast.Name)}
        constants = [node for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id in used for t in node.targets)]
        for node in quick + constants:
            seen |= strings_in(node) & commands
    assert commands - seen == set(), f"no quick test runs {sorted(commands - seen)}"


def test_the_development_page_gives_the_quick_subset():
    assert QUICK in (ROOT / "docs" / "development.md").read_text()
