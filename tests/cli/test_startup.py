"""Start-up: the parser is built from ``fmtcli.base.choices`` alone, so ``fmt --version`` and
``fmt --help`` load neither numpy nor ml_dtypes; each command loads its own modules.
(Timing is in benchmarks/bench_startup.py; these tests check what is imported.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from fmtcli.cli import main
sys.argv = ["fmt", *{args!r}]
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("numpy", "ml_dtypes", "rich", "fmtcli.numerics.rounding", "fmtcli.quantize")
               if m in sys.modules)
print("LOADED", ",".join(heavy), file=sys.stderr)
"""


def loaded(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=list(args))],
                          capture_output=True, text=True, timeout=60)
    line = proc.stderr.rsplit("LOADED", 1)[1].strip()
    return set(filter(None, line.split(",")))


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--version"], ["--help"], ["quantize", "--help"],
                                  ["loss-scale", "--help"], ["--show-completion", "bash"]])
def test_version_and_help_load_no_numerical_library(args):
    assert loaded(*args) == set()


@pytest.mark.slow
def test_a_command_loads_only_what_it_uses():
    assert "fmtcli.quantize" not in loaded("range", "fp16", "--json")
    assert "fmtcli.quantize" in loaded("quantize", "--json")


def test_the_version_is_the_installed_distribution_s():
    from importlib.metadata import version

    import fmtcli

    assert fmtcli.__version__ == version("fmtcli")
    from typer.testing import CliRunner

    from fmtcli.cli import app

    assert CliRunner().invoke(app, ["--version"]).stdout == f"fmtcli {version('fmtcli')}\n"


def test_the_parser_s_recipe_names_are_the_recipes():
    from fmtcli.base.choices import RECIPE_NAMES
    from fmtcli.numerics.schemes import RECIPES

    assert RECIPE_NAMES == tuple(RECIPES)


def test_the_package_s_names_load_on_first_use():
    import fmtcli

    assert fmtcli.get_format("fp16").max == 65504
    assert set(fmtcli.__all__) <= set(dir(fmtcli))
    with pytest.raises(AttributeError):
        fmtcli.no_such_name  # noqa: B018


def test_every_renderer_names_a_real_result_type():
    """render.RENDERERS is keyed by (module, name): each key is a class that exists, and
    every result type of fmtcli has an entry."""
    import importlib

    from fmtcli.render import RENDERERS

    for module, name in RENDERERS:
        assert isinstance(getattr(importlib.import_module(module), name), type)
    assert {name for _, name in RENDERERS} == {
        "FormatTable", "UnderflowResult", "QuantizeResult", "ScaleSearchResult",
        "LossScaleResult", "ConformanceResult", "SoftmaxTrace",
        "AttentionResult", "CalcResult", "SumResult", "DotResult", "CompareResult",
        "KvResult", "AuditResult", "TrainResult"}


@pytest.mark.slow
def test_drawing_the_range_table_loads_no_engine():
    assert not {"fmtcli.quantize", "fmtcli.numerics.rounding"} & loaded("range")


def test_one_table_of_storage_types_feeds_every_list():
    """dtypes.TABLE is the one list: the loaders, the torch backend, the safetensors writer
    and the CUDA kernel use views of it, and each name is a real numpy / ml_dtypes dtype."""
    import ml_dtypes

    from fmtcli.base import dtypes
    from fmtcli.engine import cuda, cuda_kernel, writers
    from fmtcli.inputs import tensors
    from fmtcli.numerics import backends

    assert tensors.FLOAT_KINDS is dtypes.FLOAT_NAMES
    assert backends.TORCH_NAMES is dtypes.TORCH_NAMES
    assert writers.SAFETENSORS_CODES is dtypes.SAFETENSORS_CODES
    assert cuda.KERNEL_CODES is cuda_kernel.KERNEL_CODES is dtypes.KERNEL_CODES
    for t in dtypes.TABLE:
        dtype = tensors.numpy_dtype(t.name)
        assert dtype.name == t.name
        # numpy's own floats have kind 'f', ml_dtypes' kind 'V'; ints 'i'/'u', bool 'b'
        assert (dtype.kind in "fV") == t.floating, t.name
        assert dtype.kind != "V" or hasattr(ml_dtypes, t.name)
    assert {code: d.name for code, d in tensors.safetensors_dtypes().items()} == \
        dtypes.SAFETENSORS_NAMES
    assert set(dtypes.KERNEL_CODES) == {"float32", "bfloat16", "float16"}


def test_fmt_help_lists_the_commands_in_the_order_of_a_session():
    """range, underflow, quantize, scale-search, loss-scale, check-backends, softmax,
    attention: the order fmtcli.cli.COMMANDS registers them in (an import sorter must not
    reorder them)."""
    from typer.testing import CliRunner

    from fmtcli.cli import app

    listed = [line.split()[0] for line in CliRunner().invoke(app, ["--help"]).stdout
              .split("Commands:")[1].splitlines()
              if line.strip() and not line.startswith("   ")]  # not a wrapped help line
    assert listed == ["range", "underflow", "quantize", "scale-search", "loss-scale",
                      "check-backends", "softmax", "attention", "calc", "sum", "dot",
                      "compare", "kv", "audit", "train"]


@pytest.mark.parametrize("args, built", [(["range", "fp16", "--json"], 1),
                                         (["quantize", "--help"], 1),
                                         (["--help"], None), ([], None),
                                         (["quantiz"], None)])
def test_fmt_command_builds_the_parser_of_that_command_alone(monkeypatch, capsys, args, built):
    """typer builds every command's parser on every run (~30 ms); ``main`` hands it the one
    command asked for, the whole group otherwise, and leaves the registry as it was."""
    import importlib

    import typer.main

    app_module = importlib.import_module("fmtcli.cli.app")  # (fmtcli.cli.app: the Typer)

    every = list(app_module.app.registered_commands)
    calls = []
    real = typer.main.get_command_from_info
    monkeypatch.setattr(typer.main, "get_command_from_info",
                        lambda *a, **kw: (calls.append(kw.get("command_info", a[0] if a else None)),
                                          real(*a, **kw))[1])
    monkeypatch.setattr(sys, "argv", ["fmt", *args])
    with pytest.raises(SystemExit):
        app_module.main()
    capsys.readouterr()
    assert len(calls) == (len(every) if built is None else built)
    if built:
        assert app_module.command_name(calls[0]) == args[0]
    assert app_module.app.registered_commands == every


@pytest.mark.slow
def test_a_float32_file_is_quantized_without_ml_dtypes(tmp_path):
    """ml_dtypes (~5 ms to import) loads only for the narrow types that need it."""
    import numpy as np

    path = tmp_path / "x.npy"
    np.save(path, np.linspace(-1, 1, 300, dtype=np.float32))
    assert "ml_dtypes" not in loaded("quantize", str(path), "--json")
