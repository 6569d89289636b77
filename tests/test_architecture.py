"""The layers of docs/architecture.md, checked on the source: every fmtcli import points
down (or within its layer), only the command line imports typer, and rich stays in the
presentation and command-line layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fmtcli"

LAYERS = {  # module (dotted, under fmtcli) -> layer, as docs/architecture.md lists them
    **dict.fromkeys(["choices", "errors", "dtypes", "lazy"], 0),
    **dict.fromkeys(["formats", "rounding", "literals", "fates", "scaling", "schemes",
                     "backends"], 1),
    **dict.fromkeys(["tensors", "npyfile", "textparse", "checkpoints"], 2),
    **dict.fromkeys(["quantize", "underflow", "scalesearch", "lossscale", "conformance",
                     "attention", "compare", "arithmetic", "kv"], 3),
    **dict.fromkeys(["render", "plaintable", "jsonsafe", "csvout", "render_softmax",
                     "render_attention", "render_compare", "render_dot", "render_kv",
                     "render_arithmetic"], 4),
    **dict.fromkeys(["cli", "__main__"], 5),
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(parts: list[str]) -> bool:
    where = PACKAGE.joinpath(*parts)
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def layer_of(name: str) -> int | None:
    """The layer of a module under fmtcli (its top-level name decides); None for fmtcli's
    own __init__ (the lazy re-exports)."""
    return LAYERS.get(name.split(".")[0]) if name else None


def imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute target, under TYPE_CHECKING) of every import in the module; fmtcli
    targets as dotted names under fmtcli, others as written."""
    tree = ast.parse(path.read_text())
    package = dotted(path).split(".") if path.name == "__init__.py" else \
        dotted(path).split(".")[:-1]
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, id(node) in typing_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [p for p in package if p][:len([p for p in package if p])
                                                  - (node.level - 1)]
                names = [".".join(base + ([node.module] if node.module else []))]
                if not node.module:  # from . import x, y: modules, or names of the package
                    names = [".".join(base + [a.name]) if is_module(base + [a.name])
                             else ".".join(base) for a in node.names]
                out += [("fmtcli:" + n.strip("."), id(node) in typing_only) for n in names]
            else:
                out.append((node.module, id(node) in typing_only))
    return out


@pytest.mark.parametrize("path", modules(), ids=lambda p: dotted(p) or "fmtcli")
def test_imports_point_down_the_layers(path):
    here = layer_of(dotted(path))
    if here is None:
        return  # fmtcli/__init__.py: names loaded on first use, from layers 0-1
    for target, typing_only in imports(path):
        if not target.startswith("fmtcli:") or typing_only:
            continue
        target_name = target.removeprefix("fmtcli:")
        if not target_name:
            continue  # fmtcli itself (package_version): the package's own top
        there = layer_of(target_name)
        assert there is not None, f"{dotted(path)} imports {target}: not in LAYERS"
        assert there <= here, f"{dotted(path)} (layer {here}) imports {target} (layer {there})"


@pytest.mark.parametrize("path", modules(), ids=lambda p: dotted(p) or "fmtcli")
def test_typer_only_in_the_command_line_and_rich_only_in_presentation(path):
    here = layer_of(dotted(path))
    for target, _ in imports(path):
        if target.split(".")[0] == "typer":
            assert here == 5, f"{dotted(path)} imports typer"
        if target.split(".")[0] == "rich":
            assert here in (4, 5), f"{dotted(path)} imports rich"


def test_every_module_has_a_layer():
    names = {dotted(p).split(".")[0] for p in modules()} - {""}
    assert names == set(LAYERS)


def test_the_import_reader_resolves_relative_imports():
    """``from .x``, ``from ..x`` and ``from . import x`` resolve to the modules they name
    (adding ``from .render import render`` to formats.py fails the layer test: tried)."""
    fake = PACKAGE / "formats.py"
    found = dict(imports(fake))
    assert "fmtcli:choices" in found and "fmtcli:errors" in found
    engine = PACKAGE / "quantize" / "engine.py"
    targets = {t for t, _ in imports(engine)}
    assert {"fmtcli:quantize.chunk", "fmtcli:schemes"} <= targets
