// The fused quantize-statistics kernel of fmt quantize (fmtcli/quantize/cuda_kernel.py
// explains what it computes and why).  cuda_kernel.kernel_source prepends the #defines
// V, L, G, DTYPE, CAST, THREADS, MIN_BLOCKS, WINDOW_LOW, WINDOW, HEAD, OUTSIDE and DONE.
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
    u32 above;  // |x * scale| > max (beyond: its rounding lies past max, saturated)
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
        t.above += fabsf(xs[i]) > p.fmax;  // below the threshold, yet above max
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
        t.above += fabsf(xs[i]) > p.fmax;
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
    Totals t = {0.0, 0.0, 0.0, 0.f, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
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
        t.above += __shfl_xor_sync(FULL, t.above, off);
    }
    // ... then over the block in shared memory, then one atomic per total and block
    __shared__ double sums[3][THREADS / 32];
    __shared__ u64 counts[12][THREADS / 32];
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
        counts[11][warp] = t.above;
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
    } else if (threadIdx.x == 14) {  // above, after outside (head[14]): head[15]
        u64 total = 0;
        for (int w = 0; w < THREADS / 32; ++w) total += counts[11][w];
        atomicAdd(&head[15], total);
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
