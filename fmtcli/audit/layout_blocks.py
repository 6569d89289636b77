"""Per-block figures of a quantized tensor for ``fmt audit``'s layout checks: each scale
block's largest |element| (the *top code*), how many of its elements sit at the element
format's largest magnitude, and its decoded scale; and a sample of dequantized rows.

Blocks follow the tensor's own ``Quantized.group``: ``block N`` runs along the rows of the
matrix view (MX: 32, NVFP4: 16), ``tile R x C`` covers R rows x C columns of each stacked
matrix (DeepSeek-V3: 128 x 128), as ``layouts.base.block_scales`` blocks them.  A tensor
larger than ``budget`` elements is sampled: whole blocks (whole rows, or whole tile rows)
spread evenly over the tensor, so the figures are shares over a sample of blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The largest magnitude of each element format the checks know (OCP MX v1.0; IEEE-like
#: float8 from their definitions).
ELEMENT_MAX = {"float4_e2m1fn": 6.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
#: element -> (the code next below the max, the lower edge of the max's rounding interval,
#: the width of the next code's interval, a code near half the max, its interval's width):
#: what ``mx-scale-rule``'s pile-up and flatness figures count
PILE_CODES = {"float4_e2m1fn": (4.0, 5.0, 1.5, 2.0, 0.75),
              "float8_e4m3fn": (416.0, 432.0, 32.0, 208.0, 16.0)}

BUDGET = 1 << 21  # elements read per check at most (whole blocks)


@dataclass(frozen=True)
class Blocks:
    """One entry per (sampled) block: ``top`` (largest |element|), ``at_max`` (elements
    at +-the format's max), ``size`` (elements) and ``scale`` (decoded, the layout's own
    direction); ``sampled``: whether only part of the tensor was read."""

    top: np.ndarray
    at_max: np.ndarray
    size: np.ndarray
    scale: np.ndarray
    sampled: bool
    at_next: int = 0   # elements at the code next below the max (PILE_CODES), all blocks
    at_low: int = 0    # elements at the code near half the max (PILE_CODES), all blocks


def _height(q) -> int:
    rows = q.matrix[0]
    return int(q.shape[-2]) if len(q.shape) >= 3 and q.shape[-2] else rows


def _spread(count: int, wanted: int) -> np.ndarray:
    """``wanted`` indices of ``range(count)``, evenly spread (all when count <= wanted)."""
    if count <= wanted:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, max(1, wanted)).round().astype(np.int64))


def block_figures(q, budget: int = BUDGET) -> Blocks | None:
    """The per-block figures of ``q`` (None where its group is neither a block along the
    rows nor a tile, or a reader is missing)."""
    if q.elements_reader is None or q.scales_reader is None or q.element not in ELEMENT_MAX:
        return None
    kind = q.group.kind.value
    if kind == "block" and q.group.axis == -1:
        return _row_blocks(q, int(q.group.block), budget)
    if kind == "tile":
        return _tile_blocks(q, q.group.tile, budget)
    return None


def _row_blocks(q, length: int, budget: int) -> Blocks | None:
    rows, cols = q.matrix
    n_blocks = -(-cols // length)
    grid = np.asarray(q.scales_reader(), dtype=np.float64)
    if grid.size % max(1, rows) or grid.size // max(1, rows) < n_blocks:
        return None  # not one scale per block of each row: a problem the readers report
    grid = grid.reshape(rows, -1)[:, :n_blocks]
    per_chunk = max(1, min(rows, (1 << 16) // max(1, cols)))
    starts = np.arange(0, rows, per_chunk)
    picked = _spread(len(starts), max(1, budget // (per_chunk * max(1, cols))))
    emax = ELEMENT_MAX[q.element]
    parts = []
    for r0 in starts[picked]:
        r1 = min(rows, int(r0) + per_chunk)
        counted = _stored(q, int(r0), r1, (1, length))
        if counted is not None:
            top, at_max, size, pile = counted
            parts.append((top, at_max, size, grid[r0:r1].ravel(), pile))
            continue
        codes = np.abs(np.asarray(q.elements_reader(int(r0), r1), dtype=np.float64))
        padded = np.zeros((r1 - r0, n_blocks * length))
        padded[:, :cols] = codes
        blocks = padded.reshape(r1 - r0, n_blocks, length)
        sizes = np.full(n_blocks, length)
        sizes[-1] = cols - (n_blocks - 1) * length
        parts.append((blocks.max(axis=2).ravel(), (blocks >= emax).sum(axis=2).ravel(),
                      np.tile(sizes, r1 - r0), grid[r0:r1].ravel(), _pile(q, codes)))
    return _joined(parts, len(picked) < len(starts))


def _tile_blocks(q, tile: tuple[int, int], budget: int) -> Blocks | None:
    rows, cols = q.matrix
    height = _height(q)
    per_matrix = -(-height // tile[0])
    n_cols = -(-cols // tile[1])
    strips = (rows // height) * per_matrix
    grid = np.asarray(q.scales_reader(), dtype=np.float64)
    if grid.size != strips * n_cols:
        return None  # not one scale per tile: a problem the readers report
    grid = grid.reshape(-1, n_cols)
    picked = _spread(strips, max(1, budget // (tile[0] * max(1, cols))))
    emax = ELEMENT_MAX[q.element]
    parts = []
    for strip in picked:
        matrix, k = divmod(int(strip), per_matrix)
        r0 = matrix * height + k * tile[0]
        r1 = min(r0 + tile[0], (matrix + 1) * height)
        counted = _stored(q, r0, r1, (r1 - r0, tile[1]))
        if counted is not None:
            top, at_max, size, pile = counted
            parts.append((top, at_max, size, grid[strip], pile))
            continue
        codes = np.abs(np.asarray(q.elements_reader(r0, r1), dtype=np.float64))
        padded = np.zeros((r1 - r0, n_cols * tile[1]))
        padded[:, :cols] = codes
        blocks = padded.reshape(r1 - r0, n_cols, tile[1])
        widths = np.full(n_cols, tile[1])
        widths[-1] = cols - (n_cols - 1) * tile[1]
        parts.append((blocks.max(axis=(0, 2)), (blocks >= emax).sum(axis=(0, 2)),
                      widths * (r1 - r0), grid[strip], _pile(q, codes)))
    return _joined(parts, len(picked) < strips)


def _stored(q, r0: int, r1: int, tile: tuple[int, int]):
    """(top, at_max, size, pile) of rows ``r0:r1``'s blocks from the stored codes by the
    compiled kernel (``stats.stored_counts``), the figures the float reading gives; None
    where there is no raw reader or kernel, or a NaN code (whose block's top is NaN in the
    float reading) is among them."""
    if q.raw_reader is None:
        return None
    from fmtcli.audit.stats import stored_counts

    raw = q.raw_reader(r0, r1)
    if raw is None or (not raw.packing and np.isnan(raw.table)[raw.codes].any()):
        return None
    following, _, _, low, _ = PILE_CODES.get(q.element, (np.nan,) * 5)
    found = stored_counts(raw, r1 - r0, q.matrix[1], tile, ELEMENT_MAX[q.element],
                          following, low)
    if found is None:
        return None
    tiles = found[0]
    pile = (int(tiles[2].sum()), int(tiles[6].sum())) if q.element in PILE_CODES else (0, 0)
    return (tiles[0].ravel(), tiles[1].ravel().astype(np.int64),
            tiles[4].ravel().astype(np.int64), pile)


def _pile(q, codes: np.ndarray) -> tuple[int, int]:
    """How many of ``codes`` (magnitudes) sit at the next code below the max and at the
    code near half the max (PILE_CODES; (0, 0) for other elements)."""
    if q.element not in PILE_CODES:
        return 0, 0
    following, _, _, low, _ = PILE_CODES[q.element]
    return int(np.count_nonzero(codes == following)), int(np.count_nonzero(codes == low))


def _joined(parts, sampled: bool) -> Blocks:
    if not parts:
        empty = np.zeros(0)
        return Blocks(empty, empty, empty, empty, sampled)
    top, at_max, size, scale = (np.concatenate(column) for column in list(zip(*parts))[:4])
    at_next = sum(part[4][0] for part in parts)
    at_low = sum(part[4][1] for part in parts)
    return Blocks(top, at_max, size, scale, sampled, at_next, at_low)


def sample_rows(q, budget: int = BUDGET) -> np.ndarray:
    """Dequantized rows of ``q``'s matrix view (float64, whole rows), at most about
    ``budget`` elements, spread evenly over the tensor."""
    rows, cols = q.matrix
    per_chunk = max(1, min(rows, (1 << 16) // max(1, cols)))
    starts = np.arange(0, rows, per_chunk)
    picked = _spread(len(starts), max(1, budget // (per_chunk * max(1, cols))))
    chunks = [np.asarray(q.rows_reader(int(r0), min(rows, int(r0) + per_chunk)),
                         dtype=np.float64) for r0 in starts[picked]]
    return np.concatenate(chunks) if chunks else np.zeros((0, cols))


def power_of_two_share(scales: np.ndarray) -> float:
    """The share of positive finite ``scales`` that are not exact powers of two."""
    values = np.asarray(scales, dtype=np.float64).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if not values.size:
        return 0.0
    mantissa, _ = np.frexp(values)
    return float(np.count_nonzero(mantissa != 0.5)) / values.size


def share(count: int | float, total: int | float) -> float:
    return float(count) / total if total else 0.0


def log2_octave(lo: float, hi: float) -> float:
    """The share of one octave that ``[lo, hi)`` spans (log-uniform values)."""
    return math.log2(hi / lo)
