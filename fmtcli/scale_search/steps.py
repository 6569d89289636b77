"""The steps of ``fmt scale-search``: what each tensor holds (``content_of``: one streamed
pass for amax and counts), the sequence of steps that delayed scaling takes (the slices of
one tensor's first axis, or several files of one tensor each), and Transformer Engine's
delayed scaling over them (``delayed_candidate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fmtcli.base.errors import Param, UsageError
from fmtcli.engine.chunk import chunk_amax
from fmtcli.engine.results import ScaleSummary, SchemeStats
from fmtcli.engine.run import quantize_tensor, worker_count
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Scheme
from fmtcli.scale_search.candidates import Candidate
from fmtcli.streaming.metrics import ErrorAccumulator
from fmtcli.streaming.parallel import default_workers, run_tasks, work_array
from fmtcli.streaming.stream import CHUNK_ELEMENTS, ChunkReader, chunk_slices, matrix_shape


@dataclass(frozen=True)
class Content:
    """What a tensor holds: max |x| (NaN if it holds NaN, as ``torch.amax``), the count of
    finite nonzero values and of NaN/inf values."""

    amax: float
    finite_nonzero: int
    nonfinite: int
    size: int

    @property
    def why_empty(self) -> str:
        if self.nonfinite == 0:
            return "all zeros"
        return "only NaN/inf" if self.nonfinite == self.size else "only zeros and NaN/inf"


def content_of(source: TensorSource, *, chunk_elements: int = CHUNK_ELEMENTS,
               workers: int | None = None) -> Content:
    """One streamed pass: amax and counts (amax in the data's width: float64 stays float64)."""
    workers = default_workers() if workers is None else workers
    reader = ChunkReader(source)
    try:
        rows, cols = matrix_shape(source.shape)
        chunks = chunk_slices(rows, cols, [], chunk_elements)
        workers = worker_count(workers, chunks)  # a small tensor: no fork
        amax = work_array((workers,), np.float64, workers > 1)
        counts = work_array((workers, 2), np.int64, workers > 1)

        def task(index: int, worker: int) -> int:
            x = reader.read(*chunks[index])
            finite = np.isfinite(x)
            counts[worker] += (np.count_nonzero(finite & (x != 0)), x.size
                               - np.count_nonzero(finite))
            amax[worker] = np.maximum(amax[worker], chunk_amax(x, *x.shape)[0, 0])  # NaN stays
            return x.size

        run_tasks(task, len(chunks), workers)
    finally:
        reader.close()
    return Content(float(amax.max()), int(counts[:, 0].sum()), int(counts[:, 1].sum()), source.size)


def sequence_of(sources: list[TensorSource], first_axis: bool) -> list[TensorSource]:
    """The tensors to evaluate: the usable tensors themselves, or the slices of one tensor's
    first axis (``first_axis``)."""
    usable = [s for s in sources if s.skipped is None]
    if not first_axis:
        return usable
    if len(usable) != 1 or len(usable[0].shape) < 2:
        raise UsageError(Param("first_axis", True)
                         + " needs one tensor with at least two dimensions")
    source = usable[0]
    steps = []
    for t in range(source.shape[0]):
        def opener(source=source, t=t):
            return source.array()[t]
        steps.append(TensorSource(source.source, f"{source.key or ''}[{t}]".lstrip(),
                                  source.shape[1:], source.dtype, opener))
    return steps


def sequence_problem(steps: list[TensorSource], first_axis: bool) -> str | None:
    """Why the tensors are not a sequence of steps for delayed scaling (None: they are).
    Steps are the slices of ``--over-first-axis``, or several files of one tensor each and
    of one shape (a tensor seen at successive steps keeps its shape)."""
    if first_axis:
        return None
    if len(steps) < 2:
        return ("delayed scaling needs a sequence of steps: give one file per step, or "
                "--over-first-axis for the slices of one tensor")
    if len({s.source for s in steps}) < len(steps):
        return ("delayed scaling needs a sequence of steps: the tensors of one checkpoint are "
                "not steps; give one file per step, or --over-first-axis")
    if len({tuple(s.shape) for s in steps}) > 1:
        return ("delayed scaling needs a sequence of steps of one shape; the files given "
                "differ in shape")
    return None


def delayed_candidate(steps: list[TensorSource], plain: Scheme, history: int, algorithm: str,
             contents: list[Content], what: str, **options) -> Candidate:
    """Transformer Engine's delayed scaling over the steps, per tensor.  Steps with nothing
    to quantize keep their place in the amax history but add no statistics."""
    spec = plain.format
    amaxes = [c.amax for c in contents]
    acc, summary = ErrorAccumulator(), ScaleSummary()
    overflow_steps = 0
    for t, step in enumerate(steps):
        past = [a for a in amaxes[max(0, t - history):t] if math.isfinite(a)]
        reference = (max(past) if algorithm == "max" else past[-1]) if past else 0.0
        scale = float(np.float32(min(spec.max / reference, np.finfo(np.float32).max))) \
            if reference > 0 else 1.0
        with np.errstate(over="ignore"):
            if np.float32(amaxes[t]) * np.float32(scale) > np.float32(spec.max):  # as the cast
                overflow_steps += 1
        if not contents[t].finite_nonzero:
            continue
        scheme = replace(plain, scale_rule=ScaleRule.FIXED, fixed_scale=scale)
        per_scheme, _ = quantize_tensor(step, [scheme], **options)
        step_acc, step_summary = per_scheme[0].acc, per_scheme[0].scales
        acc.merge(step_acc)
        summary.merge(step_summary)
    stats = SchemeStats.from_accumulator(
        replace(plain, scale_rule=ScaleRule.FIXED, fixed_scale=1.0), acc, summary)
    note = (f"{what}; history {history}, algorithm {algorithm}; the first step has no "
            f"history and uses scale 1")
    return Candidate(f"delayed {algorithm}", stats, note, overflow_steps, len(steps))
