"""Which scale should I use?  Candidate scale rules for one format and granularity, side by
side, and the best by a chosen metric.  Direction: ``x_q = cast(x * scale) / scale``.

Every candidate is a ``Scheme`` evaluated by the quantize engine (one pass over the data
for all of them); nothing here quantizes on its own.  Candidates:

- ``amax`` and ``amax margin 1..3`` (scale = max / amax / 2**margin);
- ``pow2-floor|ceil|nearest`` and the MX E8M0 rules ``mx-floor`` and ``mx-rceil``;
- ``percentile 99.9|99.99|99.999``: the percentile of |x| maps to max (the rest saturates);
- ``delayed max`` / ``delayed most_recent`` (Transformer Engine's delayed scaling): over a
  sequence of tensors (steps), step t is scaled with max / f(amax of the H steps before it),
  f = max or the most recent; the first step has no history and uses scale 1, as TE starts.
  One scale per tensor only;
- ``mse search``: a grid search over log2 of a common factor on the amax scales, from 2 up
  to 2**-6, first in steps of 1/4 binade, then in steps of 1/32 around the best; with one
  scale per tensor this is a search over log2(scale) itself.  Resolution: 1/32 binade.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from .backends import Backend, Device
from .errors import UsageError
from .metrics import ErrorAccumulator
from .quantize import matrix_shape, quantize, quantize_tensor, tensor_amax
from .results import ScaleSummary, SchemeStats
from .scaling import ScaleRule
from .schemes import Granularity, ScaleFormat, Scheme
from .tensors import TensorSource


class Metric(str, Enum):
    MSE = "mse"
    SQNR = "sqnr"
    MEDIAN_REL = "median-rel"
    P99_REL = "p99-rel"
    FLUSHED = "flushed"


def metric_value(stats: SchemeStats, metric: Metric) -> float:
    """The metric as a number to minimise (SQNR negated); NaN ranks last."""
    value = {Metric.MSE: stats.rmse ** 2, Metric.SQNR: -stats.sqnr_db,
             Metric.MEDIAN_REL: stats.median_rel_error, Metric.P99_REL: stats.p99_rel_error,
             Metric.FLUSHED: stats.flushed_fraction}[metric]
    return math.inf if math.isnan(value) else value


@dataclass(frozen=True)
class Candidate:
    """One scale rule and what it does to the data."""

    name: str
    stats: SchemeStats
    note: str | None = None
    overflow_steps: int | None = None  # delayed scaling: steps whose amax exceeded the scale
    steps: int | None = None

    def to_dict(self) -> dict:
        s = self.stats
        scales = s.scales
        one = scales["count"] == 1 or (scales["min"] is not None and scales["min"] == scales["max"]
                                       and scales["distinct"] == 1)
        rule = "delayed" if self.overflow_steps is not None else s.scheme["scale_rule"]
        out = {"name": self.name, "scale_rule": rule,
               "margin": s.scheme["margin"], "percentile": s.scheme["percentile"],
               "scale": scales["min"] if one else None, "scales": scales,
               "flushed_fraction": s.flushed_fraction,
               "saturated_fraction": s.saturated / s.count if s.count else 0.0,
               "median_rel_error": s.median_rel_error, "p99_rel_error": s.p99_rel_error,
               "sqnr_db": s.sqnr_db, "mse": s.rmse ** 2, "count": s.count,
               "nan_produced": s.nan_produced, "note": self.note}
        if self.overflow_steps is not None:
            out["overflow_steps"] = self.overflow_steps
            out["steps"] = self.steps
            out["overflow_step_fraction"] = self.overflow_steps / self.steps if self.steps else 0.0
        return out


@dataclass(frozen=True)
class ScaleSearchResult:
    scheme: dict
    metric: Metric
    candidates: tuple[Candidate, ...]
    best: str
    tensors: tuple[dict, ...]
    steps: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"format": self.scheme["format"], "granularity": self.scheme["granularity"],
                "scheme": self.scheme, "metric": self.metric.value, "best": self.best,
                "steps": self.steps, "tensors": list(self.tensors),
                "candidates": [c.to_dict() for c in self.candidates], "notes": list(self.notes)}


COARSE = np.arange(-1.0, 6.0 + 1e-9, 0.25)  # margins (binades below the amax scale)
FINE_STEP = 1 / 32
HISTORY = 1024  # Transformer Engine's default amax_history_len


def _percentile_fits(base: Scheme, steps: list[TensorSource]) -> bool:
    """Percentile scales come per tensor or per block/tile within a chunk; a tile that
    spans every row but not every column (per column, tall tiles) would need a histogram
    per column."""
    for step in steps:
        rows, cols = matrix_shape(step.shape)
        tr, tc = base.tile_shape(rows, cols, len(step.shape))
        if tr >= rows > 1 and tc < cols:
            return False
    return True


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
    """Statistics of each scheme over all the tensors (their total when there are several)."""
    result = quantize(sources, schemes, **options)
    if result.total is not None:
        return list(result.total)
    return list(result.quantized[0].schemes)


def _mse_search(sources, plain: Scheme, **options) -> Candidate:
    """Grid search of the margin (log2 of the scale factor) by MSE."""
    coarse = [replace(plain, margin=float(m)) for m in COARSE]
    stats = _evaluate(sources, coarse, **options)
    errors = [metric_value(s, Metric.MSE) for s in stats]
    centre = float(COARSE[int(np.argmin(errors))])
    fine_margins = centre + np.arange(-8, 9) * FINE_STEP
    fine = [replace(plain, margin=float(m)) for m in fine_margins]
    fine_stats = _evaluate(sources, fine, **options)
    every = list(zip(COARSE.tolist(), stats)) + list(zip(fine_margins.tolist(), fine_stats))
    margin, best = min(every, key=lambda pair: (metric_value(pair[1], Metric.MSE), pair[0]))
    factor = "1 (the amax scale itself)" if margin == 0 else f"2^{-margin:+.4g}"
    note = (f"grid search over log2 of the scale factor on amax scales: steps of 1/4 binade "
            f"from x2 to x2^-6, then 1/32 around the best; best factor {factor}")
    return Candidate("mse search", best, note)


def sequence_of(sources: list[TensorSource], first_axis: bool) -> list[TensorSource]:
    """The steps of a sequence: the tensors themselves, or the slices of one tensor's first
    axis (``first_axis``)."""
    usable = [s for s in sources if s.skipped is None]
    if not first_axis:
        return usable
    if len(usable) != 1 or len(usable[0].shape) < 2:
        raise UsageError("--over-first-axis needs one tensor with at least two dimensions")
    source = usable[0]
    steps = []
    for t in range(source.shape[0]):
        def opener(source=source, t=t):
            return source.array()[t]
        steps.append(TensorSource(source.source, f"{source.key or ''}[{t}]".lstrip(),
                                  source.shape[1:], source.dtype, opener))
    return steps


def _delayed(steps: list[TensorSource], plain: Scheme, history: int, algorithm: str,
             amaxes: list[float], **options) -> Candidate:
    """Transformer Engine's delayed scaling over the steps, per tensor."""
    spec = plain.format
    acc, summary = ErrorAccumulator(), ScaleSummary()
    overflow_steps = 0
    for t, step in enumerate(steps):
        past = [a for a in amaxes[max(0, t - history):t] if math.isfinite(a)]
        reference = (max(past) if algorithm == "max" else past[-1]) if past else 0.0
        scale = float(np.float32(min(spec.max / reference, np.finfo(np.float32).max))) \
            if reference > 0 else 1.0
        if np.float32(amaxes[t]) * np.float32(scale) > np.float32(spec.max):  # as the cast

            overflow_steps += 1
        scheme = replace(plain, scale_rule=ScaleRule.FIXED, fixed_scale=scale)
        per_scheme, _ = quantize_tensor(step, [scheme], **options)
        _, step_acc, step_summary = per_scheme[0]
        acc.merge(step_acc)
        summary.merge(step_summary)
    stats = SchemeStats.from_accumulator(
        replace(plain, scale_rule=ScaleRule.FIXED, fixed_scale=1.0), acc, summary)
    note = (f"history {history}, algorithm {algorithm}; the first step has no history and "
            f"uses scale 1")
    return Candidate(f"delayed {algorithm}", stats, note, overflow_steps, len(steps))


def search_scales(sources: list[TensorSource], base: Scheme, metric: Metric = Metric.MSE, *,
                  history: int = HISTORY, first_axis: bool = False, seed: int = 0,
                  chunk_elements: int | None = None, workers: int | None = None,
                  backend: Backend | str = Backend.NUMPY, device: Device | str = Device.CPU
                  ) -> ScaleSearchResult:
    """Evaluate every candidate rule for ``base``'s format and granularity; the best by
    ``metric`` (ties: the first listed)."""
    if history < 1:
        raise UsageError(f"--history must be >= 1, got {history}")
    options = {"seed": seed, "workers": workers, "backend": backend, "device": device}
    if chunk_elements is not None:
        options["chunk_elements"] = chunk_elements
    steps = sequence_of(sources, first_axis)
    per_tensor = base.granularity is Granularity.TENSOR
    named, notes = _rule_candidates(base, not _percentile_fits(base, steps))
    stats = _evaluate(steps, [scheme for _, scheme in named], **options)
    candidates = [Candidate(name, s) for (name, _), s in zip(named, stats)]
    candidates.append(_mse_search(steps, named[0][1], **options))
    if len(steps) >= 2 and per_tensor:
        amaxes = [tensor_amax(step, workers=workers) for step in steps]
        for algorithm in ("max", "most_recent"):
            candidates.append(_delayed(steps, named[0][1], history, algorithm, amaxes,
                                       **options))
    elif per_tensor:
        notes.append("delayed scaling needs a sequence: give several tensors, or "
                      "--over-first-axis for the slices of one")
    else:
        notes.append("delayed scaling is one scale per tensor: use --per tensor")
    best = min(candidates, key=lambda c: metric_value(c.stats, metric))
    tensors = tuple(s.to_dict() for s in sources if s.skipped is None)
    return ScaleSearchResult(named[0][1].to_dict(), metric, tuple(candidates), best.name,
                             tensors, len(steps), tuple(notes))
