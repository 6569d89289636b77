"""OpenAI gpt-oss's MXFP4 expert weights: ``*.blocks`` and ``*.scales``.

Definition (openai/gpt-oss, ``gpt_oss/torch/weights.py`` ``Checkpoint._get_mxfp4_tensor``,
read in the gpt-oss 0.0.9 wheel; the model card's "MXFP4 quantization of the MoE
weights"; the element format and E8M0 scales of OCP MX v1.0): a weight ``W`` of shape
``(..., N)`` is stored as

- ``W.blocks``: uint8 ``(..., G, 16)``: G = N / 32 blocks of 32 FP4 E2M1 codes, two per
  byte, the *low* nibble first (``sub[:, 0::2] = lut[blk & 0x0F]; sub[:, 1::2] =
  lut[blk >> 4]``), ``lut`` = ``FP4_VALUES`` (+0, 0.5, 1, 1.5, 2, 3, 4, 6, then the
  negatives);
- ``W.scales``: uint8 ``(..., G)``: one E8M0 byte per block, bias 127 (``scales - 127``);

and dequantized as ``torch.ldexp(lut[code], scale - 127)``, reshaped to ``(..., G * 32)``.
The scale is a *dequantization* scale (x = code * 2^(byte - 127)).  The original checkpoint
names the pair ``block.<n>.mlp.mlp1_weight.blocks`` / ``.scales`` (stacked experts: E x O
x G x 16); the Hugging Face conversion names them ``model.layers.<n>.mlp.experts.
gate_up_proj_blocks`` / ``_scales``; both are read, the logical key being the name without
the suffix.  (transformers transposes the dequantized ``gate_up_proj`` / ``down_proj`` to
E x in x out; fmt keeps the stored orientation, E x out x in.)

The product is exact in float32 (a power-of-two scale), so fmt's values equal gpt-oss's
reader's bfloat16 ones bit for bit, except for the byte 255 (NaN in OCP MX; fmt decodes it
as NaN, gpt-oss's ``ldexp`` as 2^128): a healthy checkpoint has none.  ``config.json``
(the Hugging Face one) says ``quantization_config = {"quant_method": "mxfp4", ...}``.
"""

from __future__ import annotations

import numpy as np

from fmtcli.inputs.layouts.base import FP4_TABLE, Checkpoint, Quantized, RawChunk, e8m0_values
from fmtcli.inputs.layouts.fp4_blocks import dequantized_rows, fp4_values, row_span
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "gptoss-mxfp4"
DESCRIPTION = "uint8 *.blocks (32 FP4 E2M1 per 16 bytes, low nibble first) x E8M0 *.scales"
REFERENCE = "openai/gpt-oss gpt_oss/torch/weights.py (Checkpoint._get_mxfp4_tensor); OCP MX v1.0"

BLOCK, BYTES = 32, 16
SUFFIXES = ((".blocks", ".scales"), ("_blocks", "_scales"))
SCALE_DTYPES = ("uint8", "float8_e8m0fnu")
FACTS = {"scale_direction": "dequantization (x = code * 2^(scale - 127))",
         "nibble_order": "low-first", "nominal_bits": 4.25,
         "scale_rule": "not published with the checkpoint (OCP MX v1.0's: "
                       "floor(log2 block_amax) - 2)"}


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    config = checkpoint.config or {}
    scheme = config.get("quant_method") if isinstance(config.get("quant_method"), str) else None
    found = []
    for key, codes in checkpoint.tensors.items():
        for blocks_suffix, scales_suffix in SUFFIXES:
            if not key.endswith(blocks_suffix) or codes.dtype != "uint8":
                continue
            base = key[:-len(blocks_suffix)]
            scales = checkpoint.get(base + scales_suffix)
            if base and scales is not None and scales.dtype in SCALE_DTYPES:
                facts = {**FACTS, "config_scheme": scheme}
                found.append(_quantized(base, codes, scales, facts))
    return found


def _problems(codes, scales) -> list[str]:
    shape = tuple(codes.shape)
    if codes.opener is None or scales.opener is None:
        return [f"{codes.key} or {scales.key} cannot be read"]
    if len(shape) < 2 or shape[-2] == 0:
        return [f"{codes.key} has shape {list(shape)}, not (..., G, 16): no blocks"]
    problems = []
    if shape[-1] != BYTES:
        problems.append(f"{codes.key} has {shape[-1]} bytes per block, not {BYTES} "
                        f"({BLOCK} FP4 values): shape {list(shape)} (truncated?)")
    if tuple(scales.shape) != shape[:-1]:
        problems.append(f"{scales.key} has shape {list(scales.shape)}, not "
                        f"{list(shape[:-1])} (one E8M0 byte per block of {list(shape)})")
    return problems


def _quantized(base: str, codes, scales, facts) -> Quantized:
    problems = _problems(codes, scales)
    stored = tuple(codes.shape)
    groups = stored[-2] if len(stored) >= 2 else 0
    shape = stored[:-2] + (groups * 2 * (stored[-1] if stored else 0),)
    width = shape[-1]
    cols = matrix_shape(shape)[1]
    def load() -> dict:  # the scales' map, opened per call (not kept: see packed)
        return {"bytes": np.asarray(scales.stored()).view(np.uint8)}

    def packed() -> np.ndarray:
        # mapped again per chunk: a map kept open keeps every page it read in the RSS
        return codes.stored().reshape(-1, max(1, width // 2))

    def scales_reader() -> np.ndarray:
        return e8m0_values(load()["bytes"])

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        a, b = row_span(r0, r1, cols, width)
        grid = load()["bytes"].reshape(-1, groups)
        block = dequantized_rows(packed()[a:b], e8m0_values(grid[a:b]), 0, b - a,
                                 BLOCK, exact32=True)
        return block.reshape(r1 - r0, cols)

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        a, b = row_span(r0, r1, cols, width)
        return fp4_values(packed(), a, b).reshape(r1 - r0, cols)

    def raw_reader(r0: int, r1: int) -> RawChunk | None:
        if cols != width:
            return None
        grid = e8m0_values(load()["bytes"].reshape(-1, groups)[r0:r1])
        return RawChunk(np.asarray(packed()[r0:r1]), 1, FP4_TABLE, grid)

    return Quantized(NAME, base, codes.source, shape, "float4_e2m1fn", "e8m0",
                     ScaleGroup("block", BLOCK), {"codes": codes, "scales": scales},
                     rows_reader, facts, elements_reader, scales_reader, problems,
                     raw_reader)
