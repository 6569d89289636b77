"""DeepSeek-V3's FP8 weights with one scale per 128 x 128 block.

Definition (DeepSeek-V3, ``README_WEIGHTS.md``, "FP8 Weight Documentation", and
``inference/kernel.py`` ``weight_dequant``): a linear layer's ``weight`` is stored as
float8_e4m3fn, O x I, beside ``weight_scale_inv``: float32, ``ceil(O/128) x ceil(I/128)``,
one per 128 x 128 block of the weight (the edge blocks are the partial ones that remain;
the quantizer pads them with zeros).  Dequantization multiplies:
``x = float(code) * weight_scale_inv[i // 128, j // 128]`` -- ``weight_scale_inv`` is a
*dequantization* scale (amax / 448 at export).  ``config.json`` says
``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
[128, 128], "activation_scheme": "dynamic"}``.

The UE8M0 variant (DeepSeek-V3.1 ``"scale_fmt": "ue8m0"``): every scale is a power of two
(an exponent-only UE8M0 value), stored as float32 or as one E8M0 byte per block
(``float8_e8m0fnu``, or uint8 with bias 127).  ``facts["scale_fmt"]`` records what the
config promises; ``fmt audit`` checks it (DeepSeek-V3 issue #961: non-power-of-two scales
where ``ue8m0`` was promised).

Leading axes (stacked experts, E x O x I with an E x gO x gI grid) are blocked matrix by
matrix.  A grid whose shape does not fit the weight is still claimed (its scales are no
data): the mismatch is recorded in ``Quantized.problems`` and ``read`` refuses it in one
line.  ``facts["scale_rule"]``: amax / 448 per block; for ue8m0 rounded up to a power of
two (DeepGEMM's ``ceil_to_ue8m0``, which DeepSeek-V3.1's FP8 cast uses);
``facts["nominal_bits"]``: 8 + the scale's bits / (128 x 128).
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.inputs.layouts.base import (
    Checkpoint,
    Quantized,
    RawChunk,
    byte_table,
    e8m0_values,
)
from fmtcli.inputs.layouts.ct_nvfp4 import rows_of_lines
from fmtcli.inputs.layouts.lookup import byte_float_values, per_block, tile_rows
from fmtcli.inputs.storage import itemsize
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "deepseek-fp8"
DESCRIPTION = "float8_e4m3fn weight x weight_scale_inv, one float32 per 128x128 block"
REFERENCE = "DeepSeek-V3 README_WEIGHTS.md; inference/kernel.py weight_dequant"

SUFFIX = "_scale_inv"
ELEMENTS = ("float8_e4m3fn",)
SCALE_DTYPES = ("float32", "bfloat16", "float8_e8m0fnu", "uint8")
DEFAULT_TILE = (128, 128)


def _tile(config: dict | None) -> tuple[int, int]:
    size = (config or {}).get("weight_block_size")
    if (isinstance(size, list) and len(size) == 2
            and all(isinstance(n, int) and 0 < n <= 1 << 20 for n in size)):
        return int(size[0]), int(size[1])
    return DEFAULT_TILE


def scale_values(stored: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 dequantization scales of a grid as stored: uint8 as E8M0 bytes (bias
    127), the rest by their storage type."""
    if dtype == "uint8":
        return e8m0_values(stored)
    from fmtcli.inputs.storage import as_values

    return np.asarray(as_values(stored)).astype(np.float32)


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    config = checkpoint.config or {}
    tile = _tile(config)
    found = []
    for key, codes in checkpoint.tensors.items():
        scales = checkpoint.get(key + SUFFIX)
        if (codes.dtype not in ELEMENTS or scales is None or codes.skipped is not None
                or scales.dtype not in SCALE_DTYPES or len(codes.shape) < 2):
            continue
        found.append(_quantized(codes, scales, tile, config))
    return found


def _quantized(codes, scales, tile, config) -> Quantized:
    shape = tuple(codes.shape)
    lead, (height, cols) = shape[:-2], shape[-2:]
    want = lead + (-(-height // tile[0]), -(-cols // tile[1]))
    problems = []
    if tuple(scales.shape) != want:
        problems.append(f"{scales.key} has shape {list(scales.shape)}, not {list(want)} "
                        f"(one per {tile[0]}x{tile[1]} block of {list(shape)})")
    scale_bits = 8 if scales.dtype in ("uint8", "float8_e8m0fnu") else 8 * itemsize(
        scales.dtype)
    facts = {"tile": list(tile), "scale_direction": "dequantization (x = code * scale_inv)",
             "scale_fmt": config.get("scale_fmt"), "quant_method": config.get("quant_method"),
             "config_scheme": config.get("quant_method"),
             "nominal_bits": 8 + scale_bits / (tile[0] * tile[1]),
             "scale_rule": ("amax / 448 per block, rounded up to a power of two (ue8m0)"
                            if config.get("scale_fmt") == "ue8m0" else "amax / 448 per block")}
    cache: dict = {}

    def load() -> dict:
        if not cache:
            cache["grid"] = scale_values(scales.stored(), scales.dtype)
        return cache

    def lines(a: int, b: int, scaled: bool = True) -> np.ndarray:
        """Rows ``a:b`` of the last axis (the blocks' rows), as values or codes (float32
        products, as ``block_scales`` would give: the scale broadcast per tile)."""
        # the codes mapped again per chunk: a map kept open keeps every page it read in the RSS
        values = byte_float_values(np.asarray(codes.stored()).reshape(-1, cols)[a:b])
        if scaled:
            picked = tile_rows(load()["grid"], np.arange(a, b), height, tile[0])
            per_block(values, picked, tile[1])
        return values

    def by_view(r0: int, r1: int, scaled: bool) -> np.ndarray:
        # the matrix view need not be rows of the last axis (an O x 1 weight is one row,
        # a 4-D one O x rest): read the last-axis rows it covers
        if r1 <= r0 or not math.prod(shape):
            return np.zeros((max(0, r1 - r0), matrix_shape(shape)[1]), dtype=np.float32)
        return rows_of_lines(lambda a, b: lines(a, b, scaled), r0, r1, shape)

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        return by_view(r0, r1, False)

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        return by_view(r0, r1, True)

    def raw_reader(r0: int, r1: int) -> RawChunk | None:
        if matrix_shape(shape)[1] != cols or codes.dtype != "float8_e4m3fn":
            return None
        stored = np.asarray(codes.stored()).reshape(-1, cols)[r0:r1]
        grid = tile_rows(load()["grid"], np.arange(r0, r1, tile[0]), height, tile[0])
        return RawChunk(stored.view(np.uint8), 0, byte_table("float8_e4m3fn"),
                        np.asarray(grid, dtype=np.float64))

    return Quantized(NAME, codes.key, codes.source, shape, "float8_e4m3fn",
                     "e8m0" if scales.dtype in ("uint8", "float8_e8m0fnu") else scales.dtype,
                     ScaleGroup("tile", tile=tile), {"codes": codes, "scales": scales},
                     rows_reader, facts, elements_reader, lambda: load()["grid"], problems,
                     raw_reader)
