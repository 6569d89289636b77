"""A chunk by the compiled kernel (``numerics.native``, ``_native.c``): its call and its sums.

``compiled_pass`` runs ``quantize_chunk`` over one padded chunk (float32, or bfloat16 and
float16 as stored) with its tile scales: ``x_q = cast(x * scale) / scale`` by the
magic-number rounding of a float32 product, saturated at max, and every statistic the numpy
path gives, to the bit; ``accumulator`` puts its sums into an ``ErrorAccumulator``.
``ChunkKernel._run_native`` decides when the kernel applies.

The kernel's work array (``scratch``) is one per process, reused by every call: a call runs
start to finish holding the GIL (the kernel never releases it), so no two calls share it at
once; forked workers each have their own copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from fmtcli.numerics import native
from fmtcli.numerics.formats import FormatSpec
from fmtcli.streaming.metrics import ErrorAccumulator

_SCRATCH = [np.empty(0, np.float32)]


def scratch(size: int) -> np.ndarray:
    """A float32 work array of ``size`` values for the compiled kernel, one per process
    and reused by every kernel and chunk: a fresh array per scheme costs a page fault per
    page written (measured: 29 candidate scales of a 384 x 384 tensor ran at 2.6 ns a
    value instead of 0.4)."""
    if _SCRATCH[0].size < size:
        _SCRATCH[0] = np.empty(max(size, 2 * _SCRATCH[0].size), np.float32)
    return _SCRATCH[0][:size]


def magic(spec: FormatSpec) -> tuple[int, int, int]:
    """The magic-number rounding of ``spec`` as the kernel takes it: the bit patterns of its
    smallest normal and of 2**(max exponent + 1) (the clamp of a value's exponent), and
    ``(23 - mantissa bits) << 23`` (the magic number's exponent offset)."""
    return (int(np.float32(spec.smallest_normal).view(np.uint32)),
            int(np.float32(2.0 ** (spec.max_exponent + 1)).view(np.uint32)),
            (23 - spec.mantissa_bits) << 23)


@dataclass
class CompiledPass:
    """What ``quantize_chunk`` found in a chunk: its sums and counts (``got``), and per
    block (where asked) the flushed values, the values past max and the largest relative
    error."""

    got: tuple
    flushed: np.ndarray | None
    saturating: np.ndarray | None
    max_rel: np.ndarray | None


def compiled_pass(module: ModuleType, xp: np.ndarray, scale: np.ndarray,
                  tile: tuple[int, int], rounding: tuple[int, int, int], fmax: float,
                  hist: np.ndarray | None, blocks: bool, saturating: bool, max_rel: bool
                  ) -> CompiledPass | None:
    """``quantize_chunk`` over the padded chunk ``xp`` (whole tiles of ``tile``) with one
    float32 scale per tile (``scale``, C-contiguous); ``rounding``: ``magic(spec)``;
    ``fmax``: the format's max where a value may lie above it, else inf.  ``hist`` (None:
    the squared errors alone) gets the relative errors' histogram; ``blocks``,
    ``saturating``, ``max_rel``: which per-block arrays to fill.  None where a result is
    not finite (the numpy path then does the chunk; ``hist`` is left as it was)."""
    rows, cols = xp.shape
    tr, tc = tile
    shape = scale.shape
    flushed = np.empty(shape, np.int64) if blocks else None
    past = np.empty(shape, np.int64) if saturating else None
    worst = np.empty(shape, np.float32) if max_rel else None
    low, high, shift = rounding
    values, kind = native.values(np.ascontiguousarray(xp))
    got = module.quantize_chunk(values, scale, (rows, cols), (tr, tc),
                                (low, high, shift, fmax), scratch(xp.size), hist=hist,
                                flushed=flushed, saturated=past, max_rel=worst, kind=kind)
    if got is None:
        return None
    return CompiledPass(got, flushed, past, worst)


def accumulator(module: ModuleType, found: CompiledPass, x: np.ndarray, padding: int,
                hist: np.ndarray | None, x_max: float, shared: dict,
                mse_only: bool) -> ErrorAccumulator:
    """The chunk's ``ErrorAccumulator`` from ``compiled_pass``'s sums: ``x`` the chunk as
    read (unpadded), ``padding`` the zeros added to whole tiles, ``x_max`` its max |x|
    (for the scaled sum of x**2, computed once per chunk and kept in ``shared``);
    ``mse_only``: the squared errors alone, as the numpy path keeps them."""
    sum_err, max_err, sum_err2, zero_results, nan_keys, saturated, above = found.got
    acc = ErrorAccumulator(hist=hist)
    size = x.size
    acc.count = acc.finite_pairs = size
    acc.max_abs_err = max_err
    acc.sum_err2 = sum_err2
    if mse_only:
        return acc
    acc.saturated = saturated
    acc.above_max = above
    acc.sum_err = sum_err
    if "sum_x2" not in shared:  # as ErrorAccumulator._add takes it, over the raw chunk
        raw, kind = native.values(np.ascontiguousarray(x))
        shared["sum_x2"] = (module.sum_squares(raw, raw.size, x_max, kind), 0.0, 0.0)
    acc.sum_x2 = shared["sum_x2"][0]
    zeros = nan_keys - padding  # 0/0: the zeros, the padding's included
    acc.flushed = zero_results - nan_keys
    acc.zeros = zeros
    acc.nonzero = size - zeros
    return acc
