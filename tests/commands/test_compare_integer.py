"""``fmt compare`` of compressed-tensors' symmetric integer layouts (pack-quantized INT4 /
INT8) gets a fmt's own of the same groups: the symmetric grid amax / q_max
(``fmtcli/compare/integer.py``), checked here against a numpy oracle written from that
definition.  Without it a healthy INT4 group-128 export of heavy-tailed weights (cosine
0.975: 4 bits cannot do better) was flagged by the 0.99 cosine floor alone.  Fixtures:
``tests/layout_fixtures.py`` (compressed-tensors 0.20.1's definition, which the battery
checks bit for bit against the library's own files)."""

from __future__ import annotations

import dataclasses
import math

import layout_fixtures as lf
import numpy as np
import pytest
from cli_helpers import json_of
from safetensors.numpy import save_file

STEM = "model.layers.0.mlp.down_proj"
KEY = STEM + ".weight"


def oracle_sqnr(w: np.ndarray, bits: int, group: int | None) -> float:
    """10 log10(sum x^2 / sum e^2) of x_q = clip(round(x / s), -q, q) * s, s = amax / q."""
    x = w.astype(np.float64)
    q = 2 ** (bits - 1) - 1
    g = x.reshape(x.shape[0], -1, group)  # group = the columns: one scale per row
    s = np.abs(g).max(axis=-1, keepdims=True) / q
    e = np.clip(np.round(g / s), -q, q) * s - g
    return 10 * math.log10(float(np.sum(x * x)) / float(np.sum(e * e)))


@pytest.fixture(scope="module")
def weight() -> np.ndarray:
    return lf.llm_like(7, (128, 512))[0]


def compared(tmp_path, w, scheme: str, edit=None) -> dict:
    tensors = lf.ct_tensors(STEM, w, scheme)
    if edit is not None:
        edit(tensors)
    folder = lf.write_layout(tmp_path / "q", tensors, lf.ct_config(scheme))
    save_file({KEY: w}, str(tmp_path / "orig.safetensors"))
    (t,) = json_of("compare", tmp_path / "orig.safetensors", folder)["tensors"]
    return t


@pytest.mark.parametrize(("scheme", "bits", "group", "label"), [
    ("int4", 4, 128, "int4 block 128 (symmetric, amax/7)"),
    ("int8", 8, 128, "int8 block 128 (symmetric, amax/127)"),
    ("int8-channel", 8, 512, "int8 row (symmetric, amax/127)")])
def test_a_healthy_integer_export_is_ok_beside_fmts_own(tmp_path, weight, scheme, bits,
                                                        group, label):
    t = compared(tmp_path, weight, scheme)
    assert t["fmt_scheme"] == label
    assert t["fmt_sqnr_db"] == pytest.approx(oracle_sqnr(weight, bits, group), abs=1e-9)
    assert t["verdict"] == "ok", t["reasons"]
    assert abs(t["sqnr_db"] - t["fmt_sqnr_db"]) < 1  # the library's rule, within a dB


def test_int4_cosine_below_the_floor_is_not_flagged_alone(tmp_path, weight):
    t = compared(tmp_path, weight, "int4")
    assert t["cosine"] < 0.99 and t["verdict"] == "ok"  # fmt's own is below 0.99 too


def test_half_size_integer_scales_are_flagged_by_the_gap(tmp_path, weight):
    def halve(tensors):
        tensors[STEM + ".weight_scale"] = tensors[STEM + ".weight_scale"] / np.float32(2)
    t = compared(tmp_path, weight, "int8", halve)
    assert t["verdict"] == "flag"
    assert any("below fmt's own" in r for r in t["reasons"]), t["reasons"]


def test_an_asymmetric_layout_gets_no_fmts_own(tmp_path, weight):
    """A zero point: the grid is not symmetric, so fmt has no own of it (cosine alone)."""
    from fmtcli.compare.integer import own_integer
    from fmtcli.inputs.tensors import load_path

    folder = lf.write_layout(tmp_path / "q", lf.ct_tensors(STEM, weight, "int4"),
                             lf.ct_config("int4"))
    (source,) = load_path(str(folder))
    q = source.quantized
    assert own_integer(source, q) is not None
    asym = dataclasses.replace(q, facts={**q.facts, "symmetric": False})
    assert own_integer(source, asym) is None
