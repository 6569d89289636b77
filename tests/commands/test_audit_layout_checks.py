"""fmt audit's layout-specific checks (fmtcli/audit/layout_checks.py): each fires on a
broken fixture and stays quiet on the healthy one.

Fixtures are written here from the exporters' definitions, with no fmtcli code:
ModelOpt NVFP4 (``NVFP4QTensor``: weight_scale_2 = amax / 2688, block scales
e4m3(block_amax / (6 weight_scale_2)), FP4 codes low nibble first); compressed-tensors
MXFP4 (``generate_mx_scales``: floor(log2 amax') - 2, amax' a binade up when its
significand >= 1.75); DeepSeek UE8M0 (DeepGEMM ``ceil_to_ue8m0(amax / 448)``, the codes
quantized with the rounded scale; transformers PR #46763's bug quantized with the
unrounded one); gpt-oss MXFP4 (OCP MX v1.0's floor rule).  They are read through the real
readers (``layouts.scan`` over ``load_path(as_stored=True)``); compressed-tensors NVFP4
(``generate_gparam``) through its reader too, through the real reader and, for cases that reader refuses, as ``Quantized``
built here.
"""

from __future__ import annotations

import json
from pathlib import Path

import layout_fixtures as lf
import ml_dtypes
import numpy as np
import pytest
from oracle import write_safetensors

from fmtcli.audit.check import Verdict
from fmtcli.audit.layout_checks import CHECKS
from fmtcli.inputs.layouts import Scan, read_config, scan
from fmtcli.inputs.layouts.base import Quantized
from fmtcli.inputs.tensors import load_path
from fmtcli.numerics.granularity import ScaleGroup

E4M3 = ml_dtypes.float8_e4m3fn


def fp4_codes(x: np.ndarray) -> np.ndarray:
    """FP4 E2M1 4-bit codes of ``x`` (nearest-even, saturating at 6)."""
    return np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F


def pack(codes: np.ndarray, low_first: bool = True) -> np.ndarray:
    first, second = codes[..., 0::2], codes[..., 1::2]
    return (first | second << 4) if low_first else (second | first << 4)


def gaussian(seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def smooth(seed: int, shape) -> np.ndarray:
    """Rows that change slowly along the columns (neighbour structure)."""
    rng = np.random.default_rng(seed)
    cols = np.arange(shape[-1])
    phase = rng.uniform(0, 6.3, shape[:-1] + (1,))
    return (0.02 * np.sin(cols / 9.0 + phase) + 0.001 * rng.standard_normal(shape)
            ).astype(np.float32)


def nvfp4(w: np.ndarray, low_first=True, block_factor=1.0, invert=False) -> dict:
    """ModelOpt NVFP4 tensors of a 2-D weight (its definition, written out)."""
    amax = float(np.abs(w).max())
    second = np.float32(amax / 2688)
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = (np.abs(blocks).max(-1) / (6 * np.float64(second))).astype(E4M3)
    per = scale.astype(np.float64)[..., None] * np.float64(second)
    codes = fp4_codes((blocks / np.where(per == 0, 1, per)).reshape(w.shape))
    scale = (scale.astype(np.float64) * block_factor).astype(E4M3)
    return {"m.weight": pack(codes, low_first).astype(np.uint8), "m.weight_scale": scale,
            "m.weight_scale_2": np.array(1 / second if invert else second, np.float32),
            "m.input_scale": np.array(0.01, np.float32)}


def audit(folder: Path, tensors: dict, config: dict | None = None) -> tuple[list, Scan]:
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    result = scan(load_path(str(folder), as_stored=True), read_config(str(folder)))
    assert result.quantized
    return result.quantized, result


def check(q, result, name: str):
    found = [c for c in (f(q, result) for f in CHECKS) if c is not None and c.name == name]
    return found[0] if found else None


MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


# -- 1. the global scale's convention -------------------------------------------------------

def test_the_modelopt_global_scale_passes_and_its_inverse_fails(tmp_path):
    w = gaussian(1, (64, 256))
    (q,), result = audit(tmp_path / "ok", nvfp4(w), MODELOPT)
    good = check(q, result, "global-scale")
    assert good.verdict is Verdict.OK and good.figures["headroom"] == pytest.approx(1, abs=0.07)
    assert good.figures["implied_amax"] == pytest.approx(np.abs(w).max(), rel=1e-6)
    (q,), result = audit(tmp_path / "bad", nvfp4(w, invert=True), MODELOPT)
    bad = check(q, result, "global-scale")
    assert bad.verdict is Verdict.FAIL and "inverted" in bad.evidence
    assert bad.figures["implied_amax_reciprocal"] == pytest.approx(np.abs(w).max(), rel=1e-6)


def test_a_global_scale_neither_reading_explains_warns(tmp_path):
    w = gaussian(2, (64, 256)) / 0.02 * 700  # amax ~2700: both readings ~2688
    (q,), result = audit(tmp_path, nvfp4(w), MODELOPT)
    found = check(q, result, "global-scale")
    assert found.verdict is Verdict.WARN and "neither" in found.evidence


@pytest.mark.parametrize("factor, verdict", [(0.5, Verdict.FAIL), (0.25, Verdict.WARN)])
def test_half_size_block_scales_fail_smaller_ones_warn(tmp_path, factor, verdict):
    (q,), result = audit(tmp_path, nvfp4(gaussian(2, (64, 256)), block_factor=factor),
                         MODELOPT)
    found = check(q, result, "global-scale")
    assert found.verdict is verdict and found.figures["input_headroom"] == pytest.approx(
        factor, abs=0.04)
    assert ("half-size" in found.evidence) is (verdict is Verdict.FAIL)


def test_one_stacked_expert_with_half_size_block_scales_fails(tmp_path):
    one = [nvfp4(gaussian(30 + i, (32, 64)) * (1 + i), block_factor=0.5 if i == 2 else 1)
           for i in range(4)]
    (q,), result = audit(tmp_path, {k: np.stack([p[k] for p in one]) for k in one[0]},
                         MODELOPT)
    found = check(q, result, "global-scale")
    assert found.verdict is Verdict.FAIL and "an expert's" in found.evidence
    assert found.figures["headroom"] == pytest.approx(1, abs=0.07)


def ct_nvfp4(w: np.ndarray, invert: bool = False) -> dict:
    """nvfp4-pack-quantized tensors (compressed-tensors generate_gparam /
    calculate_qparams: weight_global_scale = 2688 / amax, weight_scale =
    e4m3(global * block_amax / 6), x = code * weight_scale / weight_global_scale)."""
    glob = np.float32(2688 / np.abs(w).max())
    blocks = w.reshape(w.shape[0], -1, 16).astype(np.float64)
    scale = (np.float64(glob) * np.abs(blocks).max(-1) / 6).astype(E4M3)
    per = scale.astype(np.float64)[..., None] / np.float64(glob)
    codes = fp4_codes((blocks / np.where(per == 0, 1, per)).reshape(w.shape))
    return {"m.weight_packed": pack(codes).astype(np.uint8), "m.weight_scale": scale,
            "m.weight_global_scale": np.array([1 / glob if invert else glob], np.float32)}


CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}


def test_the_compressed_tensors_global_scale_divides(tmp_path):
    w = gaussian(3, (32, 128))
    (q,), result = audit(tmp_path / "ok", ct_nvfp4(w), CT_NVFP4)
    assert q.facts["global_scale_convention"] == "compressed-tensors"
    good = check(q, result, "global-scale")
    assert good.verdict is Verdict.OK
    assert good.figures["implied_amax"] == pytest.approx(np.abs(w).max(), rel=1e-6)
    (q,), result = audit(tmp_path / "bad", ct_nvfp4(w, invert=True), CT_NVFP4)
    assert check(q, result, "global-scale").verdict is Verdict.FAIL


# -- 2. the nibble order --------------------------------------------------------------------

def test_swapped_nibbles_fail_on_structured_rows(tmp_path):
    w = smooth(4, (64, 512))
    (q,), result = audit(tmp_path / "ok", nvfp4(w), MODELOPT)
    good = check(q, result, "nibble-order")
    assert good.verdict is Verdict.OK and good.figures["confidence"] == "high"
    (q,), result = audit(tmp_path / "bad", nvfp4(w, low_first=False), MODELOPT)
    bad = check(q, result, "nibble-order")
    assert bad.verdict is Verdict.FAIL and "swapped" in bad.evidence


def test_random_weights_leave_the_nibble_order_inconclusive(tmp_path):
    for order in (True, False):
        (q,), result = audit(tmp_path / str(order), nvfp4(gaussian(5, (64, 512)), order),
                             MODELOPT)
        found = check(q, result, "nibble-order")
        assert found.verdict is Verdict.OK and found.figures["confidence"] == "low"


def with_norm(low_first: bool, tied: bool) -> dict:
    """q_proj with per-input-channel magnitudes and its layer's input_layernorm: tied
    (the norm's gains follow the columns', as trained layers' outlier channels do) or not."""
    rng = np.random.default_rng(16)
    gains = np.exp(rng.standard_normal(512))
    w = (rng.standard_normal((128, 512)) * gains * 0.02).astype(np.float32)
    norm = (1 / gains if tied else np.exp(rng.standard_normal(512))).astype(np.float32)
    tensors = {k.replace("m.", "model.layers.0.self_attn.q_proj."): v
               for k, v in nvfp4(w, low_first).items()}
    return {**tensors, "model.layers.0.input_layernorm.weight": norm}


def test_swapped_nibbles_fail_against_the_layer_norm(tmp_path):
    (q,), result = audit(tmp_path / "ok", with_norm(True, True), MODELOPT)
    good = check(q, result, "nibble-order")
    assert good.verdict is Verdict.OK and good.figures["confidence"] == "high"
    assert good.figures["anchor"] == "model.layers.0.input_layernorm.weight"
    (q,), result = audit(tmp_path / "bad", with_norm(False, True), MODELOPT)
    bad = check(q, result, "nibble-order")
    assert bad.verdict is Verdict.FAIL and "input_layernorm" in bad.evidence
    for order in (True, False):  # a norm unrelated to the columns decides nothing
        (q,), result = audit(tmp_path / f"free{order}", with_norm(order, False), MODELOPT)
        found = check(q, result, "nibble-order")
        assert found.verdict is Verdict.OK and found.figures["confidence"] == "low"


# -- 3. the exporter's MX scale rule --------------------------------------------------------

def ct_exponent(amax: np.ndarray) -> np.ndarray:
    """compressed-tensors generate_mx_scales (FP4): round_to_power_2 then floor(log2) - 2."""
    bits = amax.astype(np.float32).view(np.uint32)
    rounded = ((bits + (1 << 21)) & 0xFF800000).view(np.float32)
    return np.floor(np.log2(rounded)).astype(np.int32) - 2


def ct_mxfp4(w: np.ndarray, shift: int = 0, quantize_shift: int | None = None) -> dict:
    """mxfp4-pack-quantized tensors: ``shift`` moves the stored exponent, the codes
    quantized with the exponent moved by ``quantize_shift`` (default: the stored one)."""
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float64)
    e = ct_exponent(np.abs(blocks).max(-1))
    used = e + (shift if quantize_shift is None else quantize_shift)
    codes = fp4_codes((blocks / np.ldexp(1.0, used)[..., None]).reshape(w.shape))
    return {"m.weight_packed": pack(codes).astype(np.uint8),
            "m.weight_scale": (e + shift + 127).astype(np.uint8)}


CT_MX = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
                                       "weights": {"num_bits": 4, "type": "float",
                                                   "group_size": 32}}}}


def test_a_healthy_compressed_tensors_mx_file_follows_its_own_rule(tmp_path):
    w = gaussian(6, (128, 512)) * np.exp(np.random.default_rng(6).standard_normal((128, 1)))
    (q,), result = audit(tmp_path, ct_mxfp4(w), CT_MX)
    found = check(q, result, "mx-scale-rule")
    assert found.verdict is Verdict.OK and found.figures["share_below_rule"] == 0
    amax = np.abs(w.reshape(128, -1, 32)).max(-1)  # a strict OCP floor check would differ:
    ocp = np.floor(np.log2(amax)).astype(np.int32) - 2
    assert 0.05 < np.mean(ocp != ct_exponent(amax)) < 0.3


@pytest.mark.parametrize("shift, quantize_shift, words", [
    (1, None, "larger than the rule"),     # double scales: top codes 2-3
    (-1, None, "smaller than the codes"),  # half-size scales, codes clipped at 6
])
def test_scales_off_by_a_factor_fail(tmp_path, shift, quantize_shift, words):
    (q,), result = audit(tmp_path, ct_mxfp4(gaussian(7, (128, 512)), shift, quantize_shift),
                         CT_MX)
    found = check(q, result, "mx-scale-rule")
    assert found.verdict is Verdict.FAIL and words in found.evidence


def deepseek_ue8m0(w: np.ndarray, bug: bool = False, power_of_two: bool = True) -> dict:
    amax = np.abs(w.reshape(w.shape[0] // 128, 128, -1, 128)).max(axis=(1, 3))
    exact = amax / 448
    rounded = np.ldexp(1.0, np.ceil(np.log2(exact)).astype(np.int32))
    stored = rounded if power_of_two else exact
    used = exact if bug else stored
    per = np.repeat(np.repeat(used, 128, axis=0), 128, axis=1)
    return {"m.weight": (w / per).astype(E4M3),
            "m.weight_scale_inv": stored.astype(np.float32)}


DEEPSEEK = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
            "activation_scheme": "dynamic", "scale_fmt": "ue8m0"}


@pytest.mark.parametrize("bug, power_of_two, verdict, words", [
    (False, True, Verdict.OK, "round-up rule"),
    (True, True, Verdict.FAIL, "#46763"),
    (False, False, Verdict.FAIL, "not powers of two"),
])
def test_deepseek_ue8m0_scales(tmp_path, bug, power_of_two, verdict, words):
    w = gaussian(8, (512, 1024)) * np.exp(np.random.default_rng(8).standard_normal((512, 1)))
    (q,), result = audit(tmp_path, deepseek_ue8m0(w, bug, power_of_two), DEEPSEEK)
    found = check(q, result, "mx-scale-rule")
    assert found.verdict is verdict and words in found.evidence


def test_gpt_oss_mxfp4_under_the_ocp_rule_passes(tmp_path):
    w = gaussian(9, (4, 32, 256))
    blocks = w.reshape(4, 32, 8, 32).astype(np.float64)
    e = np.floor(np.log2(np.abs(blocks).max(-1))).astype(np.int32) - 2
    codes = fp4_codes(blocks / np.ldexp(1.0, e)[..., None]).reshape(4, 32, 8, 32)
    (q,), result = audit(tmp_path, {"m.blocks": pack(codes).astype(np.uint8),
                                    "m.scales": (e + 127).astype(np.uint8)})
    found = check(q, result, "mx-scale-rule")
    assert found.verdict is Verdict.OK and found.figures["rule"] == "unpublished"


def test_gpt_oss_double_scales_fail(tmp_path):
    w = gaussian(9, (4, 32, 256))
    blocks = w.reshape(4, 32, 8, 32).astype(np.float64)
    e = np.floor(np.log2(np.abs(blocks).max(-1))).astype(np.int32) - 1  # one binade up
    codes = fp4_codes(blocks / np.ldexp(1.0, e)[..., None]).reshape(4, 32, 8, 32)
    (q,), result = audit(tmp_path, {"m.blocks": pack(codes).astype(np.uint8),
                                    "m.scales": (e + 127).astype(np.uint8)})
    found = check(q, result, "mx-scale-rule")
    assert found.verdict is Verdict.FAIL and found.figures["share_below_rule"] > 0.1


# -- 4. per-expert scales -------------------------------------------------------------------

def experts(tmp_path, shared: bool) -> tuple[list, Scan]:
    tensors = {}
    for i in range(3):
        w = gaussian(10 + i, (32, 64))
        one = nvfp4(w / np.abs(w).max() * 0.05 if shared else w * (1 + i))
        tensors.update({k.replace("m.", f"model.mlp.experts.{i}.up."): v
                        for k, v in one.items()})
    return audit(tmp_path, tensors, MODELOPT)


def test_experts_sharing_one_global_scale_warn_once(tmp_path):
    quantized, result = experts(tmp_path / "shared", shared=True)
    found = [check(q, result, "expert-scales") for q in quantized]
    assert found[0].verdict is Verdict.WARN and "share one global scale" in found[0].evidence
    assert found[1:] == [None, None]
    quantized, result = experts(tmp_path / "own", shared=False)
    assert check(quantized[0], result, "expert-scales").verdict is Verdict.OK


def test_stacked_experts_with_one_global_scale_warn(tmp_path):
    for shared, verdict in ((True, Verdict.WARN), (False, Verdict.OK)):
        one = [nvfp4(gaussian(20 + i, (32, 64)) * (1 if shared else 1 + i)) for i in range(4)]
        tensors = {k: np.stack([p[k] for p in one]) for k in one[0]}
        if shared:
            tensors["m.weight_scale_2"][:] = tensors["m.weight_scale_2"].max()
        (q,), result = audit(tmp_path / str(shared), tensors, MODELOPT)
        found = check(q, result, "expert-scales")
        assert found.verdict is verdict and found.figures["global_scale_experts"] == 4


# -- 5. scales the config promises ----------------------------------------------------------

def test_a_missing_input_scale_or_kv_scale_warns(tmp_path):
    tensors = nvfp4(gaussian(13, (32, 64)))
    named = {k.replace("m.", "model.layers.0.self_attn.k_proj."): v for k, v in tensors.items()}
    config = {**MODELOPT, "kv_cache_quant_algo": "FP8"}
    (q,), result = audit(tmp_path / "kv", named, config)
    found = check(q, result, "missing-scales")
    assert found.verdict is Verdict.WARN and "k_scale" in found.evidence
    named["model.layers.0.self_attn.k_proj.k_scale"] = np.array(0.02, np.float32)
    named["model.layers.0.self_attn.v_proj.v_scale"] = np.array(0.02, np.float32)
    quantized, result = audit(tmp_path / "ok", named, config)
    found = [check(q, result, "missing-scales") for q in quantized]
    assert [f.verdict for f in found if f is not None] == [Verdict.OK]
    del tensors["m.input_scale"]
    (q,), result = audit(tmp_path / "input", tensors, MODELOPT)
    found = check(q, result, "missing-scales")
    assert found.verdict is Verdict.WARN and "m.input_scale" in found.evidence


def test_a_static_compressed_tensors_scheme_without_input_scale_warns(tmp_path):
    w = gaussian(17, (64, 128))
    scale = np.array([np.abs(w).max() / 448], np.float32)
    tensors = {"m.weight": (w / scale[0]).astype(E4M3), "m.weight_scale": scale}
    config = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {
                  "targets": ["Linear"], "format": "float-quantized",
                  "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                  "input_activations": {"num_bits": 8, "type": "float",
                                        "strategy": "tensor", "dynamic": False}}}}
    (q,), result = audit(tmp_path / "missing", tensors, config)
    found = check(q, result, "missing-scales")
    assert found.verdict is Verdict.WARN and found.figures["missing"] == ["m.input_scale"]
    tensors["m.input_scale"] = np.array([0.01], np.float32)
    (q,), result = audit(tmp_path / "there", tensors, config)
    assert check(q, result, "missing-scales").verdict is Verdict.OK


def test_compressed_tensors_promises_come_from_config_groups():
    from fmtcli.audit.layout_checks import promises

    q = Quantized("compressed-tensors-fp8", "m.weight", "x", (2, 2), "float8_e4m3fn",
                  "float32", ScaleGroup("tensor"), {}, lambda a, b: None)
    static = {"config_groups": {"g": {"input_activations": {"dynamic": False}}},
              "kv_cache_scheme": {"num_bits": 8}}
    assert promises(static, q) == ("input_scale", True)
    dynamic = {"config_groups": {"g": {"input_activations": {"dynamic": True}}}}
    assert promises(dynamic, q) == (None, False)


# -- 6. KV-cache scales ---------------------------------------------------------------------

def kv(values, direction="dequantization (x = code * k_scale)") -> Quantized:
    arr = np.asarray(values, dtype=np.float32)
    return Quantized("kv-scales", "model.layers.0.self_attn.k_scale", "x", arr.shape,
                     "float8_e4m3fn", "float32", ScaleGroup("tensor"), {},
                     lambda a, b: arr, {"scale_direction": direction},
                     scales_reader=lambda: arr)


@pytest.mark.parametrize("values, direction, verdict", [
    ([0.02], "dequantization", Verdict.OK),
    ([0.01, 0.02, 0.03, 0.04], "dequantization", Verdict.OK),
    ([0.0], "dequantization", Verdict.FAIL),
    ([float("nan")], "dequantization", Verdict.FAIL),
    ([0.02], "quantization (x = code / scale)", Verdict.FAIL),
    ([22400.0], "dequantization", Verdict.WARN),
    ([[0.1, 0.2], [0.3, 0.4]], "dequantization", Verdict.WARN),
])
def test_kv_scales(values, direction, verdict):
    q = kv(values, direction)
    found = check(q, Scan([q], [], None), "kv-scales")
    assert found.verdict is verdict


def test_checks_that_do_not_apply_say_none(tmp_path):
    w = gaussian(14, (256, 256))
    (q,), result = audit(tmp_path, deepseek_ue8m0(w, power_of_two=False),
                         {**DEEPSEEK, "scale_fmt": None})
    names = {c.name for c in (f(q, result) for f in CHECKS) if c is not None}
    assert names == set()


def test_kv_scales_through_the_reader(tmp_path):
    layer = "model.layers.0.self_attn."
    quantized, result = audit(tmp_path / "ok", {
        layer + "k_scale": np.array(0.05, np.float32),
        layer + "v_scale": np.full(4, 0.01, np.float32)})
    assert [check(q, result, "kv-scales").verdict for q in quantized] == [Verdict.OK] * 2
    quantized, result = audit(tmp_path / "inverted", {  # fmt's direction, 448 / amax
        layer + "k_scale": np.array(448 / 0.2, np.float32),
        layer + "v_scale": np.array(-1.0, np.float32)})
    assert [check(q, result, "kv-scales").verdict for q in quantized] == [Verdict.WARN,
                                                                          Verdict.FAIL]


# -- the real library: its own checkpoints pass every layout check --------------------------

def _library_folder(folder: Path, preset: str, w: np.ndarray) -> None:
    """compressed-tensors' own checkpoint of a bfloat16 Linear ``proj`` holding ``w``
    under ``preset`` (``layout_fixtures.ct_library``: the library's calculate_qparams, with
    generate_gparam's global scale for NVFP4, compressed and saved as save_pretrained
    does).  Run with /tmp/ctcheck/bin/python -m pytest; skipped without the library."""
    pytest.importorskip("compressed_tensors")  # first: importing torch alone takes seconds
    if lf.ct_library(folder, "proj", w, preset, dtype="bfloat16") is None:
        pytest.skip(f"this compressed-tensors lacks the API or the {preset} preset the "
                    "writer drives")


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["MXFP4A16", "MXFP8A16", "NVFP4A16", "NVFP4"])
def test_the_library_s_own_checkpoints_pass(tmp_path, preset):
    w = gaussian(15, (128, 512)) * np.exp(np.random.default_rng(15).standard_normal((128, 1)))
    _library_folder(tmp_path / "m", preset, w)
    result = scan(load_path(str(tmp_path / "m"), as_stored=True),
                  read_config(str(tmp_path / "m")))
    (q,) = result.quantized
    found = {c.name: c for c in (f(q, result) for f in CHECKS) if c is not None}
    expected = {"nibble-order"} if preset != "MXFP8A16" else set()
    expected |= {"global-scale"} if preset.startswith("NV") else {"mx-scale-rule"}
    expected |= {"missing-scales"} if preset == "NVFP4" else set()  # input_global_scale
    assert set(found) == expected
    assert all(c.verdict is Verdict.OK for c in found.values()), found
    if "mx-scale-rule" in found:
        assert found["mx-scale-rule"].figures["rule"] == "compressed-tensors"
        assert found["mx-scale-rule"].figures["share_below_rule"] == 0
