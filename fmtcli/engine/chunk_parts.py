"""The pieces of a chunk's work: its plan, tile amax, scales, and what its blocks did.

Direction: ``x_q = cast(x * scale) / scale``.  A ``Plan`` is one scheme applied to one
tensor (its tile; scales first where a tile spans the tensor's rows); ``chunk_amax`` and
``tile_percentile`` give a chunk's per-tile figures, ``scales_for`` their scales (float32,
float64 under the exact product; NVFP4's two levels), ``nvfp4_tensor_scale`` NVFP4's
per-tensor one; ``BlockFacts`` is what a chunk's blocks did.  ``chunk.ChunkKernel`` uses
them all; ``first_pass`` the amax and scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.numerics import native
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import (
    F32_MAX,
    F32_TINY,
    NVFP4_SCALE_FORMAT,
    Product,
    ScaleRule,
    amax_to_scale,
    scale_to_e4m3,
)
from fmtcli.numerics.schemes import ScaleFormat, Scheme
from fmtcli.numerics.tiles import tile_amax
from fmtcli.streaming.stream import widen


@dataclass
class Plan:
    """One scheme applied to one tensor: its tile and, if global, its precomputed scales."""

    scheme: Scheme
    tile: tuple[int, int]
    is_global: bool  # its tiles span every row (or the whole single row): scales come first
    needs_tensor_amax: bool = False  # NVFP4's two-level scales need the tensor's amax first
    scales: np.ndarray | None = None  # global schemes: (1, n_tile_columns)
    tensor_scale: float | None = None  # NVFP4's float32 per-tensor scale


@dataclass
class BlockFacts:
    """What one chunk's blocks did (schemes whose blocks fit in a chunk): per block, values
    flushed to zero and values in it; how many blocks saturated a value; with worst blocks
    asked for, each block's largest relative error (NaN where it has no nonzero value)."""

    flushed: np.ndarray  # (block rows, block columns) of the chunk
    sizes: np.ndarray
    saturating: int
    amax: np.ndarray
    scale: np.ndarray
    max_rel: np.ndarray | None = None


def chunk_amax(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """``numerics.tiles.tile_amax`` as float32 (float64 data: float64), by the compiled
    kernel for a contiguous float32, bfloat16 or float16 chunk where it is built (one pass,
    no padded or widened copy), else by numpy."""
    kernel = native.module()
    if kernel is None or native.kind_of(x.dtype) is None or not x.flags.c_contiguous:
        return tile_amax(x if x.dtype.itemsize > 2 else widen(x, np.float32), tr, tc)
    rows, cols = x.shape
    out = np.empty((-(-rows // tr), -(-cols // tc)), np.float32)
    buffer, kind = native.values(x)
    kernel.tile_amax(buffer, rows, cols, tr, tc, out, kind)
    return out


def widened(x: np.ndarray, shared: dict) -> np.ndarray:
    """A chunk read as stored (bfloat16, float16: ``ChunkReader.read(as_stored=True)``) as
    float32, widened once per chunk and kept in ``shared`` for the chunk's other schemes;
    float32 and float64 chunks as they are."""
    if x.dtype.itemsize > 2:
        return x
    if "widened" not in shared:
        shared["widened"] = widen(x, np.float32)
    return shared["widened"]


def tile_percentile(x: np.ndarray, tr: int, tc: int, q: float) -> np.ndarray:
    """The q-th percentile (in percent, linear interpolation) of |x| in every (tr x tc) tile
    of an unpadded chunk; a ragged edge tile counts only its own elements, and a tile
    holding NaN gets NaN (as its amax would)."""
    rows, cols = x.shape
    pr, pc = (-rows) % tr, (-cols) % tc
    a = np.abs(x)
    if pr or pc:
        a = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    grid = a.reshape(a.shape[0] // tr, tr, a.shape[1] // tc, tc).transpose(0, 2, 1, 3)
    flat = grid.reshape(grid.shape[0], grid.shape[1], tr * tc)
    if pr or pc:
        result = np.nanpercentile(flat, q, axis=2)
        result[np.isnan(tile_amax(x, tr, tc))] = np.nan  # NaN of the data, not the padding
    else:
        result = np.percentile(flat, q, axis=2)
    return result.astype(x.dtype)


def scales_for(amax: np.ndarray, plan: Plan) -> np.ndarray:
    """Scales for tile amaxes under the plan's scheme (x_q = cast(x*scale)/scale): float32,
    float64 under the exact product (``scaling.amax_to_scale``); NVFP4's are float32 always
    (its scale format is pinned: E4M3 times float32)."""
    scheme = plan.scheme
    if scheme.scale_format is ScaleFormat.E4M3_FP32:
        # NVFP4: decode scale per block d = e4m3(amax / max_elem * g), g the tensor scale;
        # the element is cast(x * g / d).  d may be an E4M3 subnormal or 0, as Transformer
        # Engine computes it (torchao clamps d up to 2**-6, E4M3's smallest normal; blocks far
        # below the tensor's amax then differ).  A block whose d underflows to 0 decodes to 0.
        # Its scale g / 0 is inf; the kernel writes its x_q as 0.
        g = np.float32(plan.tensor_scale)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            decode = scale_to_e4m3(amax.astype(np.float32) / np.float32(scheme.format.max) * g)
            scale = g / decode
        return np.where(amax == 0, np.float32(1), scale).astype(np.float32)
    kernel = native.module()
    if (kernel is not None and scheme.scale_rule is ScaleRule.AMAX
            and scheme.product is Product.FLOAT32 and amax.dtype == np.float32
            and scheme.format.max <= F32_MAX and amax.flags.c_contiguous):
        out = np.empty(amax.shape, np.float32)  # the same rule in one compiled loop
        kernel.amax_scales(amax, out, amax.size, np.float32(scheme.format.max),
                           2.0 ** -scheme.margin)
        return out
    return amax_to_scale(amax, scheme.format, scheme.scale_rule, scheme.margin, scheme.product)


def nvfp4_tensor_scale(amax: float, scheme: Scheme) -> float:
    """NVFP4's per-tensor float32 scale: amax maps to max_elem * max_e4m3 (6 * 448: the
    largest value a block can hold, its largest E4M3 block scale times FP4's max), kept in
    float32's normal range (beyond it, under the exact product, the largest values saturate
    rather than the scale becoming 0 or inf)."""
    if not (amax > 0) or not math.isfinite(amax):
        return 1.0
    block_scale_max = get_format(NVFP4_SCALE_FORMAT).max  # 448
    return float(np.float32(min(max(scheme.format.max * block_scale_max / amax, F32_TINY),
                                F32_MAX)))
