"""Reading a tensor in chunks: the matrix view, the chunk grid, and a reader.

Shared by ``fmt quantize``, ``fmt scale-search``, ``fmt loss-scale`` and ``fmt compare``
(and the CUDA route, the Dask tasks and ``--out``).  A tensor is read as a matrix
(``matrix_shape``: the one definition of how an N-D tensor is blocked) in chunks of whole
rows (or, for a single long row, of column ranges aligned to every block size), about
``chunk_elements`` values each, as float32 (float64 for float64 data), in the machine's
byte order whatever the file's.
"""

from __future__ import annotations

import math
import mmap
import os
from typing import Protocol

import numpy as np

from fmtcli.base.choices import CHUNK_ELEMENTS as CHUNK_ELEMENTS  # re-exported
from fmtcli.base.dtypes import bits_of
from fmtcli.base.errors import DataError, Note, shown
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics import native
from fmtcli.numerics.granularity import (  # noqa: F401  (re-exported: the one matrix view)
    KERNEL_AXIS,
    matrix_shape,
    view_shape,
)


class Tiled(Protocol):
    """What the chunk grid needs of a scheme's plan (``engine.chunk.Plan``): its tile
    (rows, columns) and whether one scale spans the whole tensor."""

    tile: tuple[int, int]
    is_global: bool


def tile_of(scheme, shape: tuple[int, ...]) -> tuple[int, int]:
    """The (rows, columns) tile of ``scheme`` on a tensor of ``shape``, in its matrix view
    (``Scheme.tile_shape`` with the view's rank: a blocked vector has one axis)."""
    return scheme.tile_shape(*matrix_shape(shape), len(view_shape(shape)))


def short_rows(scheme, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """Where the rows of the matrix view (its columns, for blocks along axis 0) are shorter
    than the block or tile ``scheme`` asks for along them: (their length, the length
    asked), else None.  Each such block holds a whole row: fewer values than asked."""
    if scheme.granularity.value not in ("block", "tile"):
        return None
    rows, cols = matrix_shape(shape)
    huge = 1 << 62
    asked = scheme.tile_shape(huge, huge, len(view_shape(shape)))
    got = tile_of(scheme, shape)
    along = 0 if asked[1] == 1 and asked[0] > 1 else 1  # blocks down the columns (axis 0)
    if got[along] < asked[along]:
        return (rows, cols)[along], asked[along]
    return None


class BlockNote(Note):
    """fmtcli's note that blocks hold fewer values than asked (said as it is, once a run)."""


def short_rows_text(sources, schemes) -> str | None:
    """One line naming the tensors whose matrix rows are shorter than a block of any of
    ``schemes`` (``short_rows``), or None where there are none."""
    from fmtcli.numerics.schemes import for_tensor

    usable = [s for s in sources if s.skipped is None]
    parts = []
    for scheme in schemes:
        found = []
        for source in usable:
            applied = for_tensor(scheme, source.key, len(view_shape(source.shape)))
            short = short_rows(applied, source.shape)
            if short is not None:
                found.append((source, short))
        if not found:
            continue
        first, (length, asked) = found[0]
        rows, cols = matrix_shape(first.shape)
        where = f"{shown(first.name)} (matrix view {rows:,} x {cols:,})"
        parts.append(f"{scheme.label}: the rows of {where} hold {length:,} values, fewer "
                     f"than a block of {asked:,}: each block is a whole row"
                     if len(usable) == 1 else
                     f"{scheme.label}: {len(found):,} of {len(usable):,} tensors "
                     f"{'has' if len(found) == 1 else 'have'} rows shorter than a block of "
                     f"{asked:,}, e.g. {where}: each of their blocks is a whole row")
    if not parts:
        return None
    return "; ".join(parts) + " (docs/quantize.md: how an N-D tensor is blocked)"


def note_short_rows(sources, schemes) -> None:
    """``short_rows_text`` as one ``BlockNote`` warning (the CLI prints it as a Note line)."""
    import warnings

    text = short_rows_text(sources, schemes)
    if text is not None:
        warnings.warn(text, BlockNote, stacklevel=2)


def chunk_slices(rows: int, cols: int, plans: list[Tiled], chunk_elements: int):
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

    Every chunk comes in the machine's byte order: a big-endian file ('>f2', '>f4', '>f8',
    bfloat16 as '>V2') has its bytes swapped in the fresh buffer (``native_order``), so no
    consumer (the compiled kernel, torch, the dtype checks) ever sees a swapped dtype.

    A tensor of an already-quantized checkpoint (``TensorSource.quantized``) is dequantized
    chunk by chunk from its parts (``inputs.layouts``), never whole.

    The tensor is read as stored (``TensorSource.stored``): bfloat16 as its bit patterns
    (``storage.BFLOAT16_BITS``), which a chunk as stored keeps and ``widen`` makes float32
    exactly, so reading bfloat16 never imports ml_dtypes (ml_dtypes' own bfloat16 arrays,
    from ``TensorSource`` objects made of arrays, are read too).
    """

    def __init__(self, source: TensorSource) -> None:
        self.quantized = source.quantized  # an already-quantized tensor: dequantized per chunk
        self.fd = None
        if self.quantized is not None:
            self.native = self.dtype = np.dtype(np.float32)
            self.path, self.cols = None, matrix_shape(source.shape)[1]
            return
        self.array = source.stored()
        rows, cols = matrix_shape(source.shape)
        self.cols = cols
        self.matrix = self.array.reshape(rows, cols)
        self.native = native_order(self.array.dtype)  # what chunks are stored as, here
        self.dtype = np.float64 if self.native == np.float64 else np.float32
        arr = self.array
        self.path = None
        # only the map itself (its base is the mmap): a view or slice of it keeps the map's
        # offset attribute but starts elsewhere in the file
        if (isinstance(arr, np.memmap) and isinstance(arr.base, mmap.mmap)
                and arr.flags.c_contiguous and getattr(arr, "filename", None)
                and hasattr(os, "preadv")):
            self.path, self.offset, self.source_dtype = arr.filename, arr.offset, arr.dtype
        self.fd_pid = None

    def read(self, rows: slice, cols: slice, as_stored: bool = False) -> np.ndarray:
        """The chunk as float32 (float64 data: float64).  ``as_stored``: a bfloat16 or
        float16 chunk comes as stored (in native byte order), for the compiled kernel,
        which widens it as it goes (``native.reads_as_stored``; ``chunk.widened`` makes the
        float32 copy on demand)."""
        if self.quantized is not None:  # inputs.layouts: decoded from its parts' maps
            return self.quantized.read(rows, cols)
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        stored = as_stored and native.reads_as_stored(self.native)
        if self.path is None:
            block = self.matrix[rows, cols]
            if stored:
                return np.ascontiguousarray(block, dtype=self.native)
            if bits_of(self.native):  # bit patterns: numpy's cast would take them as ints
                return widen(np.ascontiguousarray(block, dtype=self.native), self.dtype)
            out = np.empty(block.shape, dtype=self.dtype)
            np.copyto(out, block, casting="unsafe")  # numpy honours the byte order
            return out
        if self.fd is None or self.fd_pid != os.getpid():
            self.fd, self.fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
        buffer = np.empty(shape, dtype=self.native)
        start = self.offset + (rows.start * self.cols + cols.start) * self.native.itemsize
        view, done = memoryview(buffer.reshape(-1).view(np.uint8)), 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], start + done)
            if got <= 0:
                raise DataError(f"{shown(self.path)}: the file ended early (truncated while "
                                "reading?)")
            done += got
        if not self.source_dtype.isnative:  # stored in the other byte order: swap here
            swap_bytes(buffer)
        if stored or buffer.dtype == self.dtype:
            return buffer
        return widen(buffer, self.dtype)

    def close(self) -> None:
        if self.fd is not None and self.fd_pid == os.getpid():
            os.close(self.fd)
        self.fd = None


def native_order(dtype) -> np.dtype:
    """``dtype`` in the machine's byte order, said as '=' (numpy's explicit '<f4' is the
    same dtype, but its buffers announce '<f', which the compiled kernel refuses)."""
    return np.dtype(dtype).newbyteorder("=")


def swap_bytes(buffer: np.ndarray) -> None:
    """Reverse the bytes of every element of a contiguous buffer in place (through an
    unsigned-integer view of the element's width: any 2-, 4- or 8-byte float, ml_dtypes'
    included)."""
    width = buffer.dtype.itemsize
    if width > 1:
        buffer.reshape(-1).view(f"u{width}").byteswap(inplace=True)


def widen(buffer: np.ndarray, dtype) -> np.ndarray:
    """``buffer.astype(dtype)``; float16 to float32 by the compiled kernel where it is
    built (numpy's conversion costs ~1.6 ns a value on CPUs it has no F16C path for; the
    kernel's is exact, inf and NaN payloads included: ``tests/engine/test_native.py``); bfloat16's
    bit patterns (``storage.BFLOAT16_BITS``, native order) by ``widen_bfloat16_bits``."""
    if bits_of(buffer.dtype) == "bfloat16":
        wide = widen_bfloat16_bits(buffer)
        if wide.dtype == dtype:
            return wide
        with np.errstate(invalid="ignore"):  # signalling NaNs stay NaN, unannounced
            return wide.astype(dtype)
    kernel = native.module()
    if (kernel is not None and buffer.dtype == np.float16 and dtype == np.float32
            and buffer.flags.c_contiguous):
        out = np.empty(buffer.shape, np.float32)
        kernel.widen_f16(buffer, out, buffer.size)
        return out
    return buffer.astype(dtype)


def widen_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16 words, in either byte order):
    each word is the float32's upper half, so ``word << 16`` is its float32 exactly (inf,
    NaN payloads, signalling NaNs and subnormals included), with no ml_dtypes."""
    wide = bits.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


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
