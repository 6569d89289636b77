"""Reading a tensor in chunks: the matrix view, the chunk grid, and a reader.

Shared by ``fmt quantize``, ``fmt scale-search`` and ``fmt loss-scale``.  A tensor is read
as a matrix (all leading dimensions by the last one) in chunks of whole rows (or, for a
single long row, of column ranges aligned to every block size), about ``chunk_elements``
values each, as float32 (float64 for float64 data).
"""

from __future__ import annotations

import math
import mmap
import os
from typing import TYPE_CHECKING

import numpy as np

from ..choices import CHUNK_ELEMENTS as CHUNK_ELEMENTS  # re-exported
from ..errors import DataError, shown
from ..tensors import TensorSource
from . import native

if TYPE_CHECKING:
    from .chunk import Plan



def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the matrix view: all leading dimensions by the last one."""
    if len(shape) == 0:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]



def chunk_slices(rows: int, cols: int, plans: list[Plan], chunk_elements: int):
    """(row slice, column slice) of every chunk, aligned to the tiles of the local schemes."""
    local = [p.tile for p in plans if not p.is_global] or [(1, 1)]
    if rows == 1 and cols > chunk_elements:  # one long row: chunk along the columns
        step = math.lcm(*(t[1] for t in local))
        step *= max(1, chunk_elements // step)
        return [(slice(0, 1), slice(c, min(c + step, cols))) for c in range(0, cols, step)]
    step = math.lcm(*(t[0] for t in local))
    step *= max(1, chunk_elements // max(1, cols * step))
    return [(slice(r, min(r + step, rows)), slice(0, cols)) for r in range(0, rows, step)]


class ChunkReader:
    """Reads chunks of a tensor's matrix view as float32 (float64 for float64 data).

    Chunks are contiguous element ranges.  A memory-mapped file is read with ``os.preadv``
    into a fresh buffer rather than through the map: no page faults, and the file's pages
    do not pile up in the process's memory.  Opens its file lazily, so forked workers each
    get their own descriptor.
    """

    def __init__(self, source: TensorSource) -> None:
        self.array = source.array()
        rows, cols = matrix_shape(source.shape)
        self.cols = cols
        self.matrix = self.array.reshape(rows, cols)
        self.dtype = np.float64 if self.array.dtype == np.float64 else np.float32
        arr = self.array
        self.path = None
        # only the map itself (its base is the mmap): a view or slice of it keeps the map's
        # offset attribute but starts elsewhere in the file
        if (isinstance(arr, np.memmap) and isinstance(arr.base, mmap.mmap)
                and arr.flags.c_contiguous and getattr(arr, "filename", None)
                and hasattr(os, "preadv")):
            self.path, self.offset, self.source_dtype = arr.filename, arr.offset, arr.dtype
        self.fd = None
        self.fd_pid = None

    def read(self, rows: slice, cols: slice, as_stored: bool = False) -> np.ndarray:
        """The chunk as float32 (float64 data: float64).  ``as_stored``: a bfloat16 or
        float16 chunk comes as stored, for the compiled kernel, which widens it as it goes
        (``native.reads_as_stored``; ``chunk.widened`` makes the float32 copy on demand)."""
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        stored = as_stored and native.reads_as_stored(self.array.dtype)
        if self.path is None:
            block = self.matrix[rows, cols]
            if stored:
                return np.ascontiguousarray(block)
            out = np.empty(block.shape, dtype=self.dtype)
            np.copyto(out, block, casting="unsafe")
            return out
        if self.fd is None or self.fd_pid != os.getpid():
            self.fd, self.fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
        buffer = np.empty(shape, dtype=self.source_dtype)
        start = self.offset + (rows.start * self.cols + cols.start) * self.source_dtype.itemsize
        view, done = memoryview(buffer.reshape(-1).view(np.uint8)), 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], start + done)
            if got <= 0:
                raise DataError(f"{shown(self.path)}: the file ended early (truncated while "
                                "reading?)")
            done += got
        if stored or buffer.dtype == self.dtype:
            return buffer
        return widen(buffer, self.dtype)

    def close(self) -> None:
        if self.fd is not None and self.fd_pid == os.getpid():
            os.close(self.fd)
        self.fd = None


def widen(buffer: np.ndarray, dtype) -> np.ndarray:
    """``buffer.astype(dtype)``; float16 to float32 by the compiled kernel where it is
    built (numpy's conversion costs ~1.6 ns a value on CPUs it has no F16C path for; the
    kernel's is exact, inf and NaN payloads included: ``tests/test_native.py``)."""
    kernel = native.module()
    if (kernel is not None and buffer.dtype == np.float16 and dtype == np.float32
            and buffer.flags.c_contiguous):
        out = np.empty(buffer.shape, np.float32)
        kernel.widen_f16(buffer, out, buffer.size)
        return out
    return buffer.astype(dtype)


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
