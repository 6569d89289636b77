"""The candidates of ``fmt scale-search`` and their ranking: each rule as a ``Scheme``
evaluated by the quantize engine (``evaluate``: one pass over the data for all of them),
the MSE grid search (``mse_search``: the squared errors alone, on ``numerics.scaling``'s
grid), and the best by a metric (``best_of``).  Delayed scaling, which needs a sequence of
steps, is ``steps``'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fmtcli.base.choices import Metric
from fmtcli.engine.results import SchemeStats
from fmtcli.engine.run import quantize_tensor, quantize_totals
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.scaling import COARSE, FINE_STEP, ScaleRule
from fmtcli.numerics.schemes import ScaleFormat, Scheme
from fmtcli.streaming.metrics import ErrorAccumulator


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


def plain_scheme(base: Scheme) -> Scheme:
    """``base``'s format and granularity with the plain amax rule: one float32 scale =
    max / amax, no margin, no recipe (what every candidate varies)."""
    return replace(base, scale_rule=ScaleRule.AMAX, margin=0, percentile=None,
                   fixed_scale=None, scale_format=ScaleFormat.FLOAT32, recipe=None)


def rule_candidates(base: Scheme, per_column: bool) -> tuple[list[tuple[str, Scheme]], list]:
    """(name, scheme) of the amax, power-of-two, MX and percentile rules; notes."""
    plain = plain_scheme(base)
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


def evaluate(sources: list[TensorSource], schemes: list[Scheme], **options) -> list[SchemeStats]:
    """Statistics of each scheme over all the tensors (their total when there are several;
    the buffer rule was applied by ``search_scales`` already)."""
    return quantize_totals(sources, schemes, include_buffers=True, **options)


def mse_values(sources: list[TensorSource], schemes: list[Scheme], **options) -> list[float]:
    """The MSE of each scheme over all the tensors, exactly as ``evaluate``'s statistics
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


def mse_search(sources, plain: Scheme, **options) -> Candidate:
    """Grid search of the margin (log2 of the scale factor) by MSE; the statistics of the
    best one."""
    coarse = COARSE.tolist()
    errors = mse_values(sources, [replace(plain, margin=float(m)) for m in coarse], **options)

    def error(mse: float) -> float:
        return math.inf if math.isnan(mse) else mse

    if not any(math.isfinite(e) for e in errors):
        note = "no scale factor gives a finite MSE"
        stats = evaluate(sources, [replace(plain, margin=0.0)], **options)[0]
        return Candidate("mse search", stats, note)
    centre = coarse[int(np.argmin([error(e) for e in errors]))]
    fine = (centre + np.arange(-8, 9) * FINE_STEP).tolist()
    fine_errors = mse_values(sources, [replace(plain, margin=float(m)) for m in fine],
                              **options)
    every = list(zip(coarse, errors)) + list(zip(fine, fine_errors))
    margin, _ = min(every, key=lambda pair: (error(pair[1]), pair[0]))
    best = evaluate(sources, [replace(plain, margin=float(margin))], **options)[0]
    factor = "1 (the amax scale itself)" if margin == 0 else f"2^{-margin:+.4g}"
    note = (f"grid search over log2 of the scale factor on amax scales: steps of 1/4 binade "
            f"from x2 to x2^-6, then 1/32 around the best; best factor {factor}")
    return Candidate("mse search", best, note)


def best_of(candidates: list[Candidate], metric: Metric) -> str | None:
    """The candidate with the smallest metric (SQNR: largest); ties: the first listed.
    Only a bounded value ranks: None when every candidate's metric is NaN or an unbounded
    error (an inf/NaN result of a finite input)."""
    ranked = [(metric_value(c.stats, metric), i) for i, c in enumerate(candidates)]
    ranked = [pair for pair in ranked if not math.isnan(pair[0]) and pair[0] != math.inf]
    return candidates[min(ranked)[1]].name if ranked else None
