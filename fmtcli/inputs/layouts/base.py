"""What every layout reader yields: ``Quantized``, one tensor of an already-quantized
checkpoint (its stored parts: codes, scales, ...), and the helpers readers share.

A layout reader (one module of this package, listed in ``layouts.READERS``) claims groups
of a checkpoint's tensors (``claim``) -- e.g. DeepSeek-V3's ``weight`` (float8_e4m3fn) with
its ``weight_scale_inv`` (float32, one per 128 x 128 block) -- and says how to dequantize
them to float32.  Dequantization is streamed: ``Quantized.read(rows, cols)`` decodes one
chunk of the tensor's matrix view (``streaming.stream.matrix_shape`` of ``shape``) from the
parts' memory maps, so a checkpoint larger than memory is read chunk by chunk.

The scale direction is the layout's own and each reader says which: a *dequantization*
scale ``d`` (DeepSeek's ``weight_scale_inv``, compressed-tensors' ``weight_scale``,
vLLM's ``k_scale``: ``x = code * d``) or fmt's own *quantization* scale ``s``
(``x_q = cast(x * s) / s``, so ``x = code / s``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fmtcli.base.errors import DataError, Note, shown
from fmtcli.inputs.layouts.lookup import tile_rows
from fmtcli.inputs.source import TensorSource
from fmtcli.inputs.textparse import check_json_depth
from fmtcli.numerics.codes import all_values
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.granularity import ScaleGroup


class LayoutNote(Note):
    """A note that a checkpoint's tensors were read as a quantized layout (said once)."""


@dataclass
class Quantized:
    """One dequantizable tensor of a quantized checkpoint.

    - ``layout``: the reader's name (``layouts.READERS``), e.g. ``deepseek-fp8``.
    - ``key``: the logical tensor's name, as the original checkpoint names it
      (``model.layers.0.mlp.down_proj.weight``); ``source``: the file of its codes.
    - ``shape``: the dequantized tensor's shape (a packed FP4 tensor's is twice its bytes).
    - ``element``: the element format, by fmt's name (``float8_e4m3fn``, ``float4_e2m1fn``,
      ``int4``, ``int8``); ``scale_dtype``: how the scales are stored (``float32``,
      ``float8_e4m3fn``, ``e8m0``, ``bfloat16``); ``group``: what one scale covers, in
      fmt's one vocabulary (``ScaleGroup``: tensor, row, block N, tile R x C).
    - ``parts``: the stored tensors by role (``codes``, ``scales``, ``global_scale``,
      ``input_scale``, ``zero_point``...), each a plain ``TensorSource``.
    - ``facts``: what the reader found and the audit checks need (the convention of a
      global scale, the nibble order, the ``config.json`` entry that named the layout...),
      JSON-ready.
    - ``rows_reader``: ``(r0, r1) -> float32 (r1 - r0, columns)``, the dequantized rows
      ``r0:r1`` of the matrix view; set by the reader.
    - ``elements_reader``: ``(r0, r1) -> float32 (r1 - r0, columns)``, the same rows'
      *element* values before any scale: FP8/FP4 codes decoded (packed FP4 unpacked),
      integers as their values before the zero point.  What ``fmt audit`` counts codes
      by (clipping at the format's max, blocks that use only the lowest codes).
    - ``scales_reader``: ``() -> float32 array``, the per-group scales decoded from their
      storage (E8M0 bytes as powers of two, float8 as its values), in their stored shape
      and the layout's own direction (``facts["scale_direction"]``); for two-level
      layouts (NVFP4) the per-block scales, the global one being ``parts["global_scale"]``.
    - ``raw_reader``: ``(r0, r1) -> RawChunk`` or None, the same rows as stored (codes and
      per-tile multipliers), where the layout's dequantization is ``RawChunk``'s formula:
      what ``fmt audit``'s compiled pass reads instead of the two float arrays.  Its
      values equal ``rows_reader``'s to the bit (tests/inputs/test_layout_raw.py).
    - ``problems``: what makes the group unreadable (a scale grid of the wrong shape, a
      packed tensor too short), each one line; ``read`` refuses with the first, and
      ``fmt audit`` reports them as failed checks.  Readers never raise while claiming.
    """

    layout: str
    key: str
    source: str
    shape: tuple[int, ...]
    element: str
    scale_dtype: str
    group: ScaleGroup
    parts: dict[str, TensorSource]
    rows_reader: Callable[[int, int], np.ndarray] = field(repr=False)
    facts: dict = field(default_factory=dict)
    elements_reader: Callable[[int, int], np.ndarray] | None = field(default=None, repr=False)
    scales_reader: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    problems: list[str] = field(default_factory=list)
    raw_reader: Callable[[int, int], RawChunk | None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.source}:{self.key}"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def matrix(self) -> tuple[int, int]:
        from fmtcli.numerics.granularity import matrix_shape

        return matrix_shape(self.shape)

    @property
    def stored_bytes(self) -> int:
        """Bytes of every stored part (codes, scales, global scales, zero points...); a
        ``metadata`` part (a file's description, shared by its tensors) is not counted."""
        return sum(part.size * _itemsize(part.dtype) for role, part in self.parts.items()
                   if role != "metadata")

    @property
    def bits_per_param(self) -> float:
        """Stored bits per element of the dequantized tensor, scales included."""
        return 8.0 * self.stored_bytes / max(1, self.size)

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        """One chunk of the matrix view, dequantized: float32 (rows, cols), C-contiguous."""
        if self.problems:
            raise DataError(f"{shown(self.name)}: {self.problems[0]}")
        # scales that overflow their products (3e38, inf, NaN) decode to inf/NaN, the
        # stored bytes' meaning (fmt audit's values-finite counts them): no numpy warning
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            block = self.rows_reader(rows.start, rows.stop)
        n_cols = self.matrix[1]
        if cols.start == 0 and cols.stop >= n_cols:
            return np.ascontiguousarray(block, dtype=np.float32)
        return np.ascontiguousarray(block[:, cols], dtype=np.float32)

    def dequantize(self) -> np.ndarray:
        """The whole tensor dequantized (float32, ``shape``): for small tensors and tests;
        the commands stream ``read``."""
        rows, cols = self.matrix
        return self.read(slice(0, rows), slice(0, cols)).reshape(self.shape)

    def as_source(self) -> TensorSource:
        """The dequantized tensor as a plain input (dtype float32, read by ``read`` in
        chunks: ``TensorSource.quantized``), so that every analysis works on it.  An empty
        one is skipped ("empty"), as a plain empty tensor is."""
        return TensorSource(self.source, self.key, tuple(self.shape), "float32",
                            self.dequantize, "empty" if self.size == 0 else None,
                            quantized=self)

    def describe(self) -> dict:
        """JSON: ``layout``, ``element``, ``scale_dtype``, ``group`` (its spelling),
        ``bits_per_param``, ``parts`` (role -> key), ``facts``."""
        return {"layout": self.layout, "element": self.element,
                "scale_dtype": self.scale_dtype, "group": self.group.spelling,
                "bits_per_param": self.bits_per_param,
                "parts": {role: part.key for role, part in self.parts.items()},
                "facts": dict(self.facts), "problems": list(self.problems)}


def _itemsize(dtype: str) -> float:
    from fmtcli.inputs.storage import itemsize

    return itemsize(dtype)


@dataclass(frozen=True)
class RawChunk:
    """Rows ``r0:r1`` of a quantized tensor's matrix view as stored, for a pass that reads
    codes, not floats (``numerics/_native.c`` ``code_stats``).

    - ``codes``: uint8 (rows, cols) one code a byte, or (rows, cols / 2) two FP4 codes a
      byte (``packing`` 1: the low nibble first, 2: the high one; 0: a byte each);
    - ``table``: float64, each code's element value (16 or 256 entries; NaN codes NaN);
    - ``grid``: float64, the dequantization multiplier of each scale tile of the chunk
      (one row per tile row it covers, one column per tile column);
    - ``mul``, ``div``: one factor of the whole chunk each (NVFP4's second level).

    Element ``x = float32(((table[code] * grid[tile]) * mul) / div)``, each step in float64:
    the reader's own decoding, which ``rows_reader`` gives as floats."""

    codes: np.ndarray
    packing: int
    table: np.ndarray
    grid: np.ndarray
    mul: float = 1.0
    div: float = 1.0


@dataclass(frozen=True)
class Checkpoint:
    """What a reader sees: the tensors of one input (file or folder) by key, in order, and
    the folder's ``config.json`` ``quantization_config`` (None where there is none)."""

    tensors: Mapping[str, TensorSource]
    config: dict | None = None

    def get(self, key: str) -> TensorSource | None:
        return self.tensors.get(key)


def part(checkpoint: Checkpoint, key: str, owner: str) -> TensorSource:
    """A stored part a reader needs; a missing or unreadable one is a DataError naming the
    tensor it belongs to."""
    found = checkpoint.get(key)
    if found is None or found.opener is None:
        raise DataError(f"{shown(owner)}: its {shown(key)} is missing or unreadable")
    return found


def refuse_rows(r0: int, r1: int) -> np.ndarray:
    """The ``rows_reader`` of a tensor too broken to read (``Quantized.read`` refuses with
    its first problem before this is reached)."""
    raise DataError("unreadable quantized tensor")


#: A config file larger than this is no config (a hint is never worth reading 16 MiB).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def json_object(folder: str | None, name: str) -> dict | None:
    """``folder/name`` as a JSON object (a dict), or None where the folder, the file, valid
    JSON or an object is missing, the file is over ``MAX_CONFIG_BYTES``, or its JSON nests
    deeper than ``textparse.MAX_JSON_DEPTH`` (a config is a hint, never a reason to fail;
    and a 900-deep one that json parses would overflow the stack of every writer after it,
    fmt audit's ``--json`` and ``--layout``'s config.json among them).  The one reader of
    a checkpoint's config files: ``config.json``, ModelOpt's ``hf_quant_config.json``."""
    if not folder:
        return None
    path = os.path.join(folder, name)
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_CONFIG_BYTES:
            return None
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        check_json_depth(text, name)
        found = json.loads(text)
    except (OSError, ValueError, RecursionError, DataError):
        return None
    return found if isinstance(found, dict) else None


def values_of(source: TensorSource) -> np.ndarray:
    """A (small) part's values as float32 or float64 (scales, global scales): decoded
    exactly from its storage type (float8 and bfloat16 included)."""
    from fmtcli.inputs.storage import as_values

    arr = np.asarray(as_values(source.stored()))
    if arr.dtype == np.float64:
        return arr
    return arr.astype(np.float32)


#: The float32 value of every E8M0 scale byte, by code (OCP MX v1.0: ``2^(b - 127)``, 255 is
#: NaN; b = 0 is 2^-127, a float32 subnormal: exact): the format registry's
#: ``float8_e8m0fnu`` decoded (``numerics.codes.all_values``), not a second definition.
E8M0_VALUES = all_values(get_format("float8_e8m0fnu")).astype(np.float32)


def e8m0_values(codes: np.ndarray) -> np.ndarray:
    """The float32 values of E8M0 scale bytes (``E8M0_VALUES``: ``2^(b - 127)``; 255 is
    NaN), the codes' shape."""
    return E8M0_VALUES[np.asarray(codes, dtype=np.uint8)]


#: The 16 values of FP4 E2M1 (OCP MX v1.0: +-0, 0.5, 1, 1.5, 2, 3, 4, 6), by 4-bit code
#: (bit 3 is the sign): the registry's ``float4_e2m1fn`` decoded, as float32.
FP4_VALUES = all_values(get_format("float4_e2m1fn")).astype(np.float32)


#: FP4_VALUES and every one-byte float's values by code, as float64 (``RawChunk.table``)
FP4_TABLE = FP4_VALUES.astype(np.float64)


def byte_table(element: str) -> np.ndarray:
    """The float64 value of each of the 256 codes of a one-byte float format by fmt's name
    (``float8_e4m3fn``: 0x7f and 0xff NaN), from the registry."""
    return all_values(get_format(element)).astype(np.float64)


#: (order, byte) -> the byte's two FP4 values in order: [0] low nibble first, [1] high
_FP4_PAIRS = np.stack([
    np.stack([FP4_VALUES[np.arange(256) & 0x0F], FP4_VALUES[np.arange(256) >> 4]], axis=-1),
    np.stack([FP4_VALUES[np.arange(256) >> 4], FP4_VALUES[np.arange(256) & 0x0F]], axis=-1)])


def unpack_fp4(packed: np.ndarray, low_first: bool = True) -> np.ndarray:
    """FP4 E2M1 values of packed bytes, two per byte, the last axis doubled: ``low_first``
    (compressed-tensors, ModelOpt, gpt-oss) puts the low nibble first."""
    packed = np.asarray(packed, dtype=np.uint8)
    pairs = _FP4_PAIRS[0 if low_first else 1]  # one gather of both values of each byte
    return pairs[packed].reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def block_scales(grid: np.ndarray, rows: np.ndarray, height: int, tile: tuple[int, int],
                 cols: int) -> np.ndarray:
    """The scale of every element of some rows of a blocked tensor's matrix view.

    The tensor is ``lead x height x cols`` (its matrix view ``prod(lead) * height`` x
    ``cols``); ``grid`` holds one scale per ``tile`` (rows, columns) of each of its
    ``height x cols`` matrices: shape ``lead + (ceil(height / tile[0]), ceil(cols /
    tile[1]))`` (the edges padded, as DeepSeek-V3 and compressed-tensors pad them).
    ``rows`` are matrix-view row indices; the result is (len(rows), cols)."""
    picked = tile_rows(grid, rows, height, tile[0])  # the scale row of each row
    # a tile wider than the matrix covers it whole: repeat no further than its columns
    # (a config's or a file's [1, 2^40] tile would otherwise ask for 2^40 copies)
    return np.repeat(picked, max(1, min(tile[1], cols)), axis=1)[:, :cols]


def check_grid(grid_shape: tuple[int, ...], shape: tuple[int, ...], tile: tuple[int, int],
               owner: str, what: str) -> None:
    """A DataError unless ``grid_shape`` is one scale per ``tile`` of ``shape``'s last two
    axes (edges padded), leading axes equal."""
    lead, (height, cols) = tuple(shape[:-2]), tuple(shape[-2:])
    want = lead + (-(-height // tile[0]), -(-cols // tile[1]))
    if tuple(grid_shape) != want:
        raise DataError(f"{shown(owner)}: {what} has shape {list(grid_shape)}, not "
                        f"{list(want)} (one per {tile[0]}x{tile[1]} tile of "
                        f"{list(shape)})")
