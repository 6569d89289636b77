"""``fmt quantize --out DIR --layout L`` on weights no layout can store: NaN and inf.

A layout folder is a model that loaders serve without looking, so a weight holding NaN or
inf (whose tiles the engine gives NaN or zero scales) is refused in one line naming it,
exit 1, nothing on stdout and nothing written (no DIR, no temporary left beside it).  fmt's
own ``--out`` file keeps recording x_q with its NaN (docs/quantize.md, Edge cases): that
convention is held here too, so that the difference is deliberate.  Every command runs in
a fresh process (``run_fmt_each``: one interpreter, a forked child per command).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from cli_helpers import assert_data_error, run_fmt_each, strict_loads

from fmtcli.engine.writers import write_safetensors
from fmtcli.inputs.safetensorsfile import load_safetensors

KEY = "model.layers.0.mlp.up_proj.weight"
LAYOUTS = {"compressed-tensors": ["--per", "row"], "deepseek-fp8": ["--tile", "128x128"],
           "modelopt-nvfp4": ["--recipe", "nvfp4"]}


def _result(code: int, out: bytes, err: bytes) -> SimpleNamespace:
    """run_fmt_each's triple in the shape assert_error reads."""
    return SimpleNamespace(exit_code=code, stdout=out.decode(), stderr=err.decode(),
                           exception=None)


def _weights(tmp_path) -> dict:
    """name -> a .safetensors of one 64 x 128 linear weight (and a norm, copied as is)."""
    rng = np.random.default_rng(5)
    healthy = (rng.standard_normal((64, 128)) * 0.02).astype(np.float32)
    one_inf, one_nan = healthy.copy(), healthy.copy()
    one_inf[7, 3] = np.inf
    one_nan[60, 127] = np.nan
    found = {}
    for name, w in (("all-nan", np.full((64, 128), np.nan, np.float32)),
                    ("one-inf", one_inf), ("one-nan", one_nan), ("healthy", healthy),
                    ("zero", np.zeros((64, 128), np.float32))):
        path = tmp_path / f"{name}.safetensors"
        write_safetensors(str(path), {KEY: w, "model.norm.weight": np.ones(128, np.float32)})
        found[name] = path
    return found


def _leftovers(tmp_path) -> list[str]:
    return [n for n in os.listdir(tmp_path) if n.startswith(".fmtcli")]


@pytest.mark.slow  # six fresh commands: ~12 s on a busy two-core machine
def test_a_weight_holding_nan_or_inf_is_refused_and_nothing_is_written(tmp_path):
    files = _weights(tmp_path)
    cases = [("all-nan", layout, False) for layout in LAYOUTS] + [
        (name, layout, True) for name, layout in (("one-inf", "compressed-tensors"),
                                                  ("one-nan", "deepseek-fp8"),
                                                  ("one-inf", "modelopt-nvfp4"))]
    commands = [["quantize", files[name], *LAYOUTS[layout], "--out",
                 tmp_path / f"{name}-{layout}-{json}", "--layout", layout,
                 *(["--json"] if json else [])] for name, layout, json in cases]
    for (name, layout, json), done in zip(cases, run_fmt_each(commands)):
        line = assert_data_error(_result(*done), KEY, "NaN or infinite", "--layout " + layout,
                                 "nothing written")
        count = "8,192 NaN or infinite values" if name == "all-nan" else \
            "1 NaN or infinite value,"
        assert count in line, line
        assert not (tmp_path / f"{name}-{layout}-{json}").exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.slow  # six fresh commands
def test_healthy_and_all_zero_weights_are_still_written(tmp_path):
    files = _weights(tmp_path)
    cases = [(name, layout) for name in ("healthy", "zero") for layout in LAYOUTS]
    commands = [["quantize", files[name], *LAYOUTS[layout], "--out",
                 tmp_path / f"{name}-{layout}", "--layout", layout, "--json"]
                for name, layout in cases]
    for (name, layout), (code, out, err) in zip(cases, run_fmt_each(commands)):
        assert code == 0, err.decode()
        assert strict_loads(out.decode())["output"]["layout"] == layout
        assert (tmp_path / f"{name}-{layout}" / "model.safetensors").is_file()


def test_overflow_ieee_nan_codes_are_refused(tmp_path):
    """--overflow ieee past 448 makes E4M3's NaN code of finite values: refused too."""
    files = _weights(tmp_path)
    target = tmp_path / "ieee"
    ((code, out, err),) = run_fmt_each([[
        "quantize", files["healthy"], "--per", "row", "--scale-rule", "pow2-ceil",
        "--overflow", "ieee", "--out", target, "--layout", "compressed-tensors"]])
    assert_data_error(_result(code, out, err), KEY, "overflowed to float8_e4m3fn's NaN",
                      "--overflow ieee", "nothing written")
    assert not target.exists() and _leftovers(tmp_path) == []


def test_fmts_own_out_keeps_recording_nan(tmp_path):
    """The convention --layout departs from on purpose: fmt's own --out file records the
    engine's x_q, NaN scale included, and exits 0; its statistics count the row's other
    127 values that came out NaN (nan_produced)."""
    files = _weights(tmp_path)
    target = tmp_path / "q.safetensors"
    ((code, out, err),) = run_fmt_each([["quantize", files["one-nan"], "--per", "row",
                                         "--out", target, "--json"]])
    assert code == 0, err.decode()
    stored = {s.key: s.array() for s in load_safetensors(str(target))}
    assert np.isnan(stored[KEY + ".scales"]).sum() == 1
    runs = {r["label"]: r for r in strict_loads(out.decode())["tensors"][0]["schemes"]}
    assert runs["per-row"]["nan_produced"] == 127
