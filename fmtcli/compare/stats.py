"""The statistics of ``fmt compare``: what one chunk of a (reference, test) pair adds,
merged exactly over chunks, tensors, roles; and the figures made of them (``CompareStats``,
``LogitStats``).  The definitions and their sources are in the package's docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fmtcli.streaming.metrics import (
    HIST_BINS,
    REL_ERROR_RESOLUTION,
    ErrorAccumulator,
    histogram_quantile,
    value_keys,
)

TOP_K = 5  # the top-k overlap of --logits
CROSS = ("sum_x2", "sum_y2", "sum_xy", "sum_e2", "max_abs", "max_rel", "differ", "ref_nan",
         "ref_inf", "test_nan", "test_inf")
LOGIT = ("rows", "bad_rows", "kl_sum", "kl_max", "top1", "topk", "topk_slots")


@dataclass
class Accumulator:
    """Everything ``compare`` keeps of a tensor (or a role, or all): the error statistics of
    ``quantize.metrics`` (reference as x, test as x_q), float64 cross sums, and with logits
    the per-row KL histogram; ``merge`` adds another exactly (histograms, counts)."""

    errors: ErrorAccumulator = field(default_factory=ErrorAccumulator)
    cross: dict = field(default_factory=lambda: dict.fromkeys(CROSS, 0.0))
    logit: dict = field(default_factory=lambda: dict.fromkeys(LOGIT, 0.0))
    kl_hist: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, np.int64))

    def add(self, x: np.ndarray, y: np.ndarray, logits: bool) -> None:
        """One chunk: ``x`` the reference, ``y`` the test, float arrays of one shape and
        dtype (a matrix of whole rows with ``logits``)."""
        self.errors.add_chunk(x, y)
        c = self.cross
        flat_x, flat_y = x.reshape(-1), y.reshape(-1)
        x64, y64 = flat_x.astype(np.float64), flat_y.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            # inf/NaN anywhere make a sum non-finite: then the careful path (rare)
            finite = math.isfinite(float(np.add.reduce(x64)) + float(np.add.reduce(y64)))
            if finite:
                fx, fy = x64, y64
                c["differ"] += int(np.count_nonzero(flat_x != flat_y))
            else:
                both = np.isfinite(x64) & np.isfinite(y64)
                c["ref_nan"] += int(np.isnan(x64).sum())
                c["ref_inf"] += int(np.isinf(x64).sum())
                c["test_nan"] += int(np.isnan(y64).sum())
                c["test_inf"] += int(np.isinf(y64).sum())
                fx, fy = x64[both], y64[both]
                c["differ"] += int(np.count_nonzero((x64 != y64) & ~(np.isnan(x64)
                                                                     & np.isnan(y64))))
            c["sum_x2"] += float(np.dot(fx, fx))
            c["sum_y2"] += float(np.dot(fy, fy))
            c["sum_xy"] += float(np.dot(fx, fy))
            e = np.subtract(fy, fx)
            c["sum_e2"] += float(np.dot(e, e))
            if e.size:
                c["max_abs"] = max(c["max_abs"], float(e.max()), -float(e.min()))
            if finite:  # |e| / |x| in place; x == 0 left out
                rel = np.divide(np.abs(e, out=e), np.abs(x64, out=x64), out=e)
                nonzero = flat_x != 0
                if not nonzero.all():
                    rel = rel[nonzero]
                if rel.size:
                    c["max_rel"] = max(c["max_rel"], float(rel.max()))
            else:
                nonzero = np.isfinite(x64) & (x64 != 0)
                if nonzero.any():
                    rel = np.abs(y64[nonzero] - x64[nonzero]) / np.abs(x64[nonzero])
                    rel[np.isnan(rel)] = np.inf  # a NaN result is an unbounded error
                    c["max_rel"] = max(c["max_rel"], float(rel.max()))
            if logits:
                self._add_logits(x.astype(np.float64), y.astype(np.float64))

    def _add_logits(self, x: np.ndarray, y: np.ndarray) -> None:
        """KL(softmax(x) || softmax(y)) per row (float64), top-1 and top-k agreement."""
        good = (~np.isnan(x) & (x != np.inf)).all(1) & (~np.isnan(y) & (y != np.inf)).all(1)
        good &= np.isfinite(x).any(1) & np.isfinite(y).any(1)
        lg = self.logit
        lg["bad_rows"] += int(x.shape[0] - good.sum())
        x, y = x[good], y[good]
        if not x.shape[0]:
            return
        log_p, log_q = _log_softmax(x), _log_softmax(y)
        p = np.exp(log_p)
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
        kl = np.maximum(terms.sum(1), 0.0)  # >= 0 in exact arithmetic; rounding can dip below
        lg["rows"] += x.shape[0]
        lg["kl_sum"] += float(kl.sum())
        lg["kl_max"] = max(lg["kl_max"], float(kl.max()))
        np.add.at(self.kl_hist, value_keys(kl), 1)
        lg["top1"] += int((x.argmax(1) == y.argmax(1)).sum())
        k = min(TOP_K, x.shape[1])
        top_x = np.argpartition(-x, k - 1, axis=1)[:, :k]
        top_y = np.argpartition(-y, k - 1, axis=1)[:, :k]
        lg["topk"] += int((top_x[:, :, None] == top_y[:, None, :]).any(2).sum())
        lg["topk_slots"] += x.shape[0] * k  # k < 5 where the last axis is shorter

    PACKED = len(ErrorAccumulator.PACKED) + len(CROSS) + len(LOGIT)

    def pack(self, out: np.ndarray) -> None:
        """The scalars (not the histograms) into a float64 row of ``PACKED`` values."""
        n = len(ErrorAccumulator.PACKED)
        self.errors.pack(out[:n])
        out[n:n + len(CROSS)] = [self.cross[k] for k in CROSS]
        out[n + len(CROSS):] = [self.logit[k] for k in LOGIT]

    def merge_packed(self, row: np.ndarray) -> None:
        """Add a chunk's packed scalars (``pack``); histograms are merged separately."""
        n = len(ErrorAccumulator.PACKED)
        self.errors.merge(ErrorAccumulator.unpack(row[:n]), hist=False)
        self._merge_scalars(dict(zip(CROSS, row[n:n + len(CROSS)].tolist())),
                            dict(zip(LOGIT, row[n + len(CROSS):].tolist())))

    def _merge_scalars(self, cross: dict, logit: dict) -> None:
        for name in CROSS:
            self.cross[name] = (max if name.startswith("max") else _add)(self.cross[name],
                                                                    cross[name])
        for name in LOGIT:
            self.logit[name] = (max if name == "kl_max" else _add)(self.logit[name],
                                                                   logit[name])

    def merge(self, other: Accumulator) -> None:
        self.errors.merge(other.errors)
        self._merge_scalars(other.cross, other.logit)
        self.kl_hist += other.kl_hist

    def stats(self, logits: bool) -> CompareStats:
        return CompareStats.from_accumulator(self, logits)


def _add(a: float, b: float) -> float:
    return a + b


def _log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(1, keepdims=True)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.exp(shifted).sum(1, keepdims=True))


@dataclass(frozen=True)
class LogitStats:
    """``--logits``: the rows compared (and left out), KL divergence and top-k agreement."""

    rows: int
    bad_rows: int
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1_agreement: float
    top5_overlap: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CompareStats:
    """The figures of one tensor (a role, the total); see the module docstring."""

    count: int
    nonzero: int
    differ: int
    ref_nan: int
    ref_inf: int
    test_nan: int
    test_inf: int
    unbounded: int
    sqnr_db: float
    cosine: float
    calc_diff: float
    rel_frobenius: float
    max_abs_error: float
    max_rel_error: float
    median_rel_error: float
    p99_rel_error: float
    logits: LogitStats | None = None
    rel_error_resolution: float = REL_ERROR_RESOLUTION

    @classmethod
    def from_accumulator(cls, acc: Accumulator, logits: bool) -> CompareStats:
        e, c, lg = acc.errors, acc.cross, acc.logit
        x2, y2, xy, e2 = c["sum_x2"], c["sum_y2"], c["sum_xy"], c["sum_e2"]
        with np.errstate(divide="ignore", invalid="ignore"):
            sqnr = float(10 * np.log10(np.float64(x2) / np.float64(e2))) if x2 or e2 \
                else math.nan
            frob = math.sqrt(e2 / x2) if x2 else (math.nan if not e2 else math.inf)
            norms = math.sqrt(x2 * y2)  # exact for x == y: a cosine of 1, not 1 - 1e-16
            if not 0 < norms < math.inf:  # the product under- or overflowed
                norms = math.sqrt(x2) * math.sqrt(y2)
            cosine = xy / norms if x2 and y2 else math.nan
            calc_diff = e2 / (x2 + y2) if x2 + y2 else math.nan
        max_abs = c["max_abs"]
        if e.unbounded:
            sqnr, frob, max_abs, cosine, calc_diff = -math.inf, math.inf, math.inf, \
                math.nan, math.nan
        logit = None
        if logits:
            rows = int(lg["rows"])
            logit = LogitStats(
                rows=rows, bad_rows=int(lg["bad_rows"]),
                kl_mean=lg["kl_sum"] / rows if rows else math.nan,
                kl_median=histogram_quantile(acc.kl_hist, rows, 0.5),
                kl_p99=histogram_quantile(acc.kl_hist, rows, 0.99),
                kl_max=lg["kl_max"] if rows else math.nan,
                top1_agreement=lg["top1"] / rows if rows else math.nan,
                top5_overlap=lg["topk"] / lg["topk_slots"] if rows else math.nan)
        return cls(count=e.count, nonzero=e.nonzero, differ=int(c["differ"]),
                   ref_nan=int(c["ref_nan"]), ref_inf=int(c["ref_inf"]),
                   test_nan=int(c["test_nan"]), test_inf=int(c["test_inf"]),
                   unbounded=e.unbounded, sqnr_db=sqnr, cosine=cosine, calc_diff=calc_diff,
                   rel_frobenius=frob, max_abs_error=max_abs,
                   max_rel_error=c["max_rel"] if e.nonzero else math.nan,
                   median_rel_error=e.quantile(0.5), p99_rel_error=e.quantile(0.99),
                   logits=logit)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "logits"}
        if self.logits is not None:
            out["logits"] = self.logits.to_dict()
        return out
