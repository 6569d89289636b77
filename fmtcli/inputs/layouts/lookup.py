"""Fast decoding steps the layout readers share: 8-bit float codes by lookup table, and a
per-block scale applied by broadcasting instead of a repeated full-size scale array.

Why (``benchmarks/bench_audit.py``, ``benchmarks/RESULTS.md``): ``astype(np.float32)`` of
ml_dtypes' float8 arrays costs ~10-15 ns an element (a Python-registered cast), a gather
from a 256-entry table ~1 ns; ``np.repeat`` of a block's scale to every element writes a
second full-size array.  Both give the same bits as before: the table *is* ml_dtypes'
cast of every byte (built once per dtype from the array's own dtype), and the broadcast
multiply is the same float operation on the same operands.
"""

from __future__ import annotations

import numpy as np

_TABLES: dict[np.dtype, np.ndarray] = {}


def byte_float_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of ``codes`` (any shape): a one-byte float dtype (ml_dtypes'
    float8_e4m3fn, float8_e5m2, float8_e8m0fnu ...) decoded through a 256-entry table of
    that dtype's own cast; anything else as ``storage.as_values(codes).astype(float32)``."""
    arr = np.asarray(codes)
    dtype = arr.dtype
    if dtype.itemsize != 1 or dtype.kind in "biu" or dtype == np.bool_:
        from fmtcli.inputs.storage import as_values

        return np.asarray(as_values(arr)).astype(np.float32)
    table = _TABLES.get(dtype)
    if table is None:
        table = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
        _TABLES[dtype] = table
    return table[arr.view(np.uint8)]


def per_block(values: np.ndarray, per: np.ndarray, block: int, op=np.multiply) -> np.ndarray:
    """``op(values, per[:, j // block])`` in place for every column j of 2-D ``values``
    (rows, width), ``per`` (rows, ceil(width / block)): the scale (or zero point) of each
    block of ``block`` columns, broadcast, never repeated: the same operation as
    ``values op= repeated per`` (numpy's promotion, the result cast to ``values``' dtype).
    Overflowing products become inf silently (as ``Quantized.read`` decodes them; audit's
    values-finite counts them).  Returns ``values``."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _per_block(values, per, block, op)


def _per_block(values: np.ndarray, per, block: int, op) -> np.ndarray:
    rows, width = values.shape
    full = width // block
    per = np.asarray(per)
    if full:
        head = values[:, :full * block].reshape(rows, full, block)  # a view, split axis
        op(head, per[:, :full, None], out=head)
        if not np.may_share_memory(head, values):  # a copy after all: write it back
            values[:, :full * block] = head.reshape(rows, full * block)
    if width > full * block:  # a ragged last block (edges padded, as the layouts pad)
        tail = values[:, full * block:]
        op(tail, per[:, full:full + 1], out=tail)
    return values


def tile_rows(grid: np.ndarray, rows: np.ndarray, height: int, tile_height: int) -> np.ndarray:
    """The scale row of every matrix-view row in ``rows`` of a tensor ``lead x height x
    cols`` whose ``grid`` holds one scale per tile (``lead + (ceil(height / tile_height),
    g_cols)``): (len(rows), g_cols), what ``base.block_scales`` repeats to every column."""
    grid = np.asarray(grid)
    flat = grid.reshape(-1, grid.shape[-1])
    matrix, within = np.divmod(rows, height)
    return flat[matrix * grid.shape[-2] + within // tile_height]
