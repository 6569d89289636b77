"""Checkpoint folders in the ecosystem's quantized layouts, written from the layouts'
published definitions with numpy + safetensors.numpy, healthy and known-broken (not a test
module itself; any test may import it).

Each writer quantizes the given float weights itself (the exporter's own rule, in numpy),
writes ``model.safetensors`` and the folder's config files, and returns a ``Fixture``:
``path`` (the folder) and ``expected`` ({logical key: float64 array}), the *exact* decoding
of the stored bytes under the layout's own definition -- what fmt's float32 values must
round to (``expected[key].astype(np.float32)``, one rounding).  A broken fixture's
``expected`` is still the decoding of what it stores (what a reader must give); the
original weights are what it should have decoded to.

- ``nvfp4_modelopt``: ModelOpt NVFP4 (nvidia-modelopt ``qtensor/nvfp4_tensor.py``
  ``NVFP4QTensor.quantize``; ``export/convert_hf_config.py`` for the configs).  Broken:
  ``half_scales`` (every block scale stored at half its value, the codes left as
  quantized: ModelOpt issue #2160's symptom), ``inverted_global`` (weight_scale_2 stored as
  its reciprocal, compressed-tensors' convention), ``swapped_nibbles`` (high nibble first).
- ``mxfp4_gptoss``: gpt-oss MXFP4 (``gpt_oss/torch/weights.py``; the scale rule is OCP MX
  v1.0's ``floor(log2 amax) - 2``, as gpt-oss does not publish its exporter's).  Broken:
  ``swapped_nibbles``.
- ``fp8_labelled_nvfp4``: ModelOpt FP8 tensors (float8_e4m3fn weight, float32 per-tensor
  weight_scale = amax / 448) in a folder whose configs say NVFP4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# the midpoints between FP4 magnitudes; a tie at an odd one (0.75, 1.75, 3.5) rounds up to
# the even code (ModelOpt's _cast_fp4: searchsorted, +1 on those bounds)
BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E4M3_MAX, E2M1_MAX = 448.0, 6.0


class Fixture(NamedTuple):
    path: Path
    expected: dict[str, np.ndarray]


def fp4_codes(scaled: np.ndarray) -> np.ndarray:
    """FP4 E2M1 codes (uint8 0-15) of ``scaled``, nearest with ties to the even code,
    magnitudes above 6 saturating to 6; the sign bit set for negative values."""
    magnitude = np.abs(scaled)
    code = np.searchsorted(BOUNDS, magnitude, side="left").astype(np.uint8)
    code += np.isin(magnitude, BOUNDS[[1, 3, 5]]).astype(np.uint8)
    return code | ((scaled < 0).astype(np.uint8) << 3)


def pack(codes: np.ndarray, swapped: bool = False) -> np.ndarray:
    """Two codes per byte along the last axis: the even one in the low nibble
    (``swapped``: in the high one)."""
    even, odd = codes[..., 0::2], codes[..., 1::2]
    low, high = (odd, even) if swapped else (even, odd)
    return (low | (high << 4)).astype(np.uint8)


def decode_packed(packed: np.ndarray) -> np.ndarray:
    """The definition's decoding of packed bytes (low nibble first) as float64 values."""
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],))
    out[..., 0::2], out[..., 1::2] = FP4[packed & 0x0F], FP4[packed >> 4]
    return out


def _write(folder: Path, tensors: dict, config: dict | None, hf_quant: dict | None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(
            {"architectures": ["LlamaForCausalLM"], "quantization_config": config}))
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return folder


def modelopt_configs(algo: str = "NVFP4", group: int = 16) -> tuple[dict, dict]:
    """config.json's quantization_config and hf_quant_config.json, as ModelOpt's export
    writes them (``convert_hf_quant_config_format``)."""
    producer = {"name": "modelopt", "version": "0.47.0"}
    hf_quant = {"producer": producer,
                "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None,
                                 "group_size": group, "exclude_modules": ["lm_head"]}}
    weights = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group}
    config = {"config_groups": {"group_0": {"input_activations": dict(weights),
                                            "weights": weights, "targets": ["Linear"]}},
              "ignore": ["lm_head"], "quant_algo": algo, "producer": producer,
              "quant_method": "modelopt"}
    return config, hf_quant


def nvfp4_quantize(weight: np.ndarray, global_amax: float | None = None):
    """ModelOpt's NVFP4 of a float32 weight (..., I), I a multiple of 16: (codes uint8
    (..., I), weight_scale float8_e4m3fn (..., I/16), weight_scale_2 float32)."""
    w = np.asarray(weight, dtype=np.float32)
    amax = np.float32(np.abs(w).max() if global_amax is None else global_amax)
    second = np.float32(amax / np.float32(E2M1_MAX * E4M3_MAX))
    blocks = w.reshape(w.shape[:-1] + (-1, 16))
    block_amax = np.abs(blocks).max(axis=-1)
    scale = (block_amax / (np.float32(E2M1_MAX) * second)).astype(np.float32)
    scale[scale == 0] = 1.0
    scale = np.clip(scale, 2.0 ** -9, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    divisor = scale.astype(np.float32) * second
    scaled = (blocks / divisor[..., None]).astype(np.float32).reshape(w.shape)
    return fp4_codes(scaled), scale, second


def nvfp4_modelopt(folder, weight: np.ndarray, *, half_scales: bool = False,
                   inverted_global: bool = False, swapped_nibbles: bool = False,
                   key: str = "model.layers.0.mlp.down_proj.weight",
                   configs: str = "both", per_matrix_global: bool = False,
                   extra: dict | None = None) -> Fixture:
    """A ModelOpt NVFP4 folder of one weight (O x I, or E x O x I stacked experts) named
    ``key``, with its ``input_scale`` (0.5 / (6 * 448)); ``configs``: "both", "config"
    (config.json only), "hf" (hf_quant_config.json only) or "none"; ``per_matrix_global``:
    one weight_scale_2 per expert (E); ``extra``: plain tensors written beside it."""
    w = np.asarray(weight, dtype=np.float32)
    if per_matrix_global:
        parts = [nvfp4_quantize(m) for m in w]
        codes = np.stack([p[0] for p in parts])
        scale = np.stack([p[1] for p in parts])
        second = np.array([p[2] for p in parts], dtype=np.float32)
    else:
        codes, scale, second = nvfp4_quantize(w)
    if half_scales:
        scale = (scale.astype(np.float32) / 2).astype(ml_dtypes.float8_e4m3fn)
    if inverted_global:
        second = (np.float32(1) / second).astype(np.float32)
    packed = pack(codes, swapped_nibbles)
    stem = key[:-len("weight")]
    tensors = {key: packed, key + "_scale": scale, key + "_scale_2": np.asarray(second),
               stem + "input_scale": np.asarray(np.float32(0.5 / (6 * 448))),
               **(extra or {})}
    config, hf_quant = modelopt_configs()
    _write(folder, tensors, config if configs in ("both", "config") else None,
           hf_quant if configs in ("both", "hf") else None)
    sec = np.asarray(second, dtype=np.float64)
    sec = sec.reshape(-1, 1, 1) if sec.ndim else sec
    values = decode_packed(packed).reshape(w.shape[:-1] + (-1, 16))
    expected = values * scale.astype(np.float64)[..., None]
    expected = expected.reshape(w.shape) * sec
    return Fixture(Path(folder), {key: expected,
                                  **{k: np.asarray(v, np.float64) for k, v in (extra or {}).items()}})


def fp8_labelled_nvfp4(folder, weight: np.ndarray,
                       key: str = "model.layers.0.mlp.down_proj.weight") -> Fixture:
    """ModelOpt FP8 tensors (float8_e4m3fn weight, float32 weight_scale = amax / 448,
    input_scale) in a folder whose config.json and hf_quant_config.json say NVFP4."""
    w = np.asarray(weight, dtype=np.float32)
    scale = np.float32(np.abs(w).max() / np.float32(E4M3_MAX))
    codes = (w / scale).astype(ml_dtypes.float8_e4m3fn)
    stem = key[:-len("weight")]
    config, hf_quant = modelopt_configs("NVFP4")
    _write(folder, {key: codes, key + "_scale": np.asarray(scale),
                    stem + "input_scale": np.asarray(np.float32(1.0))}, config, hf_quant)
    return Fixture(Path(folder), {key: codes.astype(np.float64) * np.float64(scale)})


def mx_scale_bytes(blocks: np.ndarray) -> np.ndarray:
    """OCP MX v1.0's shared scale of blocks (..., 32) of FP4 E2M1: the E8M0 byte of
    ``floor(log2 amax) - 2`` (2: E2M1's largest exponent), clamped to [-127, 127]; an
    all-zero block gets byte 0 (2^-127)."""
    amax = np.abs(blocks).max(axis=-1)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2
    exponent = np.where(amax > 0, np.clip(exponent, -127, 127), -127)
    return (exponent + 127).astype(np.uint8)


def mxfp4_gptoss(folder, weights: dict[str, np.ndarray], *, swapped_nibbles: bool = False,
                 hf_names: bool = False, config: bool = True,
                 extra: dict | None = None) -> Fixture:
    """A gpt-oss MXFP4 folder: each weight (..., N), N a multiple of 32, as
    ``<name>.blocks`` uint8 (..., N/32, 16) + ``<name>.scales`` uint8 (..., N/32)
    (``hf_names``: ``<name>_blocks`` / ``<name>_scales``, the Hugging Face spelling);
    ``config``: config.json with ``{"quant_method": "mxfp4"}``."""
    tensors, expected = dict(extra or {}), {k: np.asarray(v, np.float64)
                                            for k, v in (extra or {}).items()}
    suffix = ("_blocks", "_scales") if hf_names else (".blocks", ".scales")
    for name, weight in weights.items():
        w = np.asarray(weight, dtype=np.float32)
        blocks = w.reshape(w.shape[:-1] + (-1, 32)).astype(np.float64)
        scale = mx_scale_bytes(blocks)
        scaled = blocks / np.ldexp(1.0, scale.astype(np.int32) - 127)[..., None]
        packed = pack(fp4_codes(scaled), swapped_nibbles)
        tensors[name + suffix[0]], tensors[name + suffix[1]] = packed, scale
        values = decode_packed(packed) * np.ldexp(1.0, scale.astype(np.int32) - 127)[..., None]
        expected[name] = values.reshape(w.shape)
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "lm_head"]}
    _write(folder, tensors, quant if config else None, None)
    return Fixture(Path(folder), expected)


# -- the rest of the layouts, from their definitions (tensors only; ``write_layout`` writes) --
#
# - ``deepseek_fp8_tensors``: DeepSeek-V3 ``README_WEIGHTS.md`` (float8_e4m3fn weight,
#   float32 ``weight_scale_inv`` = amax / 448 per 128 x 128 block, edges partial; ``ue8m0``:
#   DeepGEMM's ``ceil_to_ue8m0``, the scale rounded up to a power of two).
# - ``ct_tensors``: compressed-tensors 0.20.1 (``compressors/naive_quantized``, ``mxfp8``,
#   ``mxfp4``, ``nvfp4``, ``pack_quantized``; ``quantization/utils/helpers.py``
#   ``calculate_qparams`` / ``generate_gparam``; ``mxfp_utils.py`` ``generate_mx_scales``).
# - ``kv_tensors``: vLLM's ``k_scale`` / ``v_scale`` (dequantization direction, amax / 448).

def linear_init(seed: int, shape) -> np.ndarray:
    """torch.nn.Linear's default initialisation: U(-1/sqrt(I), 1/sqrt(I)), float32."""
    bound = 1 / np.sqrt(shape[-1])
    return np.random.default_rng(seed).uniform(-bound, bound, shape).astype(np.float32)


def llm_like(seed: int, shape) -> tuple[np.ndarray, np.ndarray]:
    """A trained-LLM-like weight and its layer norm: Student-t(5) values times log-normal
    input-channel gains, four outlier channels (x8); the norm's gains the reciprocal of the
    columns' (a tied anchor, as trained layers' outlier channels are)."""
    rng = np.random.default_rng(seed)
    gains = np.exp(0.5 * rng.standard_normal(shape[-1]))
    gains[rng.choice(shape[-1], 4, replace=False)] *= 8
    w = rng.standard_t(5, shape) * gains * 0.02
    return w.astype(np.float32), (1 / gains).astype(np.float32)


def _tile_amax(w: np.ndarray, tile: int = 128) -> np.ndarray:
    rows, cols = w.shape
    padded = np.zeros((-(-rows // tile) * tile, -(-cols // tile) * tile))
    padded[:rows, :cols] = np.abs(w)
    return padded.reshape(padded.shape[0] // tile, tile, -1, tile).max(axis=(1, 3))


def _expand(grid: np.ndarray, shape, tile=(128, 128)) -> np.ndarray:
    return np.repeat(np.repeat(grid.astype(np.float64), tile[0], 0), tile[1], 1)[
        :shape[0], :shape[1]]


def deepseek_fp8_tensors(key: str, w: np.ndarray, ue8m0: bool = False,
                         factor: float = 1.0) -> dict:
    """DeepSeek-V3 FP8 of one O x I weight; ``factor``: the codes made with factor x the
    scale (0.5: an exporter that divided by half the right scale, the codes clipped)."""
    amax = _tile_amax(w)
    grid = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    if ue8m0:
        grid = np.ldexp(np.float32(1), np.ceil(np.log2(grid)).astype(np.int32)).astype(
            np.float32)
    codes = np.clip(w / (_expand(grid, w.shape) * factor), -E4M3_MAX, E4M3_MAX)
    return {key: codes.astype(ml_dtypes.float8_e4m3fn), key + "_scale_inv": grid}


def deepseek_config(ue8m0: bool = False) -> dict:
    return {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
            "activation_scheme": "dynamic", **({"scale_fmt": "ue8m0"} if ue8m0 else {})}


def ct_mx_bytes(blocks: np.ndarray, offset: int) -> np.ndarray:
    """compressed-tensors' E8M0 bytes of blocks (..., 32) (``generate_mx_scales``): amax
    rounded up a binade when its significand is >= 1.75, floor(log2) - offset (2 for FP4,
    8 for FP8), bias 127."""
    amax = np.abs(blocks.astype(np.float64)).max(axis=-1)
    mantissa, exponent = np.frexp(np.where(amax > 0, amax, 1.0))
    floor_log2 = exponent - 1 + (mantissa >= 0.875)
    return np.clip(127 + floor_log2 - offset, 0, 254).astype(np.uint8)


def _pack_int32(q: np.ndarray, bits: int) -> np.ndarray:
    """compressed-tensors' ``pack_to_int32`` for 4 or 8 bits: offset to unsigned, 32 / bits
    values per word, the first in the lowest bits."""
    per = 32 // bits
    u = (q.astype(np.int64) + (1 << (bits - 1))).astype(np.uint64)
    u = u.reshape(q.shape[0], -1, per) << (np.arange(per, dtype=np.uint64) * bits)
    return u.sum(axis=-1).astype(np.uint32).view(np.int32)


CT_SCHEMES = {  # scheme -> (config format, weights args of its config group)
    "fp8-tensor": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "tensor"}),
    "fp8-channel": ("float-quantized", {"num_bits": 8, "type": "float",
                                        "strategy": "channel"}),
    "fp8-block": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block",
                                      "block_structure": [128, 128]}),
    "mxfp8": ("mxfp8-quantized", {"num_bits": 8, "type": "float", "strategy": "group",
                                  "group_size": 32, "scale_dtype": "torch.uint8"}),
    "mxfp4": ("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "group",
                                       "group_size": 32, "scale_dtype": "torch.uint8"}),
    "nvfp4": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                       "group_size": 16}),
    "int4": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group",
                                "group_size": 128}),
    "int8": ("pack-quantized", {"num_bits": 8, "type": "int", "strategy": "group",
                                "group_size": 128}),
    "int8-channel": ("pack-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}),
    "int8-naive": ("int-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}),
}


def ct_config(scheme: str, kv: bool = False) -> dict:
    """config.json's quantization_config as ``ModelCompressor.update_config`` writes it
    (the fields fmt reads); ``kv``: a static FP8 ``kv_cache_scheme``."""
    fmt, weights = CT_SCHEMES[scheme]
    weights = {"symmetric": True, "dynamic": False, "group_size": None, **weights}
    kv_scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                 "symmetric": True} if kv else None
    return {"quant_method": "compressed-tensors", "quantization_status": "compressed",
            "format": fmt, "ignore": ["lm_head"], "kv_cache_scheme": kv_scheme,
            "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt,
                                          "weights": weights, "input_activations": None}}}


def _ct_fp8(w: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(weight_scale float32, the scale expanded to w's shape) of an FP8 scheme."""
    if scheme == "fp8-tensor":
        scale = np.array([np.abs(w).max() / E4M3_MAX], np.float32)
        return scale, np.full(w.shape, np.float64(scale[0]))
    if scheme == "fp8-channel":
        scale = (np.abs(w).max(axis=1, keepdims=True) / E4M3_MAX).astype(np.float32)
        return scale, np.repeat(scale.astype(np.float64), w.shape[1], axis=1)
    scale = (_tile_amax(w) / E4M3_MAX).astype(np.float32)
    return scale, _expand(scale, w.shape)


def ct_tensors(stem: str, w: np.ndarray, scheme: str) -> dict:
    """A compressed-tensors module ``stem`` (``model.layers.0.self_attn.q_proj``) of one
    O x I float32 weight in ``scheme`` (a key of ``CT_SCHEMES``), from the definition."""
    w = np.asarray(w, np.float32)
    o, i = w.shape
    if scheme.startswith("fp8"):
        scale, full = _ct_fp8(w, scheme)
        codes = np.clip(w / full, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
        return {stem + ".weight": codes, stem + ".weight_scale": scale}
    if scheme.startswith("mx"):
        blocks = w.reshape(o, -1, 32).astype(np.float64)
        scale = ct_mx_bytes(blocks, 2 if scheme == "mxfp4" else 8)
        scaled = (blocks / np.ldexp(1.0, scale.astype(np.int32) - 127)[..., None]).reshape(o, i)
        if scheme == "mxfp8":
            codes = np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
            return {stem + ".weight": codes, stem + ".weight_scale": scale}
        return {stem + ".weight_packed": pack(fp4_codes(scaled)), stem + ".weight_scale": scale}
    if scheme == "nvfp4":
        glob = np.float32(E2M1_MAX * E4M3_MAX / np.abs(w).max())
        blocks = w.reshape(o, -1, 16).astype(np.float64)
        scale = (np.float64(glob) * np.abs(blocks).max(-1) / E2M1_MAX).astype(
            ml_dtypes.float8_e4m3fn)
        per = scale.astype(np.float64)[..., None] / np.float64(glob)
        codes = fp4_codes((blocks / np.where(per == 0, 1, per)).reshape(o, i))
        return {stem + ".weight_packed": pack(codes), stem + ".weight_scale": scale,
                stem + ".weight_global_scale": np.array([glob], np.float32)}
    bits = 4 if scheme == "int4" else 8
    group = i if scheme in ("int8-channel", "int8-naive") else 128
    qmax = (1 << (bits - 1)) - 1
    amax = np.abs(w).reshape(o, -1, group).max(-1)
    scale = (amax / (qmax + 0.5)).astype(np.float32)  # amax / ((q_max - q_min) / 2)
    q = np.clip(np.round(w / np.repeat(scale, group, axis=1)), -qmax - 1, qmax)  # float32
    if scheme == "int8-naive":  # naive-quantized: the int8 codes as they are
        return {stem + ".weight": q.astype(np.int8), stem + ".weight_scale": scale}
    return {stem + ".weight_packed": _pack_int32(q, bits), stem + ".weight_scale": scale,
            stem + ".weight_shape": np.array([o, i], np.int64)}


def kv_tensors(layer: int = 0, heads: int | None = None, seed: int = 0) -> dict:
    """vLLM's KV-cache scales of one layer (float32, amax / 448 for amaxes of 2-40; one
    per tensor, or ``heads`` values per KV head)."""
    rng = np.random.default_rng(seed)
    shape = () if heads is None else (heads,)
    prefix = f"model.layers.{layer}.self_attn."
    return {prefix + s: (rng.uniform(2, 40, shape) / E4M3_MAX).astype(np.float32)
            for s in ("k_scale", "v_scale")}


def write_layout(folder, tensors: dict, config: dict | None) -> Path:
    """model.safetensors of ``tensors`` and config.json with ``config`` as its
    quantization_config (None: no config.json)."""
    return _write(folder, tensors, config, None)


def swap_nibbles(packed: np.ndarray) -> np.ndarray:
    """Every byte's two nibbles exchanged (a high-nibble-first writer's bytes)."""
    return ((packed >> 4) | (packed << 4)).astype(np.uint8)


#: the battery's compressed-tensors scheme -> the library's preset that writes it
CT_PRESETS = {"fp8-tensor": "FP8", "fp8-channel": "FP8_DYNAMIC", "fp8-block": "FP8_BLOCK",
              "mxfp8": "MXFP8A16", "mxfp4": "MXFP4A16", "nvfp4": "NVFP4A16",
              "int4": "W4A16", "int8": "W8A16", "int8-naive": "W8A8"}


def ct_library(folder, stem: str, w: np.ndarray, scheme: str, extra: dict | None = None,
               dtype: str = "float32", weights_only: bool = False):
    """The same module written by compressed-tensors itself (None where the library, its
    0.20 API or the preset is missing): a Linear named ``stem`` holding ``w`` (float32)
    under the preset ``CT_PRESETS[scheme]`` (``scheme`` may also be one of the library's
    preset names itself: ``"NVFP4"``, ``"MXFP6A16"``...), its qparams from the library's
    ``calculate_qparams`` over the strategy's min/max (``generate_gparam`` for NVFP4's
    global scale; a static input scale set to 1/32), compressed by ``ModelCompressor`` and
    saved as ``save_pretrained`` saves it; ``extra``: plain tensors written beside it;
    ``dtype``: the model's dtype before quantizing (``bfloat16``: scales stored in
    bfloat16 too); ``weights_only``: the preset's weights without its input activations
    (FP8_DYNAMIC so is naive-quantized)."""
    try:
        import torch
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import (
            QuantizationConfig,
            QuantizationScheme,
            apply_quantization_config,
            preset_name_to_scheme,
        )
        from compressed_tensors.quantization.utils import (
            calculate_qparams,
            generate_gparam,
            maybe_pad_tensor_for_block_quant,
        )
        from safetensors.torch import save_file as torch_save
    except ImportError:
        return None
    root = torch.nn.Module()
    parent = root
    *path, last = stem.split(".")
    for name in path:
        parent.add_module(name, torch.nn.Module())
        parent = getattr(parent, name)
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    parent.add_module(last, linear)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(np.asarray(w, np.float32)))
    root.to(getattr(torch, dtype))
    try:
        preset = preset_name_to_scheme(CT_PRESETS.get(scheme, scheme), ["Linear"])
    except (KeyError, ValueError):  # a preset this release does not have
        return None
    if weights_only:
        preset = QuantizationScheme(targets=["Linear"], weights=preset.weights)
    apply_quantization_config(root, QuantizationConfig(config_groups={"group_0": preset}))
    args, x = linear.quantization_scheme.weights, linear.weight.data
    glob = None
    if hasattr(linear, "weight_global_scale"):
        glob = generate_gparam(x.min(), x.max())
        linear.weight_global_scale.data.copy_(glob)
    strategy = getattr(args.strategy, "value", args.strategy)
    if strategy == "tensor":
        low, high = x.amin(), x.amax()
    elif strategy == "channel":
        low, high = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    elif strategy == "block":
        bh, bw = args.block_structure
        padded = maybe_pad_tensor_for_block_quant(x, (bh, bw))
        tiles = padded.reshape(padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
        low, high = tiles.amin((1, 3)), tiles.amax((1, 3))
    else:
        groups = x.unflatten(-1, (-1, args.group_size))
        low, high = groups.amin(-1), groups.amax(-1)
    scale, _ = calculate_qparams(low, high, args, global_scale=glob)
    linear.weight_scale.data.copy_(scale.reshape(linear.weight_scale.shape))
    if hasattr(linear, "input_scale"):
        linear.input_scale.data.fill_(0.03125)
    compressor = ModelCompressor.from_pretrained_model(root)
    compressor.compress_model(root)
    Path(folder).mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in root.state_dict().items()}
    tensors.update({k: torch.from_numpy(np.asarray(v)) for k, v in (extra or {}).items()})
    torch_save(tensors, str(Path(folder) / "model.safetensors"))
    compressor.update_config(str(folder))
    return Path(folder)
