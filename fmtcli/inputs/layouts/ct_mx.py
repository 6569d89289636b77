"""compressed-tensors MX weights: ``mxfp8-quantized`` and ``mxfp4-pack-quantized``.

Definition (compressed-tensors 0.20.1, read in its source):

- ``compressors/mxfp8/base.py`` (``MXFP8QuantizationCompressor``): ``weight`` stored as
  float8_e4m3fn, shape ``[O, I]``, and ``weight_scale`` as uint8 E8M0 exponents, one per
  group of 32 along a row: ``[O, I / 32]`` (the ``MXFP8`` preset of
  ``quantization/quant_scheme.py``: FP8, strategy ``group``, ``group_size`` 32,
  ``scale_dtype`` uint8).
- ``compressors/mxfp4/base.py`` (``MXFP4PackedCompressor``, on the NVFP4 packer of
  ``compressors/nvfp4/``): ``weight_packed`` uint8 ``[O, I / 2]``, two FP4 E2M1 codes per
  byte, the *low* nibble first (``nvfp4/helpers.py``: ``pack_fp4_to_uint8`` stores
  ``first | second << 4``, ``unpack_fp4_from_uint8`` stacks ``(low, high)``; bit 3 of a
  nibble is its sign), beside ``weight_scale`` uint8 E8M0 ``[O, I / 32]``; no global scale
  and no ``weight_shape`` (the columns are twice the packed ones).
- E8M0 (``compressors/mx_utils.py``): a byte ``b`` is the scale ``2^(b - 127)``;
  ``decompress_mx_scale`` gives it as bfloat16 and the dequantization multiplies:
  ``x = code * 2^(b - 127)`` (``quantization/lifecycle/forward_helpers.py``
  ``_dequantize``) -- a *dequantization* scale.  Every product of an FP8 or FP4 code and
  a power of two is exact in bfloat16 and float32 (down to bfloat16's smallest
  subnormal, 2^-133), so fmt's values equal the library's bit for bit.  OCP MX v1.0 reads
  byte 255 as NaN (fmt does); the library computes ``2.0 ** 128`` (inf).
- The scale rule (``quantization/utils/mxfp_utils.py`` ``generate_mx_scales`` and
  ``round_to_power_2``): ``b = 127 + floor(log2 amax) - offset``, with the amax first
  rounded up to the next power of two when its significand is >= 1.75 (a 1-bit
  mantissa's rounding); ``offset`` = floor(log2 of the element's max): 2 for FP4 (6.0),
  8 for FP8 E4M3 (448); clamped to [0, 255].
- ``config.json``: ``format`` ``mxfp8-quantized`` / ``mxfp4-pack-quantized`` (or per group
  under ``mixed-precision``), ``weights.group_size`` 32, ``scale_dtype`` ``torch.uint8``.

Detected from the tensors alone: ``weight`` float8_e4m3fn with a uint8 (or
float8_e8m0fnu) ``weight_scale``; ``weight_packed`` uint8 with a uint8 ``weight_scale``
and no ``weight_global_scale`` (that is NVFP4's).  Shapes that disagree (a packed tensor
cut short, a scale grid of the wrong shape) are claimed with a problem.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.inputs.layouts.base import (
    FP4_TABLE,
    Checkpoint,
    Quantized,
    RawChunk,
    byte_table,
    e8m0_values,
    unpack_fp4,
)
from fmtcli.inputs.layouts.ct_fp8 import config_entry, module_of, sibling
from fmtcli.inputs.layouts.lookup import byte_float_values, per_block
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "compressed-tensors-mx"
DESCRIPTION = ("MXFP8 (float8_e4m3fn) or packed MXFP4 weight x E8M0 weight_scale per 32, "
               "compressed-tensors mxfp8-quantized / mxfp4-pack-quantized")
REFERENCE = ("compressed-tensors 0.20.1: compressors/mxfp8/base.py, compressors/mxfp4/base.py, "
             "compressors/mx_utils.py, compressors/nvfp4/helpers.py, "
             "quantization/utils/mxfp_utils.py")

GROUP = 32
SCALE_DTYPES = ("uint8", "float8_e8m0fnu")
DIRECTION = "dequantization (x = code * scale)"
KINDS = {  # element: (format, element bits, the rule's exponent offset, its round-up point)
    "float8_e4m3fn": ("mxfp8-quantized", 8, 8, "1.75"),
    "float4_e2m1fn": ("mxfp4-pack-quantized", 4, 2, "1.75"),
    "float6_e2m3fn": ("mxfp6-pack-quantized", 6, 2, "1.9375"),  # recognised, not read
}


def rule(element: str) -> str:
    _, _, offset, point = KINDS[element]
    return (f"E8M0 exponent = floor(log2 amax) - {offset}, +1 when amax's significand is "
            f">= {point} (compressed-tensors generate_mx_scales), clamped to [0, 255]")


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found, modules = [], set()
    for key, codes in checkpoint.tensors.items():
        for suffix, dtype, element in (("weight", "float8_e4m3fn", "float8_e4m3fn"),
                                       ("weight_packed", "uint8", "float4_e2m1fn")):
            module = module_of(key, suffix)
            if (module is None or codes.dtype != dtype or codes.opener is None
                    or codes.size == 0):
                continue
            scales = checkpoint.get(sibling(module, "weight_scale"))
            if (scales is None or scales.dtype not in SCALE_DTYPES or scales.opener is None
                    or checkpoint.get(sibling(module, "weight_global_scale")) is not None
                    or module in modules):  # a weight and a weight_packed: the first
                continue
            modules.add(module)
            found.append(_quantized(checkpoint, module, codes, scales, element))
    return found


def _shape_problems(codes, scales, element: str) -> tuple[tuple[int, ...], list[str]]:
    """The dequantized shape and what makes the group unreadable."""
    stored = tuple(codes.shape)
    if len(stored) < 2:
        return stored, [f"{codes.key} has shape {list(stored)}, not [rows, columns]"]
    shape = stored[:-1] + (stored[-1] * 2,) if element == "float4_e2m1fn" else stored
    want = shape[:-1] + (-(-shape[-1] // GROUP),)
    problems = [] if matrix_shape(shape) == (math.prod(shape[:-1]), shape[-1]) else [
        f"{codes.key} has shape {list(stored)}: not rows of {shape[-1]} values"]
    if tuple(scales.shape) != want:
        what = (f"{codes.key} holds {shape[-1]:,} FP4 values per row (2 per byte)"
                if element == "float4_e2m1fn" else f"{codes.key} has {shape[-1]:,} columns")
        problems.append(f"{scales.key} has shape {list(scales.shape)}, not {list(want)} "
                        f"(one E8M0 byte per {GROUP} values of {list(shape)}; {what})")
    return shape, problems


def _is_mxfp6(checkpoint: Checkpoint, module: str, codes, scales) -> bool:
    """A ``weight_packed`` of MXFP6 (``compressors/mxfp6``: 4 E2M3 codes in 3 bytes, [O,
    3I/4]), by its config or by its 24 bytes per E8M0 scale."""
    fmt, _ = config_entry(checkpoint.config, module, ("mxfp6-pack-quantized",))
    packed, grid = tuple(codes.shape), tuple(scales.shape)
    return fmt == "mxfp6-pack-quantized" or (
        len(packed) >= 2 and grid[:-1] == packed[:-1] and packed[-1] == 24 * grid[-1])


def _quantized(checkpoint: Checkpoint, module: str, codes, scales, element: str) -> Quantized:
    shape, problems = _shape_problems(codes, scales, element)
    if element == "float4_e2m1fn" and _is_mxfp6(checkpoint, module, codes, scales):
        element, shape = "float6_e2m3fn", tuple(codes.shape[:-1]) + (codes.shape[-1] * 4 // 3,)
        problems = [f"{codes.key} is MXFP6 (mxfp6-pack-quantized: 4 E2M3 codes in 3 "
                    "bytes), a layout fmt does not read"]
    fmt, weights = config_entry(checkpoint.config, module, (KINDS[element][0],))
    size = weights.get("group_size")
    if isinstance(size, int) and not isinstance(size, bool) and size != GROUP:
        problems.append(f"config.json says group_size {size} for {module or 'the weight'}, "
                        f"not MX's {GROUP}")
    parts = {"codes": codes, "scales": scales}
    extra = checkpoint.get(sibling(module, "input_global_scale"))
    if extra is not None and extra.opener is not None:
        parts["input_global_scale"] = extra
    bits = KINDS[element][1]
    facts = {"scale_direction": DIRECTION, "config_scheme": fmt,
             "nominal_bits": bits + 8 / GROUP, "scale_rule": rule(element),
             "quant_method": (checkpoint.config or {}).get("quant_method"),
             "block": GROUP}
    if element == "float4_e2m1fn":
        facts["nibble_order"] = "low-first"
    rows, elements, grid, raw = _readers(codes, scales, shape, element)
    key = sibling(module, "weight")
    return Quantized(NAME, key, codes.source, shape, element, "e8m0",
                     ScaleGroup("block", GROUP), parts, rows, facts, elements, grid, problems,
                     raw)


def _readers(codes, scales, shape: tuple[int, ...], element: str):
    """(rows_reader, elements_reader, scales_reader): codes streamed by rows of the
    matrix view from their memory map (packed bytes unpacked low nibble first), the E8M0
    grid's rows a chunk needs decoded from its map per chunk (nothing kept for the
    tensor's life: a kept grid or map grows an audit's memory with the checkpoint)."""
    rows_total, cols = matrix_shape(shape)

    def grid_bytes() -> np.ndarray:
        return np.asarray(scales.stored()).view(np.uint8)

    def grid() -> np.ndarray:
        return e8m0_values(grid_bytes()).reshape(scales.shape)

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        # the memory map opened per chunk: a map kept open keeps every page read in the RSS
        stored = codes.stored()
        if element == "float4_e2m1fn":
            packed = stored.reshape(rows_total, cols // 2)[r0:r1]
            return unpack_fp4(packed, low_first=True)
        return byte_float_values(stored.reshape(rows_total, cols)[r0:r1])

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        values = elements_reader(r0, r1)
        per = e8m0_values(grid_bytes().reshape(rows_total, -1)[r0:r1])
        return per_block(values, per, GROUP)

    def raw_reader(r0: int, r1: int) -> RawChunk | None:
        if element not in ("float4_e2m1fn", "float8_e4m3fn", "float8_e5m2"):
            return None
        per = e8m0_values(grid_bytes().reshape(rows_total, -1)[r0:r1]).astype(np.float64)
        stored = codes.stored()
        if element == "float4_e2m1fn":
            packed = stored.reshape(rows_total, cols // 2)[r0:r1]
            return RawChunk(np.asarray(packed), 1, FP4_TABLE, per)
        found = np.asarray(stored.reshape(rows_total, cols)[r0:r1]).view(np.uint8)
        return RawChunk(found, 0, byte_table(element), per)

    return rows_reader, elements_reader, grid, raw_reader
