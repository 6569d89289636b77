"""compressed-tensors integer weights packed into int32 words: ``pack-quantized``.

Definition (compressed-tensors 0.20.1, read in its source):

- ``compressors/pack_quantized/base.py`` (``PackedQuantizationCompressor``): a module's
  weight of ``num_bits`` (1-8) signed integers is stored as ``weight_packed`` (int32,
  ``shape[:-1] + (ceil(I * num_bits / 32),)``), ``weight_scale`` (the weight's float dtype:
  bfloat16, float16 or float32; ``[1]`` per tensor, ``[O, 1]`` per channel, ``[O,
  ceil(I / group_size)]`` per group), ``weight_shape`` (int64, the original shape) and,
  for an asymmetric group or channel scheme, ``weight_zero_point`` packed the same way
  *along the rows* (``pack_to_int32(zero_point, num_bits, packed_dim=0)``: int32
  ``[ceil(O * num_bits / 32), groups]``); an asymmetric per-tensor zero point is stored as
  it is.  ``weight_g_idx`` (older GPTQ exports with activation ordering: the group of
  each column) is honoured where present.
- ``compressors/pack_quantized/helpers.py`` (``pack_to_int32``, ``unpack_from_int32``):
  each value is offset to unsigned (``q + 2^(num_bits - 1)``) and the row is one dense
  little-endian bit stream: element ``i`` occupies bits ``i * num_bits`` onwards of the
  row's words (bit ``k`` is bit ``k % 32`` of word ``k // 32``; a value may straddle two
  words when ``num_bits`` does not divide 32).  Eight int4 or four int8 values per word,
  the first element in the lowest bits.  Older releases packed ``32 // num_bits`` values
  per word without straddling -- the same words for 1, 2, 4 and 8 bits; for 3, 5, 6 and 7
  bits fmt tells the two apart by the packed width (``facts["packing"]``).
- ``quantization/lifecycle/forward_helpers.py`` ``_dequantize``: ``x = (q - zero_point)
  * weight_scale`` -- a *dequantization* scale (``calculate_qparams``: ``amax / ((q_max -
  q_min) / 2)`` symmetric, ``(max - min) / (q_max - q_min)`` with ``zero_point = q_min -
  min / scale`` asymmetric, ``quantization/utils/helpers.py``).
- ``config.json``: ``format`` (or the group's) ``pack-quantized``; the group's
  ``weights``: ``num_bits``, ``type`` int, ``strategy``, ``group_size``, ``symmetric``.

Exactness: fmt forms ``(q - zero_point) * weight_scale`` in float64 (exact) and rounds to
float32 once.  The library computes in the scale's dtype: with float32 scales its values
are fmt's bit for bit; with bfloat16 scales they are the exact product rounded to
bfloat16 (an int8 difference has up to 9 significant bits, a bfloat16 scale 8).

Detected from the tensors alone: an int32 ``weight_packed`` beside a float
``weight_scale``; ``num_bits`` comes from the config, else from ``weight_shape`` and the
packed width (the one width that fits).  A ``weight_shape`` that disagrees with the
packed words, or scales of no strategy's shape, are the Quantized's problems.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.dtypes import ITEMSIZES
from fmtcli.base.errors import DataError, shown
from fmtcli.inputs.layouts.base import Checkpoint, Quantized, refuse_rows, values_of
from fmtcli.inputs.layouts.ct_fp8 import config_entry, module_of, sibling, siblings
from fmtcli.inputs.layouts.ct_nvfp4 import int_setting, rows_of_lines
from fmtcli.numerics.granularity import ScaleGroup

NAME = "compressed-tensors-pack"
DESCRIPTION = ("int32 weight_packed (int1-int8, dense bit stream, offset to unsigned) - "
               "weight_zero_point, x weight_scale per tensor, channel or group")
REFERENCE = ("compressed-tensors 0.20.1: compressors/pack_quantized/base.py, "
             "compressors/pack_quantized/helpers.py; quantization/lifecycle/"
             "forward_helpers.py _dequantize")

FORMATS = ("pack-quantized",)
SCALE_DTYPES = ("bfloat16", "float16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DIRECTION = "dequantization (x = code * scale)"
RULE = ("weight_scale = amax / ((q_max - q_min) / 2) symmetric; (max - min) / (q_max - "
        "q_min), zero_point = q_min - min / scale asymmetric; stored in the weight's dtype "
        "(compressed-tensors calculate_qparams)")
MAX_SHAPE_VALUES = 8


def dense_width(count: int, bits: int) -> int:
    """int32 words of ``count`` values of ``bits`` bits in one dense bit stream."""
    return -(-count * bits // 32)


def legacy_width(count: int, bits: int) -> int:
    """int32 words of ``count`` values at ``32 // bits`` per word (older releases)."""
    return -(-count // (32 // bits))


def unpack_words(words: np.ndarray, bits: int, count: int, dense: bool = True) -> np.ndarray:
    """The unsigned ``bits``-bit fields (int64 (rows, count)) of rows of int32 words:
    element ``i`` at bit ``i * bits`` of the row's stream (``dense``), else at bit
    ``(i % per) * bits`` of word ``i // per``, ``per = 32 // bits``."""
    w = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    index = np.arange(count, dtype=np.int64)
    if dense:
        word, shift = (index * bits) >> 5, (index * bits) & 31
    else:
        per = 32 // bits
        word, shift = index // per, (index % per) * bits
    field = w[:, word] >> shift
    if dense and 32 % bits:
        w = np.concatenate([w, np.zeros((w.shape[0], 1), dtype=np.int64)], axis=1)
        field |= w[:, word + 1] << (32 - shift)
    return field & ((1 << bits) - 1)


def _bits(weights: dict, packed, shape: tuple[int, ...] | None) -> tuple[int | None, str]:
    """``num_bits``: the config's, else the one width ``weight_shape`` fits."""
    bits = int_setting(weights, "num_bits", 1, 8)
    if bits is not None:
        return bits, "config.json"
    if shape is None:
        return None, "no config.json num_bits and no weight_shape"
    fits = [b for b in range(1, 9) if packed.shape[-1] == dense_width(shape[-1], b)]
    if not fits:  # older releases: 32 // bits per word (the dense stream decides first)
        fits = [b for b in range(1, 9) if packed.shape[-1] == legacy_width(shape[-1], b)]
    if len(fits) == 1:
        return fits[0], "weight_shape and the packed width"
    return None, (f"{len(fits)} widths fit {list(shape)} in {packed.shape[-1]} words and "
                  "config.json names none")


def _shape(parts: dict, problems: list[str]) -> tuple[int, ...] | None:
    found = parts.get("shape")
    if found is None:
        return None
    if (found.dtype not in INT_DTYPES or len(found.shape) != 1
            or not 1 <= found.size <= MAX_SHAPE_VALUES or found.opener is None):
        problems.append(f"{found.key} is {found.dtype} {list(found.shape)}, not a shape")
        return None
    try:
        values = [int(v) for v in np.asarray(found.stored()).reshape(-1)]
    except (DataError, ValueError, OSError) as error:
        problems.append(f"{found.key} is unreadable: {error}")
        return None
    if min(values) < 1:
        problems.append(f"{found.key} is {values}, not a shape")
        return None
    return tuple(values)


#: The parts a packed weight may have beside its codes: (role, last part of the name).
PARTS = (("scales", "weight_scale"), ("shape", "weight_shape"),
         ("zero_point", "weight_zero_point"), ("g_idx", "weight_g_idx"),
         ("input_global_scale", "input_global_scale"), ("input_scale", "input_scale"))


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found = []
    for key, packed in checkpoint.tensors.items():
        module = module_of(key, "weight_packed")
        if module is None or packed.dtype != "int32" or packed.opener is None:
            continue
        parts = {"codes": packed, **siblings(checkpoint, module, PARTS)}
        if "scales" not in parts or parts["scales"].dtype not in SCALE_DTYPES:
            continue
        found.append(_quantized(module, parts, checkpoint.config))
    return found


def _layout(parts: dict, weights: dict, problems: list[str]) -> dict:
    """Shape, bits and packing of the codes (``{}`` with a problem where they disagree)."""
    packed = parts["codes"]
    if not packed.shape or not packed.size:
        problems.append(f"{packed.key} has shape {list(packed.shape)}: no packed rows")
        return {}
    shape = _shape(parts, problems)
    if problems:
        return {}
    bits, source = _bits(weights, packed, shape)
    if bits is None:
        problems.append(f"{packed.key}: the number of bits is unknown ({source})")
        return {}
    if shape is None:
        shape = tuple(packed.shape[:-1]) + (packed.shape[-1] * 32 // bits,)
    dense, legacy = dense_width(shape[-1], bits), legacy_width(shape[-1], bits)
    if tuple(shape[:-1]) != tuple(packed.shape[:-1]) or packed.shape[-1] not in (dense,
                                                                                 legacy):
        problems.append(f"weight_shape {list(shape)} disagrees with {packed.key} "
                        f"{list(packed.shape)} (int{bits}: {dense} words per row of "
                        f"{shape[-1]})")
        return {}
    return {"shape": shape, "bits": bits, "bits_from": source,
            "dense": packed.shape[-1] == dense}


def _grouping(parts: dict, weights: dict, shape: tuple, problems: list[str]) -> dict:
    """What one scale covers: per tensor, per row, or groups of ``group`` columns."""
    scale, cols = parts["scales"], shape[-1]
    n = scale.shape[-1] if scale.shape else 1
    size = int_setting(weights, "group_size", 1, 1 << 30)
    if scale.size == 1 and weights.get("strategy") in (None, "tensor"):
        return {"group": ScaleGroup("tensor"), "columns": math.prod(shape), "n": 1}
    if len(scale.shape) == len(shape) and tuple(scale.shape[:-1]) == tuple(shape[:-1]):
        size = size or (cols if n == 1 else -(-cols // n))
        if -(-cols // size) == n:
            group = ScaleGroup("row") if n == 1 else ScaleGroup("block", size)
            return {"group": group, "columns": size, "n": n}
    what = f"groups of {size}" if size else "tensor, row or group"
    problems.append(f"{scale.key} has shape {list(scale.shape)}, not one per {what} of "
                    f"{list(shape)}")
    return {}


def _zero_shape_ok(parts: dict, layout: dict, grouping: dict) -> str | None:
    zero, scale = parts.get("zero_point"), parts["scales"]
    if zero is None:
        return None
    if zero.dtype == "int32" and len(zero.shape) == len(scale.shape) >= 2:
        rows = layout["shape"][-2]
        packed = tuple(scale.shape[:-2]) + (dense_width(rows, layout["bits"]), scale.shape[-1])
        if tuple(zero.shape) == packed:
            return "packed"
    if zero.dtype in INT_DTYPES and tuple(zero.shape) == tuple(scale.shape):
        return "as stored"
    return None


def _quantized(module: str, parts: dict, config: dict | None) -> Quantized:
    packed = parts["codes"]
    fmt, weights = config_entry(config, module, FORMATS)
    problems: list[str] = []
    layout = _layout(parts, weights, problems)
    grouping = _grouping(parts, weights, layout["shape"], problems) if layout else {}
    zero_form = _zero_shape_ok(parts, layout, grouping) if grouping else None
    if grouping and "zero_point" in parts and zero_form is None:
        zero = parts["zero_point"]
        problems.append(f"{zero.key} is {zero.dtype} {list(zero.shape)}, not a zero point "
                        f"per scale of {parts['scales'].key} {list(parts['scales'].shape)}")
    if grouping and "zero_point" not in parts and weights.get("symmetric") is False:
        problems.append("config.json says asymmetric but weight_zero_point is missing")
    if grouping and "g_idx" in parts and parts["g_idx"].size != layout["shape"][-1]:
        problems.append(f"{parts['g_idx'].key} has {parts['g_idx'].size} entries, not one "
                        f"per column ({layout['shape'][-1]})")
    elif grouping and "g_idx" in parts and parts["g_idx"].dtype not in INT_DTYPES:
        problems.append(f"{parts['g_idx'].key} is {parts['g_idx'].dtype}, not group indices "
                        "(integers)")
    bits = layout.get("bits") or int_setting(weights, "num_bits", 1, 8) or 4
    shape = layout.get("shape") or (tuple(packed.shape[:-1]) + (
        packed.shape[-1] * 32 // bits,) if packed.shape else (0,))
    scale = parts["scales"]
    columns = grouping.get("columns", shape[-1] if shape else 1)
    asym = "zero_point" in parts
    facts = {"scale_direction": DIRECTION, "config_scheme": fmt,
             "nominal_bits": bits + (8 * ITEMSIZES.get(scale.dtype, 2) + bits * asym)
             / max(1, columns),
             "num_bits": layout.get("bits"), "num_bits_from": layout.get("bits_from"),
             "group_size": columns if grouping.get("n", 1) > 1 else None,
             "strategy": weights.get("strategy"), "symmetric": not asym,
             "zero_point": zero_form or "none (symmetric)",
             "packing": ("dense bit stream" if layout.get("dense", True)
                         else f"{32 // bits} per int32 word (older compressed-tensors)"),
             "g_idx": "g_idx" in parts, "scale_rule": RULE}
    readers = _readers(parts, layout, grouping, zero_form) if not problems else {}
    return Quantized(NAME, sibling(module, "weight"), packed.source, shape, f"int{bits}",
                     scale.dtype, grouping.get("group", ScaleGroup("tensor")), parts,
                     readers.get("rows", refuse_rows), facts, readers.get("elements"),
                     readers.get("scales"), problems)


def _zero_points(parts: dict, layout: dict, zero_form: str | None) -> np.ndarray | None:
    """The zero points as integers in the scales' shape (rows of groups), or None."""
    if zero_form is None:
        return None
    stored = np.asarray(parts["zero_point"].stored())
    if zero_form == "as stored":
        return stored.astype(np.int64).reshape(-1, stored.shape[-1] if stored.ndim else 1)
    bits, rows = layout["bits"], layout["shape"][-2]
    lead = stored.reshape(-1, stored.shape[-2], stored.shape[-1])
    fields = [unpack_words(m.T, bits, rows).T for m in lead]  # packed along the rows
    return np.concatenate(fields, axis=0) - (1 << (bits - 1))


def _readers(parts: dict, layout: dict, grouping: dict, zero_form: str | None) -> dict:
    shape, bits, dense = layout["shape"], layout["bits"], layout["dense"]
    width, n = shape[-1], grouping["n"]
    cache: dict = {}

    def arrays() -> dict:
        if not cache:
            from fmtcli.inputs.storage import as_values

            column = (np.asarray(parts["g_idx"].stored()).astype(np.int64).reshape(-1)
                      if "g_idx" in parts else np.arange(width) // grouping["columns"])
            if n > 1 and column.size and not 0 <= column.min() <= column.max() < n:
                raise DataError(f"{shown(parts['g_idx'].name)} names groups outside "
                                f"0..{n - 1}")
            cache.update(
                packed=parts["codes"].stored().reshape(-1, parts["codes"].shape[-1]),
                scales=np.asarray(as_values(parts["scales"].stored())).reshape(-1, n),
                zero=_zero_points(parts, layout, zero_form), column=column)
        return cache

    def codes(a: int, b: int) -> np.ndarray:
        words = np.asarray(arrays()["packed"][a:b])
        return unpack_words(words, bits, width, dense) - (1 << (bits - 1))

    def dequantized(a: int, b: int) -> np.ndarray:
        found = arrays()
        values = codes(a, b).astype(np.float64)
        rows = slice(0, 1) if n == 1 and found["scales"].shape[0] == 1 else slice(a, b)
        column = found["column"] if n > 1 else np.zeros(width, dtype=np.int64)
        if found["zero"] is not None:
            values -= found["zero"][rows][:, column]
        values *= found["scales"][rows].astype(np.float64)[:, column]
        return values.astype(np.float32)

    def elements(r0: int, r1: int) -> np.ndarray:
        return rows_of_lines(lambda a, b: codes(a, b).astype(np.float32), r0, r1, shape)

    return {"rows": lambda r0, r1: rows_of_lines(dequantized, r0, r1, shape),
            "elements": elements, "scales": lambda: values_of(parts["scales"])}
