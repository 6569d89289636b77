"""The CUDA fast path of ``fmt quantize``: one fused kernel, one pass over the tensor.

For blocks of B elements along the last axis (B a power of two up to 1024) with amax
scales, nearest-even rounding and saturation, the kernel reads each element once and does
everything the CPU engine does with it:

- the block's amax (an integer max of the magnitudes' bits, so NaN > inf > finite) across
  the lanes that share the block;
- its scale, ``max / amax`` as one correctly rounded float32 division, clamped as the
  engine clamps it (``scaling``);
- the scaled cast ``r = cast(x * scale)``: the hardware's nearest-even, saturating FP8
  conversion (``cvt.rn.satfinite.e4m3x2.f32`` / ``e5m2x2``) for E4M3 and E5M2, otherwise the
  engine's magic-number addition (``rounding.round_float32_nearest_even``);
- ``x_q = r / scale``, correctly rounded, and every statistic of ``metrics.ErrorAccumulator``.

Median and p99 come from the same histogram as on the CPU: the top 16 bits of the float32
relative error ``|x_q - x| / |x|``.  Every block of threads keeps the bins where nonzero
relative errors fall (2**-32 up to 1, 4096 bins, 16 KiB of shared memory) plus slots for
zero inputs, flushed values (relative error exactly 1) and exact results; every element
adds 1 to one of them.  The relative error is taken with the fast reciprocal (1 ulp) and
redone in float64 (difference and quotient, truncated to float32) when it lands within 8 ulp
of a bin edge, as the CPU engine does, so every element lands in the bin the CPU gives it:
the histogram, and so the quantiles, equal the CPU engine's exactly.  The block's totals go
to the device with one atomic each; the last block to finish copies them into page-locked,
device-mapped host memory and zeroes them for the next launch, so a call is one launch and
one wait.

Blocks with inf or NaN, extreme magnitudes (outside 2**-60..2**60) or values scaled past
the rounding threshold take a careful path: IEEE divisions, float64 sums, every count.

The kernel is CUDA C, compiled at first use with NVRTC through
``torch.cuda._compile_kernel`` (torch >= 2.8; the NVRTC library comes with torch's CUDA
wheels).  Where that is missing, ``available()`` says so and quantize takes its general path.
torch is imported only here, only when this path runs.
"""

from __future__ import annotations

import ctypes
import functools
import struct

import numpy as np

from .metrics import FINITE_BINS, HIST_BINS, ErrorAccumulator
from .results import ScaleSummary
from .rounding import OverflowPolicy, RoundingMode, beyond_threshold, magic_rounding_applies
from .scaling import ScaleRule
from .schemes import Granularity, ScaleFormat, Scheme

THREADS = 256  # threads per block of the launch
BLOCKS_PER_SM = 4  # blocks of threads launched per multiprocessor
MIN_BLOCKS = 2  # blocks of threads each multiprocessor must hold at once (caps registers)
ELEMENTS = 16  # elements per thread (at least; blocks over 256 elements: block / 32)
WINDOW_LOW = 0x3000  # first histogram bin kept in shared memory: relative error 2**-32
WINDOW = 4096  # bins kept in shared memory (up to 2**0 = 1.0, bin 0x3F80)
DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
HARDWARE_CASTS = {"float8_e4m3fn": 1, "float8_e5m2": 2}
# The layout of the kernel's running totals on the device and of the copy its last block
# leaves in host memory, int64: HEAD slots (COUNTERS, then DONE, the count of finished
# blocks), the window's bins, then the whole histogram (only for relative errors outside
# the window, which float32 data cannot produce: kept as a guard)
HEAD = 16
COUNTERS = ("zeros", "flushed_or_zero", "exact_or_zero", "nonfinite", "nan", "beyond", "pairs",
            "nan_scales", "max_err_bits", "scale_max_bits", "scale_min_inverted_bits",
            "sum_err", "sum_err2", "sum_x2", "outside")

_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define FULL 0xffffffffu
// the shared window's slots past its bins
#define SLOT_REDO 0u
#define SLOT_ZERO 1u
#define SLOT_FLUSHED 2u
#define SLOT_EXACT 3u
// out, the running totals (HEAD, OUTSIDE, DONE: from the host): HEAD totals, then the
// window's bins, then the whole histogram (for the rare relative errors outside the
// window); zero at launch, zero again at exit.  result: where the last block copies them.
#define INF_BITS 0x7f800000u

__device__ __forceinline__ u32 umax32(u32 a, u32 b) { return a > b ? a : b; }

__device__ __forceinline__ float half_bits_to_float(u32 h) {
    float f;
    unsigned short s = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
}

// V elements of chunk c (zeros where not valid), as float32
__device__ __forceinline__ void load(const void* src, long long c, bool valid, float* x) {
#if DTYPE == 0
    const float4* p = reinterpret_cast<const float4*>(src) + c * (V / 4);
#pragma unroll
    for (int k = 0; k < V / 4; ++k) {
        float4 v = valid ? __ldcs(p + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        x[4 * k] = v.x; x[4 * k + 1] = v.y; x[4 * k + 2] = v.z; x[4 * k + 3] = v.w;
    }
#else
    const uint4* p = reinterpret_cast<const uint4*>(src) + c * (V / 8);
#pragma unroll
    for (int k = 0; k < V / 8; ++k) {
        uint4 v = valid ? __ldcs(p + k) : make_uint4(0u, 0u, 0u, 0u);
        u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#if DTYPE == 1
            x[8 * k + 2 * i] = __uint_as_float(w[i] << 16);
            x[8 * k + 2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
#else
            x[8 * k + 2 * i] = half_bits_to_float(w[i] & 0xffffu);
            x[8 * k + 2 * i + 1] = half_bits_to_float(w[i] >> 16);
#endif
        }
    }
#endif
}

struct Params {
    float fmax, beyond, scale_lo, scale_hi;
    u32 magic_low, magic_high, magic_shift;
};

// nearest-even, saturating rounding of a and b to the target format, back in float32
__device__ __forceinline__ void cast2(float a, float b, float& ra, float& rb, const Params& p) {
#if CAST == 1 || CAST == 2
    unsigned short packed;
    u32 halves;
#if CAST == 1
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(a), "f"(b));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(packed));
#else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(a), "f"(b));
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(halves) : "h"(packed));
#endif
    ra = half_bits_to_float(halves >> 16);
    rb = half_bits_to_float(halves & 0xffffu);
#else
    float in[2] = {a, b};
    float out[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float m = fabsf(in[i]);
        u32 e = __float_as_uint(m) & INF_BITS;
        e = (e < p.magic_low ? p.magic_low : (e > p.magic_high ? p.magic_high : e))
            + p.magic_shift;
        float big = __uint_as_float(e);
        float r = __fsub_rn(__fadd_rn(m, big), big);
        r = copysignf(r, in[i]);
        if (in[i] != in[i]) r = in[i];
        if (fabsf(r) > p.fmax) r = copysignf(p.fmax, r);
        out[i] = r;
    }
    ra = out[0];
    rb = out[1];
#endif
}

// Running totals of one thread.  flushed_or_zero counts flushed values and zero inputs,
// err0_or_zero exact results of nonzero inputs and zero inputs: the host takes the zeros off.
struct Totals {
    double s_err, s_err2, s_x2;
    float max_err;
    u32 zero, flushed_or_zero, err0_or_zero, nonfinite, nan, beyond, pairs, nan_scale;
    u32 scale_max, scale_min_inv;
};

// One nonzero, finite, not flushed relative error |xq - x| / |x| into the histogram, its
// bin decided exactly as the CPU engine decides it (metrics._bin_keys): the difference and
// the quotient in float64, truncated toward zero to float32 (a quotient just below a bin
// edge stays in the bin below, where a float32 division could round up onto the edge).
// Into the shared window, else the global histogram (inf/NaN: the host ranks it).
__device__ __forceinline__ void histogram_exact(float xq, float xv, u32* window, u64* out) {
    const double q = fabs((double)xq - (double)xv) / fabs((double)xv);
    const u32 key = __float_as_uint(__double2float_rz(q)) >> 16;
    if (key - WINDOW_LOW < WINDOW) {
        atomicAdd(&window[key - WINDOW_LOW], 1u);
    } else if (key < 0x7f80u) {
        atomicAdd(&out[HEAD + WINDOW + key], 1ull);
        atomicAdd(&out[OUTSIDE], 1ull);  // tells the host to copy the whole histogram
    }
}

// 1 / s as __fdiv_rn refines it (approximate reciprocal and one Newton step)
__device__ __forceinline__ float refined_reciprocal(float s) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(s));
    return __fmaf_rn(y, __fmaf_rn(-s, y, 1.f), y);
}

// r / s with y = refined_reciprocal(s): __fdiv_rn's fast path (product, residual, correction)
__device__ __forceinline__ float divide_clean(float r, float s, float y) {
    const float q0 = __fmaf_rn(r, y, 0.f);
    return __fmaf_rn(y, __fmaf_rn(-s, q0, r), q0);
}

// A chunk whose blocks are all clean: finite, max |x| in [2**-60, 2**60] or 0, no value
// scaled past the rounding threshold, and a scale for which the dequantizing division can
// use NVIDIA's own division sequence with the reciprocal taken once per block (the path
// __fdiv_rn takes when its range check passes: the same result).  Branch-free per element:
// every element adds 1 to one slot of the shared window -- its relative error's bin, or
// the slot for zero inputs, flushed values, exact results, or (rare) relative errors that
// the fast reciprocal (1 ulp) puts within 8 ulp of a bin edge or outside the window, which
// are then redone in float64 (histogram_exact).
__device__ __forceinline__ void chunk_clean(const float* x, const float* scale,
                                            const float* recip, Totals& t, const Params& p,
                                            u32* window, u64* out) {
    float xs[V], r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) xs[i] = __fmul_rn(x[i], scale[i / (V / G)]);
#pragma unroll
    for (int i = 0; i < V; i += 2) cast2(xs[i], xs[i + 1], r[i], r[i + 1], p);
    float p_err = 0.f, p_err2 = 0.f, p_x2 = 0.f;
    bool redo = false;
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const float xq = divide_clean(r[i], scale[i / (V / G)], recip[i / (V / G)]);
        const float err = __fsub_rn(xq, x[i]);
        p_err = __fadd_rn(p_err, err);
        p_err2 = __fmaf_rn(err, err, p_err2);
        p_x2 = __fmaf_rn(x[i], x[i], p_x2);
        t.max_err = fmaxf(t.max_err, fabsf(err));
        float inv;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inv) : "f"(fabsf(x[i])));
        const u32 bits = __float_as_uint(__fmul_rn(fabsf(err), inv));
        const u32 bin = (bits >> 16) - WINDOW_LOW;
        const bool near = ((bits + 8u) & 0xffffu) < 16u || bin >= WINDOW;
        u32 slot = near ? WINDOW + SLOT_REDO : bin;
        slot = err == 0.f ? WINDOW + SLOT_EXACT : slot;
        slot = r[i] == 0.f ? WINDOW + SLOT_FLUSHED : slot;
        slot = x[i] == 0.f ? WINDOW + SLOT_ZERO : slot;
        redo = redo || slot == WINDOW + SLOT_REDO;
        atomicAdd(&window[slot], 1u);
    }
    t.s_err += (double)p_err;
    t.s_err2 += (double)p_err2;
    t.s_x2 += (double)p_x2;
    t.pairs += V;
    if (redo) {
        for (int i = 0; i < V; ++i) {
            const float xq = divide_clean(r[i], scale[i / (V / G)], recip[i / (V / G)]);
            const float ae = fabsf(__fsub_rn(xq, x[i])), ax = fabsf(x[i]);
            float inv;
            asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inv) : "f"(ax));
            const u32 bits = __float_as_uint(__fmul_rn(ae, inv));
            const bool near = ((bits + 8u) & 0xffffu) < 16u
                              || (bits >> 16) - WINDOW_LOW >= WINDOW;
            if (near && ae != 0.f && r[i] != 0.f) histogram_exact(xq, x[i], window, out);
        }
    }
}

// Any chunk: inf/NaN inputs, extreme ranges, saturation; IEEE divisions, float64 sums.
__device__ __forceinline__ void chunk_general(const float* x, const float* scale, Totals& t,
                                           const Params& p, u32* window, u64* out) {
    const float inf = __uint_as_float(INF_BITS);
    float xs[V], r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) xs[i] = __fmul_rn(x[i], scale[i / (V / G)]);
#pragma unroll
    for (int i = 0; i < V; i += 2) cast2(xs[i], xs[i + 1], r[i], r[i + 1], p);
    for (int i = 0; i < V; ++i) {
        const float xv = x[i];
        const float xq = __fdiv_rn(r[i], scale[i / (V / G)]);
        const float err = __fsub_rn(xq, xv);
        const float ax = fabsf(xv), ae = fabsf(err);
        const bool finite_x = ax < inf, finite_err = ae < inf;
        if (finite_x && finite_err) {
            t.s_err += (double)err;
            t.s_err2 += (double)err * (double)err;
            t.s_x2 += (double)xv * (double)xv;
            t.max_err = fmaxf(t.max_err, ae);
            t.pairs += 1u;
        }
        const bool population = finite_x && xv != 0.f;
        t.zero += xv == 0.f;
        t.nonfinite += !finite_x;
        t.nan += (xq != xq) && (xv == xv);
        t.beyond += fabsf(xs[i]) >= p.beyond;
        t.flushed_or_zero += (population && xq == 0.f) || xv == 0.f;
        t.err0_or_zero += (population && ae == 0.f) || xv == 0.f;
        if (population && ae != 0.f && finite_err && xq != 0.f)
            histogram_exact(xq, xv, window, out);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
fmt_quantize_stats(const void* __restrict__ src, int n_chunks, u64* __restrict__ out,
                   u64* __restrict__ result, double fmax, double beyond, double scale_lo,
                   double scale_hi, int magic_low, int magic_high, int magic_shift) {
    __shared__ u32 window[WINDOW + 4];
    for (int i = threadIdx.x; i < WINDOW + 4; i += THREADS) window[i] = 0u;
    __syncthreads();
    Params p;
    p.fmax = (float)fmax;
    p.beyond = (float)beyond;
    p.scale_lo = (float)scale_lo;
    p.scale_hi = (float)scale_hi;
    p.magic_low = (u32)magic_low;
    p.magic_high = (u32)magic_high;
    p.magic_shift = (u32)magic_shift;
    Totals t = {0.0, 0.0, 0.0, 0.f, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
    const int lane = threadIdx.x & 31;
    const long long stride = (long long)gridDim.x * THREADS;
    long long c0 = (long long)blockIdx.x * THREADS + (threadIdx.x & ~31);
    float x[V], next[V];
    load(src, c0 + lane, c0 + lane < n_chunks, x);
    for (; c0 < n_chunks; c0 += stride) {
        const long long c = c0 + lane;
        const bool valid = c < n_chunks;  // the same for all L lanes of a block
        load(src, c + stride, c + stride < n_chunks, next);  // in flight while this one runs
        float scale[G], recip[G];
        bool clean = true;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            u32 amax = 0u;  // integer max of the magnitudes: NaN > inf > finite
#pragma unroll
            for (int j = 0; j < V / G; ++j)
                amax = umax32(amax, __float_as_uint(x[g * (V / G) + j]) & 0x7fffffffu);
#pragma unroll
            for (int off = L / 2; off > 0; off >>= 1)
                amax = umax32(amax, __shfl_xor_sync(FULL, amax, off));
            const float a = __uint_as_float(amax);
            const bool mid = amax >= 0x21800000u && amax <= 0x5d800000u;  // [2**-60, 2**60]
            float s;
            // max / amax, clamped to the normal float32 range, as scaling.amax_to_scale
            if (mid) s = fminf(fmaxf(divide_clean(p.fmax, a, refined_reciprocal(a)),
                                     1.17549435e-38f), 3.40282347e+38f);  // = __fdiv_rn here
            else if (amax == 0u) s = 1.f;                                // all zeros
            else if (amax > INF_BITS) s = __uint_as_float(0x7fc00000u);  // NaN in the block
            else if (amax == INF_BITS) s = 0.f;                          // inf in the block
            else s = fminf(fmaxf(__fdiv_rn(p.fmax, a), 1.17549435e-38f), 3.40282347e+38f);
            scale[g] = s;
            recip[g] = refined_reciprocal(s);
            clean = clean && (amax == 0u || mid) && s >= p.scale_lo && s <= p.scale_hi
                    && __fmul_rn(a, s) < p.beyond;
            if (valid && (lane & (L - 1)) == 0) {
                if (s == s) {
                    t.scale_max = umax32(t.scale_max, __float_as_uint(s));
                    t.scale_min_inv = umax32(t.scale_min_inv, ~__float_as_uint(s));
                } else {
                    t.nan_scale += 1u;
                }
            }
        }
        if (valid) {
            if (clean) chunk_clean(x, scale, recip, t, p, window, out);
            else chunk_general(x, scale, t, p, window, out);
        }
#pragma unroll
        for (int i = 0; i < V; ++i) x[i] = next[i];
    }
    // this thread's totals: summed over the warp, then one atomic per warp
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        t.s_err += __shfl_xor_sync(FULL, t.s_err, off);
        t.s_err2 += __shfl_xor_sync(FULL, t.s_err2, off);
        t.s_x2 += __shfl_xor_sync(FULL, t.s_x2, off);
        t.max_err = fmaxf(t.max_err, __shfl_xor_sync(FULL, t.max_err, off));
        t.scale_max = umax32(t.scale_max, __shfl_xor_sync(FULL, t.scale_max, off));
        t.scale_min_inv = umax32(t.scale_min_inv, __shfl_xor_sync(FULL, t.scale_min_inv, off));
        t.zero += __shfl_xor_sync(FULL, t.zero, off);
        t.flushed_or_zero += __shfl_xor_sync(FULL, t.flushed_or_zero, off);
        t.err0_or_zero += __shfl_xor_sync(FULL, t.err0_or_zero, off);
        t.nonfinite += __shfl_xor_sync(FULL, t.nonfinite, off);
        t.nan += __shfl_xor_sync(FULL, t.nan, off);
        t.beyond += __shfl_xor_sync(FULL, t.beyond, off);
        t.pairs += __shfl_xor_sync(FULL, t.pairs, off);
        t.nan_scale += __shfl_xor_sync(FULL, t.nan_scale, off);
    }
    // ... then over the block in shared memory, then one atomic per total and block
    __shared__ double sums[3][THREADS / 32];
    __shared__ u64 counts[11][THREADS / 32];
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        sums[0][warp] = t.s_err;
        sums[1][warp] = t.s_err2;
        sums[2][warp] = t.s_x2;
        counts[0][warp] = t.zero;
        counts[1][warp] = t.flushed_or_zero;
        counts[2][warp] = t.err0_or_zero;
        counts[3][warp] = t.nonfinite;
        counts[4][warp] = t.nan;
        counts[5][warp] = t.beyond;
        counts[6][warp] = t.pairs;
        counts[7][warp] = t.nan_scale;
        counts[8][warp] = __float_as_uint(t.max_err);
        counts[9][warp] = t.scale_max;
        counts[10][warp] = t.scale_min_inv;
    }
    __syncthreads();  // (also: every shared-memory histogram add is done)
    if (threadIdx.x == 0) {
        counts[0][0] += window[WINDOW + SLOT_ZERO];
        counts[1][0] += window[WINDOW + SLOT_ZERO] + window[WINDOW + SLOT_FLUSHED];
        counts[2][0] += window[WINDOW + SLOT_ZERO] + window[WINDOW + SLOT_EXACT];
    }
    __syncthreads();
    u64* head = out;
    if (threadIdx.x < 3) {
        double total = 0.0;
        for (int w = 0; w < THREADS / 32; ++w) total += sums[threadIdx.x][w];
        atomicAdd(reinterpret_cast<double*>(head + 11 + threadIdx.x), total);
    } else if (threadIdx.x < 14) {
        const int k = threadIdx.x - 3;
        u64 total = 0;
        for (int w = 0; w < THREADS / 32; ++w)
            total = k < 8 ? total + counts[k][w] : (total > counts[k][w] ? total : counts[k][w]);
        if (k < 8) atomicAdd(&head[k], total);
        else atomicMax(&head[k], total);
    }
    for (int i = threadIdx.x; i < WINDOW; i += THREADS)
        if (window[i]) atomicAdd(&out[HEAD + i], (u64)window[i]);
    // The last block to finish copies the totals to the host's page-locked buffer and
    // zeroes them for the next launch (the pattern of CUDA's threadFenceReduction sample).
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(&out[DONE], 1ull) == (u64)gridDim.x - 1;
    __syncthreads();
    if (last) {
        __threadfence();
        const bool whole = __ldcg(&out[OUTSIDE]) != 0;
        for (int i = threadIdx.x; i < HEAD + WINDOW; i += THREADS) {
            result[i] = __ldcg(&out[i]);
            out[i] = 0;
        }
        if (whole) {
            for (int i = HEAD + WINDOW + threadIdx.x; i < HEAD + WINDOW + 65536; i += THREADS) {
                result[i] = __ldcg(&out[i]);
                out[i] = 0;
            }
        }
    }
}
"""


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
            and 1 <= block <= 1024 and block & (block - 1) == 0
            and cols % layout(block)[0] == 0)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether a CUDA device is there and this torch compiles and loads the kernel (NVRTC
    through ``_compile_kernel``, torch >= 2.8): tried once per process."""
    try:
        import torch
    except ImportError:
        return False
    if not (torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")):
        return False
    try:
        return hasattr(_compiled(128, 0, 0), "func")  # the launch uses the driver handle
    except Exception:  # no NVRTC library, an unsupported device, an API change
        return False


@functools.lru_cache(maxsize=8)
def hardware_cast_supported(device_index: int) -> bool:
    """FP8 conversion instructions (``cvt ... e4m3x2``) need compute capability 8.9+."""
    import torch

    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def layout(block: int) -> tuple[int, int, int]:
    """(V, L, G): elements per thread, lanes sharing one block, blocks per thread."""
    v = max(ELEMENTS, block // 32)
    if block >= v:
        return v, block // v, 1
    return v, 1, v // block


def kernel_source(block: int, dtype: int, cast: int) -> str:
    """The CUDA C source for blocks of ``block`` elements, input ``DTYPES`` code ``dtype``
    and cast ``cast`` (``HARDWARE_CASTS`` code, 0 for the magic-number rounding)."""
    v, lanes, groups = layout(block)
    return (f"#define V {v}\n#define L {lanes}\n#define G {groups}\n#define DTYPE {dtype}\n"
            f"#define CAST {cast}\n#define THREADS {THREADS}\n#define MIN_BLOCKS {MIN_BLOCKS}\n"
            f"#define WINDOW_LOW {WINDOW_LOW}u\n#define WINDOW {WINDOW}u\n"
            f"#define HEAD {HEAD}\n#define OUTSIDE {COUNTERS.index('outside')}\n"
            f"#define DONE {HEAD - 1}\n") + _SOURCE


def compile_kernel(source: str, name: str):
    """NVRTC-compile ``source`` for the current device, without contracting a * b + c into
    fused multiply-adds where the source does not ask for them (the engine's rounding
    depends on each step being rounded)."""
    import torch

    return torch.cuda._compile_kernel(source, name, nvcc_options=["-fmad=false"])


def quantize_blocks_cuda(x, scheme: Scheme, *, hardware_cast: bool = True,
                         blocks_per_sm: int = BLOCKS_PER_SM
                         ) -> tuple[ErrorAccumulator, ScaleSummary]:
    """Statistics of ``scheme`` (see ``fast_path_applies``) on a CUDA tensor of float32,
    bfloat16 or float16, and a summary of its scales (count, min, max, NaN; distinct values
    are not counted here).  One kernel launch; the kernel writes its totals straight into
    page-locked host memory, so the host only waits for it."""
    import torch

    x = x.contiguous().reshape(-1)
    buffers = launch(x, scheme, hardware_cast=hardware_cast, blocks_per_sm=blocks_per_sm)
    hist = np.zeros(HIST_BINS, np.int64)  # while the kernel runs
    torch.cuda.current_stream(x.device).synchronize()
    # (read in place: _unpack keeps no reference to the buffer, which the next launch reuses)
    head = buffers.host[:HEAD + WINDOW] if x.numel() else np.zeros(HEAD + WINDOW, np.int64)
    if head[COUNTERS.index("outside")]:
        hist += buffers.host[HEAD + WINDOW:]
    return _unpack(head, hist, x.numel(), scheme.block)


def launch(x, scheme: Scheme, *, hardware_cast: bool = True,
           blocks_per_sm: int = BLOCKS_PER_SM) -> _Buffers:
    """Start the kernel on the flat contiguous CUDA tensor ``x``; the buffers its totals
    will be in once the current stream gets there."""
    import torch

    spec = scheme.format
    block = scheme.block
    dtype = DTYPES[str(x.dtype).removeprefix("torch.")]
    v, _, _ = layout(block)
    if x.numel() % block or x.numel() % v:
        raise ValueError(f"the tensor must hold whole blocks and whole runs of {v} elements "
                         "(fast_path_applies)")
    n_chunks = x.numel() // v
    if n_chunks >= 2**31:
        raise ValueError("tensor too large for one launch")
    device = x.device.index or 0
    cast = (HARDWARE_CASTS.get(spec.name, 0)
            if hardware_cast and hardware_cast_supported(device) else 0)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    buffers = _buffers(device, stream)
    if n_chunks:
        key = (spec.name, block, dtype, cast, device, blocks_per_sm)
        prepared = _PREPARED.get(key)
        if prepared is None:
            prepared = _PREPARED[key] = _Prepared(spec, block, dtype, cast, device,
                                                  blocks_per_sm)
        try:
            prepared(x, n_chunks, buffers, stream)
        except Exception:
            _buffers.cache_clear()  # a failed launch may leave them dirty
            raise
    return buffers


class _Buffers:
    """The kernel's running totals on the device (zero between launches: the kernel's
    last block zeroes them) and the page-locked, device-mapped host memory it copies them
    to; one pair per device and stream."""

    SIZE = HEAD + WINDOW + HIST_BINS

    def __init__(self, device_index: int):
        import torch

        self.totals = torch.zeros(self.SIZE, dtype=torch.int64, device=f"cuda:{device_index}")
        driver = _driver()
        host = ctypes.c_void_p()
        _check(driver.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(self.SIZE * 8),
                                     ctypes.c_uint(0x03)))  # PORTABLE | DEVICEMAP
        self._host_pointer = host
        mapped = ctypes.c_uint64()
        _check(driver.cuMemHostGetDevicePointer_v2(ctypes.byref(mapped), host, ctypes.c_uint(0)))
        self.device_pointer = mapped.value
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * self.SIZE).from_address(host.value))

    def __del__(self):
        try:
            _driver().cuMemFreeHost(self._host_pointer)
        except Exception:  # interpreter shutdown: the process frees it anyway
            pass


@functools.lru_cache(maxsize=8)
def _buffers(device_index: int, stream: int) -> _Buffers:
    return _Buffers(device_index)


@functools.lru_cache(maxsize=1)
def _driver():
    """The CUDA driver library (loaded already: torch uses it)."""
    return ctypes.CDLL("libcuda.so.1")


def _check(rc: int) -> None:
    if rc:
        raise RuntimeError(f"CUDA driver error {rc} in fmtcli's quantize kernel")


@functools.lru_cache(maxsize=32)
def _compiled(block: int, dtype: int, cast: int):
    return compile_kernel(kernel_source(block, dtype, cast), "fmt_quantize_stats")


class _Prepared:
    """A compiled kernel with its scalar arguments and grid made once per format, block
    size, dtype and device: a launch is then one driver call."""

    def __init__(self, spec, block: int, dtype: int, cast: int, device_index: int,
                 blocks_per_sm: int):
        import torch

        self.kernel = _compiled(block, dtype, cast)
        m = spec.mantissa_bits
        lo, hi = clean_scales(spec)
        self.scalars = [ctypes.c_double(spec.max), ctypes.c_double(beyond_threshold(spec)),
                        ctypes.c_double(lo), ctypes.c_double(hi),
                        ctypes.c_int(int(np.float32(spec.smallest_normal).view(np.int32))),
                        ctypes.c_int(int(np.float32(2.0 ** (spec.max_exponent + 1))
                                         .view(np.int32))),
                        ctypes.c_int((23 - m) << 23)]
        sms = torch.cuda.get_device_properties(device_index).multi_processor_count
        self.grid = sms * blocks_per_sm

    def __call__(self, x, n_chunks: int, buffers: _Buffers, stream: int) -> None:
        grid = max(1, min(self.grid, -(-n_chunks // THREADS)))
        values = [ctypes.c_void_p(x.data_ptr()), ctypes.c_int(n_chunks),
                  ctypes.c_void_p(buffers.totals.data_ptr()),
                  ctypes.c_void_p(buffers.device_pointer), *self.scalars]
        args = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        _check(_driver().cuLaunchKernel(self.kernel.func, grid, 1, 1, THREADS, 1, 1, 0,
                                        ctypes.c_void_p(stream), args, None))


_PREPARED: dict[tuple, _Prepared] = {}  # by format name, block, dtype, cast, device, grid


def clean_scales(spec) -> tuple[float, float]:
    """The scales for which the kernel dequantizes with a reciprocal taken once per block.

    NVIDIA's IEEE division (``__fdiv_rn``) refines a reciprocal of the divisor, multiplies,
    and corrects with two fused multiply-adds, after a range check (``FCHK``) that sends
    extreme operands to a slow path.  For ``r / scale`` with r on the format's grid, scale,
    every nonzero quotient and r itself within [2**-100, 2**100] keep clear of that range,
    so the kernel runs the same sequence with the reciprocal hoisted out of the block:
    the same results (tests/test_gpu.py compares them on every value of several formats).
    """
    low = max(2.0 ** -100, spec.max * 2.0 ** -100)
    high = min(2.0 ** 100, spec.smallest_subnormal * 2.0 ** 100)
    if spec.smallest_subnormal < 2.0 ** -100 or spec.max > 2.0 ** 100 or low > high:
        return 1.0, 0.0  # never
    return float(np.float32(low)), float(np.float32(high))


def _unpack(head: np.ndarray, hist: np.ndarray, count: int, block: int
            ) -> tuple[ErrorAccumulator, ScaleSummary]:
    """The accumulator and scale summary from the kernel's totals and window of bins;
    ``hist`` holds the bins outside the window (zeros where no relative error fell there)
    and becomes the accumulator's histogram.  (Plain Python on one list: this runs after
    the wait, on every call.)"""
    (zeros, flushed_or_zero, exact_or_zero, nonfinite, nan, beyond, pairs, nan_scales,  # COUNTERS
     max_err, high, inverted_low, _, _, _, outside) = head[:len(COUNTERS)].tolist()
    sum_err, sum_err2, sum_x2 = struct.unpack("<3d", head[_SUMS].tobytes())
    window = head[HEAD:HEAD + WINDOW]
    binned = int(hist[:FINITE_BINS].sum()) if outside else 0
    hist[WINDOW_LOW:WINDOW_LOW + WINDOW] += window
    flushed = flushed_or_zero - zeros
    exact = exact_or_zero - zeros  # exact results of nonzero inputs
    nonzero = count - zeros - nonfinite
    hist[0] += exact
    hist[0x3F80] += flushed  # relative error exactly 1
    # population elements whose relative error is inf or NaN (x_q inf/NaN) rank last, past
    # the finite bins, as on the CPU
    hist[FINITE_BINS] += nonzero - binned - int(window.sum()) - exact - flushed
    # finite inputs whose result is inf or NaN (a block holding NaN has a NaN scale): an
    # unbounded error, as metrics counts it
    acc = ErrorAccumulator(count=count, nonzero=nonzero, zeros=zeros,
                           nonfinite_inputs=nonfinite, flushed=flushed, saturated=beyond,
                           nan_produced=nan, unbounded=count - nonfinite - pairs,
                           finite_pairs=pairs, sum_err=sum_err,
                           sum_err2=sum_err2, sum_x2=sum_x2, max_abs_err=_float(max_err),
                           hist=hist)
    n_blocks = count // block
    summary = ScaleSummary(count=n_blocks, nan=nan_scales, counted=False)
    if n_blocks > nan_scales:
        summary.high = _float(high)
        summary.low = _float(~inverted_low & 0xFFFFFFFF)
    return acc, summary


_SUMS = slice(COUNTERS.index("sum_err"), COUNTERS.index("sum_x2") + 1)


def _float(bits: int) -> float:
    """The float32 with these bits."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]
