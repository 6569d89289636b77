"""The first pass of a tensor: the amax (or |x|'s histogram) that a scale spanning it needs.

Tiles that span more rows than a chunk holds (per-tensor, per-column), the whole of a long
single row, percentile clipping over the tensor and NVFP4's tensor scale need a figure of
the whole tensor before any chunk is scaled.  ``first_pass_partials`` reads chunks for that
alone (on forked workers, or a Dask task's share of them) and returns partial maxima and
histograms that combine exactly in any order; ``apply_first_pass`` turns them into each
plan's scales.  Direction: ``x_q = cast(x * scale) / scale``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fmtcli.engine.chunk_parts import Plan, chunk_amax, nvfp4_tensor_scale, scales_for
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.streaming.metrics import FINITE_BINS, HIST_BINS, HIST_SHIFT
from fmtcli.streaming.parallel import run_tasks, work_array
from fmtcli.streaming.stream import ChunkReader


def needs_first_pass(plan: Plan) -> bool:
    """Whether a plan's scales (or NVFP4's tensor scale) need the whole tensor first."""
    return (plan.is_global and plan.scales is None) or plan.needs_tensor_amax


def first_pass_partials(reader: ChunkReader, chunks, plans: list[Plan], workers: int,
                        progress: Callable[[int], None] | None = None):
    """The first pass over ``chunks`` (all of a tensor's, or some of them: a Dask task's
    share, ``distributed``): one running maximum per tile column and worker, and for
    percentile rules one histogram of |x| per worker.  Returns (maxima per first-pass plan:
    arrays of workers x tile columns, histograms: workers x ``HIST_BINS`` or None); maxima
    of several calls stack along their first axis and histograms add up, exactly
    (memory: workers x columns, whatever the tensor's length).  ``workers``: the processes
    that share the chunks (``run.worker_count``; 1: this one)."""
    cols = reader.cols
    targets = [p for p in plans if needs_first_pass(p)]
    widths = [-(-cols // p.tile[1]) if p.is_global else 1 for p in targets]
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

