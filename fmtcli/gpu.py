"""The CUDA fast path of ``fmt quantize``: one fused Triton kernel per pass.

For blocks of B elements along the last axis (B a power of two up to 1024) with amax
scales, nearest-even rounding and saturation, each program of the kernel loads tiles of
blocks, takes each block's amax, its scale (``max / amax`` as one correctly rounded float32
division, as the CPU engine), the scaled cast (the hardware's nearest-even, saturating
conversion for E4M3 and E5M2; for other formats the CPU engine's magic-number addition,
``rounding.round_float32_nearest_even``), divides back, and accumulates every statistic;
programs add their totals with atomics.  Statistics equal the CPU engine's: the same
counts, extrema and histogram bins (tests/test_gpu.py checks this on a GPU).

Median and p99 need the relative-error histogram.  Pass 1 counts it by binade (sign and
exponent, 512 bins); the binades holding the two ranks are then counted again at the CPU
histogram's full resolution (2**-7) in pass 2, which re-reads the tensor.  The histogram
handed back is exact in those two binades (so both quantiles equal the CPU engine's) and
counts every other binade at its lower edge.

torch and Triton are imported only here, only when this path runs.
"""

from __future__ import annotations

import math

import numpy as np

from .metrics import HIST_BINS, ErrorAccumulator
from .results import ScaleSummary
from .rounding import OverflowPolicy, RoundingMode, beyond_threshold, magic_rounding_applies
from .scaling import ScaleRule
from .schemes import Granularity, ScaleFormat, Scheme

COARSE_BINS = 512  # sign + exponent of the float32 relative error; the last bin (negative
# NaN's) also takes the inputs outside the population (zero, NaN, inf, padding)
ITERATIONS = 16


def fast_path_applies(scheme: Scheme, shape: tuple[int, ...]) -> bool:
    """Whether the fused kernel handles this scheme and tensor."""
    spec = scheme.format
    block = scheme.block
    cols = shape[-1] if shape else 1
    return (scheme.granularity is Granularity.BLOCK and scheme.axis == -1
            and scheme.scale_rule is ScaleRule.AMAX and scheme.scale_format is ScaleFormat.FLOAT32
            and scheme.rounding is RoundingMode.NEAREST_EVEN
            and scheme.overflow is OverflowPolicy.SATURATE
            and magic_rounding_applies(spec) and spec.has_zero and spec.signed
            and 1 <= block <= 1024 and block & (block - 1) == 0 and cols % block == 0)


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def quantize_stats(x_ptr, n_blocks, stats_ptr, imax_ptr, hist_ptr, fine_lo, fine_hi,
                       fmax, beyond, magic_low, magic_high, magic_shift,
                       BLOCK: tl.constexpr, TILE: tl.constexpr, ITERS: tl.constexpr,
                       BINS: tl.constexpr, FINE: tl.constexpr, HIST: tl.constexpr,
                       CAST: tl.constexpr, WIDE: tl.constexpr):
        pid = tl.program_id(0)
        rows = tl.arange(0, TILE)
        cols = tl.arange(0, BLOCK)
        fmax_v = tl.full([TILE], 1.0, tl.float32) * fmax
        acc_err = tl.zeros([TILE], dtype=tl.float32)
        acc_err2 = tl.zeros([TILE], dtype=tl.float32)
        acc_x2 = tl.zeros([TILE], dtype=tl.float32)
        acc_max = tl.zeros([TILE], dtype=tl.float32)
        n_zero = tl.zeros([TILE], dtype=tl.int32)
        n_flushed = tl.zeros([TILE], dtype=tl.int32)
        n_nonfinite = tl.zeros([TILE], dtype=tl.int32)
        n_nan = tl.zeros([TILE], dtype=tl.int32)
        n_beyond = tl.zeros([TILE], dtype=tl.int32)
        n_pairs = tl.zeros([TILE], dtype=tl.int32)
        s_max = tl.zeros([TILE], dtype=tl.float32)
        s_min = tl.full([TILE], float("inf"), tl.float32)
        n_nan_scale = tl.zeros([TILE], dtype=tl.int32)
        hist = tl.zeros([BINS], dtype=tl.int32)
        for it in range(ITERS):
            block_ids = (pid * ITERS + it) * TILE + rows
            valid = block_ids < n_blocks
            if WIDE:
                offs = block_ids.to(tl.int64)[:, None] * BLOCK + cols[None, :]
            else:
                offs = block_ids[:, None] * BLOCK + cols[None, :]
            mask = valid[:, None] & (cols[None, :] < BLOCK)
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            a = tl.abs(x)
            has_nan = tl.max((x != x).to(tl.int32), axis=1) > 0
            amax = tl.max(a, axis=1)
            amax = tl.where(has_nan, float("nan"), amax)
            scale = tl.math.div_rn(fmax_v, amax)
            scale = tl.minimum(tl.maximum(scale, 1.1754943508222875e-38), 3.4028234663852886e38)
            scale = tl.where(amax == 0, 1.0, scale)
            scale = tl.where(amax == float("inf"), 0.0, scale)
            scale = tl.where(amax != amax, float("nan"), scale)
            scale_ok = valid & (scale == scale)
            s_max = tl.maximum(s_max, tl.where(scale_ok, scale, 0.0))
            s_min = tl.minimum(s_min, tl.where(scale_ok, scale, float("inf")))
            n_nan_scale += (valid & (scale != scale)).to(tl.int32)
            xs = x * scale[:, None]
            m = tl.abs(xs)
            if CAST == 1:  # the hardware's nearest-even, saturating FP8 conversions
                r = xs.to(tl.float8e4nv).to(tl.float32)
            elif CAST == 2:
                r = xs.to(tl.float8e5).to(tl.float32)
            else:  # the engine's magic-number rounding, for every other format
                bits = m.to(tl.int32, bitcast=True) & 0x7F800000
                bits = tl.minimum(tl.maximum(bits, magic_low), magic_high) + magic_shift
                big = bits.to(tl.float32, bitcast=True)
                r = (m + big) - big
                r = tl.where(xs < 0, -r, r)
                r = tl.where(xs != xs, xs, r)
                r = tl.where(tl.abs(r) > fmax, tl.where(r > 0, fmax, -fmax), r)
            xq = tl.math.div_rn(r, tl.broadcast_to(scale[:, None], (TILE, BLOCK)))
            err = xq - x
            finite_x = (a == a) & (a != float("inf"))
            population = mask & finite_x & (x != 0)
            if not FINE:  # pass 2 only refines the histogram
                finite = finite_x & (err == err) & (tl.abs(err) != float("inf")) & mask
                e = tl.where(finite, err, 0.0)
                acc_err += tl.sum(e, axis=1)
                acc_err2 += tl.sum(e * e, axis=1)
                xf = tl.where(finite, x, 0.0)
                acc_x2 += tl.sum(xf * xf, axis=1)
                acc_max = tl.maximum(acc_max, tl.max(tl.abs(e), axis=1))
                n_pairs += tl.sum(finite.to(tl.int32), axis=1)
                n_zero += tl.sum(((x == 0) & mask).to(tl.int32), axis=1)
                n_flushed += tl.sum((population & (xq == 0)).to(tl.int32), axis=1)
                n_nonfinite += tl.sum((mask & ~finite_x).to(tl.int32), axis=1)
                n_nan += tl.sum((mask & (xq != xq) & (x == x)).to(tl.int32), axis=1)
                n_beyond += tl.sum((mask & (m >= beyond) & (xs == xs)).to(tl.int32), axis=1)
            rel = tl.math.div_rn(tl.abs(xq - x), a)
            key = rel.to(tl.int32, bitcast=True)
            coarse = (key >> 23) & 0x1FF
            if FINE:
                fine = (key >> 16) & 127
                idx = tl.where(coarse == fine_lo, fine, tl.where(coarse == fine_hi, 128 + fine,
                                                                 BINS - 1))
            else:
                idx = coarse
            idx = tl.where(population, idx, BINS - 1)
            if HIST:
                hist += tl.histogram(tl.reshape(idx, [TILE * BLOCK]), BINS)
        tl.atomic_add(hist_ptr + tl.arange(0, BINS), hist)
        tl.atomic_add(stats_ptr + 0, tl.sum(acc_err.to(tl.float64)))
        tl.atomic_add(stats_ptr + 1, tl.sum(acc_err2.to(tl.float64)))
        tl.atomic_add(stats_ptr + 2, tl.sum(acc_x2.to(tl.float64)))
        tl.atomic_max(imax_ptr + 0, tl.max(acc_max).to(tl.int32, bitcast=True))
        tl.atomic_add(imax_ptr + 1, tl.sum(n_zero))
        tl.atomic_add(imax_ptr + 2, tl.sum(n_flushed))
        tl.atomic_add(imax_ptr + 3, tl.sum(n_nonfinite))
        tl.atomic_add(imax_ptr + 4, tl.sum(n_nan))
        tl.atomic_add(imax_ptr + 5, tl.sum(n_beyond))
        tl.atomic_add(imax_ptr + 6, tl.sum(n_pairs))
        tl.atomic_max(imax_ptr + 7, tl.max(s_max).to(tl.int32, bitcast=True))
        tl.atomic_min(imax_ptr + 8, tl.min(s_min).to(tl.int32, bitcast=True))
        tl.atomic_add(imax_ptr + 9, tl.sum(n_nan_scale))

    return quantize_stats


_KERNEL = None


def quantize_blocks_cuda(x, scheme: Scheme, *, tile_elements: int = 4096,
                         iterations: int = ITERATIONS, num_warps: int = 4,
                         histogram: bool = True, hardware_cast: bool = True
                         ) -> tuple[ErrorAccumulator, ScaleSummary]:
    """Statistics of ``scheme`` (see ``fast_path_applies``) on a contiguous CUDA tensor, and
    a summary of its scales (count, min, max, NaN; distinct values are not counted here)."""
    import torch
    import triton

    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _kernel()
    spec = scheme.format
    block = scheme.block
    x = x.contiguous().reshape(-1)
    n_blocks = x.numel() // block
    tile = max(1, tile_elements // block)
    grid = (triton.cdiv(n_blocks, tile * iterations),)
    m = spec.mantissa_bits
    low = int(np.float32(spec.smallest_normal).view(np.int32))
    high = int(np.float32(2.0 ** (spec.max_exponent + 1)).view(np.int32))
    beyond = beyond_threshold(spec)
    device = x.device
    cast_kind = {"float8_e4m3fn": 1, "float8_e5m2": 2}.get(spec.name, 0) if hardware_cast else 0

    def run(fine_lo: int, fine_hi: int, fine: bool):
        stats = torch.zeros(3, dtype=torch.float64, device=device)
        ints = torch.zeros(10, dtype=torch.int32, device=device)
        ints[8] = int(np.float32(np.inf).view(np.int32))
        hist = torch.zeros(COARSE_BINS, dtype=torch.int32, device=device)
        _KERNEL[grid](x, n_blocks, stats, ints, hist, fine_lo, fine_hi, float(spec.max),
                      beyond, low, high, (23 - m) << 23, BLOCK=block, TILE=tile,
                      ITERS=iterations, BINS=COARSE_BINS, FINE=fine, HIST=histogram,
                      CAST=cast_kind, WIDE=x.numel() + tile * iterations * block >= 2**31,
                      num_warps=num_warps)
        return stats.cpu().numpy(), ints.cpu().numpy().astype(np.int64), hist.cpu().numpy()

    stats, ints, coarse = run(0, 0, False)
    count = x.numel()
    acc = ErrorAccumulator(hist=np.zeros(HIST_BINS, np.int64))
    acc.count = count
    acc.zeros = int(ints[1])
    acc.flushed = int(ints[2])
    acc.nonfinite_inputs = int(ints[3])
    acc.nan_produced = int(ints[4])
    acc.saturated = int(ints[5])
    acc.finite_pairs = int(ints[6])
    acc.nonzero = count - acc.zeros - acc.nonfinite_inputs
    acc.sum_err, acc.sum_err2, acc.sum_x2 = (float(v) for v in stats)
    acc.max_abs_err = float(np.int32(ints[0]).view(np.float32))
    coarse = coarse.astype(np.int64)
    coarse[255:] = 0  # inf/NaN binades and the dump: counted back below, past the finite bins
    # the binades holding the median and p99 ranks, counted again at full resolution
    cumulative = np.cumsum(coarse)
    wanted = []
    for q in (0.5, 0.99):
        rank = max(1, math.ceil(q * acc.nonzero))
        if acc.nonzero and rank <= cumulative[-1]:
            wanted.append(int(np.searchsorted(cumulative, rank)))
    wanted = (wanted + wanted)[:2] if wanted else [0, 0]
    _, _, fine = run(wanted[0], wanted[1], True)
    for binade in range(255):
        acc.hist[binade << 7] = coarse[binade]
    for slot, binade in enumerate(dict.fromkeys(wanted)):
        acc.hist[binade << 7: (binade + 1) << 7] = fine[slot * 128:(slot + 1) * 128]
    # population elements whose relative error is inf or NaN (x_q inf/NaN) rank last, in
    # the bins past the finite ones, as on the CPU
    acc.hist[0x7F80] = acc.nonzero - int(acc.hist[:0x7F80].sum())
    summary = ScaleSummary(count=n_blocks, nan=int(ints[9]), counted=False)
    if n_blocks > summary.nan:
        summary.high = float(np.int32(ints[7]).view(np.float32))
        summary.low = float(np.int32(ints[8]).view(np.float32))
    return acc, summary
