"""compressed-tensors NVFP4 weights: ``nvfp4-pack-quantized``.

Definition (compressed-tensors 0.20.1, read in its source):

- ``compressors/nvfp4/base.py`` (``NVFP4PackedCompressor``): a module's weight O x I is
  stored as ``weight_packed`` (uint8, O x I/2), ``weight_scale`` (float8_e4m3fn, or the
  scheme's ``scale_dtype``; O x I/16, one per group of 16 along the rows) and
  ``weight_global_scale`` (float32, one value; fmt also takes one per stacked matrix);
  ``weight_zero_point`` only for an asymmetric scheme, ``input_global_scale`` for a static
  input scheme (kept here as the part ``input_global_scale``; an ``input_scale`` beside it
  is kept too).
- ``compressors/nvfp4/helpers.py`` (``pack_fp4_to_uint8``, ``unpack_fp4_from_uint8``):
  FP4 E2M1 codes (sign bit 3, magnitude index 0-7 of 0, 0.5, 1, 1.5, 2, 3, 4, 6), two per
  byte over the row-major flattened weight, the *low* nibble the even element
  (``packed = idx[:, 0] | idx[:, 1] << 4``).
- ``quantization/lifecycle/forward_helpers.py`` ``_dequantize``: ``scale = weight_scale /
  weight_global_scale``, ``x = (code - zero_point) * scale``.  The global scale *divides*
  (a quantization-direction factor), the block scale multiplies: ``x = code *
  weight_scale / weight_global_scale`` -- the reciprocal of ModelOpt's ``weight_scale_2``.
- The exporter's rule (``quantization/utils/helpers.py``): ``generate_gparam``:
  ``weight_global_scale = 448 * 6 / amax`` (float32; NaN or inf become 1);
  ``calculate_qparams``: ``weight_scale = float8_e4m3fn(weight_global_scale *
  block_amax / 6)``, a zero scale replaced by float8's eps.
- ``config.json``: ``quantization_config.format`` (or the group's ``format``)
  ``nvfp4-pack-quantized``; the group's ``weights``: ``num_bits`` 4, ``type`` float,
  ``strategy`` ``tensor_group``, ``group_size`` 16 (``model_compressor.py``
  ``update_config``).

Exactness: fmt forms ``(code - zero_point) * weight_scale`` in float64 (exact: two and
four significant bits), divides by the float32 global scale in float64 and rounds to
float32 once -- the exact decoding of the stored bytes, correctly rounded up to a float64
double rounding.  The library decodes to bfloat16 (``unpack_fp4_from_uint8``'s default):
float32 ``weight_scale / weight_global_scale``, the float32 product, then bfloat16, so its
values are off the exact ones by up to 2^-8 relative (0.39%).

Detected from the tensors alone: ``weight_packed`` (uint8) beside ``weight_global_scale``
or a float8_e4m3fn ``weight_scale`` (compressed-tensors' MXFP4 has neither: E8M0 uint8
scales, no global scale).  The config's group confirms (``facts["config_scheme"]``) and
gives the group size.  Leading axes (stacked experts) are read row by row of the last
axis.  The config helpers are ``ct_fp8``'s (``config_entry``: the config group of a module,
by ``re:`` target or the first of the format).
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.dtypes import ITEMSIZES
from fmtcli.base.errors import DataError
from fmtcli.inputs.layouts.base import (
    FP4_TABLE,
    Checkpoint,
    Quantized,
    RawChunk,
    refuse_rows,
    unpack_fp4,
    values_of,
)
from fmtcli.inputs.layouts.ct_fp8 import config_entry, module_of, sibling, siblings
from fmtcli.inputs.layouts.lookup import per_block
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "compressed-tensors-nvfp4"
DESCRIPTION = ("uint8 weight_packed (FP4 E2M1 x2, low nibble first) x float8_e4m3fn "
               "weight_scale per 16 / float32 weight_global_scale")
REFERENCE = ("compressed-tensors 0.20.1: compressors/nvfp4/base.py, compressors/nvfp4/"
             "helpers.py; quantization/lifecycle/forward_helpers.py _dequantize")

FORMATS = ("nvfp4-pack-quantized",)
GROUP = 16
SCALE_DTYPES = ("float8_e4m3fn", "bfloat16", "float16", "float32")
FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")
DIRECTION = "dequantization (x = code * scale)"
RULE = ("weight_global_scale = 448 * 6 / amax (float32); weight_scale = float8_e4m3fn("
        "weight_global_scale * block_amax / 6), zero -> eps (compressed-tensors "
        "generate_gparam, calculate_qparams)")
FP4_MAX_TIMES_E4M3_MAX = 448.0 * 6.0


# -- helpers (shared with ct_pack) ------------------------------------------------------

def int_setting(weights: dict, name: str, low: int, high: int) -> int | None:
    """A config ``weights`` entry that is an int in ``low..high``, else None."""
    value = weights.get(name)
    return value if isinstance(value, int) and low <= value <= high else None


def rows_of_lines(decode, r0: int, r1: int, shape: tuple[int, ...]) -> np.ndarray:
    """Rows ``r0:r1`` of ``shape``'s matrix view from ``decode(a, b)``, which gives rows
    ``a:b`` of the last axis (float32 (b - a, shape[-1])): only the rows they cover."""
    cols, width = matrix_shape(shape)[1], shape[-1]
    first, last = r0 * cols, r1 * cols  # flat element range
    a, b = first // width, -(-last // width)
    flat = decode(a, b).reshape(-1)[first - a * width:last - a * width]
    return flat.reshape(r1 - r0, cols)


# -- the reader ----------------------------------------------------------------------------

#: The parts a packed weight may have beside its codes: (role, last part of the name).
PARTS = (("scales", "weight_scale"), ("global_scale", "weight_global_scale"),
         ("zero_point", "weight_zero_point"), ("input_global_scale", "input_global_scale"),
         ("input_scale", "input_scale"))


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found = []
    for key, packed in checkpoint.tensors.items():
        module = module_of(key, "weight_packed")
        if module is None or packed.dtype != "uint8" or packed.opener is None:
            continue
        scale = checkpoint.get(sibling(module, "weight_scale"))
        glob = checkpoint.get(sibling(module, "weight_global_scale"))
        if glob is None and (scale is None or scale.dtype != "float8_e4m3fn"):
            continue  # compressed-tensors' MXFP4 (E8M0 uint8 scales), not NVFP4
        parts = {"codes": packed, **siblings(checkpoint, module, PARTS)}
        found.append(_quantized(module, parts, checkpoint.config))
    return found


def _checks(parts: dict, shape: tuple[int, ...], group: int) -> list[str]:
    packed = parts["codes"]
    problems = []
    want = shape[:-1] + (-(-shape[-1] // group),)
    scale = parts.get("scales")
    if scale is None:
        problems.append("its weight_scale is missing")
    elif scale.dtype not in SCALE_DTYPES or scale.opener is None:
        problems.append(f"{scale.key} is {scale.dtype}, not float8_e4m3fn")
    elif tuple(scale.shape) != want:
        problems.append(f"{scale.key} has shape {list(scale.shape)}, not {list(want)} (one "
                        f"per {group} of {list(shape)}: {packed.key} holds "
                        f"{list(packed.shape)} bytes, two FP4 values each)")
    zero = parts.get("zero_point")
    if zero is not None and scale is not None and tuple(zero.shape) != tuple(scale.shape):
        problems.append(f"{zero.key} has shape {list(zero.shape)}, not weight_scale's "
                        f"{list(scale.shape)}")
    glob = parts.get("global_scale")
    if glob is None:
        problems.append("its weight_global_scale is missing")
    elif (glob.size not in (1, math.prod(shape[:-2])) or glob.dtype not in FLOAT_DTYPES
          or glob.opener is None):
        problems.append(f"{glob.key} is {glob.dtype} {list(glob.shape)}, not one float32 "
                        "(or one per stacked matrix)")
    return problems


def _global(parts: dict, problems: list[str]) -> np.ndarray | None:
    """The global scale's values, float64, one or one per stacked matrix (None, with a
    problem, where they are unusable)."""
    if problems or "global_scale" not in parts:
        return None
    try:
        values = np.asarray(values_of(parts["global_scale"]), dtype=np.float64).reshape(-1)
    except (DataError, ValueError, OSError) as error:
        problems.append(f"{parts['global_scale'].key} is unreadable: {error}")
        return None
    bad = values[~(np.isfinite(values) & (values > 0))]
    if bad.size:
        problems.append(f"{parts['global_scale'].key} holds {float(bad[0])!r}, not a "
                        "positive number")
        return None
    return values


def _quantized(module: str, parts: dict, config: dict | None) -> Quantized:
    packed = parts["codes"]
    fmt, weights = config_entry(config, module, FORMATS)
    group = int_setting(weights, "group_size", 1, 1 << 20) or GROUP
    shape = tuple(packed.shape[:-1]) + (2 * packed.shape[-1],) if packed.shape else (0,)
    problems = [] if packed.shape and packed.size else [
        f"{packed.key} has shape {list(packed.shape)}: no packed rows"]
    problems += _checks(parts, shape, group) if not problems else []
    glob = _global(parts, problems)
    scale = parts.get("scales")
    scale_bits = 8 * ITEMSIZES.get(scale.dtype if scale is not None else "", 1)
    facts = {"scale_direction": DIRECTION, "global_scale_convention": "compressed-tensors",
             "nibble_order": "low-first", "config_scheme": fmt,
             "nominal_bits": 4 + scale_bits / group, "group_size": group,
             "symmetric": "zero_point" not in parts,
             "zero_point": "none (symmetric)" if "zero_point" not in parts else "per group",
             "strategy": weights.get("strategy", "tensor_group"),
             "global_scale": None if glob is None else (
                 float(glob[0]) if glob.size == 1 else glob.tolist()),
             "implied_amax": None if glob is None else float(
                 FP4_MAX_TIMES_E4M3_MAX / glob.min()),
             "scale_rule": RULE}
    readers = _readers(parts, shape, group, glob) if not problems else {}
    key = f"{module}.weight" if module else "weight"
    return Quantized(NAME, key, packed.source, shape, "float4_e2m1fn",
                     scale.dtype if scale is not None else "float8_e4m3fn",
                     ScaleGroup("block", group), parts,
                     readers.get("rows", refuse_rows), facts, readers.get("elements"),
                     readers.get("scales"), problems, readers.get("raw"))


def _readers(parts: dict, shape: tuple[int, ...], group: int, glob: np.ndarray) -> dict:
    from fmtcli.inputs.storage import as_values

    width, n_groups = shape[-1], -(-shape[-1] // group)

    def arrays() -> dict:
        """The scale (and zero-point) grids' maps, opened per chunk (not kept: see codes)."""
        found = {"scales": as_values(parts["scales"].stored()).reshape(-1, n_groups)}
        if "zero_point" in parts:
            found["zero"] = as_values(parts["zero_point"].stored()).reshape(-1, n_groups)
        return found

    def codes(a: int, b: int) -> np.ndarray:
        # mapped again per chunk: a map kept open keeps every page it read in the RSS
        packed = parts["codes"].stored().reshape(-1, width // 2)
        return unpack_fp4(np.asarray(packed[a:b]), low_first=True)

    def dequantized(a: int, b: int) -> np.ndarray:
        values = codes(a, b).astype(np.float64)
        grids = arrays()
        scale = np.asarray(grids["scales"][a:b]).astype(np.float64)
        if "zero" in grids:
            zero = np.asarray(grids["zero"][a:b]).astype(np.float64)
            per_block(values, zero, group, np.subtract)
        per_block(values, scale, group)
        if glob.size == 1:
            values /= glob[0]
        else:  # one per stacked matrix of shape[-2] last-axis rows
            values /= glob[np.arange(a, b) // shape[-2]][:, None]
        return values.astype(np.float32)

    def raw(r0: int, r1: int) -> RawChunk | None:
        if "zero_point" in parts or matrix_shape(shape)[1] != width:
            return None
        packed = parts["codes"].stored().reshape(-1, width // 2)
        scale = np.asarray(arrays()["scales"][r0:r1], dtype=np.float64)
        div = glob[0] if glob.size == 1 else glob[r0 // shape[-2]]
        return RawChunk(np.asarray(packed[r0:r1]), 1, FP4_TABLE, scale, 1.0, float(div))

    return {"rows": lambda r0, r1: rows_of_lines(dequantized, r0, r1, shape),
            "raw": raw,
            "elements": lambda r0, r1: rows_of_lines(codes, r0, r1, shape),
            "scales": lambda: values_of(parts["scales"])}
