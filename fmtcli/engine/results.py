"""Result objects of ``fmt quantize``: frozen dataclasses with ``to_dict()`` for JSON.

Renderers read their attributes; ``to_dict()`` is the JSON document and nothing else.
``SchemeRun`` is the mergeable state a result's ``SchemeStats`` come from; the scales'
summary is ``scales``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from fmtcli.engine.scales import ScaleStats, ScaleSummary
from fmtcli.inputs.tensors import TensorInfo, skipped_records
from fmtcli.numerics.schemes import Scheme
from fmtcli.streaming.blocks import (
    EXP_BINS,
    WORST_FIELDS,
    BlockAccumulator,
    BlockStats,
    WorstBlock,
    log2_histogram,
)
from fmtcli.streaming.metrics import (
    HIST_BINS,
    REL_ERROR_RESOLUTION,
    ErrorAccumulator,
    histogram_quantile,
    scaled_sum,
)
from fmtcli.streaming.stream import matrix_shape


@dataclass(frozen=True)
class TensorSqnr:
    """The mean of the tensors' SQNR in dB, beside a total's own SQNR (which is weighted by
    energy: sum(x**2) over sum(err**2) of every value, so the tensor of the largest values
    sets it).  Tensors without error (SQNR inf) are not averaged but counted in
    ``lossless``; tensors of zeros (no SQNR) neither; one unbounded error (-inf) makes
    the mean -inf."""

    mean: float
    tensors: int  # tensors averaged
    lossless: int

    @classmethod
    def of(cls, values: list[float]) -> TensorSqnr:
        finite = [v for v in values if math.isfinite(v)]
        lossless = sum(v == math.inf for v in values)
        if any(v == -math.inf for v in values):
            mean = -math.inf
        elif finite:
            mean = math.fsum(finite) / len(finite)
        else:
            mean = math.inf if lossless else math.nan
        return cls(mean, len(finite), lossless)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "tensors": self.tensors, "lossless": self.lossless}


@dataclass(frozen=True)
class SchemeStats:
    """Statistics of one tensor (or the total) under one scheme (as applied to the tensor)."""

    scheme: Scheme
    count: int
    nonzero: int
    zeros: int
    nonfinite_inputs: int
    flushed: int
    flushed_fraction: float
    saturated: int  # rounded past max and clipped back to +-max (metrics)
    overflowed: int
    nan_produced: int
    median_rel_error: float
    p99_rel_error: float
    max_abs_error: float
    rmse: float
    mse: float
    sqnr_db: float
    bias: float
    scales: ScaleStats
    rel_error_resolution: float = REL_ERROR_RESOLUTION
    # floor(log2(scale)) -> blocks using it (None where not known: the CUDA path)
    scale_log2_histogram: dict[int, int] | None = None
    blocks: BlockStats | None = None  # per-block facts (None: scales span the tensor, CUDA)
    above_max: int = 0  # |x * scale| > max: saturated, overflowed, and those rounding to max
    per_tensor_sqnr: TensorSqnr | None = None  # totals: the mean of the tensors' SQNR
    # the median relative error over the blocks that do not hold the tensor's amax (a
    # total: each tensor's amax block left out); None where blocks are not known
    median_rel_error_outside_amax_block: float | None = None

    @classmethod
    def from_accumulator(cls, scheme, acc: ErrorAccumulator, scales: ScaleSummary,
                         exponents: np.ndarray | None = None,
                         blocks: BlockAccumulator | None = None,
                         outside: float | None = None) -> SchemeStats:
        """The statistics of an accumulator.  An inf/NaN result of a finite input is an
        unbounded error (``metrics``): then mse/rmse/max_abs_error are inf, sqnr_db -inf and
        bias NaN, rather than figures over the finite results that would look better."""
        pairs = acc.finite_pairs
        # sums of squares as value * 2**power (float64 data near 1e300 or 1e-300)
        err2, err_power = scaled_sum(acc.sum_err2, acc.sum_err2_big, acc.sum_err2_tiny)
        x2, x_power = scaled_sum(acc.sum_x2, acc.sum_x2_big, acc.sum_x2_tiny)
        rmse = math.ldexp(math.sqrt(err2 / pairs), err_power // 2) if pairs else math.nan
        mse = acc.mse()
        if err2 == 0:
            sqnr = math.inf if x2 > 0 else math.nan
        elif x2 > 0:
            sqnr = 10 * (math.log10(x2 / err2) + (x_power - err_power) * math.log10(2))
        else:
            sqnr = -math.inf
        max_abs = acc.max_abs_err if pairs else math.nan
        bias = acc.sum_err / pairs if pairs else math.nan
        if acc.unbounded:
            rmse = max_abs = math.inf
            sqnr, bias = -math.inf, math.nan
        return cls(
            scheme=scheme, count=acc.count, nonzero=acc.nonzero, zeros=acc.zeros,
            nonfinite_inputs=acc.nonfinite_inputs, flushed=acc.flushed,
            flushed_fraction=acc.flushed / acc.nonzero if acc.nonzero else 0.0,
            saturated=acc.saturated, overflowed=acc.overflowed, nan_produced=acc.nan_produced,
            median_rel_error=acc.quantile(0.5), p99_rel_error=acc.quantile(0.99),
            max_abs_error=max_abs, rmse=rmse, mse=mse, sqnr_db=sqnr, bias=bias,
            scales=scales.stats(),
            scale_log2_histogram=None if exponents is None else log2_histogram(exponents),
            blocks=None if blocks is None else blocks.stats(), above_max=acc.above_max,
            median_rel_error_outside_amax_block=outside)

    @property
    def saturated_fraction(self) -> float:
        """Saturated values over all values (``count``)."""
        return self.saturated / self.count if self.count else 0.0

    @property
    def above_max_fraction(self) -> float:
        """Values with |x * scale| > max over all values (``count``)."""
        return self.above_max / self.count if self.count else 0.0

    @property
    def overflowed_fraction(self) -> float:
        """Values that overflowed to inf/NaN over all values (``count``)."""
        return self.overflowed / self.count if self.count else 0.0

    @property
    def nan_produced_fraction(self) -> float:
        """NaNs produced from non-NaN inputs over all values (``count``)."""
        return self.nan_produced / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        """JSON keys: every count statistic ``X`` comes with ``X_fraction`` (``flushed`` over
        ``nonzero`` inputs, the others over ``count``), and the error with ``rmse`` and ``mse``."""
        out = self.scheme.to_dict()
        out.update({k: getattr(self, k) for k in (
            "count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "flushed_fraction",
            "saturated", "saturated_fraction", "above_max", "above_max_fraction",
            "overflowed", "overflowed_fraction", "nan_produced", "nan_produced_fraction",
            "median_rel_error", "p99_rel_error",
            "max_abs_error", "rmse", "mse", "sqnr_db", "bias", "rel_error_resolution",
            "median_rel_error_outside_amax_block")})
        out["scales"] = self.scales.to_dict()
        out["scale_log2_histogram"] = (None if self.scale_log2_histogram is None else
                                       {str(e): n for e, n in self.scale_log2_histogram.items()})
        out["blocks"] = None if self.blocks is None else self.blocks.to_dict()
        out["per_tensor_sqnr_db"] = (None if self.per_tensor_sqnr is None
                                     else self.per_tensor_sqnr.to_dict())
        return out


@dataclass
class SchemeRun:
    """The mergeable state of one scheme over one tensor, a group of tensors or all of them:
    the error accumulator, the scales used, per-block facts and the worst blocks (rows of
    ``blocks.WORST_FIELDS`` plus the tensor's index).  ``blocks``/``exponents`` are None
    where they are not known (scales spanning the tensor have no blocks; the CUDA path keeps
    neither); a merge with an unknown part leaves it unknown."""

    scheme: Scheme
    acc: ErrorAccumulator
    scales: ScaleSummary
    exponents: np.ndarray | None = None
    blocks: BlockAccumulator | None = None
    worst: np.ndarray = field(default_factory=lambda: np.zeros((0, len(WORST_FIELDS) + 1)))
    sparse: list | None = None  # (bins, counts) of merged histograms, where kept sparse
    # (bins, counts) of the relative errors in each tensor's block holding its amax, and
    # their nonzero inputs: left out of the median outside it (None: blocks not known)
    amax_blocks: list | None = None
    amax_block_nonzero: int = 0

    @classmethod
    def empty(cls, scheme: Scheme, histogram: bool = True) -> SchemeRun:
        """A run to merge others into (``histogram=False``: its histogram is kept sparse,
        as a list of the merged runs' nonzero bins, for the many groups of a checkpoint)."""
        return cls(scheme, ErrorAccumulator(hist=np.zeros(HIST_BINS, np.int64) if histogram
                                            else None), ScaleSummary(),
                   np.zeros(EXP_BINS, np.int64), BlockAccumulator(),
                   sparse=None if histogram else [], amax_blocks=[])

    def merge(self, other: SchemeRun, worst: int = 0) -> None:
        """Add another run (keeping the ``worst`` worst blocks of both)."""
        self.acc.merge(other.acc, hist=self.sparse is None)
        if self.sparse is not None:
            keys = np.flatnonzero(other.acc.hist)
            self.sparse.append((keys, other.acc.hist[keys]))
        self.scales.merge(other.scales)
        if self.exponents is not None and other.exponents is not None:
            self.exponents = self.exponents + other.exponents
        else:
            self.exponents = None
        if self.blocks is not None and other.blocks is not None:
            self.blocks.merge(other.blocks)
        else:
            self.blocks = None
        if worst:
            self.worst = top_blocks(np.concatenate([self.worst, other.worst]), worst)
        if self.amax_blocks is not None and other.amax_blocks is not None:
            self.amax_blocks = self.amax_blocks + other.amax_blocks
            self.amax_block_nonzero += other.amax_block_nonzero
        else:
            self.amax_blocks = None

    def stats(self) -> SchemeStats:
        acc = self.acc
        if self.sparse is not None:
            acc = replace(acc, hist=np.zeros(HIST_BINS, np.int64))
            for keys, counts in self.sparse:
                acc.hist[keys] += counts
        outside = None
        if self.amax_blocks is not None and acc.hist is not None:
            hist = acc.hist.copy()
            for keys, counts in self.amax_blocks:
                hist[keys] -= counts
            outside = histogram_quantile(hist, acc.nonzero - self.amax_block_nonzero, 0.5)
        return SchemeStats.from_accumulator(self.scheme, acc, self.scales, self.exponents,
                                            self.blocks, outside)


def top_blocks(rows: np.ndarray, k: int) -> np.ndarray:
    """The k worst of worst-block rows (``blocks.WORST_FIELDS`` and the tensor's index):
    most flushed, then the largest relative error (NaN last), then the first tensor, row
    and column; rows of NaN (unused slots) are dropped."""
    rows = rows[~np.isnan(rows[:, 0])] if rows.size else rows
    rel = np.where(np.isnan(rows[:, 1]), -np.inf, rows[:, 1])
    order = np.lexsort((rows[:, 3], rows[:, 2], rows[:, -1], -rel, -rows[:, 0]))[:k]
    return rows[order]


@dataclass(frozen=True)
class GroupResult:
    """Tensors whose names differ only in layer indices (``roles.role_of``), merged exactly:
    their statistics per scheme as if they were one tensor."""

    pattern: str
    tensors: tuple[str, ...]  # names, in checkpoint order
    schemes: tuple[SchemeStats, ...]

    @property
    def count(self) -> int:
        """How many tensors share the pattern."""
        return len(self.tensors)

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "tensors": list(self.tensors), "count": self.count,
                "schemes": [s.to_dict() for s in self.schemes]}


@dataclass(frozen=True)
class TensorResult:
    """One input tensor: where it came from, and its statistics per scheme (or why not);
    ``buffer``: a non-weight buffer by name (``roles.is_buffer``); ``in_total``: whether
    the total counts it."""

    tensor: TensorInfo
    schemes: tuple[SchemeStats, ...]
    buffer: bool = False
    in_total: bool = True
    layout: str | None = None  # the values' quantized layout (inputs.layouts), None: stored

    @property
    def skipped(self) -> str | None:
        """Why the tensor was left out (None: it was quantized)."""
        return self.tensor.skipped

    def to_dict(self) -> dict:
        """The tensor's keys and ``matrix`` (the [rows, columns] of the matrix view its
        blocks tile: ``stream.matrix_shape``), then ``skipped`` (why it was left out, or
        null) and ``schemes`` (empty for a skipped tensor): every key always present.
        ``layout``: where the values come from, the quantized layout whose codes and scales
        were dequantized (``deepseek-fp8``...), or null for values as stored."""
        out = self.tensor.to_dict()
        out["layout"] = self.layout
        out["matrix"] = list(matrix_shape(self.tensor.shape))
        out["buffer"] = self.buffer
        out["in_total"] = self.in_total and not self.skipped
        out["skipped"] = self.skipped
        out["schemes"] = [s.to_dict() for s in self.schemes] if not self.skipped else []
        return out


@dataclass(frozen=True)
class QuantizeResult:
    """Every tensor's statistics and, for several tensors, the total per scheme; the
    tensors left out (``skipped``: not floating point, empty) and what ``--out`` wrote."""

    tensors: tuple[TensorResult, ...]
    total: tuple[SchemeStats, ...] | None
    schemes: tuple[Scheme, ...]
    output: dict | None = None
    groups: tuple[GroupResult, ...] = ()  # by role, in checkpoint order
    worst_blocks: tuple[WorstBlock, ...] = ()  # per scheme, worst first (when asked for)
    ran_on: dict | None = None  # a Dask run: where (``distributed.connect``); else None
    buffers_in_total: bool = False  # the total counts the buffers (asked, or all are)

    @property
    def quantized(self) -> list[TensorResult]:
        return [t for t in self.tensors if t.skipped is None]

    def to_dict(self) -> dict:
        first = self.schemes[0].format.name if self.schemes else None
        out = {
            "format": first,
            "schemes": [s.to_dict() for s in self.schemes],
            "tensors": [t.to_dict() for t in self.tensors],
            "total": [s.to_dict() for s in self.total] if self.total else None,
            "buffers_in_total": self.buffers_in_total,
        }
        if self.output:
            out["output"] = self.output
        out["skipped"] = skipped_records(t.tensor for t in self.tensors)
        out["groups"] = [g.to_dict() for g in self.groups]
        out["worst_blocks"] = [b.to_dict() for b in self.worst_blocks]
        if self.ran_on:  # --dask: where it ran (the only key a local run lacks)
            out["dask"] = self.ran_on
        return out
