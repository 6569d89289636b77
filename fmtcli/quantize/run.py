"""``fmt quantize``: every usable tensor under every scheme, their total and groups by role.

``quantize`` runs each tensor through the engine (``engine.run.quantize_tensor``: chunks on
forked workers, or the fused CUDA kernel; ``x_q = cast(x * scale) / scale``) and merges the
tensors' runs, exactly and in checkpoint order, into a total per scheme (``Totals``), one
per group of tensors whose names differ only in layer indices (``roles``), and the worst
blocks; ``--out`` is ``outputs.Output``.  The result is a frozen ``QuantizeResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fmtcli.base.errors import Param, UsageError
from fmtcli.engine import run as engine
from fmtcli.engine.results import GroupResult, QuantizeResult, SchemeRun, TensorResult, TensorSqnr
from fmtcli.inputs.storage import itemsize
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics import native
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.scaling import Product
from fmtcli.numerics.schemes import Scheme
from fmtcli.quantize.outputs import Output
from fmtcli.streaming.blocks import WorstBlock
from fmtcli.streaming.roles import counted_in_total, is_buffer, roles_in_order
from fmtcli.streaming.stream import CHUNK_ELEMENTS, keep_freed_memory, note_short_rows

Progress = Callable[[int, int], None]


class Totals:
    """What ``quantize`` merges over the usable tensors, in checkpoint order: per scheme
    the total of the tensors it counts (``roles.counted_in_total``: buffers left out unless
    ``include_buffers`` or every tensor is one) with their SQNRs, the groups by role, and
    the ``worst_blocks`` worst blocks of the total."""

    def __init__(self, usable: list[TensorSource], schemes: list[Scheme],
                 include_buffers: bool, worst_blocks: int) -> None:
        self.usable, self.schemes, self.worst_blocks = usable, schemes, worst_blocks
        self.names = [engine.name_of(s) for s in usable]
        self.counted = set(counted_in_total(self.names, include_buffers))
        self.buffers_in_total = any(is_buffer(self.names[i]) for i in self.counted)
        self.totals = [SchemeRun.empty(s) for s in schemes]
        self.sqnrs: list[list[float]] = [[] for _ in schemes]
        self.roles = roles_in_order(self.names)
        self.role_of = {i: role for role, members in self.roles.items() for i in members}
        self.groups = {role: [SchemeRun.empty(s, histogram=False) for s in schemes]
                       for role in self.roles}

    def add(self, index: int, source: TensorSource, runs: list[SchemeRun]) -> TensorResult:
        """Merge usable tensor ``index``'s runs in; its ``TensorResult``."""
        for run in runs:
            run.worst[:, -1] = index  # the worst blocks' tensor, for the report
        stats = tuple(run.stats() for run in runs)
        for i, run in enumerate(runs):
            if index in self.counted:
                self.totals[i].merge(run, self.worst_blocks)
                self.sqnrs[i].append(stats[i].sqnr_db)
            self.groups[self.role_of[index]][i].merge(run)
        return TensorResult(source.info(), stats, is_buffer(self.names[index]),
                            index in self.counted, layout_of(source))

    def total(self) -> tuple | None:
        """Each scheme's statistics over the counted tensors, with the mean of their SQNR
        (None for a single tensor: its own are the report)."""
        if len(self.usable) <= 1:
            return None
        return tuple(replace(run.stats(), per_tensor_sqnr=TensorSqnr.of(sqnrs))
                     for run, sqnrs in zip(self.totals, self.sqnrs))

    def group_results(self) -> tuple[GroupResult, ...]:
        return tuple(GroupResult(role, tuple(self.usable[i].name for i in members),
                                 tuple(run.stats() for run in self.groups[role]))
                     for role, members in self.roles.items())

    def worst(self) -> tuple[WorstBlock, ...]:
        """The total's worst blocks, per scheme, worst first."""
        return tuple(
            WorstBlock(scheme.label, self.usable[int(row[-1])].name, int(row[2]),
                       int(row[3]), float(row[4]), float(row[5]), int(row[6]), int(row[0]),
                       float(row[1]))
            for scheme, run in zip(self.schemes, self.totals) for row in run.worst)


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
    ``engine.run.quantize_tensor`` is (the default); ``distributed`` passes one that
    collects the tensor's runs from a Dask cluster.

    With several tensors the result has a total per scheme; ``groups`` merges the tensors
    whose names differ only in layer indices (``roles``), exactly, in checkpoint order.
    The total leaves out non-weight buffers (``roles.is_buffer``: BatchNorm's running
    statistics, ...) unless ``include_buffers`` (or every tensor is one); each total also
    carries the mean of its tensors' SQNR (``results.TensorSqnr``).
    """
    keep_freed_memory()
    schemes = engine.with_product(schemes, product)
    usable = [s for s in sources if s.skipped is None]
    sizes = [s.size * itemsize(s.dtype) for s in usable]  # bytes as stored (no ml_dtypes)
    native.note_if_absent(sum(sizes))
    output = Output(out, out_scheme, schemes, usable)
    if worst_blocks < 0:
        raise UsageError(Param("worst_blocks", worst_blocks) + ": must be >= 0")
    note_short_rows(usable, schemes)
    totals = Totals(usable, schemes, include_buffers, worst_blocks)
    options = dict(seed=seed, chunk_elements=chunk_elements, workers=workers,
                   keep=output.keep, keep_mode=output.keep_mode, backend=backend,
                   device=device, worst=worst_blocks)
    run = run_tensor or engine.quantize_tensor  # looked up here: tests may stand one in
    tensors, base, index = [], 0, 0
    for source in sources:
        if source.skipped is not None:
            tensors.append(TensorResult(source.info(), (), is_buffer(engine.name_of(source)),
                                        False, layout_of(source)))
            continue
        runs, kept = _one_tensor(run, source, schemes, output, on_tensor,
                                 _share(progress, base, sizes[index], sum(sizes)), options)
        base += sizes[index]
        tensors.append(totals.add(index, source, runs))
        output.done(source, runs, kept)
        index += 1
    written = output.finish()
    return QuantizeResult(tuple(tensors), totals.total(), tuple(schemes), written,
                          totals.group_results(), totals.worst(),
                          buffers_in_total=totals.buffers_in_total)


def layout_of(source: TensorSource) -> str | None:
    """The layout a tensor's values were dequantized from (``inputs.layouts``), or None."""
    return getattr(source.quantized, "layout", None)


def _one_tensor(run: Callable, source: TensorSource, schemes: list[Scheme], output: Output,
                on_tensor: Callable[[str], None] | None, progress: Progress | None,
                options: dict):
    """``run`` (``quantize_tensor`` or a stand-in) on one tensor, its ``--out`` destination
    opened first and, where it fails, its half-written ``.npy`` removed: (runs, kept)."""
    sink = output.sink(source)
    if on_tensor:
        on_tensor(source.name)
    try:
        return run(source, schemes, progress=progress, sink=sink, **options)
    except BaseException:
        output.abort()
        raise


def _share(progress: Progress | None, base: int, size: int, grand_total: int
           ) -> Progress | None:
    """One tensor's ``progress(done, total)`` as bytes of the whole run: its ``size`` bytes
    after the ``base`` bytes of the tensors before it, of ``grand_total``."""
    if not progress:
        return None

    def tensor_progress(done: int, total: int) -> None:
        progress(base + done * size // max(total, 1), grand_total)

    return tensor_progress
