"""How far is TEST from REF?  Two tensors, or two checkpoints matched by tensor name.

The figures people write by hand when they compare a reference run with a low-precision
one (or a checkpoint with its dequantized copy), over whole tensors, streamed in chunks:

- ``sqnr_db`` = 10 log10(sum x**2 / sum (y - x)**2), x the reference, y the test: torchao's
  ``compute_error`` (``torchao/quantization/utils.py``: 20 log10(||x|| / ||x - y||));
- ``cosine`` = sum x y / sqrt(sum x**2 sum y**2);
- ``calc_diff`` = 1 - 2 sum x y / sum (x**2 + y**2): DeepGEMM's test metric
  (``deep_gemm/testing/numeric.py``), computed as sum (x - y)**2 / sum (x**2 + y**2), its
  exact equal that does not cancel (DeepGEMM's form loses every digit below 1e-16);
- ``rel_frobenius`` = ||y - x|| / ||x||;
- ``max_abs_error``; ``max_rel_error`` (exact) and the median and p99 of |y - x| / |x| over
  the nonzero reference values, from the exact histogram of ``quantize.metrics`` (the lower
  edge of a bin 2**-7 wide: quantiles do not depend on chunks or workers);
- ``differ``: elements where y != x (NaN against NaN counts as equal); NaN and inf counts
  on each side.

Elements whose reference is inf or NaN are left out of every figure (counted).  Where the
reference is finite and the test is not (``unbounded``, as in ``quantize.metrics``): SQNR is
-inf, the relative Frobenius and max errors inf, cosine and calc_diff NaN (undefined), so a
test that makes NaN never looks better than one that is merely wrong.  Sums are float64,
summed chunk by chunk in chunk order (the last bits can differ between chunk sizes, never
between worker counts); float64 data beyond ~1e154 overflows their squares (the figures
made of sums are then NaN or 0: the maxima and quantiles stay right).

``logits=True`` reads the last axis as logits (a row per token): the KL divergence
KL(softmax(x) || softmax(y)) of each row, as llama.cpp's ``perplexity --kl-divergence``
reports it (mean, median, p99, max), top-1 agreement (its "same top p") and the mean
overlap of the top-5 sets.  Rows with NaN or +inf on either side are counted and left out.

Workers: the chunks of a tensor go to forked workers (``quantize.parallel``); each writes
its chunks' statistics into shared memory and the parent merges them in chunk order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .choices import CHUNK_ELEMENTS
from .errors import DataError, UsageError, shown
from .quantize import parallel
from .quantize.metrics import (
    HIST_BINS,
    REL_ERROR_RESOLUTION,
    ErrorAccumulator,
    histogram_quantile,
    value_keys,
)
from .quantize.roles import role_of
from .quantize.stream import ChunkReader, chunk_slices, matrix_shape
from .tensors import (
    TensorInfo,
    TensorSource,
    dtype_name,
    load_path,
    numpy_dtype,
    select_keys,
    skipped_records,
    unusable_reason,
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


@dataclass(frozen=True)
class TensorComparison:
    """One matched pair: the reference's description, the test's dtype, the figures."""

    name: str
    ref: TensorInfo
    test: TensorInfo
    stats: CompareStats

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.ref.shape), "ref_dtype": self.ref.dtype,
                "test_dtype": self.test.dtype, **self.stats.to_dict()}


@dataclass(frozen=True)
class RoleComparison:
    """Tensors with the same name but for their layer indices (``quantize.roles``), merged."""

    pattern: str
    count: int
    stats: CompareStats

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "tensors": self.count, **self.stats.to_dict()}


@dataclass(frozen=True)
class CompareResult:
    """All of ``fmt compare``: the pairs in REF's order, roles, total, names on one side."""

    ref: str
    test: str
    logits: bool
    tensors: tuple[TensorComparison, ...]
    roles: tuple[RoleComparison, ...]
    total: CompareStats
    only_in_ref: tuple[str, ...]
    only_in_test: tuple[str, ...]
    skipped: tuple[TensorInfo, ...]

    def to_dict(self) -> dict:
        return {"ref": self.ref, "test": self.test, "logits": self.logits,
                "tensors": [t.to_dict() for t in self.tensors],
                "roles": [r.to_dict() for r in self.roles], "total": self.total.to_dict(),
                "only_in_ref": list(self.only_in_ref), "only_in_test": list(self.only_in_test),
                "skipped": skipped_records(self.skipped)}


# -- matching ------------------------------------------------------------------------------

Pair = tuple[str, TensorSource, TensorSource]


def match_sources(ref: list[TensorSource], test: list[TensorSource], keys: list[str] | None,
                  any_dtype: bool = False) -> tuple[list[Pair], list[str], list[str]]:
    """(name, ref, test) pairs in REF's order, names only in REF, names only in TEST.

    A side that is one array without a name (``.npy``) pairs with the other side's one
    tensor (after ``keys``).  Shapes must agree, and dtypes unless ``any_dtype``; a
    mismatch is a ``DataError`` naming the tensor."""
    if keys and not any(s.key is not None for s in ref + test):
        raise UsageError(f"key={shown(keys[0])}: REF and TEST are single arrays, with no "
                         "tensor names to pick")
    ref = select_keys(ref, keys) if keys and any(s.key for s in ref) else ref
    test = select_keys(test, keys) if keys and any(s.key for s in test) else test
    if len(ref) == 1 and len(test) == 1 and (ref[0].key is None or test[0].key is None):
        pairs = [(ref[0].key or test[0].key or ref[0].source, ref[0], test[0])]
        only_ref, only_test = [], []
    elif any(s.key is None for s in ref + test):
        one, many = ("REF", test) if any(s.key is None for s in ref) else ("TEST", ref)
        raise UsageError(f"{one} is one array and the other side holds {len(many):,} "
                         "tensors: choose one with --key NAME")
    else:
        by_key = {s.key: s for s in test}
        names = {s.key for s in ref}
        pairs = [(s.key, s, by_key[s.key]) for s in ref if s.key in by_key]
        only_ref = [s.key for s in ref if s.key not in by_key]
        only_test = [s.key for s in test if s.key not in names]
        if not pairs:
            raise DataError("REF and TEST have no tensor name in common",
                            f"REF: {_listing(only_ref)}; TEST: {_listing(only_test)}")
    for name, r, t in pairs:
        if tuple(r.shape) != tuple(t.shape):
            raise DataError(f"{shown(name)}: shapes differ: REF {_shape(r)}, TEST {_shape(t)}")
        if r.dtype != t.dtype and not any_dtype and not (r.skipped or t.skipped):
            raise DataError(f"{shown(name)}: dtypes differ: REF {r.dtype}, TEST {t.dtype} "
                            "(--any-dtype compares them as float64)")
    return pairs, only_ref, only_test


def _shape(s: TensorSource) -> str:
    return str(tuple(s.shape))


def _listing(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:4]) + (", ..." if len(names) > 4 else "") \
        if names else "none"


# -- the work ------------------------------------------------------------------------------

def compare_pair(ref: TensorSource, test: TensorSource, logits: bool = False,
                 chunk_elements: int = CHUNK_ELEMENTS, workers: int | None = None,
                 progress: Callable[[int], None] | None = None) -> Accumulator:
    """The merged statistics of one pair, read in chunks of whole rows (whole rows of the
    last axis always with ``logits``), on ``workers`` forked processes."""
    rows, cols = matrix_shape(tuple(ref.shape))
    if logits and not ref.shape:
        raise UsageError(f"--logits reads the last axis as logits; {shown(ref.name)} is a "
                         "scalar")
    chunks = chunk_slices(rows, cols, [], max(chunk_elements, cols) if logits
                          else chunk_elements)
    readers = ChunkReader(ref), ChunkReader(test)
    mixed = readers[0].dtype != readers[1].dtype
    workers = parallel.default_workers() if workers is None else max(1, workers)
    workers = min(workers, len(chunks))
    packed = parallel.work_array((len(chunks), Accumulator.PACKED), np.float64, workers > 1)
    hists = parallel.work_array((workers, 2, HIST_BINS), np.int64, workers > 1)

    def task(item: int, worker: int) -> int:
        r, c = chunks[item]
        x, y = (reader.read(r, c) for reader in readers)
        if mixed:
            x, y = x.astype(np.float64), y.astype(np.float64)
        acc = Accumulator(ErrorAccumulator(hist=hists[worker, 0]), kl_hist=hists[worker, 1])
        acc.add(x, y, logits)
        acc.pack(packed[item])
        return x.size

    try:
        parallel.run_tasks(task, len(chunks), workers, progress)
    finally:
        for reader in readers:
            reader.close()
    total = Accumulator(ErrorAccumulator(hist=hists[:, 0].sum(0)), kl_hist=hists[:, 1].sum(0))
    for row in packed:  # chunk order: the sums do not depend on the workers
        total.merge_packed(row)
    return total


def compare_sources(ref: list[TensorSource], test: list[TensorSource], ref_name: str,
                    test_name: str, keys: list[str] | None = None, logits: bool = False,
                    any_dtype: bool = False, chunk_elements: int = CHUNK_ELEMENTS,
                    workers: int | None = None, on_tensor: Callable[[str], None] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> CompareResult:
    """Compare every pair of tensors ``match_sources`` makes of ``ref`` and ``test``."""
    pairs, only_ref, only_test = match_sources(ref, test, keys, any_dtype)
    usable = [(n, r, t) for n, r, t in pairs if not (r.skipped or t.skipped)]
    skipped = tuple(s.info() for _, r, t in pairs for s in (r, t) if s.skipped)
    if not usable:
        reasons = dict.fromkeys(f"{shown(s.key or s.name)}: {s.skipped}" for s in skipped)
        raise DataError("no floating-point tensor to compare", "; ".join(list(reasons)[:4]))
    itemsize = {n: numpy_dtype(r.dtype).itemsize for n, r, _ in usable}
    all_bytes = sum(r.size * itemsize[n] for n, r, _ in usable)
    done = 0
    tensors, roles, total = [], {}, Accumulator()
    for name, r, t in usable:
        if on_tensor:
            on_tensor(name)
        acc = compare_pair(r, t, logits, chunk_elements, workers,
                           (lambda n, d=done, b=itemsize[name]: progress(d + n * b, all_bytes))
                           if progress else None)
        done += r.size * itemsize[name]
        tensors.append(TensorComparison(name, r.info(), t.info(), acc.stats(logits)))
        role = role_of(name)
        if role not in roles:
            roles[role] = [0, Accumulator()]
        roles[role][0] += 1
        roles[role][1].merge(acc)
        total.merge(acc)
    return CompareResult(
        ref=ref_name, test=test_name, logits=logits, tensors=tuple(tensors),
        roles=tuple(RoleComparison(p, n, a.stats(logits)) for p, (n, a) in roles.items()),
        total=total.stats(logits), only_in_ref=tuple(only_ref),
        only_in_test=tuple(only_test), skipped=skipped)


def compare_files(ref: str, test: str, keys: list[str] | None = None, logits: bool = False,
                  any_dtype: bool = False, chunk_elements: int = CHUNK_ELEMENTS,
                  workers: int | None = None, **callbacks) -> CompareResult:
    """``fmt compare REF TEST``: the files (or model folders) loaded lazily and compared."""
    if ref == "-" and test == "-":
        raise UsageError("'-' (standard input) is given twice; it can be read once")
    return compare_sources(load_path(ref), load_path(test), ref, test, keys, logits,
                           any_dtype, chunk_elements, workers, **callbacks)


def _in_memory(side: str, data) -> list[TensorSource]:
    """An array, or a dict of name -> array, as the sources ``compare_sources`` takes."""
    items = data.items() if isinstance(data, dict) else [(None, data)]
    sources = []
    for key, value in items:
        array = np.asarray(value)
        reason = unusable_reason(array.dtype, array.size)
        sources.append(TensorSource(side, key, array.shape, dtype_name(array.dtype),
                                    None if reason else (lambda a=array: a), reason))
    return sources


def compare_arrays(ref, test, logits: bool = False, **options) -> CompareResult:
    """``fmt compare`` of arrays in memory: two arrays, or two dicts of name -> array
    (matched by name); ``options`` as ``compare_sources`` takes them (``keys``,
    ``any_dtype``, ``chunk_elements``, ``workers``)."""
    return compare_sources(_in_memory("<ref>", ref), _in_memory("<test>", test), "<ref>",
                           "<test>", logits=logits, **options)
