"""The flat layout's module paths (before the layer folders) still import, forward to where
each name lives now, and say so once with a DeprecationWarning (fmtcli/_moved.py)."""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import pytest

from fmtcli._moved import MOVED


def fresh_import(name: str):
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    return module, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_and_warns_where_it_moved(old):
    module, warned = fresh_import(old)
    targets = MOVED[old].split()
    assert warned and targets[0] in str(warned[0].message)
    for target in targets:
        importlib.import_module(target)  # every target exists
    assert set(dir(importlib.import_module(targets[0]))) <= set(dir(module))


@pytest.mark.parametrize("old, name, new", [
    ("fmtcli.tensors", "load_inputs", "fmtcli.inputs.tensors"),
    ("fmtcli.schemes", "build_scheme", "fmtcli.numerics.schemes"),
    ("fmtcli.quantize.stream", "matrix_shape", "fmtcli.streaming.stream"),
    ("fmtcli.quantize.engine", "quantize", "fmtcli.quantize.run"),
    ("fmtcli.quantize.engine", "quantize_tensor", "fmtcli.engine.run"),
    ("fmtcli.formats", "get_format", "fmtcli.numerics.formats"),
    ("fmtcli.choices", "Granularity", "fmtcli.base.choices"),
])
def test_the_documented_names_of_the_old_paths_are_the_same_objects(old, name, new):
    module, _ = fresh_import(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_from_fmtcli_import_an_old_module_works():
    sys.modules.pop("fmtcli.formats", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from fmtcli import formats
    from fmtcli.numerics.formats import get_format

    assert formats.get_format is get_format


def test_an_unknown_name_of_an_old_path_is_an_import_error():
    fresh_import("fmtcli.quantize.engine")
    with pytest.raises(ImportError):
        exec("from fmtcli.quantize.engine import no_such_name", {})


def old_paths_in(text: str) -> list[str]:
    """The moved paths a source text imports (code or code in a string): ``import old``,
    ``from old import x`` and ``from package import old_module``."""
    found = []
    for match in re.finditer(r"^\s*(?:from\s+([\w.]+)\s+import\s+\(?([\w, ]+)|import\s+([\w.]+))",
                             text, re.M):
        module, names, plain = match.groups()
        if plain:
            found += [plain] if plain in MOVED else []
            continue
        found += [module] if module in MOVED else []
        found += [f"{module}.{n.strip()}" for n in names.split(",")
                  if f"{module}.{n.strip()}" in MOVED]
    return found


def test_the_old_path_finder_sees_every_form():
    text = ("import fmtcli.tensors\nfrom fmtcli.quantize.stream import x\n"
            "    from fmtcli.quantize import native, quantize\nfrom fmtcli.inputs import tensors\n")
    assert old_paths_in(text) == ["fmtcli.tensors", "fmtcli.quantize.stream",
                                  "fmtcli.quantize.native"]


def test_the_package_itself_uses_no_old_path():
    """Nothing in fmtcli/, tests/, scripts/, benchmarks/ or examples/ (this file aside)
    imports a moved path, in code or in code written into a string."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = {str(p.relative_to(root)): old_paths_in(p.read_text())
             for d in ("fmtcli", "tests", "scripts", "benchmarks", "examples")
             for p in (root / d).rglob("*.py") if p.name != Path(__file__).name}
    assert {k: v for k, v in found.items() if v} == {}


def test_every_module_of_the_flat_layout_still_imports():
    """Every module the package had before the layer folders (commit 1cbea9d's tree)."""
    flat = """fmtcli.arithmetic.calc fmtcli.arithmetic.dot fmtcli.arithmetic.dot_cuda
    fmtcli.arithmetic.exactsum fmtcli.arithmetic.expression fmtcli.arithmetic.ops
    fmtcli.arithmetic.pairs fmtcli.arithmetic.ratio fmtcli.arithmetic.runs
    fmtcli.arithmetic.sum_inputs fmtcli.arithmetic.summation fmtcli.attention.accuracy
    fmtcli.attention.budget fmtcli.attention.exact fmtcli.attention.io_model
    fmtcli.attention.limits fmtcli.attention.ranges fmtcli.attention.report
    fmtcli.attention.softmax fmtcli.attention.softmax_inputs fmtcli.attention.timing
    fmtcli.compare.stats fmtcli.kv.inputs fmtcli.kv.scales fmtcli.quantize.distributed
    fmtcli.underflow fmtcli.cli.options fmtcli.cli.output fmtcli.cli.app""".split()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in sorted(set(flat) | set(MOVED)):
            importlib.import_module(name)
