"""The layers of docs/architecture.md, checked on the source.

The graph is built from every ``import`` in ``fmtcli/`` (read with ``ast``: module-level,
function-level and ``TYPE_CHECKING`` imports alike), and must hold:

- every module is in a layer (its folder decides), and the top level stays small;
- no import points up a layer, and no analysis imports another analysis;
- the graph has no cycle;
- only the command line imports typer, only presentation and the command line import rich,
  and the bottom layer needs nothing but the standard library.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fmtcli"

# The layers, bottom first: a module's first dotted part (its folder) decides its layer
LAYER_NAMES = ["base", "numerics", "inputs", "streaming", "engine", "analyses", "render", "cli"]
ANALYSES = ["quantize", "scale_search", "loss_scale", "underflow", "check_backends", "kv",
            "compare", "attention", "arithmetic", "audit", "train"]
FOLDERS = {"base": 0, "_moved": 0, "numerics": 1, "inputs": 2, "streaming": 3, "engine": 4,
           **dict.fromkeys(ANALYSES, 5), "render": 6, "cli": 7, "__main__": 7}
# the compiled kernel (a C extension: no .py file to read)
EXTENSIONS = {"numerics._native"}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    where = PACKAGE.joinpath(*name.split("."))
    return (name in EXTENSIONS or where.with_suffix(".py").exists()
            or (where / "__init__.py").exists())


def layer_of(name: str) -> int | None:
    """The layer of a module under fmtcli; 0 for fmtcli's own ``__init__`` (it imports
    only ``base`` and ``_moved``; its exports load on first use)."""
    return 0 if not name else FOLDERS.get(name.split(".")[0])


def analysis_of(name: str) -> str | None:
    return name.split(".")[0] if layer_of(name) == 5 else None


def module_of(name: str) -> str:
    """The module a dotted name under fmtcli lives in (longest prefix that is a module)."""
    while name and not is_module(name):
        name = name.rpartition(".")[0]
    return name


@cache
def imports(path: Path) -> tuple[tuple[str, int], ...]:
    """(target, line) of every import in the module: fmtcli targets as ``fmtcli:`` and the
    dotted module under fmtcli (``from x import name`` resolves to ``x.name`` where that is
    a module), others by their top-level name."""
    tree = ast.parse(path.read_text())
    here = dotted(path).split(".") if dotted(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "fmtcli" or alias.name.startswith("fmtcli."):
                    out.append(("fmtcli:" + module_of(alias.name[7:]), node.lineno))
                else:
                    out.append((alias.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module == "fmtcli" or (node.module or "").startswith("fmtcli."):
                parts = node.module.split(".")[1:]
            else:
                out.append((node.module.split(".")[0], node.lineno))
                continue
            for alias in node.names:
                name = ".".join(parts + [alias.name])
                out.append(("fmtcli:" + module_of(name if is_module(name) else ".".join(parts)),
                            node.lineno))
    return tuple(out)


def graph() -> dict[str, set[str]]:
    edges = {}
    for path in modules():
        here = dotted(path)
        edges[here] = {t.removeprefix("fmtcli:") for t, _ in imports(path)
                       if t.startswith("fmtcli:")} - {here, ""}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


IDS = {"ids": lambda p: dotted(p) or "fmtcli"}


@pytest.mark.parametrize("path", modules(), **IDS)
def test_every_module_has_a_layer(path):
    assert layer_of(dotted(path)) is not None, f"{dotted(path)}: no layer (FOLDERS)"


@pytest.mark.slow
@pytest.mark.parametrize("path", modules(), **IDS)
def test_imports_point_down_the_layers(path):
    here = dotted(path)
    for target, line in imports(path):
        if not target.startswith("fmtcli:") or target == "fmtcli:":
            continue
        there = target.removeprefix("fmtcli:")
        assert layer_of(there) is not None, f"{here}:{line} imports {there}: no layer"
        assert layer_of(there) <= layer_of(here), (
            f"{here} ({LAYER_NAMES[layer_of(here)]}) line {line} imports {there} "
            f"({LAYER_NAMES[layer_of(there)]}): up a layer")


@pytest.mark.parametrize("path", modules(), **IDS)
def test_no_analysis_imports_another(path):
    here = dotted(path)
    for target, line in imports(path):
        there = target.removeprefix("fmtcli:")
        if target.startswith("fmtcli:") and analysis_of(here) and analysis_of(there):
            assert analysis_of(there) == analysis_of(here), (
                f"{here} line {line} imports {there}: one analysis reaching into another")


def test_the_import_graph_has_no_cycle():
    assert cycles(graph()) == []


@pytest.mark.parametrize("path", modules(), **IDS)
def test_typer_only_in_the_command_line_rich_only_in_presentation(path):
    here = layer_of(dotted(path))
    for target, line in imports(path):
        if target == "typer":
            assert here == 7, f"{dotted(path)} line {line} imports typer"
        if target == "rich":
            assert here in (6, 7), f"{dotted(path)} line {line} imports rich"


@pytest.mark.parametrize("path", [p for p in modules() if layer_of(dotted(p)) == 0], **IDS)
def test_the_bottom_layer_needs_only_the_standard_library(path):
    """base/ is what the parser is built from, before numpy loads."""
    for target, line in imports(path):
        if not target.startswith("fmtcli:"):
            assert target in sys.stdlib_module_names or target == "__future__", (
                f"{dotted(path)} line {line} imports {target}")


def test_the_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top


# -- the reader itself --------------------------------------------------------------------

def test_the_graph_finds_a_planted_cycle_and_an_upward_import():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert layer_of("render.kv") > layer_of("kv") > layer_of("engine.chunk")


def test_the_import_reader_resolves_relative_absolute_and_package_imports(tmp_path):
    """``from .x``, ``from ..x``, ``from fmtcli.p import module`` and function-level imports
    resolve to the modules they name."""
    engine_run = PACKAGE / "engine" / "run.py"
    targets = {t for t, _ in imports(engine_run)}
    assert {"fmtcli:engine.chunk", "fmtcli:numerics.schemes"} <= targets
    native = {t for t, _ in imports(PACKAGE / "numerics" / "native.py")}
    assert "fmtcli:numerics._native" in native


def test_the_tests_mirror_the_layers():
    """tests/ holds a folder per layer of the package (numerics, inputs, streaming, engine),
    one for the commands' analyses (and ``train``, fmt train's model, casts and loop, which
    need torch), one for the command line and one for the docs; at the top only the shared
    helpers and the tests of the package's shape."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders == {"numerics", "inputs", "streaming", "engine", "commands", "train", "cli",
                       "docs"}
    top = {p.name for p in tests.glob("test_*.py")}
    assert top == {"test_architecture.py", "test_structure.py", "test_markers.py",
                   "test_moved_paths.py"}
    assert all(list((tests / f).glob("test_*.py")) for f in folders)
