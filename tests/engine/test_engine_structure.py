"""The engine core's shape (issue 23): short functions in ``engine/`` and ``quantize/``, the
compiled kernel's argument block, and the rule that keeps its module tables safe.

Read from the source with ``ast`` (functions) and from the C text (the kernel's rule); the
argument block is exercised on the built kernel (skipped where it is not built)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from fmtcli.numerics import native

PACKAGE = Path(__file__).resolve().parents[2] / "fmtcli"
CORE = ("engine", "quantize")
MAX_FUNCTION_LINES = 60
SOURCE = PACKAGE / "numerics" / "_native.c"


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (lines)`` of every function or method in the module longer than ``limit``
    lines (docstring included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines})")
    return found


@pytest.mark.parametrize("path", sorted(p for folder in CORE
                                        for p in (PACKAGE / folder).rglob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_function_of_the_engine_core_is_over_60_lines(path):
    assert long_functions(path) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    planted = tmp_path / "long.py"
    planted.write_text("def f():\n" + "    x = 1\n" * 70 + "\n\ndef g():\n    return 1\n")
    assert long_functions(planted) == ["f (71)"]


def test_the_engine_imports_no_analysis():
    """``engine/`` is the core that quantize, scale-search, kv and compare share: nothing in
    it reaches into ``fmtcli.quantize`` (``test_architecture`` checks every analysis)."""
    for path in (PACKAGE / "engine").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) fmtcli\.quantize\b", text, re.M), path


# -- the compiled kernel ------------------------------------------------------------------

def c_functions(text: str) -> dict[str, str]:
    """The body of each top-level C function entry point (``static PyObject *name(...)``)."""
    bodies = {}
    for match in re.finditer(r"^static PyObject \*(\w+)\(([^)]*)\)\n\{", text, re.M):
        depth, at = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            at += 1
        bodies[match[1]] = match[2] + text[match.end():at]
    return bodies


def test_the_kernel_states_its_table_rule_and_never_releases_the_gil():
    """Its module tables (the histograms, the hash set) are safe only while every call
    holds the GIL: the source says so, and no function releases it."""
    text = SOURCE.read_text()
    assert "static uint32_t local_hist" in text and "static uint32_t set_slots" in text
    header = text.split("*/", 1)[0]
    assert "GIL" in header and "local_hist" in header and "set_slots" in header
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # comments aside
    for releases in ("Py_BEGIN_ALLOW_THREADS", "PyEval_SaveThread", "Py_mod_gil",
                     "PyUnstable_Module_SetGIL"):
        assert releases not in code, releases


def test_no_kernel_entry_point_takes_more_than_eight_positionals():
    """``quantize_chunk`` took sixteen; the entry points now take at most eight, and one
    that takes more than six takes keywords."""
    for name, body in c_functions(SOURCE.read_text()).items():
        parse = re.search(r'PyArg_ParseTuple(AndKeywords)?\(args, (?:kwargs, )?"([^"]*)"', body)
        if parse is None:
            continue
        units = re.sub(r"\([^)]*\)", "T", parse[2].split("|")[0].replace("$", ""))
        assert len(units) <= 8, (name, parse[2])
        if name == "quantize_chunk":
            assert parse[1] and "$" in parse[2], "quantize_chunk: outputs by keyword"


def kernel():
    if native.module() is None:
        pytest.skip("the compiled kernel is not built (or FMTCLI_KERNEL=numpy)")
    return native.module()


def chunk_args(x):
    """A 2 x 8 float32 chunk in tiles of 1 x 8 under E4M3's rounding (the block)."""
    low = int(np.float32(2.0 ** -6).view(np.uint32))
    high = int(np.float32(2.0 ** 9).view(np.uint32))
    scales = np.float32([[448 / np.abs(x[0]).max()], [448 / np.abs(x[1]).max()]])
    return (x, scales, (2, 8), (1, 8), (low, high, 20 << 23, 448.0),
            np.empty(x.size, np.float32))


def test_quantize_chunk_takes_its_block_by_name_and_its_outputs_by_keyword():
    k = kernel()
    x = np.linspace(-3, 5, 16, dtype=np.float32).reshape(2, 8)
    args = chunk_args(x)
    names = ("x", "scales", "shape", "tile", "rounding", "scratch")
    hists = [np.zeros(1 << 16, np.int64) for _ in range(2)]
    flushed = [np.empty((2, 1), np.int64) for _ in range(2)]
    by_position = k.quantize_chunk(*args, hist=hists[0], flushed=flushed[0])
    by_name = k.quantize_chunk(**dict(zip(names, args)), hist=hists[1], flushed=flushed[1])
    assert by_position is not None and by_position == by_name
    assert np.array_equal(hists[0], hists[1]) and hists[0].sum() == x.size
    assert np.array_equal(flushed[0], flushed[1])
    mse_only = k.quantize_chunk(*args)  # hist=None: the squared errors alone
    assert mse_only[2] == by_position[2] and mse_only[1] == by_position[1]


@pytest.mark.parametrize("call", ["sixteen positionals", "an output by position",
                                  "an unknown keyword", "shape as one number"])
def test_quantize_chunk_refuses_the_old_positional_form(call):
    k = kernel()
    x, scales, shape, tile, rounding, scratch = chunk_args(
        np.ones((2, 8), np.float32))
    hist = np.zeros(1 << 16, np.int64)
    calls = {
        "sixteen positionals": lambda: k.quantize_chunk(x, scales, 2, 8, 1, 8, *rounding,
                                                        scratch, hist, None, None, None, 0),
        "an output by position": lambda: k.quantize_chunk(x, scales, shape, tile, rounding,
                                                          scratch, hist),
        "an unknown keyword": lambda: k.quantize_chunk(x, scales, shape, tile, rounding,
                                                       scratch, histogram=hist),
        "shape as one number": lambda: k.quantize_chunk(x, scales, 16, tile, rounding,
                                                        scratch),
    }
    with pytest.raises(TypeError):
        calls[call]()
    assert not hist.any()
