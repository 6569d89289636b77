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

A side read as an already-quantized layout (``inputs.layouts``: a tensor's codes and scales
dequantized to float32) gets a verdict per tensor beside fmt's own quantization of the
original under the same element format and granularity (``verdict``); its synthetic
float32 dtype needs no ``any_dtype``.  Pairs that look like codes read without their
scales (one byte against a wider dtype, SQNR < 0 dB) are named in one ``RawCodesNote``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fmtcli.base.choices import CHUNK_ELEMENTS
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.compare.stats import Accumulator, CompareStats, LogitStats
from fmtcli.compare.verdict import (
    NO_JUDGEMENT,
    Judgement,
    RawCodesNote,
    judge_pair,
    merged,
    raw_codes_note,
)
from fmtcli.compare.verdict import raw_codes as looks_raw
from fmtcli.inputs import storage
from fmtcli.inputs.checkpoints import repeated_keys, tensor_names
from fmtcli.inputs.tensors import (
    TensorInfo,
    TensorSource,
    dtype_name,
    load_path,
    select_keys,
    skipped_records,
    unusable_reason,
)
from fmtcli.streaming import parallel
from fmtcli.streaming.metrics import HIST_BINS, ErrorAccumulator
from fmtcli.streaming.roles import role_of
from fmtcli.streaming.stream import ChunkReader, chunk_slices, matrix_shape

__all__ = ["Accumulator", "CompareResult", "CompareStats", "Judgement", "LogitStats",
           "RoleComparison", "TensorComparison", "compare_arrays", "compare_files",
           "compare_pair", "compare_sources", "match_sources"]


@dataclass(frozen=True)
class TensorComparison:
    """One matched pair: its name (the key, or ``file:key`` where keys repeat in a folder:
    ``match_sources``), the two tensors' descriptions (file, key, shape, dtype), the
    figures."""

    name: str
    ref: TensorInfo
    test: TensorInfo
    stats: CompareStats
    judgement: Judgement | None = None  # where a side is a quantized layout (``verdict``)

    @property
    def layout(self) -> str | None:
        return self.judgement.layout if self.judgement else None

    def to_dict(self) -> dict:
        """JSON: ``name``, ``key`` (the tensor's name in its file), ``ref_source`` and
        ``test_source`` (the files), ``shape``, the dtypes, the figures, then ``layout``,
        ``fmt_scheme``, ``fmt_sqnr_db``, ``verdict``, ``reasons`` (null and [] where no
        side is a quantized layout: ``verdict.Judgement``)."""
        return {"name": self.name, "key": self.ref.key, "ref_source": self.ref.source,
                "test_source": self.test.source, "shape": list(self.ref.shape),
                "ref_dtype": self.ref.dtype, "test_dtype": self.test.dtype,
                **self.stats.to_dict(),
                **(self.judgement.to_dict() if self.judgement else NO_JUDGEMENT)}


@dataclass(frozen=True)
class RoleComparison:
    """Tensors with the same name but for their layer indices (``quantize.roles``), merged."""

    pattern: str
    count: int
    stats: CompareStats
    fmt_sqnr_db: float | None = None  # fmt's own, merged (``verdict.merged``)
    flagged: int | None = None  # tensors flagged (None: no side is a quantized layout)

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "tensors": self.count, **self.stats.to_dict(),
                "fmt_sqnr_db": self.fmt_sqnr_db, "flagged": self.flagged}


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
    fmt_sqnr_db: float | None = None  # the total's fmt's own (``verdict.merged``)
    flagged: int | None = None  # tensors flagged (None: no side is a quantized layout)

    @property
    def judged(self) -> bool:
        """Whether a side is a quantized layout (each tensor has a verdict)."""
        return self.flagged is not None

    def to_dict(self) -> dict:
        """JSON; ``fmt_sqnr_db`` and ``flagged`` (the total's) are null where no side is a
        quantized layout."""
        return {"ref": self.ref, "test": self.test, "logits": self.logits,
                "tensors": [t.to_dict() for t in self.tensors],
                "roles": [r.to_dict() for r in self.roles], "total": self.total.to_dict(),
                "fmt_sqnr_db": self.fmt_sqnr_db, "flagged": self.flagged,
                "only_in_ref": list(self.only_in_ref), "only_in_test": list(self.only_in_test),
                "skipped": skipped_records(self.skipped)}


# -- matching ------------------------------------------------------------------------------

Pair = tuple[str, TensorSource, TensorSource]


def match_sources(ref: list[TensorSource], test: list[TensorSource], keys: list[str] | None,
                  any_dtype: bool = False, roots: tuple[str | None, str | None] = (None, None)
                  ) -> tuple[list[Pair], list[str], list[str]]:
    """(name, ref, test) pairs in REF's order, names only in REF, names only in TEST.

    Tensors are matched by name (``checkpoints.tensor_names``): the key where it is unique
    on both sides (a sharded checkpoint against a single file), the file and the key
    (``a.pt:w``, the file relative to ``roots``, the paths given) for a key that repeats
    on either side, the file for a tensor without a key in a folder.  A side that is one
    array without a name (``.npy``) pairs with the other side's one tensor (after
    ``keys``).  Shapes must agree, and dtypes unless ``any_dtype``; a mismatch is a
    ``DataError`` naming the tensor."""
    if keys and not any(s.key is not None for s in ref + test):
        raise UsageError(Param("key", keys[0]) + ": REF and TEST are single arrays, with no "
                         "tensor names to pick")
    repeated = repeated_keys(ref) | repeated_keys(test)  # of the whole sides: --key keeps it
    ref = select_keys(ref, keys) if keys and any(s.key for s in ref) else ref
    test = select_keys(test, keys) if keys and any(s.key for s in test) else test
    if len(ref) == 1 and len(test) == 1 and (ref[0].key is None or test[0].key is None):
        pairs = [(ref[0].key or test[0].key or ref[0].source, ref[0], test[0])]
        only_ref, only_test = [], []
    elif any(len(side) == 1 and side[0].key is None for side in (ref, test)):
        one, many = ("REF", test) if len(ref) == 1 and ref[0].key is None else ("TEST", ref)
        raise UsageError(f"{one} is one array and the other side holds {len(many):,} "
                         "tensors: choose one with --key NAME")
    else:
        ref_names, test_names = (_names(side, label, root, repeated) for side, label, root
                                 in ((ref, "REF", roots[0]), (test, "TEST", roots[1])))
        by_name = dict(zip(test_names, test))
        pairs = [(n, s, by_name[n]) for n, s in zip(ref_names, ref) if n in by_name]
        only_ref = [n for n in ref_names if n not in by_name]
        in_ref = set(ref_names)
        only_test = [n for n in test_names if n not in in_ref]
        if not pairs:
            why = (f" (names that repeat across a folder's files are matched by file and "
                   f"name: {_listing(sorted(repeated))})" if repeated else "")
            raise DataError(f"REF and TEST have no tensor name in common{why}",
                            f"REF: {_listing(only_ref)}; TEST: {_listing(only_test)}")
    for name, r, t in pairs:
        if tuple(r.shape) != tuple(t.shape):
            raise DataError(f"{shown(name)}: shapes differ: REF {_shape(r)}, TEST {_shape(t)}")
        if (r.dtype != t.dtype and not any_dtype and not (r.skipped or t.skipped)
                and r.quantized is None and t.quantized is None):  # dequantized: float32
            raise DataError(f"{shown(name)}: dtypes differ: REF {r.dtype}, TEST {t.dtype} "
                            "(--any-dtype compares them as float64)")
    return pairs, only_ref, only_test


def _names(side: list[TensorSource], label: str, root: str | None, repeated: set[str]
           ) -> list[str]:
    """The names of one side's tensors; two tensors of one name (one file holding a key
    twice, as nested dicts can) are a ``DataError``: nothing says which to match."""
    names = tensor_names(side, root, repeated)
    seen: dict[str, TensorSource] = {}
    for name, s in zip(names, side):
        if name in seen:
            raise DataError(f"{label} holds two tensors named {shown(name)} (in "
                            f"{shown(seen[name].source)} and {shown(s.source)}): nothing "
                            "says which to compare")
        seen[name] = s
    return names


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
    """Compare every pair of tensors ``match_sources`` makes of ``ref`` and ``test``
    (``ref_name`` and ``test_name``, the paths given, are what file names are relative
    to); roles merge tensors by key (``quantize.roles``), whatever their files."""
    pairs, only_ref, only_test = match_sources(ref, test, keys, any_dtype,
                                               (ref_name, test_name))
    usable = [(n, r, t) for n, r, t in pairs if not (r.skipped or t.skipped)]
    skipped = tuple(s.info() for _, r, t in pairs for s in (r, t) if s.skipped)
    if not usable:
        reasons = dict.fromkeys(f"{shown(s.key or s.name)}: {s.skipped}" for s in skipped)
        raise DataError("no floating-point tensor to compare", "; ".join(list(reasons)[:4]))
    judged = any(s.quantized is not None for _, r, t in usable for s in (r, t))
    itemsize = {n: storage.itemsize(r.dtype) for n, r, _ in usable}  # no ml_dtypes
    all_bytes = sum(r.size * itemsize[n] for n, r, _ in usable)
    done, tensors, raw, members = 0, [], {}, []
    roles: dict[str, list] = {}
    for name, r, t in usable:
        if on_tensor:
            on_tensor(name)
        acc = compare_pair(r, t, logits, chunk_elements, workers,
                           (lambda n, d=done, b=itemsize[name]: progress(d + n * b, all_bytes))
                           if progress else None)
        done += r.size * itemsize[name]
        stats = acc.stats(logits)
        judgement = judge_pair(r, t, stats, acc, chunk_elements=chunk_elements,
                               workers=workers) if judged else None
        tensors.append(TensorComparison(name, r.info(), t.info(), stats, judgement))
        if looks_raw(r, t, stats):
            raw[name] = tuple(sorted((r.dtype, t.dtype), key=storage.itemsize))
        members.append((acc, judgement))
        roles.setdefault(role_of(name if r.key is None else r.key), []).append(members[-1])
    if raw:
        import warnings

        warnings.warn(raw_codes_note(list(raw), raw), RawCodesNote, stacklevel=2)
    return _result(ref_name, test_name, logits, tensors, roles, members, judged,
                   (only_ref, only_test, skipped))


def _merged(members: list, logits: bool, judged: bool) -> tuple:
    """(stats, fmt's own SQNR, flagged) of (accumulator, judgement) pairs, merged."""
    total = Accumulator()
    for acc, _ in members:
        total.merge(acc)
    own, flagged = merged([j for _, j in members]) if judged else (None, None)
    return total.stats(logits), own, flagged


def _result(ref_name: str, test_name: str, logits: bool, tensors: list, roles: dict,
            members: list, judged: bool, rest: tuple) -> CompareResult:
    """The result: roles merged in their members' order, the total in the tensors'."""
    role_results = tuple(RoleComparison(p, len(m), *_merged(m, logits, judged))
                         for p, m in roles.items())
    stats, own, flagged = _merged(members, logits, judged)
    only_ref, only_test, skipped = rest
    return CompareResult(
        ref=ref_name, test=test_name, logits=logits, tensors=tuple(tensors),
        roles=role_results, total=stats, only_in_ref=tuple(only_ref),
        only_in_test=tuple(only_test), skipped=skipped, fmt_sqnr_db=own, flagged=flagged)


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
