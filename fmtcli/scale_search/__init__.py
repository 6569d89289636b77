"""Which scale should I use?  Candidate scale rules for one format and granularity, side by
side, and the best by a chosen metric.  Direction: ``x_q = cast(x * scale) / scale``.

Every candidate is a ``Scheme`` evaluated by the quantize engine (one pass over the data
for all of them); nothing here quantizes on its own.  Candidates:

- ``amax`` and ``amax margin 1..3`` (scale = max / amax / 2**margin);
- ``pow2-floor|ceil|nearest`` and the MX E8M0 rules ``mx-floor`` and ``mx-rceil``;
- ``percentile 99.9|99.99|99.999``: the percentile of |x| maps to max (the rest saturates);
- ``delayed max`` / ``delayed most_recent`` (Transformer Engine's delayed scaling): over a
  sequence of steps, step t is scaled with max / f(amax of the H steps before it),
  f = max or the most recent; the first step has no history and uses scale 1, as TE starts.
  One scale per tensor only.  Steps are only what is meant as steps: the slices of one
  tensor's first axis (``--over-first-axis``), or several files of one tensor each, all of
  one shape, in the order given.  The tensors of one checkpoint are not a sequence;
- ``mse search``: a grid search over log2 of a common factor on the amax scales, from 2 up
  to 2**-6, first in steps of 1/4 binade, then in steps of 1/32 around the best; with one
  scale per tensor this is a search over log2(scale) itself.  Resolution: 1/32 binade.

A tensor without a finite nonzero value (all zeros, only NaN/inf) has nothing to quantize:
it is left out of the candidates (a note names it), and when no tensor has anything to
quantize the result has no candidates and no best.  Where no candidate's metric is finite
(NaN, or an unbounded error from inf/NaN results), there is no best either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fmtcli.base.choices import HISTORY, Metric
from fmtcli.base.errors import Param, UsageError, shown
from fmtcli.engine.chunk import chunk_amax
from fmtcli.engine.results import ScaleSummary, SchemeStats
from fmtcli.engine.run import quantize_tensor, quantize_totals, worker_count
from fmtcli.inputs.tensors import TensorInfo, TensorSource, skipped_records
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.scaling import COARSE, FINE_STEP, ScaleRule
from fmtcli.numerics.schemes import Granularity, ScaleFormat, Scheme
from fmtcli.streaming.metrics import ErrorAccumulator
from fmtcli.streaming.parallel import default_workers, run_tasks, work_array
from fmtcli.streaming.roles import counted_in_total
from fmtcli.streaming.stream import (
    CHUNK_ELEMENTS,
    ChunkReader,
    chunk_slices,
    matrix_shape,
    short_rows_text,
    tile_of,
)


def metric_value(stats: SchemeStats, metric: Metric) -> float:
    """The metric as a number to minimise (SQNR negated); NaN where it is undefined."""
    return {Metric.MSE: stats.mse, Metric.SQNR: -stats.sqnr_db,
            Metric.MEDIAN_REL: stats.median_rel_error, Metric.P99_REL: stats.p99_rel_error,
            Metric.FLUSHED: stats.flushed_fraction}[metric]


@dataclass(frozen=True)
class Candidate:
    """One scale rule and what it does to the data."""

    name: str
    stats: SchemeStats
    note: str | None = None
    overflow_steps: int | None = None  # delayed scaling: steps whose amax exceeded the scale
    steps: int | None = None

    @property
    def scale_rule(self) -> str:
        """The rule's name in JSON: the scheme's rule, or ``delayed``."""
        return "delayed" if self.overflow_steps is not None else self.stats.scheme.scale_rule.value

    def to_dict(self) -> dict:
        """The rule, then the statistics under the same keys as ``fmt quantize`` (from
        ``SchemeStats.to_dict``: every count with its ``_fraction``, ``rmse`` and ``mse``)."""
        s = self.stats
        out = {"name": self.name, "scale_rule": self.scale_rule, "margin": s.scheme.margin,
               "percentile": s.scheme.percentile, "scale_format": s.scheme.scale_format.value,
               "scale": s.scales.single}
        scheme = s.scheme.to_dict()
        out.update({k: v for k, v in s.to_dict().items() if k not in scheme})
        out["note"] = self.note
        if self.overflow_steps is not None:
            out["overflow_steps"] = self.overflow_steps
            out["steps"] = self.steps
            out["overflow_step_fraction"] = self.overflow_steps / self.steps if self.steps else 0.0
        return out


@dataclass(frozen=True)
class ScaleSearchResult:
    """The candidates, the best (``None`` when nothing ranks), the tensors read and those
    skipped (not floating point, empty), and notes on what was left out and why."""

    scheme: Scheme
    metric: Metric
    candidates: tuple[Candidate, ...]
    best: str | None
    tensors: tuple[TensorInfo, ...]
    steps: int
    notes: tuple[str, ...] = ()
    skipped: tuple[TensorInfo, ...] = ()
    sequence: str | None = None  # what the delayed candidates took as steps

    def to_dict(self) -> dict:
        return {"format": self.scheme.format.name,
                "granularity": self.scheme.granularity.value,
                "scheme": self.scheme.to_dict(), "metric": self.metric.value, "best": self.best,
                "steps": self.steps, "sequence": self.sequence,
                "tensors": [t.to_dict() for t in self.tensors],
                "skipped": skipped_records(self.skipped),
                "candidates": [c.to_dict() for c in self.candidates], "notes": list(self.notes)}




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


def _percentile_fits(base: Scheme, steps: list[TensorSource]) -> bool:
    """Percentile scales come per tensor or per block/tile within a chunk; a tile that
    spans every row but not every column (per column, tall tiles) would need a histogram
    per column."""
    for step in steps:
        rows, cols = matrix_shape(step.shape)
        tr, tc = tile_of(base, step.shape)
        if tr >= rows > 1 and tc < cols:
            return False
    return True


def _per_element(base: Scheme, steps: list[TensorSource]) -> list[TensorSource]:
    """Tensors of more than one element where the granularity gives every element its own
    scale (``--per column`` of a 1-D tensor, which is one row; ``--block 1``)."""
    out = []
    for step in steps:
        if step.size > 1 and tile_of(base, step.shape) == (1, 1):
            out.append(step)
    return out


def _names(steps: list[TensorSource], limit: int = 4) -> str:
    text = ", ".join(shown(s.name) for s in steps[:limit])
    return text + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


def _rule_candidates(base: Scheme, per_column: bool) -> tuple[list[tuple[str, Scheme]], list]:
    """(name, scheme) of the amax, power-of-two, MX and percentile rules; notes."""
    plain = replace(base, scale_rule=ScaleRule.AMAX, margin=0, percentile=None,
                    fixed_scale=None, scale_format=ScaleFormat.FLOAT32, recipe=None)
    out = [("amax", plain)]
    out += [(f"amax margin {m}", replace(plain, margin=m)) for m in (1, 2, 3)]
    for rule in (ScaleRule.POW2_FLOOR, ScaleRule.POW2_CEIL, ScaleRule.POW2_NEAREST):
        out.append((rule.value, replace(plain, scale_rule=rule)))
    for rule in (ScaleRule.MX_FLOOR, ScaleRule.MX_RCEIL):
        out.append((rule.value, replace(plain, scale_rule=rule, scale_format=ScaleFormat.E8M0)))
    notes = []
    if per_column:
        notes.append("percentile clipping is offered per tensor and per block or tile, "
                     "not per column (nor for tiles spanning every row)")
    else:
        for q in (99.9, 99.99, 99.999):
            out.append((f"percentile {q:g}", replace(plain, scale_rule=ScaleRule.PERCENTILE,
                                                      percentile=q)))
    return out, notes


def _evaluate(sources: list[TensorSource], schemes: list[Scheme], **options) -> list[SchemeStats]:
    """Statistics of each scheme over all the tensors (their total when there are several;
    the buffer rule was applied by ``search_scales`` already)."""
    return quantize_totals(sources, schemes, include_buffers=True, **options)


def _mse_values(sources: list[TensorSource], schemes: list[Scheme], **options) -> list[float]:
    """The MSE of each scheme over all the tensors, exactly as ``_evaluate``'s statistics
    report it (the same sums, merged in the same order), at a fraction of the cost: the
    engine computes only the squared errors (``quantize_tensor(mse_only=True)``)."""
    totals = [ErrorAccumulator(hist=None) for _ in schemes]
    for source in sources:
        if source.skipped is not None:
            continue
        runs, _ = quantize_tensor(source, schemes, mse_only=True, **options)
        for total, run in zip(totals, runs):
            total.merge(run.acc, hist=False)
    return [total.mse() for total in totals]


def _mse_search(sources, plain: Scheme, **options) -> Candidate:
    """Grid search of the margin (log2 of the scale factor) by MSE; the statistics of the
    best one."""
    coarse = COARSE.tolist()
    errors = _mse_values(sources, [replace(plain, margin=float(m)) for m in coarse], **options)

    def error(mse: float) -> float:
        return math.inf if math.isnan(mse) else mse

    if not any(math.isfinite(e) for e in errors):
        note = "no scale factor gives a finite MSE"
        stats = _evaluate(sources, [replace(plain, margin=0.0)], **options)[0]
        return Candidate("mse search", stats, note)
    centre = coarse[int(np.argmin([error(e) for e in errors]))]
    fine = (centre + np.arange(-8, 9) * FINE_STEP).tolist()
    fine_errors = _mse_values(sources, [replace(plain, margin=float(m)) for m in fine],
                              **options)
    every = list(zip(coarse, errors)) + list(zip(fine, fine_errors))
    margin, _ = min(every, key=lambda pair: (error(pair[1]), pair[0]))
    best = _evaluate(sources, [replace(plain, margin=float(margin))], **options)[0]
    factor = "1 (the amax scale itself)" if margin == 0 else f"2^{-margin:+.4g}"
    note = (f"grid search over log2 of the scale factor on amax scales: steps of 1/4 binade "
            f"from x2 to x2^-6, then 1/32 around the best; best factor {factor}")
    return Candidate("mse search", best, note)


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


def _delayed(steps: list[TensorSource], plain: Scheme, history: int, algorithm: str,
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


def best_of(candidates: list[Candidate], metric: Metric) -> str | None:
    """The candidate with the smallest metric (SQNR: largest); ties: the first listed.
    Only a bounded value ranks: None when every candidate's metric is NaN or an unbounded
    error (an inf/NaN result of a finite input)."""
    ranked = [(metric_value(c.stats, metric), i) for i, c in enumerate(candidates)]
    ranked = [pair for pair in ranked if not math.isnan(pair[0]) and pair[0] != math.inf]
    return candidates[min(ranked)[1]].name if ranked else None


def search_scales(sources: list[TensorSource], base: Scheme, metric: Metric = Metric.MSE, *,
                  history: int = HISTORY, first_axis: bool = False, seed: int = 0,
                  chunk_elements: int | None = None, workers: int | None = None,
                  backend: Backend | str = Backend.NUMPY, device: Device | str = Device.CPU,
                  include_buffers: bool = False) -> ScaleSearchResult:
    """Evaluate every candidate rule for ``base``'s format and granularity; the best by
    ``metric`` (ties: the first listed).  The rules are ranked over the tensors less the
    non-weight buffers (``quantize.roles.is_buffer``), as quantize's total leaves them out,
    unless ``include_buffers`` (or every tensor is one); a note names what was left out."""
    if history < 1:
        raise UsageError(Param("history", history) + ": an amax history must be >= 1 step long")
    options = {"seed": seed, "workers": workers, "backend": backend, "device": device}
    if chunk_elements is not None:
        options["chunk_elements"] = chunk_elements
    steps = sequence_of(sources, first_axis)
    tensors = tuple(s.info() for s in sources if s.skipped is None)
    skipped = tuple(s.info() for s in sources if s.skipped is not None)
    contents = [content_of(step, workers=workers) for step in steps]
    quantizable = [s for s, c in zip(steps, contents) if c.finite_nonzero]
    empty = [(s, c) for s, c in zip(steps, contents) if not c.finite_nonzero]
    notes = []
    if empty:
        why = sorted({c.why_empty for _, c in empty})
        notes.append(f"nothing to quantize in {_names([s for s, _ in empty])} "
                     f"({', '.join(why)}): left out of the candidates")
    plain = replace(base, scale_rule=ScaleRule.AMAX, margin=0, percentile=None,
                    fixed_scale=None, scale_format=ScaleFormat.FLOAT32, recipe=None)
    if not quantizable:
        return ScaleSearchResult(plain, metric, (), None, tensors, len(steps),
                                 ("nothing to quantize: no finite nonzero value in the "
                                  "input, so no scale rule has anything to rank",), skipped)
    names = [s.name if s.key is None else s.key for s in quantizable]
    counted = counted_in_total(names, include_buffers)
    if len(counted) < len(quantizable):
        left = [quantizable[i] for i in range(len(quantizable)) if i not in set(counted)]
        notes.append(f"{len(left):,} non-weight buffer{'' if len(left) == 1 else 's'} "
                     f"({_names(left)}) left out of the ranking: --include-buffers counts "
                     "them")
        quantizable = [quantizable[i] for i in counted]
    short = short_rows_text(quantizable, [base])
    if short:
        notes.append(short)
    per_element = _per_element(base, quantizable)
    if per_element:
        why = (": a 1-D tensor is one row, so --per column gives each value its own scale"
               if base.granularity is Granularity.COLUMN else "")
        notes.append(f"one scale per element in {_names(per_element)}{why}")
    per_tensor = base.granularity is Granularity.TENSOR
    named, rule_notes = _rule_candidates(base, not _percentile_fits(base, quantizable))
    notes += rule_notes
    stats = _evaluate(quantizable, [scheme for _, scheme in named], **options)
    candidates = [Candidate(name, s) for (name, _), s in zip(named, stats)]
    candidates.append(_mse_search(quantizable, plain, **options))
    problem = sequence_problem(steps, first_axis)
    sequence = None
    if not per_tensor:
        notes.append("delayed scaling is one scale per tensor: use --per tensor")
    elif problem:
        notes.append(problem)
    else:
        sequence = (f"each slice of the first axis is one step ({len(steps)} steps)"
                    if first_axis else
                    f"each file is one step, in the order given ({len(steps)} steps)")
        for algorithm in ("max", "most_recent"):
            candidates.append(_delayed(steps, plain, history, algorithm, contents, sequence,
                                       **options))
    best = best_of(candidates, metric)
    if best is None:
        notes.append(f"no best: no candidate has a finite {metric.value}")
    return ScaleSearchResult(plain, metric, tuple(candidates), best, tensors,
                             len(steps), tuple(notes), skipped, sequence)
