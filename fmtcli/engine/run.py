"""The engine's tensor pass: ``x_q = cast(x * scale) / scale`` over a whole tensor, in chunks.

``quantize_tensor`` runs one tensor under every scheme; ``quantize_totals`` merges many into
each scheme's total (what a search of many candidates reads).  For each tensor
``cuda.route`` says where each scheme runs; the rest is the CPU stream loop here: the tensor
is read in chunks (``stream``), ``chunk.ChunkKernel`` does the arithmetic of each chunk and
scheme, and ``chunk_pass.ChunkPass`` keeps and merges the statistics.  Tiles that span more
rows than a chunk holds (per-tensor, per-column) and NVFP4's tensor scale need the amax
first: ``first_pass`` reads the tensor for that alone.

Chunks run on forked worker processes (``parallel``) that write every chunk's statistics
into shared memory; the parent merges them in chunk order, so results depend neither on
the number of workers nor on their timing.  Histograms (integers) merge exactly in any order.
``fmt quantize`` itself (many tensors, groups, ``--out``) is ``fmtcli.quantize.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fmtcli.base.errors import UsageError
from fmtcli.engine.chunk import ChunkKernel, Plan
from fmtcli.engine.chunk_pass import ChunkPass
from fmtcli.engine.cuda import quantize_on_gpu, route
from fmtcli.engine.first_pass import apply_first_pass, first_pass_partials, needs_first_pass
from fmtcli.engine.results import SchemeRun, SchemeStats
from fmtcli.inputs.storage import itemsize
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics import native
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.scaling import Product, ScaleRule
from fmtcli.numerics.schemes import ScaleFormat, Scheme, for_tensor
from fmtcli.streaming.parallel import default_workers, run_tasks
from fmtcli.streaming.roles import counted_in_total
from fmtcli.streaming.stream import (
    CHUNK_ELEMENTS,
    ChunkReader,
    chunk_slices,
    keep_freed_memory,
    matrix_shape,
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
    sets each such plan's scales or tensor scale (``first_pass.first_pass_partials`` on
    ``worker_count`` processes, then ``apply_first_pass``)."""
    partial, hists = first_pass_partials(reader, chunks, plans,
                                         worker_count(workers, chunks), progress)
    apply_first_pass(plans, partial, hists)


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


@dataclass(frozen=True)
class TensorJob:
    """How ``quantize_tensor``'s CPU pass runs one tensor: the stochastic rounding's
    ``seed``, values per chunk, worker processes, the ``worst`` blocks kept per scheme,
    ``mse_only``, and what it keeps: scheme ``keep`` (an index among the schemes the pass
    runs, or None) as ``keep_mode`` ("values" or "codes") through ``sink``;
    ``progress(done, total)``: the pass's work, a value read counting 1 and a scheme's
    pass over it ``SCHEME_PASS_COST``."""

    seed: int = 0
    chunk_elements: int = CHUNK_ELEMENTS
    workers: int = 1
    worst: int = 0
    mse_only: bool = False
    keep: int | None = None
    keep_mode: str = "values"
    sink: Callable | None = None
    progress: Progress | None = None


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
        job = TensorJob(seed, chunk_elements, workers, worst, mse_only,
                        None if keep is None else rest.index(keep), keep_mode, sink, progress)
        results, kept = _quantize_tensor(reader, source, [schemes[i] for i in rest],
                                         [casts[i] for i in rest], job)
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


def _quantize_tensor(reader: ChunkReader, source: TensorSource, schemes: list[Scheme],
                     casts: list, job: TensorJob):
    """The CPU pass of ``schemes`` over one tensor, each cast by its ``casts`` entry
    (backend, device): the first pass where a plan needs one, then the chunk pass.  Returns
    (``SchemeRun`` per scheme, the kept scheme's (scale grid, tile) or None)."""
    rows, cols = matrix_shape(source.shape)
    plans = plan_schemes(source, schemes)
    chunks = chunk_slices(rows, cols, plans, job.chunk_elements)
    first = any(needs_first_pass(p) for p in plans)
    weight = SCHEME_PASS_COST * len(plans)  # progress: a value's share of the work, in units
    total = rows * cols * (weight + (1 if first else 0))
    progress, offset = job.progress, 0
    if first:
        _first_pass(reader, chunks, plans, job.workers,
                    (lambda done: progress(done, total)) if progress else None)
        offset = rows * cols
    kernels = [ChunkKernel(p, job.seed, b, d, source.name, job.worst, job.mse_only)
               for p, (b, d) in zip(plans, casts)]
    n_workers = worker_count(job.workers, chunks)
    work = ChunkPass(plans, kernels, rows, cols, chunks, n_workers, job.worst, job.mse_only)
    run_tasks(lambda index, worker: work.task(reader, index, worker, job.keep, job.keep_mode,
                                              job.sink),
              len(chunks), n_workers,
              (lambda done: progress(offset + done * weight, total)) if progress else None)
    results = work.runs()
    kept = None
    if job.keep is not None:
        plan = plans[job.keep]
        grid = plan.scales if plan.is_global else work.grids[job.keep]
        kept = (np.array(grid), plan.tile)
    return results, kept


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
    native.note_if_absent(sum(s.size * itemsize(s.dtype) for s in usable))
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
