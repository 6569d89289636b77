"""Per-block facts of a scheme: how its scales spread, and which blocks flush or clip.

Tensor-wide figures hide the few blocks that hurt (Transformer Engine users ask for these
per-block views: TransformerEngine issue 2801).  For every scheme whose blocks fit in a chunk
(blocks, tiles, rows) each chunk reports, per block, how many nonzero values flushed to zero
and whether any saturated; the parent merges them exactly, in any order:

- ``scale_log2_histogram``: floor(log2(scale)) of every finite positive scale -> how many
  blocks use it (exact: E8M0 scales are powers of two, float32/float64 scales are binned by
  their exponent);
- the blocks that flush at least one value and that saturate at least one value;
- quantiles of the per-block flushed fraction (flushed / values in the block), from a
  histogram of its float32 top 16 bits, as the relative-error quantiles are: to within
  +0.78%, exact at 0;
- with ``worst`` > 0, the worst blocks: most values flushed, then the largest relative error,
  then the first in the tensor.

Scale direction as everywhere: ``x_q = cast(x * scale) / scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

EXP_LOW = -1100  # floor(log2) of float64 scales lies in -1074 .. 1023
EXP_BINS = 2 * 1100 + 1
FRACTION_SHIFT = 16  # the fraction histogram keeps the top 16 bits of the float32 fraction
FRACTION_FIRST_KEY = 0x3000  # 2**-32 and below share the first nonzero bin
FRACTION_BINS = (0x3F800000 >> FRACTION_SHIFT) - FRACTION_FIRST_KEY + 2  # [0] = fraction 0
FRACTION_RESOLUTION = 2.0 ** -(23 - FRACTION_SHIFT)  # relative width of a bin: 0.78%
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
WORST_FIELDS = ("flushed", "max_rel_error", "row", "column", "amax", "scale", "size")


def exponent_counts(scales: np.ndarray) -> np.ndarray:
    """How many of the finite positive ``scales`` have each floor(log2): an array of
    ``EXP_BINS`` counts, index ``e - EXP_LOW``."""
    s = np.asarray(scales, dtype=np.float64).reshape(-1)
    s = s[np.isfinite(s) & (s > 0)]
    if not s.size:
        return np.zeros(EXP_BINS, np.int64)
    exponent = np.frexp(s)[1].astype(np.int64) - 1  # s = m * 2**e, 0.5 <= m < 1
    return np.bincount(exponent - EXP_LOW, minlength=EXP_BINS).astype(np.int64)


def log2_histogram(counts: np.ndarray) -> dict[int, int]:
    """``exponent_counts`` as a map from exponent to count (nonzero entries, ascending)."""
    return {int(i) + EXP_LOW: int(counts[i]) for i in np.flatnonzero(counts)}


def fraction_counts(flushed: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """A histogram (``FRACTION_BINS``) of the per-block flushed fractions flushed / size.

    Called per chunk: few of its blocks flush a value, so bin 0 counts the others and only
    the blocks that flush are binned."""
    flushed, sizes = np.asarray(flushed), np.asarray(sizes)
    if flushed.shape != sizes.shape:
        flushed, sizes = np.broadcast_arrays(flushed, sizes)
    flushed, sizes = flushed.reshape(-1), sizes.reshape(-1)
    some = np.flatnonzero(flushed)
    counts = np.zeros(FRACTION_BINS, np.int64)
    counts[0] = flushed.size - some.size
    if some.size:
        fraction = (flushed[some] / sizes[some]).astype(np.float32)
        keys = (fraction.view(np.uint32) >> np.uint32(FRACTION_SHIFT)).astype(np.int64)
        keys = np.where(fraction > 0, np.maximum(keys - FRACTION_FIRST_KEY, 0) + 1, 0)
        found = np.bincount(keys)
        counts[:found.size] += found
    return counts


def fraction_of_key(index: int) -> float:
    """The lower edge of a fraction bin (0 for bin 0)."""
    if index == 0:
        return 0.0
    key = index - 1 + FRACTION_FIRST_KEY
    return float(np.uint32(key << FRACTION_SHIFT).view(np.float32))


def block_sizes(rows: int, cols: int, tr: int, tc: int) -> np.ndarray:
    """Values in each (tr x tc) block of a rows x cols chunk; ragged edges are smaller."""
    r = np.full(-(-rows // tr), tr, np.int64)
    c = np.full(-(-cols // tc), tc, np.int64)
    r[-1] = rows - (r.size - 1) * tr
    c[-1] = cols - (c.size - 1) * tc
    return np.outer(r, c)


@dataclass
class BlockAccumulator:
    """Mergeable per-block facts of one scheme over chunks, tensors, groups."""

    blocks: int = 0
    flushing: int = 0  # blocks with at least one value flushed to zero
    saturating: int = 0  # blocks with at least one value clipped to the format's max
    fractions: np.ndarray = field(default_factory=lambda: np.zeros(FRACTION_BINS, np.int64))

    PACKED = ("blocks", "flushing", "saturating")

    def add(self, flushed: np.ndarray, sizes: np.ndarray, saturating: int) -> None:
        """One chunk: per-block flushed counts and sizes (same shape), and how many of its
        blocks saturate."""
        self.blocks += flushed.size
        self.flushing += int(np.count_nonzero(flushed))
        self.saturating += saturating
        self.fractions += fraction_counts(flushed, sizes)

    def merge(self, other: BlockAccumulator) -> None:
        self.blocks += other.blocks
        self.flushing += other.flushing
        self.saturating += other.saturating
        self.fractions += other.fractions

    def stats(self) -> BlockStats:
        return BlockStats(self.blocks, self.flushing, self.saturating,
                          tuple((name, self.quantile(q)) for name, q in QUANTILES))

    def quantile(self, q: float) -> float:
        """The q-quantile of the per-block flushed fraction (lower edge of its bin)."""
        if not self.blocks:
            return math.nan
        rank = max(1, math.ceil(q * self.blocks))
        return fraction_of_key(int(np.searchsorted(np.cumsum(self.fractions), rank)))


@dataclass(frozen=True)
class BlockStats:
    """The per-block facts of a scheme on a tensor, a group or the total."""

    count: int  # blocks
    flushing: int
    saturating: int
    flushed_fraction_quantiles: tuple[tuple[str, float], ...]  # (p50, p90, p99, max)

    @property
    def flushing_fraction(self) -> float:
        """Blocks with a value flushed to zero, over all blocks."""
        return self.flushing / self.count if self.count else 0.0

    @property
    def saturating_fraction(self) -> float:
        """Blocks with a value clipped to max, over all blocks."""
        return self.saturating / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {"count": self.count, "flushing": self.flushing,
                "flushing_fraction": self.flushing_fraction, "saturating": self.saturating,
                "saturating_fraction": self.saturating_fraction,
                "flushed_fraction_quantiles": dict(self.flushed_fraction_quantiles),
                "flushed_fraction_resolution": FRACTION_RESOLUTION}


@dataclass(frozen=True)
class WorstBlock:
    """One of the worst blocks of a scheme: where it is and what it did.  ``row`` and
    ``column`` index the block grid of the tensor's matrix view (``stream.matrix_shape``)."""

    scheme: str  # the scheme's label
    tensor: str  # the tensor's name
    row: int
    column: int
    amax: float
    scale: float
    size: int  # values in the block
    flushed: int
    max_rel_error: float

    def to_dict(self) -> dict:
        return {"scheme": self.scheme, "tensor": self.tensor, "block": [self.row, self.column],
                "amax": self.amax, "scale": self.scale, "size": self.size,
                "flushed": self.flushed, "max_rel_error": self.max_rel_error}


def chunk_worst(flushed: np.ndarray, max_rel: np.ndarray, amax: np.ndarray,
                scale: np.ndarray, sizes: np.ndarray, first_row: int, first_col: int,
                k: int) -> np.ndarray:
    """The k worst blocks of a chunk as rows of ``WORST_FIELDS`` (float64), worst first;
    ``first_row``/``first_col``: the block coordinates of the chunk's first block."""
    rows, cols = np.indices(flushed.shape)
    rel = np.where(np.isnan(max_rel), -np.inf, max_rel)
    # lexsort: last key is primary; ties keep the block order (first in the tensor)
    order = np.lexsort((cols.reshape(-1), rows.reshape(-1), -rel.reshape(-1),
                        -flushed.reshape(-1)))[:k]
    out = np.full((k, len(WORST_FIELDS)), np.nan)
    take = [a.reshape(-1)[order] for a in (flushed, max_rel, rows + first_row,
                                          cols + first_col, amax, scale, sizes)]
    out[:order.size] = np.stack(take, axis=1)
    return out
