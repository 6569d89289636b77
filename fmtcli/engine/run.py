"""The quantize engine: ``x_q = cast(x * scale) / scale`` over whole tensors, in chunks.

``quantize`` runs every usable tensor under every scheme and totals them; ``quantize_tensor``
does one tensor.  For each, ``cuda.route`` says where each scheme runs; the rest is the CPU
stream loop here: the tensor is read in chunks (``stream``), ``chunk.ChunkKernel`` does the
arithmetic of each chunk and scheme, and ``metrics.ErrorAccumulator`` keeps the statistics.
Tiles that span more rows than a chunk holds (per-tensor, per-column) and NVFP4's tensor
scale need the amax first: a first pass reads the tensor for that alone.

Chunks run on forked worker processes (``parallel``) that write every chunk's statistics
into shared memory; the parent merges them in chunk order, so results depend neither on
the number of workers nor on their timing.  Histograms (integers) merge exactly in any order.
``--out`` is written by ``writers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fmtcli.base.choices import Granularity
from fmtcli.base.errors import UsageError, shown
from fmtcli.engine.chunk import ChunkKernel, Plan, chunk_amax, nvfp4_tensor_scale, scales_for
from fmtcli.engine.cuda import quantize_on_gpu, route
from fmtcli.engine.results import (
    GroupResult,
    QuantizeResult,
    ScaleSummary,
    SchemeRun,
    SchemeStats,
    TensorResult,
    TensorSqnr,
    top_blocks,
)
from fmtcli.engine.writers import NpyWriter, codes_of, output_names, write_codes
from fmtcli.inputs.tensors import TensorSource, numpy_dtype
from fmtcli.numerics import native
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.scaling import Product, ScaleRule
from fmtcli.numerics.schemes import ScaleFormat, Scheme, for_tensor
from fmtcli.streaming.blocks import (
    EXP_BINS,
    FRACTION_BINS,
    WORST_FIELDS,
    BlockAccumulator,
    WorstBlock,
    chunk_worst,
    exponent_counts,
    fraction_counts,
)
from fmtcli.streaming.metrics import FINITE_BINS, HIST_BINS, HIST_SHIFT, ErrorAccumulator
from fmtcli.streaming.parallel import default_workers, run_tasks, shared_array, work_array
from fmtcli.streaming.roles import counted_in_total, is_buffer, roles_in_order
from fmtcli.streaming.stream import (
    CHUNK_ELEMENTS,
    ChunkReader,
    chunk_slices,
    keep_freed_memory,
    matrix_shape,
    note_short_rows,
    tile_of,
    view_shape,
)

Progress = Callable[[int, int], None]


def plan_schemes(source: TensorSource, schemes: list[Scheme]) -> list[Plan]:
    """Each scheme as applied to this tensor: its tile and whether it needs a first pass."""
    rows, cols = matrix_shape(source.shape)
    plans = []
    for scheme in schemes:
        scheme = for_tensor(scheme, source.key, len(view_shape(source.shape)))
        tile = tile_of(scheme, source.shape)
        spans = (tile[0] >= rows and rows > 1) or (rows == 1 and tile[1] >= cols)
        plan = Plan(scheme, tile, spans or scheme.fixed_scale is not None,
                    needs_tensor_amax=scheme.scale_format is ScaleFormat.E4M3_FP32)
        if scheme.fixed_scale is not None:
            plan.scales = np.full((1, 1), scheme.fixed_scale, dtype=np.float32)
        elif plan.is_global and scheme.scale_rule is ScaleRule.PERCENTILE and tile[1] < cols:
            raise UsageError("percentile clipping needs one scale per tensor, or blocks/tiles "
                             "that fit in a chunk (not per column)")
        plans.append(plan)
    return plans


def _first_pass(reader: ChunkReader, chunks, plans: list[Plan], workers: int,
                progress: Callable[[int], None] | None) -> None:
    """amax of the tiles that span all rows (or the whole row), and NVFP4's tensor amax;
    sets each such plan's scales or tensor scale (``first_pass_partials``, then
    ``apply_first_pass``)."""
    apply_first_pass(plans, *first_pass_partials(reader, chunks, plans, workers, progress))


def first_pass_partials(reader: ChunkReader, chunks, plans: list[Plan], workers: int,
                        progress: Callable[[int], None] | None = None):
    """The first pass over ``chunks`` (all of a tensor's, or some of them: a Dask task's
    share, ``distributed``): one running maximum per tile column and worker, and for
    percentile rules one histogram of |x| per worker.  Returns (maxima per first-pass plan:
    arrays of workers x tile columns, histograms: workers x ``HIST_BINS`` or None); maxima
    of several calls stack along their first axis and histograms add up, exactly
    (memory: workers x columns, whatever the tensor's length)."""
    cols = reader.cols
    targets = [p for p in plans if needs_first_pass(p)]
    widths = [-(-cols // p.tile[1]) if p.is_global else 1 for p in targets]
    workers = worker_count(workers, chunks)
    forks = workers > 1
    partial = [work_array((workers, w), reader.dtype, forks) for w in widths]  # float64 stays
    percentile = [p for p in targets if p.scheme.scale_rule is ScaleRule.PERCENTILE]
    hists = work_array((workers, HIST_BINS), np.int64, forks) if percentile else None

    def task(index: int, worker: int) -> int:
        rs, cs = chunks[index]
        x = reader.read(rs, cs, as_stored=not percentile)  # amax alone: 16-bit as stored
        if percentile:  # one histogram of |x| serves every per-tensor percentile scheme
            with np.errstate(over="ignore"):  # float64 beyond float32: the inf bin
                keys = np.right_shift(np.abs(x).astype(np.float32).view(np.uint32),
                                      HIST_SHIFT)
            hists[worker] += np.bincount(keys.reshape(-1), minlength=HIST_BINS)
        found: dict[int, np.ndarray] = {}  # by tile width: schemes that differ only in
        for target, out in zip(targets, partial):  # their rule share one amax
            # a global tile spans the chunk's rows, and either its columns (per-column,
            # custom tiles) or the whole chunk (per-tensor; a long row's per-row; NVFP4)
            tc = target.tile[1] if target.is_global and out.shape[1] > 1 else x.shape[1]
            if tc not in found:
                found[tc] = chunk_amax(x, x.shape[0], tc).reshape(-1)
            np.maximum(out[worker], found[tc], out=out[worker])  # NaN propagates
        return x.size

    run_tasks(task, len(chunks), workers, progress)
    return partial, hists


def apply_first_pass(plans: list[Plan], partial: list[np.ndarray],
                     hists: np.ndarray | None) -> None:
    """Set the scales (or NVFP4's tensor scale) of the plans that need a first pass, from
    ``first_pass_partials``' maxima and histograms (of all the tensor's chunks)."""
    targets = [p for p in plans if needs_first_pass(p)]
    for p, out in zip(targets, partial):
        amax = out.max(axis=0, keepdims=True)
        if p.needs_tensor_amax:
            p.tensor_scale = nvfp4_tensor_scale(float(amax.max()), p.scheme)
        if p.is_global and p.scheme.scale_rule is ScaleRule.PERCENTILE:
            clip = histogram_percentile(hists.sum(axis=0), p.scheme.percentile)
            if not np.isfinite(amax).all():  # NaN/inf poison the statistic, as amax
                clip = float(amax[0, 0])
            p.scales = scales_for(np.array([[clip]], dtype=np.float32), p)
        elif p.is_global:
            p.scales = scales_for(amax, p)


# Forking a worker costs about a millisecond and its exit and the wait for it more: below
# this many values a tensor is done sooner in this process (measured: a 44-tensor
# checkpoint of 3.5M values, 0.32 s with a fork for every tensor of 3 chunks or more).
PARALLEL_ELEMENTS = 1 << 21


#: What a scheme's pass over a value costs against the first pass's (a read and a max), for
#: the progress bar's rate: measured 5-12x on 200 MB of float32 (a per-tensor scheme 4.7x,
#: NVFP4 12x; 2 cores), so that the bar does not race through the first pass and then slow.
SCHEME_PASS_COST = 6


def worker_count(workers: int, chunks: list) -> int:
    """How many processes share a tensor's chunks: one for a small tensor, else up to
    ``workers`` (one chunk each at least)."""
    elements = sum((rs.stop - rs.start) * (cs.stop - cs.start) for rs, cs in chunks)
    if elements < PARALLEL_ELEMENTS:
        return 1
    return max(1, min(workers, len(chunks)))


def one_block(plan: Plan, rows: int, cols: int) -> bool:
    """Whether a block, tile or row scheme covers the whole tensor with one scale (its
    per-block facts are then those of the tensor)."""
    return (plan.scheme.granularity in (Granularity.BLOCK, Granularity.TILE, Granularity.ROW)
            and -(-rows // plan.tile[0]) * -(-cols // plan.tile[1]) == 1)


def needs_first_pass(plan: Plan) -> bool:
    """Whether a plan's scales (or NVFP4's tensor scale) need the whole tensor first."""
    return (plan.is_global and plan.scales is None) or plan.needs_tensor_amax


def histogram_percentile(counts: np.ndarray, q: float) -> float:
    """The q-th percentile (percent) of |x| from a histogram of its float32 top 16 bits: the
    upper edge of the bin holding it (within 2**-7 relative; NaN bins ignored).  A percentile
    in the lowest bin, which holds the zeros (and float32 values below ~9.2e-41), is 0: the
    block then has nothing to scale and gets scale 1, as an amax of 0 does (the bin's upper
    edge would give a scale of ~3.4e38 for a tensor of zeros)."""
    finite = counts[:FINITE_BINS]
    total = int(finite.sum())
    if total == 0:
        return 0.0
    from fractions import Fraction  # here: 2 ms of every run's start-up otherwise

    rank = max(1, math.ceil(Fraction(repr(q)) * total / 100))  # exact: 99.9% of 4000 is 3996
    index = int(np.searchsorted(np.cumsum(finite), rank))
    if index == 0:
        return 0.0
    return float(np.uint32((index + 1) << HIST_SHIFT).view(np.float32))


def quantize_tensor(source: TensorSource, schemes: list[Scheme], *, seed: int = 0,
                    chunk_elements: int = CHUNK_ELEMENTS, workers: int | None = None,
                    progress: Progress | None = None, keep: int | None = None,
                    keep_mode: str = "values", sink: Callable | None = None,
                    backend: Backend | str = Backend.NUMPY, device: Device | str = Device.CPU,
                    product: Product | str | None = None, worst: int = 0,
                    mse_only: bool = False):
    """Quantize one tensor under every scheme.

    Returns a list of ``results.SchemeRun`` (the scheme as applied, its accumulator, scale
    summary, per-block facts and, with ``worst`` > 0, its ``worst`` worst blocks) and, with
    ``keep`` (a scheme index), that scheme's scale grid (tiles of the matrix view) and tile
    shape.  ``mse_only``: each run's accumulator holds only what ``mse()`` needs (for
    searches that rank many scales by MSE; the CPU path, numpy backend).  The
    kept scheme's output per chunk goes to ``sink(row_slice, col_slice, array)``, called in
    the worker processes: the sink must write to shared memory (a memory-mapped file or a
    ``parallel.shared_array``).  ``product``: the width of ``x * scale`` for every scheme
    (``scaling.Product``; None keeps each scheme's own, float32 by default).
    """
    workers = default_workers() if workers is None else workers
    schemes = with_product(schemes, product)
    casts, fast = route(source, schemes, backend, device, writes_output=keep is not None)
    if all(fast):
        return quantize_on_gpu(source, schemes, progress), None
    rest = [i for i, f in enumerate(fast) if not f]
    if any(casts[i][0] is not Backend.NUMPY for i in rest):
        workers = 1  # torch's thread pools and CUDA do not survive a fork
    reader = ChunkReader(source)
    try:
        results, kept = _quantize_tensor(reader, source, [schemes[i] for i in rest], seed,
                                         chunk_elements, workers, progress,
                                         None if keep is None else rest.index(keep),
                                         keep_mode, sink, [casts[i] for i in rest], worst,
                                         mse_only)
    finally:
        reader.close()
    if len(rest) == len(schemes):
        return results, kept
    # the schemes the fused kernel takes, merged back in order
    merged = dict(zip(rest, results))
    chosen = [i for i, f in enumerate(fast) if f]
    merged.update(zip(chosen, quantize_on_gpu(source, [schemes[i] for i in chosen], None)))
    return [merged[i] for i in range(len(schemes))], kept


def with_product(schemes: list[Scheme], product: Product | str | None) -> list[Scheme]:
    """The schemes with their product width set (None: unchanged)."""
    if product is None:
        return list(schemes)
    product = Product(product)
    return [s if s.product is product else replace(s, product=product) for s in schemes]


def _quantize_tensor(reader, source, schemes, seed, chunk_elements, workers, progress, keep,
                     keep_mode, sink, casts, worst, mse_only):
    rows, cols = matrix_shape(source.shape)
    plans = plan_schemes(source, schemes)
    chunks = chunk_slices(rows, cols, plans, chunk_elements)
    first = any(needs_first_pass(p) for p in plans)
    weight = SCHEME_PASS_COST * len(plans)  # progress: a value's share of the work, in units
    total = rows * cols * (weight + (1 if first else 0))
    offset = 0
    if first:
        _first_pass(reader, chunks, plans, workers,
                    (lambda done: progress(done, total)) if progress else None)
        offset = rows * cols
    kernels = [ChunkKernel(p, seed, b, d, source.name, worst, mse_only)
               for p, (b, d) in zip(plans, casts)]
    n_workers = worker_count(workers, chunks)
    work = ChunkPass(plans, kernels, rows, cols, chunks, n_workers, worst, mse_only)
    run_tasks(lambda index, worker: work.task(reader, index, worker, keep, keep_mode, sink),
              len(chunks), n_workers,
              (lambda done: progress(offset + done * weight, total)) if progress else None)
    results = work.runs()
    kept = None
    if keep is not None:
        grid = plans[keep].scales if plans[keep].is_global else work.grids[keep]
        kept = (np.array(grid), plans[keep].tile)
    return results, kept


class ChunkPass:
    """The chunk pass of one tensor: every chunk's statistics under every plan, and their
    merge into one ``SchemeRun`` per plan.

    Sums are kept per chunk and merged in chunk order (so results depend neither on the
    number of workers nor on their timing); integer histograms per worker (they add up
    exactly in any order); scales in a grid per plan (tiles of the matrix view).  The
    engine runs ``task`` on forked workers writing into shared arrays; a Dask task
    (``distributed``) runs it for some of the chunks in one process, sends back ``part``,
    and the client's pass (``grids=False``) takes each in with ``absorb``."""

    def __init__(self, plans: list[Plan], kernels: list[ChunkKernel], rows: int, cols: int,
                 chunks: list, n_workers: int, worst: int, mse_only: bool,
                 grids: bool = True) -> None:
        self.plans, self.kernels, self.chunks = plans, kernels, chunks
        self.rows, self.cols, self.worst, self.mse_only = rows, cols, worst, mse_only
        forks = n_workers > 1
        packed = len(ErrorAccumulator.PACKED)
        self.records = work_array((len(chunks), len(plans), packed), np.float64, forks)
        # mse_only: no histogram (an accumulator whose chunk falls back to the full
        # statistics makes its own, unused: mse() reads the sums alone)
        self.hists = (None if mse_only else
                      work_array((n_workers, len(plans), HIST_BINS), np.int64, forks))
        # per-block facts: scalars per chunk, the flushed-fraction histogram per worker, and
        # the worst blocks of each chunk (merged in chunk order, like everything else)
        self.block_records = work_array((len(chunks), len(plans),
                                         len(BlockAccumulator.PACKED)), np.int64, forks)
        self.fractions = work_array((n_workers, len(plans), FRACTION_BINS), np.int64, forks)
        # the block holding the tensor's amax (per worker: the largest block amax it met,
        # the first in the tensor among equals): (amax, block row, block column, nonzero)
        # and the histogram of its relative errors, for the median outside it
        self.top = work_array((n_workers, len(plans), 4), np.float64, forks)
        self.top[..., 0] = -1.0  # no block yet (an amax is >= 0; NaN never wins)
        self.top_hists = (None if mse_only else
                          work_array((n_workers, len(plans), HIST_BINS), np.int64, forks))
        # a chunk cannot hold more blocks than values: the rows kept per chunk are bounded
        # by its size, whatever --worst-blocks asks for
        self.per_chunk = min(worst, max((-(-(rs.stop - rs.start) // p.tile[0]))
                                        * (-(-(cs.stop - cs.start) // p.tile[1]))
                                        for p in plans for rs, cs in chunks))
        self.worst_rows = work_array((len(chunks), len(plans), self.per_chunk,
                                      len(WORST_FIELDS)), np.float64, forks) if worst else None
        self.long_row = rows == 1 and len(chunks) > 1
        self.grids = [None if p.is_global or not grids else
                      work_array((-(-rows // p.tile[0]), -(-cols // p.tile[1])),
                                 np.float64 if p.scheme.product is Product.EXACT
                                 else np.float32, forks)
                      for p in plans]
        # with grids=False: each plan's scale summary and exponent counts, as absorbed
        self.scale_parts = [(ScaleSummary(), np.zeros(EXP_BINS, np.int64)) for _ in plans]
        # bfloat16/float16 chunks as stored where a scheme runs the compiled kernel (no
        # widened copy; the others widen the chunk once, kept in ``shared``)
        self.as_stored = any(k.native is not None for k in kernels)

    def task(self, reader: ChunkReader, index: int, worker: int, keep: int | None = None,
             keep_mode: str = "values", sink: Callable | None = None) -> int:
        """Read chunk ``index`` and run every plan's kernel on it; returns its size."""
        rs, cs = self.chunks[index]
        x = reader.read(rs, cs, as_stored=self.as_stored)
        shared: dict = {}
        for i, kernel in enumerate(self.kernels):
            acc, scales, kept, facts = kernel.run(
                x, (rs.start, cs.start, self.cols),
                None if self.hists is None else self.hists[worker, i],
                keep_mode if keep == i else None, shared)
            acc.pack(self.records[index, i])
            first_row, first_col = (0, 0)
            if scales is not None:
                tr, tc = self.plans[i].tile
                first_row, first_col = ((0, cs.start // tc) if self.long_row
                                        else (rs.start // tr, 0))
                self.grids[i][first_row:first_row + scales.shape[0],
                              first_col:first_col + scales.shape[1]] = scales
            if facts is not None:
                self.block_records[index, i] = (facts.flushed.size,
                                                np.count_nonzero(facts.flushed),
                                                facts.saturating)
                self.fractions[worker, i] += fraction_counts(facts.flushed, facts.sizes)
                if self.worst:
                    self.worst_rows[index, i] = chunk_worst(
                        facts.flushed, facts.max_rel, facts.amax, facts.scale, facts.sizes,
                        first_row, first_col, self.per_chunk)
                self._take_top(x, rs, cs, i, worker, kernel, facts.amax, first_row, first_col)
            if kept is not None and sink is not None:
                sink(rs, cs, kept)
        return x.size

    def _take_top(self, x, rs, cs, i, worker, kernel, amax, first_row, first_col) -> None:
        """Keep the chunk's block of the largest amax (the first among equals) where it
        beats the worker's: its place, and its relative errors' histogram from the same
        kernel run on that block alone (chunk results do not depend on the chunking)."""
        if self.top_hists is None or not amax.size:
            return
        ranked = np.where(np.isnan(amax), -1.0, amax.astype(np.float64))
        r, c = np.unravel_index(int(np.argmax(ranked)), amax.shape)  # first of the largest
        found = (float(ranked[r, c]), first_row + r, first_col + c)
        if not better(found, tuple(self.top[worker, i, :3])):
            return
        tr, tc = self.plans[i].tile
        block = np.ascontiguousarray(x[r * tr:(r + 1) * tr, c * tc:(c + 1) * tc])
        hist = np.zeros(HIST_BINS, np.int64)
        acc, _, _, _ = kernel.run(block, (rs.start + r * tr, cs.start + c * tc, self.cols),
                                  hist, None, {})
        self.top[worker, i] = (*found, acc.nonzero)
        self.top_hists[worker, i] = hist

    def top_block(self, i: int) -> tuple[np.ndarray, int] | None:
        """Plan ``i``'s block holding the tensor's amax: (its histogram, its nonzero
        count), or None where no block was seen."""
        if self.top_hists is None:
            return None
        best = None
        for w in range(len(self.top)):
            if self.top[w, i, 0] >= 0 and (best is None or better(
                    tuple(self.top[w, i, :3]), tuple(self.top[best, i, :3]))):
                best = w
        if best is None:
            return None
        return self.top_hists[best, i], int(self.top[best, i, 3])

    def grid_rows(self, i: int, first: int, stop: int) -> np.ndarray:
        """The part of plan ``i``'s scale grid that chunks ``first`` .. ``stop - 1`` wrote
        (chunks are aligned to every local tile: no tile is shared by two chunks)."""
        tr, tc = self.plans[i].tile
        (r0, c0), (r1, c1) = self.chunks[first], self.chunks[stop - 1]
        if self.long_row:
            return self.grids[i][:, c0.start // tc:-(-c1.stop // tc)]
        return self.grids[i][r0.start // tr:-(-r1.stop // tr)]

    def part(self, first: int, stop: int) -> dict:
        """What chunks ``first`` .. ``stop - 1`` (run by ``task`` with worker 0 in this
        process) found: per-chunk records, the histograms, and per plan the summary and
        exponent counts of the scales they used; small (no values, no scale grids)."""
        part = {"first": first, "stop": stop, "records": self.records[first:stop],
                "block_records": self.block_records[first:stop],
                "fractions": self.fractions[0],
                "hists": None if self.hists is None else self.hists[0],
                "worst_rows": None if self.worst_rows is None else self.worst_rows[first:stop],
                "top": self.top[0].copy(),
                "top_hists": None if self.top_hists is None else [
                    (np.flatnonzero(h), h[np.flatnonzero(h)]) for h in self.top_hists[0]],
                "scales": []}
        for i, plan in enumerate(self.plans):
            if plan.is_global or self.mse_only:
                part["scales"].append(None)
                continue
            grid = self.grid_rows(i, first, stop)
            summary = ScaleSummary()
            summary.add(grid)
            part["scales"].append((summary, exponent_counts(grid)))
        return part

    def absorb(self, part: dict) -> None:
        """Take in another process's ``part`` (``grids=False``, one worker's arrays)."""
        first, stop = part["first"], part["stop"]
        self.records[first:stop] = part["records"]
        self.block_records[first:stop] = part["block_records"]
        self.fractions[0] += part["fractions"]
        if self.hists is not None:
            self.hists[0] += part["hists"]
        if self.worst_rows is not None:
            self.worst_rows[first:stop] = part["worst_rows"]
        if self.top_hists is not None:
            for i, (keys, counts) in enumerate(part["top_hists"]):
                if part["top"][i, 0] >= 0 and better(tuple(part["top"][i, :3]),
                                                     tuple(self.top[0, i, :3])):
                    self.top[0, i] = part["top"][i]
                    self.top_hists[0, i] = 0
                    self.top_hists[0, i, keys] = counts
        for (summary, exponents), found in zip(self.scale_parts, part["scales"]):
            if found is not None:
                summary.merge(found[0])
                exponents += found[1]

    def runs(self) -> list[SchemeRun]:
        """One ``SchemeRun`` per plan: the chunks' records merged in chunk order."""
        rows, cols, chunks = self.rows, self.cols, self.chunks
        hists, results = self.hists, []
        for i, plan in enumerate(self.plans):
            acc = ErrorAccumulator(hist=None if hists is None else
                                   hists[0, i].copy() if len(hists) == 1
                                   else hists[:, i].sum(axis=0))
            for index in range(len(chunks)):
                acc.merge(ErrorAccumulator.unpack(self.records[index, i]), hist=False)
            if self.mse_only:  # the squared errors are all a search asks of this run
                results.append(SchemeRun(plan.scheme, acc, ScaleSummary()))
                continue
            grid = plan.scales if plan.is_global else self.grids[i]
            if grid is not None:
                summary = ScaleSummary()
                summary.add(grid)
                exponents = exponent_counts(grid)
            else:
                summary, exponents = self.scale_parts[i]
            run = SchemeRun(plan.scheme, acc, summary, exponents)
            if plan.is_global and one_block(plan, rows, cols):
                # a block scheme on a tensor that fits in one block (a short bias): that block
                run.blocks = BlockAccumulator(1, int(acc.flushed > 0), int(acc.saturated > 0),
                                              fraction_counts(np.array([acc.flushed]),
                                                              np.array([max(acc.count, 1)])))
                run.amax_blocks = [(np.flatnonzero(acc.hist), acc.hist[acc.hist > 0])]
                run.amax_block_nonzero = acc.nonzero
            elif not plan.is_global:
                top = self.top_block(i)
                if top is not None:
                    keys = np.flatnonzero(top[0])
                    run.amax_blocks, run.amax_block_nonzero = [(keys, top[0][keys])], top[1]
                else:  # no block at all (no values): nothing to leave out
                    run.amax_blocks = []
            if not plan.is_global:
                run.blocks = BlockAccumulator(*(int(v) for v in
                                                self.block_records[:, i].sum(axis=0)),
                                              fractions=self.fractions[:, i].sum(axis=0))
                if self.worst:
                    found = self.worst_rows[:, i].reshape(-1, len(WORST_FIELDS))
                    run.worst = top_blocks(np.concatenate([found, np.zeros((len(found), 1))],
                                                          axis=1), self.worst)
            results.append(run)
        return results


def better(a: tuple, b: tuple) -> bool:
    """Whether block ``a`` = (amax, row, column) outranks ``b`` as the block holding a
    tensor's amax: a larger amax, or the same amax earlier in the tensor."""
    return a[0] > b[0] or (a[0] == b[0] and (a[1], a[2]) < (b[1], b[2]))


def quantize_totals(sources: list[TensorSource], schemes: list[Scheme],
                    include_buffers: bool = False, **options) -> list[SchemeStats]:
    """Each scheme's statistics over all the usable tensors: what ``quantize`` reports as
    its ``total`` (or, for one tensor, that tensor's), merged in the same order, without the
    per-tensor and per-group results that a search of many candidates does not read;
    buffers (``roles.is_buffer``) left out as ``quantize`` leaves them out of its total.
    ``options``: those of ``quantize_tensor``."""
    keep_freed_memory()
    usable = [s for s in sources if s.skipped is None]
    usable = [usable[i] for i in counted_in_total([name_of(s) for s in usable],
                                                  include_buffers)]
    native.note_if_absent(sum(s.size * numpy_dtype(s.dtype).itemsize for s in usable))
    totals = [SchemeRun.empty(s) for s in schemes]
    for source in usable:
        runs, _ = quantize_tensor(source, schemes, **options)
        if len(usable) == 1:
            return [run.stats() for run in runs]
        for total, run in zip(totals, runs):
            total.merge(run)
    return [run.stats() for run in totals]


def name_of(source: TensorSource) -> str:
    """The name roles and the buffer rule read: the key, else the source's name."""
    return source.name if source.key is None else source.key


def quantize(sources: list[TensorSource], schemes: list[Scheme], *, seed: int = 0,
             chunk_elements: int = CHUNK_ELEMENTS, workers: int | None = None,
             progress: Progress | None = None, on_tensor: Callable[[str], None] | None = None,
             out: str | None = None, out_scheme: int = -1,
             backend: Backend | str = Backend.NUMPY, device: Device | str = Device.CPU,
             product: Product | str | None = None, worst_blocks: int = 0,
             run_tensor: Callable | None = None,
             include_buffers: bool = False) -> QuantizeResult:
    """Quantize every usable tensor under every scheme; totals and groups by role.

    ``progress(done, total)`` counts bytes of the tensors' data (as stored) over all tensors;
    ``on_tensor(name)`` is called as each tensor starts.  ``out``: a path checked beforehand
    with ``writers.check_target``; the scheme ``out_scheme`` of ``schemes`` is written there
    (``.npy``: dequantized values of the single tensor; ``.npz``/``.safetensors``: codes and
    scales of every tensor).  ``backend``/``device``: whose cast stores the scaled values
    (``backends``; torch runs in this process, one chunk at a time).  ``product``: the
    width of ``x * scale`` (``scaling.Product``: float32 by default for every data type,
    or exact); None keeps each scheme's own.  ``worst_blocks``: how many of each scheme's
    worst blocks to report (0: none).  ``run_tensor``: what runs each tensor, called as
    ``quantize_tensor`` is (the default); ``distributed`` passes one that collects the
    tensor's runs from a Dask cluster.

    With several tensors the result has a total per scheme; ``groups`` merges the tensors
    whose names differ only in layer indices (``roles``), exactly, in checkpoint order.
    The total leaves out non-weight buffers (``roles.is_buffer``: BatchNorm's running
    statistics, ...) unless ``include_buffers`` (or every tensor is one); each total also
    carries the mean of its tensors' SQNR (``results.TensorSqnr``).
    """
    keep_freed_memory()
    schemes = with_product(schemes, product)
    usable = [s for s in sources if s.skipped is None]
    sizes = [s.size * numpy_dtype(s.dtype).itemsize for s in usable]  # bytes as stored
    grand_total = sum(sizes)
    native.note_if_absent(grand_total)
    keep = None if out is None else range(len(schemes))[out_scheme]
    to_npy = out is not None and out.lower().endswith(".npy")
    if to_npy and len(usable) != 1:
        raise UsageError(f"out={shown(out)}: a .npy holds one tensor and there are "
                         f"{len(usable)}",
                         "write .npz or .safetensors")
    if worst_blocks < 0:
        raise UsageError(f"worst_blocks={worst_blocks}: must be >= 0")
    note_short_rows(usable, schemes)
    tensors, coded = [], []
    out_names = dict(zip(map(id, usable), output_names(usable)))  # --out's member names
    totals = [SchemeRun.empty(s) for s in schemes]
    names = [name_of(s) for s in usable]
    counted = set(counted_in_total(names, include_buffers))
    buffers_in_total = any(is_buffer(names[i]) for i in counted)
    tensor_sqnrs: list[list[float]] = [[] for _ in schemes]
    roles = roles_in_order(names)
    role_of_tensor = {i: role for role, members in roles.items() for i in members}
    groups = {role: [SchemeRun.empty(s, histogram=False) for s in schemes] for role in roles}
    base = 0
    usable_index = 0
    for source in sources:
        if source.skipped is not None:
            tensors.append(TensorResult(source.info(), (), is_buffer(name_of(source)), False))
            continue
        index, usable_index = usable_index, usable_index + 1
        writer = sink = codes = None
        if keep is not None and to_npy:
            wide = (source.dtype == "float64"
                    and schemes[keep].product is Product.EXACT)  # x_q in float64
            writer = NpyWriter(out, source.shape, np.float64 if wide else np.float32)
            sink = writer.write
        elif keep is not None:
            rows, cols = matrix_shape(source.shape)
            spec = schemes[keep].format
            codes = shared_array((rows, cols), codes_of(np.zeros(1, np.float32), spec).dtype)

            def sink(rs, cs, block, codes=codes, spec=spec):
                codes[rs, cs] = codes_of(block, spec)

        tensor_progress = None
        if progress:
            def tensor_progress(done, total, base=base, size=sizes[index]):
                progress(base + done * size // max(total, 1), grand_total)
        if on_tensor:
            on_tensor(source.name)
        try:
            runs, kept = (run_tensor or quantize_tensor)(
                source, schemes, seed=seed, chunk_elements=chunk_elements, workers=workers,
                progress=tensor_progress, keep=keep, keep_mode="values" if to_npy else "codes",
                sink=sink, backend=backend, device=device, worst=worst_blocks)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        base += sizes[index]
        for run in runs:
            run.worst[:, -1] = index  # the worst blocks' tensor, for the report
        stats = tuple(run.stats() for run in runs)
        tensors.append(TensorResult(source.info(), stats, is_buffer(names[index]),
                                    index in counted))
        for i, run in enumerate(runs):
            if index in counted:
                totals[i].merge(run, worst_blocks)
                tensor_sqnrs[i].append(stats[i].sqnr_db)
            groups[role_of_tensor[index]][i].merge(run)
        if writer is not None:
            writer.close()
        elif codes is not None:
            grid, tile = kept
            applied = runs[keep].scheme
            coded.append((out_names[id(source)], np.array(codes).reshape(source.shape), grid,
                          {"scheme": applied.to_dict(), "tile": list(tile),
                           "shape": list(source.shape),
                           "matrix": list(matrix_shape(source.shape))}))
    if coded:
        write_codes(out, coded)
    total = (tuple(replace(run.stats(), per_tensor_sqnr=TensorSqnr.of(sqnrs))
                   for run, sqnrs in zip(totals, tensor_sqnrs)) if len(usable) > 1 else None)
    output = None if out is None else {"path": out, "scheme": schemes[keep].label,
                                       "content": "dequantized values" if to_npy
                                       else "codes and scales"}
    group_results = tuple(
        GroupResult(role, tuple(usable[i].name for i in members),
                    tuple(run.stats() for run in groups[role]))
        for role, members in roles.items())
    worst = tuple(
        WorstBlock(scheme.label, usable[int(row[-1])].name, int(row[2]), int(row[3]),
                   float(row[4]), float(row[5]), int(row[6]), int(row[0]), float(row[1]))
        for scheme, run in zip(schemes, totals) for row in run.worst)
    return QuantizeResult(tuple(tensors), total, tuple(schemes), output, group_results, worst,
                          buffers_in_total=buffers_in_total)
