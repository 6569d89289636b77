"""Scaled quantization of tensors, streamed in chunks: ``x_q = cast(x * scale) / scale``.

A tensor is read as a matrix (see ``schemes``) in chunks of whole rows (or, for a single
long row, of column ranges aligned to every block size), about ``chunk_elements`` values
each.  Per chunk and scheme the work is: the amax of every tile, its scale, the scaled cast
(a few float32 passes; ``rounding.round_float32_nearest_even`` for the usual formats), the
division back, and every statistic (``metrics.ErrorAccumulator``).  Tiles that span more
rows than a chunk holds (per-tensor, per-column) get their amax in a first, cheap pass.
Chunks run on a small thread pool (numpy releases the GIL) and their statistics merge in
chunk order, so results are deterministic.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .errors import DataError, UsageError
from .metrics import HIST_BINS, ErrorAccumulator
from .output import NpyWriter, codes_of, write_codes
from .results import QuantizeResult, ScaleSummary, SchemeStats, TensorResult
from .rounding import (
    OverflowPolicy, RoundingMode, apply_range, magic_rounding_applies, round_float32_nearest_even,
    round_unbounded,
)
from .scaling import amax_to_scale, scale_to_e4m3
from .schemes import Scheme, ScaleFormat, for_tensor
from .tensors import TensorSource

CHUNK_ELEMENTS = 1 << 18

Progress = Callable[[int, int], None]


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the matrix view: all leading dimensions by the last one."""
    if len(shape) == 0:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


@dataclass
class _Plan:
    """One scheme applied to one tensor: its tile and, if global, its precomputed scales."""

    scheme: Scheme
    tile: tuple[int, int]
    is_global: bool
    scales: np.ndarray | None = None  # global schemes: (1, n_tile_columns)
    tensor_scale: float | None = None  # NVFP4's float32 per-tensor scale


_MAGNITUDE = {np.dtype(np.float32): (np.uint32, np.uint32(0x7FFFFFFF)),
              np.dtype(np.float64): (np.uint64, np.uint64(0x7FFFFFFFFFFFFFFF))}


def _tile_amax(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """amax of every (tr x tc) tile of a 2-D chunk; ragged edges count as smaller tiles.

    Computed on the bit patterns with the sign cleared: for IEEE floats their order as
    unsigned integers is the order of the magnitudes, and NaN patterns sort above inf, so a
    tile holding NaN gets a NaN amax (as torch.amax).  Integer max is the faster reduction.
    """
    rows, cols = x.shape
    pr, pc = (-rows) % tr, (-cols) % tc
    carrier, mask = _MAGNITUDE[x.dtype]
    a = np.bitwise_and(x.view(carrier), mask)
    if pr or pc:
        a = np.pad(a, ((0, pr), (0, pc)))
    if tr == 1:
        amax = a.reshape(a.shape[0], -1, tc).max(axis=2)
    else:
        amax = a.reshape(a.shape[0] // tr, tr, -1, tc).max(axis=(1, 3))
    return amax.view(x.dtype)


def _scales_for(amax: np.ndarray, plan: _Plan) -> np.ndarray:
    """float32 scales for tile amaxes under the plan's scheme (x_q = cast(x*scale)/scale)."""
    scheme = plan.scheme
    if scheme.scale_format is ScaleFormat.E4M3_FP32:
        # NVFP4: decode scale per block d = e4m3(amax / max_elem * g), g the tensor scale;
        # the element is cast(x * g / d).  A block whose d underflows to 0 decodes to 0.
        g = np.float32(plan.tensor_scale)
        decode = scale_to_e4m3(amax.astype(np.float32) / np.float32(scheme.format.max) * g)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = g / decode
        return np.where(amax == 0, np.float32(1), scale).astype(np.float32)
    return amax_to_scale(amax, scheme.format, scheme.scale_rule, scheme.margin)


def _nvfp4_tensor_scale(amax: float, scheme: Scheme) -> float:
    """NVFP4's per-tensor float32 scale: amax maps to max_elem * max_e4m3 (6 * 448)."""
    if not (amax > 0) or not math.isfinite(amax):
        return 1.0
    return float(np.float32(scheme.format.max * 448.0) / np.float32(amax))


class _ChunkKernel:
    """The per-chunk work of one scheme: scale, cast, divide back, accumulate statistics."""

    def __init__(self, plan: _Plan, seed: int) -> None:
        self.plan = plan
        self.spec = plan.scheme.format
        self.seed = seed
        self.fast = (plan.scheme.rounding is RoundingMode.NEAREST_EVEN
                     and magic_rounding_applies(self.spec))

    def run(self, x: np.ndarray, chunk_index: int, hist: np.ndarray, keep: str | None):
        """Quantize one chunk; returns (accumulator, scales of its tiles or None, kept array).

        ``keep``: None, "values" (x_q) or "codes" (the rounded x * scale, on the format's grid).
        """
        plan, spec, scheme = self.plan, self.spec, self.plan.scheme
        tr, tc = plan.tile
        rows, cols = x.shape
        if plan.is_global:
            tr = rows  # the chunk is one band of the global tiles
        pr, pc = (-rows) % tr, (-cols) % tc
        xp = np.pad(x, ((0, pr), (0, pc))) if (pr or pc) else x
        padding = xp.size - x.size
        local_scales = x_max = None
        if plan.is_global:
            scale = plan.scales
        else:
            amax = _tile_amax(xp, tr, tc)
            x_max = float(amax.max())
            scale = _scales_for(amax, plan)
            local_scales = scale
        shape4 = (xp.shape[0] // tr, tr, xp.shape[1] // tc, tc)
        s4 = scale[:, None, :, None]
        xs = np.multiply(xp.reshape(shape4), s4)
        flat = xs.reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            if self.fast and flat.dtype == np.float32:
                r = round_float32_nearest_even(flat, spec)
            else:
                rng = np.random.default_rng((self.seed, chunk_index))
                r = round_unbounded(flat, spec, scheme.rounding, rng)
            counts: dict = {}
            r = apply_range(flat, r, spec, scheme.rounding, scheme.overflow, counts)
        saturated = overflowed = 0
        if counts["beyond"]:
            became = int(np.count_nonzero(~np.isfinite(r))) - int(np.count_nonzero(~np.isfinite(flat)))
            overflowed = max(became, 0)
            saturated = counts["beyond"] - overflowed
        with np.errstate(invalid="ignore", divide="ignore"):
            x_q = np.divide(r.reshape(shape4), s4, out=xs)
            dead = np.isinf(scale)
            if dead.any():  # NVFP4 blocks whose decode scale underflowed decode to 0
                x_q[np.broadcast_to(dead[:, None, :, None], shape4)] = 0
        x_q = x_q.reshape(xp.shape)
        kept = None
        if keep == "codes":
            kept = r.reshape(xp.shape)[:rows, :cols].copy()
        acc = ErrorAccumulator(hist=hist)
        acc.add_chunk(xp, x_q, saturated, overflowed, padding, x_max=x_max)
        if keep == "values":
            kept = x_q[:rows, :cols]
        return acc, local_scales, kept


def _chunks(rows: int, cols: int, plans: list[_Plan], chunk_elements: int):
    """(row slice, column slice) of every chunk, aligned to the local tiles."""
    local_tr = [p.tile[0] for p in plans if not p.is_global] or [1]
    local_tc = [p.tile[1] for p in plans if not p.is_global] or [1]
    if rows == 1 and cols > chunk_elements:  # one long row: chunk along the columns
        step = math.lcm(*local_tc)
        step *= max(1, chunk_elements // step)
        return [(slice(0, 1), slice(c, min(c + step, cols))) for c in range(0, cols, step)]
    step = math.lcm(*local_tr)
    step *= max(1, chunk_elements // max(1, cols * step))
    return [(slice(r, min(r + step, rows)), slice(0, cols)) for r in range(0, rows, step)]


class _Reader:
    """Reads chunks of a tensor's matrix view as float32 (float64 for float64 data).

    Chunks are contiguous element ranges (whole rows, or a column range of a single row).
    A memory-mapped file is read with ``os.preadv`` into a fresh buffer rather than through
    the map: no page faults, and the file's pages do not pile up in this process's memory.
    """

    def __init__(self, source: TensorSource) -> None:
        self.array = source.array()
        rows, cols = matrix_shape(source.shape)
        self.cols = cols
        self.matrix = self.array.reshape(rows, cols)
        self.dtype = np.float64 if self.array.dtype == np.float64 else np.float32
        self.fd = None
        arr = self.array
        if (isinstance(arr, np.memmap) and arr.flags.c_contiguous and getattr(arr, "filename", None)
                and hasattr(os, "preadv")):
            self.fd = os.open(arr.filename, os.O_RDONLY)
            self.offset = arr.offset
            self.source_dtype = arr.dtype

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        if self.fd is not None:
            buffer = np.empty(shape, dtype=self.source_dtype)
            start = (rows.start * self.cols + cols.start) * self.source_dtype.itemsize
            view, done = memoryview(buffer.reshape(-1).view(np.uint8)), 0
            while done < len(view):
                got = os.preadv(self.fd, [view[done:]], self.offset + start + done)
                if got <= 0:
                    raise DataError("the file ended early (truncated while reading?)")
                done += got
            return buffer if buffer.dtype == self.dtype else buffer.astype(self.dtype)
        block = self.matrix[rows, cols]
        out = np.empty(block.shape, dtype=self.dtype)
        np.copyto(out, block, casting="unsafe")
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _pool_map(function, items, threads: int):
    """Map in order with at most 2 * threads items in flight (bounded memory)."""
    if threads <= 1:
        for item in items:
            yield function(item)
        return
    with ThreadPoolExecutor(threads) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_MALLOC_TUNED = False


def keep_freed_memory() -> None:
    """Ask glibc to keep freed chunk buffers for reuse instead of returning them to the OS.

    Every chunk allocates a few arrays of about a megabyte; by default glibc serves those
    with fresh mmap pages or trims them away on free, and the page faults cost more than
    the arithmetic (measured: 11 ns instead of 4 ns per element for the statistics).  Raising
    the mmap and trim thresholds keeps them in the heap.  No effect where glibc is absent.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 64 << 20)
        libc.mallopt(m_trim_threshold, 512 << 20)
    except (OSError, AttributeError):
        pass


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def quantize_tensor(source: TensorSource, schemes: list[Scheme], *, seed: int = 0,
                    chunk_elements: int = CHUNK_ELEMENTS, threads: int | None = None,
                    progress: Progress | None = None, keep: int | None = None,
                    keep_mode: str = "values", sink: Callable | None = None):
    """Quantize one tensor under every scheme.

    Returns a list of (scheme as applied, accumulator, scale summary) and, with ``keep`` (a
    scheme index), that scheme's scale grid (tiles of the matrix view) and tile shape; the
    kept scheme's per-chunk output goes to ``sink(row_slice, col_slice, array)``.
    """
    threads = default_threads() if threads is None else threads
    reader = _Reader(source)
    try:
        return _quantize_tensor(reader, source, schemes, seed, chunk_elements, threads,
                                progress, keep, keep_mode, sink)
    finally:
        reader.close()


def _quantize_tensor(reader, source, schemes, seed, chunk_elements, threads, progress, keep,
                     keep_mode, sink):
    rows, cols = matrix_shape(source.shape)
    plans = []
    for scheme in schemes:
        scheme = for_tensor(scheme, source.key, len(source.shape))
        tile = scheme.tile_shape(rows, cols)
        spans_rows = tile[0] >= rows and rows > 1
        spans_row = rows == 1 and tile[1] >= cols
        plans.append(_Plan(scheme, tile, spans_rows or spans_row
                           or scheme.scale_format is ScaleFormat.E4M3_FP32))
    chunks = _chunks(rows, cols, plans, chunk_elements)
    total = rows * cols * (2 if any(p.is_global for p in plans) else 1)
    done = _global_pass(reader, chunks, plans, threads, progress, total) \
        if any(p.is_global for p in plans) else 0
    kernels = [_ChunkKernel(p, seed) for p in plans]
    hists: dict[int, list[np.ndarray]] = {}

    def work(item):
        index, (rs, cs) = item
        x = reader.read(rs, cs)
        local = hists.setdefault(threading.get_ident(),
                                 [np.zeros(HIST_BINS, np.int64) for _ in plans])
        return x.size, [k.run(x, index, local[i], keep_mode if keep == i else None)
                        for i, k in enumerate(kernels)]

    accs = [ErrorAccumulator(hist=np.zeros(HIST_BINS, np.int64)) for _ in plans]
    summaries = [ScaleSummary() for _ in plans]
    kept_scales: list[np.ndarray] = []
    for (size, results), (rs, cs) in zip(_pool_map(work, enumerate(chunks), threads), chunks):
        for i, (acc, scales, out) in enumerate(results):
            accs[i].merge(acc, hist=False)
            if scales is not None:
                summaries[i].add(scales)
                if keep == i:
                    kept_scales.append(scales)
            if out is not None and sink is not None:
                sink(rs, cs, out)
        done += size
        if progress:
            progress(done, total)
    for local in hists.values():
        for i, hist in enumerate(local):
            accs[i].hist += hist
    for i, plan in enumerate(plans):
        if plan.scales is not None:  # global scales, counted once
            summaries[i].add(plan.scales)
            if keep == i:
                kept_scales.append(plan.scales)
    kept = None
    if keep is not None:
        long_row = rows == 1 and len(chunks) > 1
        grid = np.concatenate(kept_scales, axis=1 if long_row else 0) \
            if len(kept_scales) > 1 else kept_scales[0]
        kept = (grid, plans[keep].tile)
    return [(p.scheme, a, s) for p, a, s in zip(plans, accs, summaries)], kept


def _global_pass(reader: _Reader, chunks, plans: list[_Plan], threads: int,
                 progress: Progress | None, total: int) -> int:
    """First pass: amax of the tiles that span all rows (or the whole row), and the tensor
    amax for NVFP4; sets each global plan's scales.  Returns the elements read."""
    global_plans = [p for p in plans if p.is_global]

    def work(rc):
        rs, cs = rc
        x = reader.read(rs, cs)
        out = []
        for p in global_plans:
            if p.scheme.scale_format is ScaleFormat.E4M3_FP32:
                out.append(np.abs(x).max(keepdims=True).reshape(1, 1))
            else:
                out.append(_tile_amax(x, x.shape[0], p.tile[1]))
        return x.size, cs, out

    amaxes: list[np.ndarray | None] = [None] * len(global_plans)
    done = 0
    for size, cs, parts in _pool_map(work, chunks, threads):
        for i, (p, part) in enumerate(zip(global_plans, parts)):
            if amaxes[i] is None:
                n_tiles = 1 if p.scheme.scale_format is ScaleFormat.E4M3_FP32 else \
                    -(-reader.matrix.shape[1] // p.tile[1])
                amaxes[i] = np.zeros((1, n_tiles), dtype=np.float32)
            if p.scheme.scale_format is ScaleFormat.E4M3_FP32 or part.shape[1] == amaxes[i].shape[1]:
                np.maximum(amaxes[i], part, out=amaxes[i])
            else:  # a column range of one long row
                first = cs.start // p.tile[1]
                target = amaxes[i][:, first:first + part.shape[1]]
                np.maximum(target, part, out=target)
        done += size
        if progress:
            progress(done, total)
    for p, amax in zip(global_plans, amaxes):
        if p.scheme.scale_format is ScaleFormat.E4M3_FP32:
            p.tensor_scale = _nvfp4_tensor_scale(float(amax.max()), p.scheme)
            p.is_global = False  # its blocks are local; only the tensor scale was global
        else:
            p.scales = _scales_for(amax, p)
    return done


def quantize(sources: list[TensorSource], schemes: list[Scheme], *, seed: int = 0,
             chunk_elements: int = CHUNK_ELEMENTS, threads: int | None = None,
             progress: Progress | None = None, out: str | None = None,
             out_scheme: int = -1) -> QuantizeResult:
    """Quantize every usable tensor under every scheme; with several tensors, a total.

    ``progress(done, total)`` counts elements read over all tensors (a tensor with a
    per-tensor or per-column scheme is read twice).  ``out``: a path checked beforehand with
    ``output.check_target``; the scheme ``out_scheme`` of ``schemes`` is written there
    (``.npy``: dequantized values of the single tensor; ``.npz``/``.safetensors``: codes and
    scales of every tensor).
    """
    keep_freed_memory()
    usable = [s for s in sources if s.skipped is None]
    grand_total = sum(s.size for s in usable)
    keep = None if out is None else range(len(schemes))[out_scheme]
    to_npy = out is not None and out.lower().endswith(".npy")
    if to_npy and len(usable) != 1:
        raise UsageError(f"--out {out}: a .npy holds one tensor and there are {len(usable)}",
                         "write .npz or .safetensors")
    tensors, coded = [], []
    totals = [ErrorAccumulator(hist=np.zeros(HIST_BINS, np.int64)) for _ in schemes]
    total_scales = [ScaleSummary() for _ in schemes]
    base = 0
    for source in sources:
        if source.skipped is not None:
            tensors.append(TensorResult(source.to_dict(), (), source.skipped))
            continue
        writer = sink = codes = None
        if keep is not None and to_npy:
            writer = NpyWriter(out, source.shape)
            sink = writer.write
        elif keep is not None:
            rows, cols = matrix_shape(source.shape)
            spec = schemes[keep].format
            codes = np.zeros((rows, cols), dtype=codes_of(np.zeros(1, np.float32), spec).dtype)

            def sink(rs, cs, block, codes=codes, spec=spec):
                codes[rs, cs] = codes_of(block, spec)

        tensor_progress = None
        if progress:
            def tensor_progress(done, total, base=base, size=source.size):
                progress(base + done * size // max(total, 1), grand_total)
        try:
            per_scheme, kept = quantize_tensor(
                source, schemes, seed=seed, chunk_elements=chunk_elements, threads=threads,
                progress=tensor_progress, keep=keep, keep_mode="values" if to_npy else "codes",
                sink=sink)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        base += source.size
        stats = []
        for i, (scheme, acc, summary) in enumerate(per_scheme):
            stats.append(SchemeStats.from_accumulator(scheme, acc, summary))
            totals[i].merge(acc)
            total_scales[i].merge(summary)
        tensors.append(TensorResult(source.to_dict(), tuple(stats), None))
        if writer is not None:
            writer.close()
        elif codes is not None:
            grid, tile = kept
            applied = per_scheme[keep][0]
            coded.append((source.key or "tensor", codes.reshape(source.shape), grid,
                          {"scheme": applied.to_dict(), "tile": list(tile),
                           "shape": list(source.shape)}))
    if coded:
        write_codes(out, coded)
    total = None
    if len(usable) > 1:
        total = tuple(SchemeStats.from_accumulator(s, a, summary)
                      for s, a, summary in zip(schemes, totals, total_scales))
    output = None if out is None else {"path": out, "scheme": schemes[keep].label,
                                       "content": "dequantized values" if to_npy
                                       else "codes and scales"}
    return QuantizeResult(tuple(tensors), total, tuple(schemes), output)


