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
