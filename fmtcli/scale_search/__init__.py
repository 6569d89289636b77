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

Here: ``search_scales`` and its result; ``candidates`` the rules, their evaluation, the MSE
search and the ranking; ``steps`` what each tensor holds, the sequence of steps and delayed
scaling over it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fmtcli.base.choices import HISTORY, Metric
from fmtcli.base.errors import Param, UsageError, shown
from fmtcli.inputs.tensors import TensorInfo, TensorSource, skipped_records
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.schemes import Granularity, Scheme
from fmtcli.scale_search.candidates import (
    Candidate,
    best_of,
    evaluate,
    mse_search,
    plain_scheme,
    rule_candidates,
)
from fmtcli.scale_search.steps import (
    content_of,
    delayed_candidate,
    sequence_of,
    sequence_problem,
)
from fmtcli.streaming.roles import counted_in_total
from fmtcli.streaming.stream import matrix_shape, short_rows_text, tile_of


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
    plain = plain_scheme(base)
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
    named, rule_notes = rule_candidates(base, not _percentile_fits(base, quantizable))
    notes += rule_notes
    stats = evaluate(quantizable, [scheme for _, scheme in named], **options)
    candidates = [Candidate(name, s) for (name, _), s in zip(named, stats)]
    candidates.append(mse_search(quantizable, plain, **options))
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
            candidates.append(delayed_candidate(steps, plain, history, algorithm, contents,
                                                sequence, **options))
    best = best_of(candidates, metric)
    if best is None:
        notes.append(f"no best: no candidate has a finite {metric.value}")
    return ScaleSearchResult(plain, metric, tuple(candidates), best, tensors,
                             len(steps), tuple(notes), skipped, sequence)
