"""The worst tensors of a checkpoint under one scheme, by a metric: pure functions on results.

Metrics (the names of ``fmt quantize --sort``), worst first:

- ``flushed``: the fraction of nonzero values flushed to zero, largest first.  The default
  of the report: a flushed value is lost whole (a 100% error), which SQNR (dominated by the
  largest values) hides and the p99 misses until 1% of the tensor flushes, while the
  median is about the format's half-ulp for every tensor.  Most tensors of a healthy
  checkpoint flush nothing: the ties below order them;
- ``p99``: the 99th-percentile relative error, largest first;
- ``sqnr``: signal-to-quantization-noise ratio, smallest first;
- ``median``: the median relative error, largest first;
- ``saturated``: the fraction of values clipped to the format's max, largest first.

Ties go to the larger flushed fraction, then the larger p99, then the lower SQNR, then to
the tensor that comes first in the checkpoint.  NaN (no nonzero value, no signal) sorts
last.  Roles (``results.GroupResult``) rank the same way (``worst_tensors`` takes anything
with ``schemes``); ``blocks_worst_first`` ranks them by their blocks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fmtcli.engine.results import SchemeStats, TensorResult

METRICS = ("flushed", "p99", "sqnr", "median", "saturated")
DEFAULT_METRIC = "flushed"


def _worse_first(value: float, larger_is_worse: bool) -> float:
    """A sort key that puts the worst value first and NaN (undefined) last."""
    if math.isnan(value):
        return math.inf
    return -value if larger_is_worse else value


def badness(stats: SchemeStats, sort: str) -> tuple[float, ...]:
    """The sort key of one tensor's statistics under the metric ``sort`` (smaller: worse)."""
    if sort not in METRICS:
        from fmtcli.base.errors import Param, UsageError

        raise UsageError(Param("sort", sort) + f": must be one of {', '.join(METRICS)}")
    value, larger = {
        "p99": (stats.p99_rel_error, True),
        "sqnr": (stats.sqnr_db, False),
        "flushed": (stats.flushed_fraction, True),
        "median": (stats.median_rel_error, True),
        "saturated": (stats.saturated_fraction, True),
    }[sort]
    return (_worse_first(value, larger), _worse_first(stats.flushed_fraction, True),
            _worse_first(stats.p99_rel_error, True), _worse_first(stats.sqnr_db, False))


def worst_tensors(tensors: list[TensorResult], sort: str = DEFAULT_METRIC,
                  scheme: int = -1, top: int = 10) -> list[TensorResult]:
    """The ``top`` worst of the quantized ``tensors`` by the metric ``sort`` under their
    ``scheme``-th scheme (an index into each tensor's schemes; -1: the last, the chosen
    scheme of a comparison)."""
    if top < 0:
        from fmtcli.base.errors import Param, UsageError

        raise UsageError(Param("top", top) + ": must be >= 0")
    ranked = sorted(((badness(t.schemes[scheme], sort), i, t)
                     for i, t in enumerate(tensors) if t.schemes), key=lambda r: r[:2])
    return [t for _, _, t in ranked[:top]]


def blocks_worst_first(groups: list, top: int, scheme: int = -1) -> list:
    """The ``top`` of ``groups`` (roles or tensors) whose blocks under their ``scheme``-th
    scheme flush most (the fraction of blocks with a value flushed), then saturate most,
    then the first in the checkpoint; those without blocks are left out."""
    ranked = sorted(((-g.schemes[scheme].blocks.flushing_fraction,
                      -g.schemes[scheme].blocks.saturating_fraction, i, g)
                     for i, g in enumerate(groups)
                     if g.schemes and g.schemes[scheme].blocks is not None),
                    key=lambda r: r[:3])
    return [g for *_, g in ranked[:top]]
