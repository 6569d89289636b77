"""The package's shape beyond its layers (``test_architecture``): each core piece defined in
one module, and no module over 400 lines (the C kernel and the CUDA source are no .py),
read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fmtcli"
MAX_LINES = 400
#: Core pieces that wave 2 copied, and the one module each is defined in now.
ONE_HOME = {
    "FLOAT64_NAMES": "numerics/format_names.py",
    "arithmetic_spec": "numerics/format_names.py",
    "is_float64": "numerics/format_names.py",
    "format_label": "numerics/format_names.py",
    "parse_formats": "numerics/format_names.py",
    "exact_units": "numerics/exactsum.py",
    "column_sums": "numerics/exactsum.py",
    "two_sum_tree": "numerics/exactsum.py",
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def where(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level: functions, classes and assignments (an
    import, even ``import x as x``, defines nothing here)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ONE_HOME))
def test_each_core_piece_is_defined_once(name):
    homes = [where(p) for p in modules() if name in defined_names(p)]
    assert homes == [ONE_HOME[name]], f"{name} defined in {homes}"


def test_the_format_list_is_parsed_in_one_place():
    """A copy of the parser would write its own refusal of an empty name."""
    holders = [where(p) for p in modules() if "empty format name" in p.read_text()]
    assert holders == ["numerics/format_names.py"]


@pytest.mark.parametrize("path", modules(), ids=where)
def test_no_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{where(path)}: {lines} lines"


def test_the_reader_sees_definitions_not_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from x import a as a\nimport b\nc = 1\nd: int = 2\n"
                      "def e(): pass\nclass F: pass\n")
    assert defined_names(module) == {"c", "d", "e", "F"}
