"""render/: one registry, one module per command, shared widgets below them.

``fmtcli.render`` is the registry alone: it names each result type's renderer (a module of
render/ and a function in it) and loads it when a result is drawn.  A command's module
imports only the shared ones (``fit``, ``numbers``, ``widgets``, ``plaintable``) and those of
its own command (``quantize`` and ``quantize_*``), never another command's, and none imports
the registry but ``fit`` (for ``PLAIN_ROWS``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
from cli_helpers import invoke

from fmtcli import render

RENDER = Path(render.__file__).parent
#: the modules every command's tables may use
SHARED = {"fit", "numbers", "widgets", "plaintable"}
#: the other views of a result (--json, --csv): no table, nothing drawn
VIEWS = {"jsonsafe", "csvout"}


def _command(module: str) -> str:
    """The command a render module belongs to: ``quantize_cells`` -> ``quantize``."""
    return module.split("_")[0] if module.startswith("quantize") else module


def _render_modules() -> list[str]:
    return sorted(p.stem for p in RENDER.glob("*.py") if p.stem != "__init__")


def _render_imports(module: str) -> list[tuple[str, int]]:
    """(module of render/, line) of every import of the registry (``""``) or of a module of
    render/ in ``module``: module-level, function-level and TYPE_CHECKING ones alike."""
    out = []
    for node in ast.walk(ast.parse((RENDER / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "fmtcli":
            out += [("", node.lineno) for a in node.names if a.name == "render"]
        elif isinstance(node, ast.ImportFrom) and node.module == "fmtcli.render":
            out += [(a.name if (RENDER / f"{a.name}.py").exists() else "", node.lineno)
                    for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "fmtcli.render."):
            out.append((node.module.split(".")[2], node.lineno))
        elif isinstance(node, ast.Import):
            out += [((a.name.split(".") + [""])[2], node.lineno) for a in node.names
                    if a.name == "fmtcli.render" or a.name.startswith("fmtcli.render.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"render.{module} line {node.lineno}: a relative import")
    return out


@pytest.mark.parametrize("module", _render_modules())
def test_a_command_s_module_imports_only_the_shared_ones_and_its_own(module):
    for other, line in _render_imports(module):
        if other == "":  # the registry: only for the knob the width rules read
            assert module == "fit", f"render.{module} line {line} imports the registry"
            continue
        assert other in SHARED or _command(other) == _command(module), (
            f"render.{module} line {line} imports render.{other}: another command's tables")
        if module in SHARED:
            assert other in SHARED, f"shared render.{module} imports render.{other}"


def test_every_registered_renderer_is_a_function_of_its_command_s_module():
    modules = set(_render_modules())
    for (_, name), (module, function) in render.RENDERERS.items():
        assert module in modules - SHARED - VIEWS, (name, module)
        assert callable(getattr(import_module(f"fmtcli.render.{module}"), function))
    commands = {_command(m) for m in modules - SHARED - VIEWS}
    assert commands == {_command(m) for m, _ in render.RENDERERS.values()}, \
        "a command's render module that no result type uses"


def test_an_unregistered_result_type_is_a_type_error():
    class Unknown:
        pass

    with pytest.raises(TypeError, match="no renderer for .*Unknown"):
        render.render(Unknown())


PROBE = """
import sys
from fmtcli.cli import main
sys.argv = ["fmt", *{args!r}]
try:
    main()
except SystemExit:
    pass
print("LOADED", ",".join(sorted(m for m in sys.modules if m.startswith("fmtcli.render"))),
      file=sys.stderr)
"""


def _loaded_render_modules(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=list(args))],
                          capture_output=True, text=True, timeout=120)
    line = proc.stderr.rsplit("LOADED", 1)[1].strip()
    return {m.removeprefix("fmtcli.render").lstrip(".") for m in line.split(",") if m}


@pytest.mark.slow
@pytest.mark.parametrize("args, own", [
    (["range", "fp8"], {"range"}),
    (["underflow", "1e-8,3"], {"underflow"}),
    (["loss-scale", "--histogram"], {"loss_scale"}),
    (["calc", "1 + 2^-9", "--format", "bf16"], {"arithmetic"}),
])
def test_drawing_one_command_s_table_loads_only_its_renderer(args, own):
    """The registry loads the one module of the result's command (and the shared ones):
    no other command's tables, no JSON writer."""
    loaded = _loaded_render_modules(*args)
    assert own <= loaded, loaded
    assert loaded - {""} - own <= SHARED, loaded


def test_the_registry_alone_loads_no_renderer():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, fmtcli.render; print(sorted(m for m in "
         "sys.modules if m.startswith('fmtcli.render.')))"],
        capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_plain_rows_is_the_knob_fit_reads(monkeypatch, table_renders):
    """``fmtcli.render.PLAIN_ROWS`` decides, when a table is drawn, whether rich lays it out
    (tests turn it to compare plaintable's bytes with rich's)."""
    args = ("underflow", "1,2,3", "--format", "fp16")
    by_rich = invoke(*args, env={"COLUMNS": "80"})
    assert table_renders, "a small table is laid out by rich"
    table_renders.clear()
    monkeypatch.setattr(render, "PLAIN_ROWS", 0)
    by_plaintable = invoke(*args, env={"COLUMNS": "80"})
    assert table_renders == [], "PLAIN_ROWS 0: every plain table drawn line by line"
    assert by_plaintable.stdout == by_rich.stdout
