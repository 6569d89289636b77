"""The chunk pass of one tensor: every chunk under every plan, merged in chunk order.

``ChunkPass.task`` reads one chunk of a tensor's matrix view and runs each plan's
``chunk.ChunkKernel`` on it (``x_q = cast(x * scale) / scale``), writing the chunk's
records into arrays that forked workers share (``parallel.work_array``); ``runs`` merges
them into one ``results.SchemeRun`` per plan.  A Dask task runs ``task`` for some chunks
and sends back ``part``; the client's pass takes each in with ``absorb``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fmtcli.base.choices import Granularity
from fmtcli.engine.chunk import ChunkKernel, Plan
from fmtcli.engine.results import SchemeRun, top_blocks
from fmtcli.engine.scales import ScaleSummary
from fmtcli.numerics.scaling import Product
from fmtcli.streaming.blocks import (
    EXP_BINS,
    FRACTION_BINS,
    WORST_FIELDS,
    BlockAccumulator,
    chunk_worst,
    exponent_counts,
    fraction_counts,
)
from fmtcli.streaming.metrics import HIST_BINS, ErrorAccumulator
from fmtcli.streaming.parallel import work_array
from fmtcli.streaming.stream import ChunkReader


def one_block(plan: Plan, rows: int, cols: int) -> bool:
    """Whether a block, tile or row scheme covers the whole tensor with one scale (its
    per-block facts are then those of the tensor)."""
    return (plan.scheme.granularity in (Granularity.BLOCK, Granularity.TILE, Granularity.ROW)
            and -(-rows // plan.tile[0]) * -(-cols // plan.tile[1]) == 1)


def better(a: tuple, b: tuple) -> bool:
    """Whether block ``a`` = (amax, row, column) outranks ``b`` as the block holding a
    tensor's amax: a larger amax, or the same amax earlier in the tensor."""
    return a[0] > b[0] or (a[0] == b[0] and (a[1], a[2]) < (b[1], b[2]))


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

