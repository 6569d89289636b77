"""NVIDIA TensorRT Model Optimizer (ModelOpt) NVFP4 checkpoints, as its Hugging Face export
writes them.

Definition (nvidia-modelopt 0.47.0, ``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``
``NVFP4QTensor.quantize`` / ``dequantize``; the export in ``modelopt/torch/export/
unified_export_hf.py`` and ``convert_hf_config.py``).  A quantized linear layer
``<m>.weight`` of O x I values is stored as:

- ``<m>.weight``: uint8 O x I/2, two FP4 E2M1 codes per byte, the *low* nibble the even
  column (``packed = (q[..., 1::2] << 4) | q[..., 0::2]``);
- ``<m>.weight_scale``: float8_e4m3fn O x I/16, one per block of 16 along the rows
  (``block_amax / (6 * weight_scale_2)``, clamped to [2^-9, 448]; 1.0 for an all-zero
  block);
- ``<m>.weight_scale_2``: float32 scalar, ``amax / (6 * 448)`` of the whole weight;
- ``<m>.input_scale``: float32 scalar, the activations' ``amax / (6 * 448)`` (kept as a
  part; W4A16_NVFP4 has none).

Dequantization multiplies both levels: ``x = code * weight_scale * weight_scale_2``
(``dequantize``: ``per_block_scale = scale.float() * double_scale``), so both are
*dequantization* scales -- where compressed-tensors' ``weight_global_scale`` is the
reciprocal, ``448 * 6 / amax``, and divides.  fmt forms the product in float64 (exact) and
rounds to float32 once; ModelOpt's float32 path rounds ``scale * double_scale`` first, so
its float32 result can differ from the correctly rounded one by one unit in the last place.

The folder says so in ``hf_quant_config.json`` (``{"producer": {"name": "modelopt", ...},
"quantization": {"quant_algo": "NVFP4", "group_size": 16, ...}}``) and in ``config.json``'s
``quantization_config`` (``{"quant_method": "modelopt", "quant_algo": "NVFP4", ...}``).
The tensors decide (uint8 weight + float8_e4m3fn weight_scale + weight_scale_2); the
configs confirm (``facts["config_scheme"]``).  A float8_e4m3fn weight with a float32
``weight_scale`` in a folder whose config names NVFP4 is claimed too, read as ModelOpt FP8
(``x = code * weight_scale``), with the mismatch as its problem.

Stacked experts (E x O x I/2 with E x O x I/16 block scales) are read matrix by matrix; a
``weight_scale_2`` with one value per matrix applies to its own.  A ``weight_scale_2`` that
is NaN, inf, zero or negative is the tensor's problem (not read), as compressed-tensors'
NVFP4 reader treats a bad ``weight_global_scale`` (``ct_nvfp4._global``).
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.errors import DataError
from fmtcli.inputs.checkpoints import config_folder
from fmtcli.inputs.layouts.base import (
    FP4_TABLE,
    Checkpoint,
    Quantized,
    RawChunk,
    json_object,
    values_of,
)
from fmtcli.inputs.layouts.fp4_blocks import dequantized_rows, fp4_values, row_span
from fmtcli.inputs.layouts.lookup import byte_float_values
from fmtcli.inputs.storage import as_values
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "modelopt-nvfp4"
DESCRIPTION = ("uint8 weight (FP4 E2M1 x2, low nibble first) x float8_e4m3fn weight_scale "
               "per 16 x float32 weight_scale_2")
REFERENCE = ("nvidia-modelopt modelopt/torch/quantization/qtensor/nvfp4_tensor.py "
             "(NVFP4QTensor); modelopt/torch/export/convert_hf_config.py")

BLOCK = 16
GLOBAL_DTYPES = ("float32", "bfloat16", "float16", "float64")
SCALE_RULE = ("weight_scale_2 = amax / (6 * 448); weight_scale = float8_e4m3fn(block_amax "
              "/ (6 * weight_scale_2)) clamped to [2^-9, 448], 1.0 for all-zero blocks")
FACTS = {"scale_direction": "dequantization (x = code * scale)",
         "nibble_order": "low-first", "global_scale_convention": "modelopt",
         "nominal_bits": 4.5, "scale_rule": SCALE_RULE}


def hf_quant_config(folder: str | None) -> dict | None:
    """``folder/hf_quant_config.json``'s ``quantization`` entry (ModelOpt's own record of
    the scheme), or None where the file, the entry or valid JSON is missing
    (``base.json_object``)."""
    config = json_object(folder, "hf_quant_config.json")
    found = config.get("quantization") if config else None
    return found if isinstance(found, dict) else None


def scheme_of(config: dict | None, folder: str | None) -> tuple[str | None, int, str | None]:
    """What the folder's configs name: (quant_algo or None, group size, which file said
    it).  ``config.json``'s entry counts where it is ModelOpt's (``quant_method``
    ``modelopt``, or a ``quant_algo`` without a method); else ``hf_quant_config.json``."""
    config = config or {}
    found, where = None, None
    if config.get("quant_method", "modelopt") == "modelopt" and "quant_algo" in config:
        found, where = config, "config.json"
    else:
        found = hf_quant_config(folder)
        where = "hf_quant_config.json" if found else None
    if not found:
        return None, BLOCK, None
    algo, size = found.get("quant_algo"), found.get("group_size", BLOCK)
    if not isinstance(size, int) or not 0 < size <= 1 << 16:
        size = BLOCK
    return (algo if isinstance(algo, str) else None), size, where


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found, schemes = [], {}
    for key, codes in checkpoint.tensors.items():
        scales = checkpoint.get(key + "_scale")
        if scales is None or not key.endswith("weight"):
            continue
        folder = config_folder(codes.source)  # a bare file name: the cwd
        if folder not in schemes:
            schemes[folder] = scheme_of(checkpoint.config, folder)
        algo, size, where = schemes[folder]
        facts = {**FACTS, "config_scheme": algo, "config_file": where, "group_size": size}
        if codes.dtype == "uint8" and scales.dtype == "float8_e4m3fn":
            found.append(_nvfp4(checkpoint, key, codes, scales, facts))
        elif (codes.dtype == "float8_e4m3fn" and scales.dtype in GLOBAL_DTYPES
              and "NVFP4" in (algo or "")):
            found.append(_mislabelled(checkpoint, key, codes, scales, facts))
    return found


def _extra_parts(checkpoint: Checkpoint, key: str) -> dict:
    parts = {}
    second = checkpoint.get(key + "_scale_2")
    if second is not None:
        parts["global_scale"] = second
    input_scale = checkpoint.get(key[:-len("weight")] + "input_scale")
    if input_scale is not None:
        parts["input_scale"] = input_scale
    return parts


def _shape_problems(codes, scales, second, size: int) -> list[str]:
    problems = []
    if len(codes.shape) < 1 or codes.shape[-1] == 0 or codes.opener is None:
        return [f"{codes.key} has shape {list(codes.shape)}: no packed FP4 bytes to read"]
    shape = tuple(codes.shape[:-1]) + (2 * codes.shape[-1],)
    want = shape[:-1] + (-(-shape[-1] // size),)
    if tuple(scales.shape) != want:
        problems.append(f"{scales.key} has shape {list(scales.shape)}, not {list(want)} "
                        f"(one float8_e4m3fn per {size} values of {list(shape)})")
    matrices = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    if second is None:
        problems.append(f"{codes.key}_scale_2 (the float32 global scale) is missing")
    elif second.dtype not in GLOBAL_DTYPES or second.size not in (1, matrices):
        problems.append(f"{second.key} is {second.dtype} {list(second.shape)}, not one float32 "
                        f"(or one per matrix: {matrices})")
    return problems


def _global_problems(second) -> list[str]:
    """A ``weight_scale_2`` that is NaN, inf, zero or negative (or unreadable) as a
    problem, as ``ct_nvfp4._global`` says a bad ``weight_global_scale``: every value it
    covers would decode to NaN, inf, 0 or the wrong sign, so the tensor is not read."""
    try:
        values = np.asarray(values_of(second), dtype=np.float64).reshape(-1)
    except (DataError, ValueError, OSError) as error:
        return [f"{second.key} is unreadable: {error}"]
    bad = values[~(np.isfinite(values) & (values > 0))]
    if bad.size:
        return [f"{second.key} holds {float(bad[0])!r}, not a positive number"]
    return []


def _nvfp4(checkpoint, key, codes, scales, facts) -> Quantized:
    parts = {"codes": codes, "scales": scales, **_extra_parts(checkpoint, key)}
    second, size = parts.get("global_scale"), facts["group_size"]
    problems = _shape_problems(codes, scales, second, size)
    if not problems:
        problems = _global_problems(second)
    shape = tuple(codes.shape[:-1]) + (2 * codes.shape[-1],) if codes.shape else (0,)
    width, height = shape[-1], (shape[-2] if len(shape) > 1 else 1)
    cols = matrix_shape(shape)[1]
    cache: dict = {}

    def load() -> dict:
        if not cache:
            cache["global"] = (np.ones(1) if second is None else
                               values_of(second).astype(np.float64).reshape(-1))
        return cache

    def factor(a: int, b: int) -> np.ndarray:
        found = load()["global"]
        return found[np.arange(a, b) // height] if found.size > 1 else found[0]

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        a, b = row_span(r0, r1, cols, width)
        # the packed bytes mapped again per chunk: a map kept open keeps its pages in the RSS
        packed = codes.stored().reshape(-1, codes.shape[-1])
        grid = as_values(scales.stored()).reshape(-1, scales.shape[-1])  # its map, exact
        block = dequantized_rows(packed, grid, a, b, size, factor(a, b))
        return block.reshape(r1 - r0, cols)

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        a, b = row_span(r0, r1, cols, width)
        return fp4_values(codes.stored().reshape(-1, codes.shape[-1]), a, b).reshape(
            r1 - r0, cols)

    def scales_reader() -> np.ndarray:
        return values_of(scales).astype(np.float32)

    def raw_reader(r0: int, r1: int) -> RawChunk | None:
        if cols != width:
            return None
        packed = codes.stored().reshape(-1, codes.shape[-1])
        grid = as_values(scales.stored()).reshape(-1, scales.shape[-1])
        mul = np.asarray(factor(r0, r1), dtype=np.float64).reshape(-1)
        return RawChunk(np.asarray(packed[r0:r1]), 1, FP4_TABLE,
                        np.asarray(grid[r0:r1], dtype=np.float64), float(mul[0]))

    return Quantized(NAME, key, codes.source, shape, "float4_e2m1fn", "float8_e4m3fn",
                     ScaleGroup("block", size), parts, rows_reader, facts,
                     elements_reader, scales_reader, problems, raw_reader)


def _mislabelled(checkpoint, key, codes, scales, facts) -> Quantized:
    """A float8_e4m3fn weight with a float32 weight_scale (ModelOpt FP8: x = code *
    weight_scale, one per tensor or per row) in a folder whose config names NVFP4."""
    parts = {"codes": codes, "scales": scales, **_extra_parts(checkpoint, key)}
    shape = tuple(codes.shape)
    rows, cols = matrix_shape(shape)
    per_row = scales.size == rows and scales.size > 1
    problems = [f"{facts['config_file']} names {facts['config_scheme']}, but {key} is "
                f"float8_e4m3fn with a {scales.dtype} {key}_scale: FP8, not NVFP4 (a "
                "uint8 weight with float8_e4m3fn block scales)"]
    if scales.size != 1 and not per_row:
        problems.append(f"{scales.key} has shape {list(scales.shape)}: neither one scale "
                        f"nor one per row ({rows})")
    facts = {**facts, "nibble_order": None, "global_scale_convention": None,
             "nominal_bits": 8.0, "scale_rule": "weight_scale = amax / 448 (ModelOpt FP8)"}

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        return byte_float_values(codes.stored().reshape(rows, cols)[r0:r1])

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        scale = values_of(scales).astype(np.float64).reshape(-1)
        scale = scale[r0:r1, None] if per_row else scale[0]
        return (elements_reader(r0, r1) * scale).astype(np.float32)

    return Quantized(NAME, key, codes.source, shape, "float8_e4m3fn", scales.dtype,
                     ScaleGroup("row" if per_row else "tensor"), parts, rows_reader, facts,
                     elements_reader, lambda: values_of(scales).astype(np.float32), problems)
