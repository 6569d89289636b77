"""``fmt compare ORIGINAL OWN`` where OWN is fmt's own ``--out`` (``inputs/layouts/fmt_out``):
fmt's own quantization is the scheme the file records (its rule, margin and scale format),
so a healthy file equals it.  Before, fmt-out's float32 scales made fmt's own the plain amax
rule: an MXFP4 ``--out`` (cosine 0.989) was flagged against an amax-scaled FP4 that
reaches 0.994."""

from __future__ import annotations

import layout_fixtures as lf
import numpy as np
import pytest
from cli_helpers import json_of, succeeds
from safetensors.numpy import save_file

KEY = "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize(("recipe", "label"), [
    ("mxfp4", "mxfp4: block 32"), ("mxfp8", "mxfp8: block 32"), ("nvfp4", "nvfp4: block 16"),
    ("deepseek", "deepseek: tile 128x128")])
def test_fmts_own_out_is_judged_against_its_recorded_scheme(tmp_path, recipe, label):
    w, _ = lf.llm_like(2, (128, 512))
    save_file({KEY: w}, str(tmp_path / "orig.safetensors"))
    succeeds("quantize", tmp_path / "orig.safetensors", "--recipe", recipe, "--out",
             tmp_path / "q.safetensors")
    (t,) = json_of("compare", tmp_path / "orig.safetensors", tmp_path / "q.safetensors")[
        "tensors"]
    assert t["layout"] == "fmt-out" and t["fmt_scheme"] == label
    assert t["sqnr_db"] == pytest.approx(t["fmt_sqnr_db"], abs=1e-5)  # the same quantization
    assert t["verdict"] == "ok", t["reasons"]


def test_a_margin_is_recorded_and_half_scales_are_still_flagged(tmp_path):
    w, _ = lf.llm_like(3, (128, 512))
    save_file({KEY: w}, str(tmp_path / "orig.safetensors"))
    succeeds("quantize", tmp_path / "orig.safetensors", "--recipe", "mxfp4", "--margin", "1",
             "--out", tmp_path / "q.safetensors")
    (t,) = json_of("compare", tmp_path / "orig.safetensors", tmp_path / "q.safetensors")[
        "tensors"]
    assert t["sqnr_db"] == pytest.approx(t["fmt_sqnr_db"], abs=1e-5) and t["verdict"] == "ok"
    from oracle import read_safetensors, write_safetensors

    tensors, metadata = read_safetensors(tmp_path / "q.safetensors")
    tensors = dict(tensors, **{KEY + ".scales": tensors[KEY + ".scales"] * np.float32(2)})
    write_safetensors(tmp_path / "half.safetensors", tensors, metadata)  # x = codes / scales
    (t,) = json_of("compare", tmp_path / "orig.safetensors", tmp_path / "half.safetensors")[
        "tensors"]
    assert t["verdict"] == "flag" and any("below fmt's own" in r for r in t["reasons"])
