"""What ``fmt audit`` measures in one streamed pass over a quantized tensor.

Two sets of figures, read chunk by chunk (whole scale groups per chunk, never the whole
tensor at once):

- ``ValueStats``: the dequantized values (``Quantized.read``, float32): count, amax (of
  the finite values), rms, the share of exact zeros, and how many are NaN or +-inf.
- ``CodeStats``: the element values before any scale (``Quantized.elements_reader``:
  FP8/FP4 codes decoded, integers as stored), counted per scale group (``Quantized.group``,
  the tile of the matrix view one scale covers):

  * a group *clips* when at least ``clip_count(n)`` = max(5, ceil(n / 256)) of its ``n``
    elements sit at the format's largest magnitude (``|code| >= max``), more than twice
    as many as at the next magnitude down (E4M3: 448 against 416, FP4: 6 against
    4), and its smallest nonzero code is below half the max: the scale was too small and
    the tail piled up at the top code.  Under an amax-derived scale one element (the
    amax) reaches the top code, a few more by rounding, fewer than one code down (whose
    interval is wider); a group bunched near its amax (a LayerNorm weight of ~1.0 under
    one scale: every code in the top binade) says nothing either way and is not counted.
    Measured on Gaussian, Student-t(3) and t(1.5) weights (``scripts/audit_thresholds.py``):
    healthy non-MX layouts clip in at most 10% of groups (NVFP4 on uniform weights, torch's
    Linear init), half-size dequantization scales in most (docs/audit.md's table);
  * a group *uses only the lowest codes* when its largest |code| is at most half the
    format's max (integers: at most (max + 1) / 2), i.e. the top binade is never used: the
    scale was too large (double scales put every group there; amax and MX rules never
    do).  Under power-of-two scales floored towards the max (fmt's ``pow2-floor``,
    DeepSeek's UE8M0) a healthy group's largest code may round to half the max exactly,
    so there only a largest code *below* half counts (MX's rule floors to the amax's
    binade, [4, 8) for FP4, [256, 512) for E4M3: never half);
  * a group is *all zero* when every code is zero.

Where a scale group spans a whole matrix (per-tensor, per-column scales, or a tile taller
than the matrix) the counts are merged across chunks; otherwise every chunk holds whole
groups.  Stacked matrices (E x O x I) are blocked matrix by matrix, as the readers block
them (``layouts.base.block_scales``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.base.choices import CHUNK_ELEMENTS
from fmtcli.numerics.tiles import tile_amax, tile_view

#: the share of a group's elements at the top code above which it clips, and the least count
CLIP_SHARE = 1 / 256
CLIP_LEAST = 5
#: a clipping group holds more top codes than this times the codes one magnitude down
PILE_UP = 2.0
#: the numbers of ``Pass.state``
STATE = 11


def clip_count(n: int) -> int:
    """The count of top codes from which a group of ``n`` elements clips."""
    return max(CLIP_LEAST, math.ceil(n * CLIP_SHARE))


def element_top(element: str) -> tuple[float, float] | None:
    """The two largest magnitudes of an element format by fmt's name: (max, the next
    one down) -- ``float8_e4m3fn`` (448, 416), ``float4_e2m1fn`` (6, 4), ``int4`` (7, 6),
    ``uint8`` (255, 254); None where unknown."""
    digits = element.removeprefix("u").removeprefix("int")
    if element.startswith(("int", "uint")) and digits.isdigit():
        bits = int(digits)
        top = float(2 ** bits - 1 if element.startswith("u") else 2 ** (bits - 1) - 1)
        return top, top - 1
    from fmtcli.base.errors import FmtError
    from fmtcli.numerics.formats import resolve_format

    try:
        spec = resolve_format(element)[0]
    except FmtError:
        return None
    top = float(spec.max)
    return top, top - math.ldexp(1.0, math.frexp(top)[1] - 1 - spec.mantissa_bits)


def element_max(element: str) -> float | None:
    """The largest magnitude of an element format (``element_top``'s first)."""
    found = element_top(element)
    return found[0] if found else None


def low_limit(element: str, top: float) -> float:
    """The largest |code| of a group that uses only the lowest codes."""
    return (top + 1) / 2 if element.startswith(("int", "uint")) else top / 2


@dataclass(frozen=True)
class ValueStats:
    """The dequantized values: ``count``, ``amax`` (largest finite |x|), ``rms`` (over
    the finite values), ``zeros`` and ``nonfinite`` counts."""

    count: int
    amax: float
    rms: float
    zeros: int
    nonfinite: int

    @property
    def zero_share(self) -> float:
        return self.zeros / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {"count": self.count, "amax": self.amax, "rms": self.rms,
                "zeros": self.zeros, "zero_share": self.zero_share,
                "nonfinite": self.nonfinite}

    @staticmethod
    def merged(parts: list[ValueStats]) -> ValueStats:
        """Several tensors' values as one (a role, the total): sums of squares merged."""
        count = sum(p.count for p in parts)
        finite = sum(p.count - p.nonfinite for p in parts)
        squares = sum(p.rms ** 2 * (p.count - p.nonfinite) for p in parts)
        return ValueStats(count, max((p.amax for p in parts), default=0.0),
                          math.sqrt(squares / finite) if finite else 0.0,
                          sum(p.zeros for p in parts), sum(p.nonfinite for p in parts))


@dataclass(frozen=True)
class CodeStats:
    """The element codes per scale group: ``groups`` counted, ``clipping`` (groups with
    at least ``clip_count`` top codes), ``lowest`` (nonzero groups whose codes stay in the
    lowest half of the range), ``zero_groups`` (every code zero), ``at_max`` (elements at
    the top code), ``top`` (the format's max) and ``elements``."""

    groups: int
    clipping: int
    lowest: int
    zero_groups: int
    at_max: int
    elements: int
    top: float

    @property
    def nonzero_groups(self) -> int:
        return self.groups - self.zero_groups

    def to_dict(self) -> dict:
        return {"groups": self.groups, "clipping_groups": self.clipping,
                "lowest_code_groups": self.lowest, "zero_groups": self.zero_groups,
                "elements_at_max": self.at_max, "elements": self.elements,
                "element_max": self.top}


def _group_counts(codes: np.ndarray, tile: tuple[int, int], top: float, below: float,
                  whole: bool = True):
    """(amax, at_max, at_below, nonzero, size, far) per tile of one chunk of codes: 2-D
    arrays (``at_below``: elements at the next magnitude down from the top; ``far``:
    2 top - the smallest nonzero |code|, 0 for an all-zero tile, so that it merges by
    max).  ``whole``: the tiles are whole groups, so ``at_below`` and ``far`` (needed only
    where a group has ``clip_count`` top codes) are left zero where none has."""
    tr, tc = tile
    mag = np.abs(codes)
    mag[~np.isfinite(mag)] = 0  # a NaN code (E4M3's 0x7f) counts as neither

    def count(mask: np.ndarray) -> np.ndarray:
        return tile_view(mask, tr, tc).sum(axis=(-3, -1), dtype=np.int64)

    rows, cols = codes.shape
    r_sizes = np.minimum(tr, rows - np.arange(0, rows, tr))
    c_sizes = np.minimum(tc, cols - np.arange(0, cols, tc))
    size = np.outer(r_sizes, c_sizes)
    at_max = count(mag >= top)
    if whole and not np.any(at_max >= np.maximum(CLIP_LEAST, np.ceil(size * CLIP_SHARE))):
        zeros = np.zeros_like(at_max)
        return tile_amax(mag, tr, tc), at_max, zeros, count(mag != 0), size, zeros
    far = tile_view(np.where(mag > 0, np.float32(2 * top) - mag, 0), tr, tc).max(
        axis=(-3, -1))
    return (tile_amax(mag, tr, tc), at_max, count(mag == below), count(mag != 0), size,
            far)


def stored_counts(raw, rows: int, cols: int, tile: tuple[int, int], top: float,
                  below: float, low: float = math.nan):
    """The compiled kernel's figures of one ``RawChunk`` (``numerics/_native.c``
    ``code_stats``): (tiles (7, tile rows, tile columns): amax, at_max, at_below,
    nonzero, size, far, at_low; values (5,): count, zeros, nonfinite, amax, sum of
    squares), or None where the kernel is absent or leaves the chunk to numpy."""
    from fmtcli.numerics import native

    kernel = native.module()
    shape = (-(-rows // tile[0]), -(-cols // tile[1]))
    grid = np.ascontiguousarray(raw.grid, dtype=np.float64)
    if kernel is None or grid.shape != shape or (raw.packing and (cols % 2 or tile[1] % 2)):
        return None
    tiles, vals = np.empty((7,) + shape), np.empty(5)
    if not kernel.code_stats(np.ascontiguousarray(raw.codes, dtype=np.uint8),
                             np.ascontiguousarray(raw.table, dtype=np.float64), grid,
                             (rows, cols, tile[0], tile[1], raw.packing),
                             (raw.mul, raw.div, top, below, low), tiles, vals):
        return None
    return tiles, vals


class Pass:
    """One tensor's streamed pass: ``add(r0, r1)`` per chunk, then ``values()`` and
    ``codes()``."""

    def __init__(self, q, top: tuple[float, float] | None, low: float | None,
                 strict_low: bool = False) -> None:
        self.q, self.low, self.strict_low = q, low, strict_low
        self.top, self.below = top if top is not None else (None, None)
        self.rows, self.cols = q.matrix
        self.height = _height(q.shape, self.rows)
        self.tile = q.group.tile_shape(self.height, self.cols, len(q.shape))
        self.count = self.zeros = self.nonfinite = 0
        self.amax, self.squares = 0.0, 0.0
        self.totals = np.zeros(4, dtype=np.int64)  # groups, clipping, lowest, zero
        self.at_max = self.elements = 0
        self.spanning = self.tile[0] >= self.height  # one group row per matrix
        self.open: list[np.ndarray] | None = None  # amax, at_max, at_below, nonzero, size

    def chunks(self, chunk_elements: int = CHUNK_ELEMENTS):
        """(r0, r1) row ranges: whole group rows, never across two stacked matrices."""
        tr = 1 if self.spanning else self.tile[0]
        step = max(tr, (max(1, chunk_elements // max(1, self.cols)) // tr) * tr)
        for m0 in range(0, self.rows, self.height):
            m1 = min(self.rows, m0 + self.height)
            for r0 in range(m0, m1, step):
                yield r0, min(m1, r0 + step), m1

    def add(self, r0: int, r1: int, matrix_end: int) -> None:
        if self._add_stored(r0, r1, r1 == matrix_end):
            return
        x = self.q.read(slice(r0, r1), slice(0, self.cols)).ravel()
        self.count += x.size
        self.zeros += int(np.count_nonzero(x == 0))
        values = x
        if x.size and not (math.isfinite(float(x.max())) and math.isfinite(float(x.min()))):
            values = x[np.isfinite(x)]  # rare: NaN or inf among them
            self.nonfinite += x.size - values.size
        if values.size:
            self.amax = max(self.amax, float(values.max()), -float(values.min()))
            wide = values.astype(np.float64)
            # einsum, not np.dot: OpenBLAS's threaded ddot spins its threads, 20-70 ns an
            # element on a busy 2-core machine (benchmarks/RESULTS.md, bench_audit) vs ~2
            self.squares += float(np.einsum("i,i->", wide, wide))
        if self.top is not None and self.q.elements_reader is not None:
            self._codes(self.q.elements_reader(r0, r1), r1 == matrix_end)

    def _add_stored(self, r0: int, r1: int, last: bool) -> bool:
        """``add`` by the compiled kernel from the stored codes (``Quantized.raw_reader``:
        ``numerics/_native.c`` ``code_stats``, one pass, the same figures); False where
        the layout, the kernel or the chunk's shape leaves it to the numpy passes."""
        if self.q.raw_reader is None or r1 <= r0 or not self.cols:
            return False
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            raw = self.q.raw_reader(r0, r1)
        if raw is None:
            return False
        rows = r1 - r0
        tile = (rows if self.spanning else self.tile[0], self.tile[1])
        top, below = (self.top, self.below) if self.top is not None else (math.inf, math.inf)
        found = stored_counts(raw, rows, self.cols, tile, top, below)
        if found is None:
            return False
        tiles, vals = found
        count = int(vals[0])
        self.count += count
        self.zeros += int(vals[1])
        self.nonfinite += int(vals[2])
        if count > int(vals[2]):
            self.amax = max(self.amax, float(vals[3]))
        self.squares += float(vals[4])
        if self.top is not None and self.q.elements_reader is not None:
            self.elements += count
            self._counted([tiles[0].astype(np.float32), *tiles[1:5].astype(np.int64),
                           tiles[5].astype(np.float32)], last)
        return True

    def _codes(self, codes: np.ndarray, last: bool) -> None:
        codes = np.asarray(codes, dtype=np.float32).reshape(-1, self.cols)
        self.elements += codes.size
        tile = (codes.shape[0] if self.spanning else self.tile[0], self.tile[1])
        self._counted(_group_counts(codes, tile, self.top, self.below, not self.spanning),
                      last)

    def _counted(self, counts, last: bool) -> None:
        """One chunk's per-tile (amax, at_max, at_below, nonzero, size, far): closed, or
        merged into a group that spans the matrix."""
        if not self.spanning:
            self._close(*(c.ravel() for c in counts))
            return
        if self.open is None:
            self.open = [c[0].astype(np.float32 if i in (0, 5) else np.int64)
                         for i, c in enumerate(counts)]
        else:
            for i, (merged, c) in enumerate(zip(self.open, counts)):
                if i in (0, 5):
                    np.maximum(merged, c[0], out=merged)
                else:
                    merged += c[0]
        if last:
            self._close(*self.open)
            self.open = None

    def _close(self, amax, at_max, at_below, nonzero, size, far) -> None:
        zero = nonzero == 0
        clip_at = np.maximum(CLIP_LEAST, np.ceil(size * CLIP_SHARE))
        spread = far > 1.5 * self.top  # its smallest nonzero code below half the top
        clips = (at_max >= clip_at) & (at_max > PILE_UP * at_below) & spread
        low = amax < self.low if self.strict_low else amax <= self.low
        self.totals += [amax.size, int(np.count_nonzero(clips)),
                        int(np.count_nonzero(~zero & low)), int(np.count_nonzero(zero))]
        self.at_max += int(at_max.sum())

    def state(self) -> list[float]:
        """What ``add`` accumulated, as numbers (a worker's row; ``merge`` adds one)."""
        return [self.count, self.zeros, self.nonfinite, self.amax, self.squares,
                *self.totals.tolist(), self.at_max, self.elements]

    def merge(self, row) -> None:
        """Add another pass's ``state`` over other whole groups (in chunk order)."""
        count, zeros, nonfinite, amax, squares, *totals, at_max, elements = row
        self.count += int(count)
        self.zeros += int(zeros)
        self.nonfinite += int(nonfinite)
        self.amax = max(self.amax, float(amax))
        self.squares += float(squares)
        self.totals += np.asarray(totals, dtype=np.int64)
        self.at_max += int(at_max)
        self.elements += int(elements)

    def values(self) -> ValueStats:
        finite = self.count - self.nonfinite
        return ValueStats(self.count, self.amax,
                          math.sqrt(self.squares / finite) if finite else 0.0,
                          self.zeros, self.nonfinite)

    def codes(self) -> CodeStats | None:
        if self.top is None or self.q.elements_reader is None:
            return None
        groups, clipping, lowest, zero = (int(n) for n in self.totals)
        return CodeStats(groups, clipping, lowest, zero, self.at_max, self.elements,
                         self.top)


def _height(shape: tuple[int, ...], rows: int) -> int:
    """The rows of one matrix of the view: a stacked tensor's (E x O x I: O), else all."""
    if len(shape) >= 3 and rows == math.prod(shape[:-1]) and shape[-2] > 0:
        return int(shape[-2])
    return max(1, rows)


def new_pass(q, power_of_two: bool = False) -> Pass:
    """An empty pass over ``q`` (``measure``'s ``power_of_two``); asymmetric integers
    (a zero point) have no code counts."""
    top = None if "zero_point" in q.parts else element_top(q.element)
    return Pass(q, top, low_limit(q.element, top[0]) if top is not None else None,
                power_of_two)


def measure(q, chunk_elements: int = CHUNK_ELEMENTS, power_of_two: bool = False,
            workers: int = 1) -> tuple[ValueStats, CodeStats | None]:
    """One streamed pass over ``q``: its dequantized statistics and its code counts.
    ``power_of_two``: the scales are powers of two floored towards the max (not MX's
    binade rule), so a healthy group's largest code may be half the max exactly and only
    one below it uses the lowest codes.  ``workers``: forked processes reading its chunks
    (whole groups each; merged in chunk order, so the figures do not depend on them; a
    tensor-spanning group is read in one process)."""
    from fmtcli.streaming.stream import keep_freed_memory

    keep_freed_memory()  # chunk buffers reused, not page-faulted in afresh (as quantize)

    def fresh() -> Pass:
        return new_pass(q, power_of_two)
    run = fresh()
    chunks = list(run.chunks(chunk_elements))
    if workers > 1 and not run.spanning and len(chunks) > 1:
        from fmtcli.streaming import parallel

        rows = parallel.shared_array((len(chunks), STATE), np.float64)

        def task(item: int, worker: int) -> int:
            one = fresh()
            one.add(*chunks[item])
            rows[item] = one.state()
            return 1
        parallel.run_tasks(task, len(chunks), workers)
        for row in rows:  # in chunk order: the same sums as one process
            run.merge(row)
    else:
        for r0, r1, end in chunks:
            run.add(r0, r1, end)
    return run.values(), run.codes()
