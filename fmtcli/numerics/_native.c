/* The CPU engine's per-chunk work in one compiled pass (an optional extension module).
 *
 * fmtcli/numerics/native.py loads it; the engine (engine/chunk_native.py, chunk_parts.py,
 * scales.py) calls it for the common case (a float32 chunk, nearest-even rounding by the
 * magic number, every scaled value in the format's range) and keeps the numpy formulation for everything else.  Each function
 * computes exactly what the numpy path computes, in the same float32 operations:
 *
 *   x_q = (|x * s| + M) - M with x * s's sign, divided by s   (rounding.round_float32_...)
 *   err = x_q - x;  rel = |err| / |x|  (float32);  histogram key = bits(rel) >> 16, redone
 *   in float64 within 8 ulp of a bin edge              (metrics._bin_keys)
 *
 * and sums by numpy's own pairwise summation (8 accumulators, blocks of 128, halves split
 * at multiples of 8), so that the statistics are the numpy path's to the bit, whether or
 * not this module was built.  Compiled without -ffast-math and with -ffp-contract=off: no
 * reassociation, no fused multiply-add.
 *
 * State.  Two tables are module globals, not per call: quantize_chunk's four interleaved
 * histograms (local_hist, 1 MiB) and distinct_bits' hash set (set_slots, 1 MiB).  They are
 * safe only because every function here runs start to finish holding the GIL -- none
 * releases it (no Py_BEGIN_ALLOW_THREADS), so two calls never overlap in one process --
 * and because each call leaves its table all zero again, on every path (quantize_chunk
 * clears the bins it touched even when it gives up; distinct_bits the slots it filled).
 * Forked workers (streaming.parallel) each get their own copy.  The module declares no
 * Py_mod_gil slot, so a free-threaded CPython turns the GIL back on when it imports it.
 * Releasing the GIL here, or declaring Py_MOD_GIL_NOT_USED, needs per-call tables first.
 * Kept global because a fresh zeroed megabyte per call is not free: calloc and free of the
 * histograms' 1 MiB took 80-90 us a call (measured with gcc -O2 and glibc on the 2-core
 * development machine), as long as the whole pass over ~200,000 values at 0.4 ns a value
 * (a 384 x 384 candidate of scale-search).  The float32 scratch that callers pass in is
 * reused for the same reason (engine/chunk_native.scratch, one per process).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HIST_SHIFT 16
#define HIST_BINS (1 << (32 - HIST_SHIFT))
#define FINITE_BINS (0x7F800000u >> HIST_SHIFT)
#define EDGE_ULPS 8
#define PW_BLOCKSIZE 128
#define BLOCK_MAX 4096 /* tile widths up to this run the two-stage inner loop */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && !defined(FMTCLI_PORTABLE_ONLY)
/* AVX2 twice the lanes of the baseline SSE2; same IEEE results (no FMA is enabled) */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

static inline uint32_t bits_of(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float float_of(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

/* ---- numpy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src) ---- */

/* ---- the stored 16-bit formats, widened exactly to float32 ---- */

/* bfloat16 is float32's top half */
static inline float bf16_value(uint16_t h) { return float_of((uint32_t)h << 16); }

/* float16: normal and subnormal by an exponent rebias of 2**112 as a float multiply (exact:
 * a subnormal half is an integer times 2**-24, and every such value is a normal float);
 * inf/NaN: exponent all ones, payload kept.  Branch-free, so loops over it vectorise
 * (numpy's astype runs ~1.6 ns a value on CPUs it has no F16C path for). */
static inline float half_value(uint16_t h)
{
    uint32_t v = h;
    uint32_t sign = (v & 0x8000u) << 16;
    uint32_t mag = v & 0x7FFFu;
    uint32_t finite = bits_of(float_of(mag << 13) * 0x1p112f);
    uint32_t special = (mag << 13) | 0x7F800000u;
    uint32_t is_special = 0u - (uint32_t)(mag >= 0x7C00u);
    return float_of((special & is_special) | (finite & ~is_special) | sign);
}

/* What a chunk's buffer holds: float32, or 16-bit patterns read as stored (the kernel
 * widens them as it goes: no widened copy of the chunk is made). */
enum { KIND_FLOAT32 = 0, KIND_BFLOAT16 = 1, KIND_FLOAT16 = 2 };

/* ---- numpy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src) ---- */

#define PAIRWISE(NAME, T, ACC, LEAF)                                                \
    static ACC NAME(const T *a, Py_ssize_t n)                                      \
    {                                                                               \
        if (n < 8) {                                                                \
            ACC res = 0.;                                                           \
            for (Py_ssize_t i = 0; i < n; i++) res += LEAF(a[i]);                   \
            return res;                                                             \
        }                                                                           \
        if (n <= PW_BLOCKSIZE) {                                                    \
            ACC r[8];                                                               \
            for (int j = 0; j < 8; j++) r[j] = LEAF(a[j]);                          \
            Py_ssize_t i;                                                           \
            for (i = 8; i < n - (n % 8); i += 8)                                    \
                for (int j = 0; j < 8; j++) r[j] += LEAF(a[i + j]);                 \
            ACC res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])); \
            for (; i < n; i++) res += LEAF(a[i]);                                   \
            return res;                                                             \
        }                                                                           \
        Py_ssize_t n2 = n / 2;                                                      \
        n2 -= n2 % 8;                                                               \
        return NAME(a, n2) + NAME(a + n2, n - n2);                                  \
    }

#define LEAF_SAME(v) (v)
#define LEAF_SQUARE_F32(v) ((float)((v) * (v)))
#define LEAF_SQUARE_F64(v) ((double)(v) * (double)(v))
PAIRWISE(pairwise_f32, float, float, LEAF_SAME)
PAIRWISE(pairwise_square_f32, float, float, LEAF_SQUARE_F32)
PAIRWISE(pairwise_square_f64, float, double, LEAF_SQUARE_F64)

/* np.add.reduce of a contiguous 1-D float32 array */
static double reduce_f32(const float *a, Py_ssize_t n) { return (double)pairwise_f32(a, n); }

/* ---- 16-bit values widened in stretches (vectorised; a stretch stays in L1) ---- */

VECTOR_CLONES
static void widen_half_portable(const uint16_t *h, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) out[i] = half_value(h[i]);
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(FMTCLI_PORTABLE_ONLY)
#include <immintrin.h>
#define HAVE_F16C_PATHS 1
/* The hardware conversion (VCVTPH2PS: 16 values an instruction with AVX-512F, 8 with
 * F16C), exact for every finite half, subnormals included; it quiets signalling NaNs, so
 * NaN lanes take half_value's bits (payload kept, as numpy keeps it). */
__attribute__((target("avx512f")))
static void widen_half_avx512(const uint16_t *h, float *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    const __m512i mag_mask = _mm512_set1_epi32(0x7FFF), inf = _mm512_set1_epi32(0x7C00);
    const __m512i exp_ones = _mm512_set1_epi32(0x7F800000);
    for (; i + 16 <= n; i += 16) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(h + i));
        __m512 wide = _mm512_cvtph_ps(raw);
        __m512i v = _mm512_cvtepu16_epi32(raw);
        __m512i mag = _mm512_and_si512(v, mag_mask);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, inf);
        __m512i sign = _mm512_slli_epi32(_mm512_andnot_si512(mag_mask, v), 16);
        __m512i special = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(mag, 13), exp_ones),
                                          sign);
        _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(nan, wide, _mm512_castsi512_ps(special)));
    }
    for (; i < n; i++) out[i] = half_value(h[i]);
}

__attribute__((target("avx2,f16c")))
static void widen_half_f16c(const uint16_t *h, float *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    const __m256i mag_mask = _mm256_set1_epi32(0x7FFF), inf = _mm256_set1_epi32(0x7C00);
    const __m256i exp_ones = _mm256_set1_epi32(0x7F800000);
    for (; i + 8 <= n; i += 8) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(h + i));
        __m256 wide = _mm256_cvtph_ps(raw);
        __m256i v = _mm256_cvtepu16_epi32(raw);
        __m256i mag = _mm256_and_si256(v, mag_mask);
        __m256i nan = _mm256_cmpgt_epi32(mag, inf);
        __m256i sign = _mm256_slli_epi32(_mm256_andnot_si256(mag_mask, v), 16);
        __m256i special = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(mag, 13), exp_ones),
                                          sign);
        _mm256_storeu_ps(out + i, _mm256_blendv_ps(wide, _mm256_castsi256_ps(special),
                                                   _mm256_castsi256_ps(nan)));
    }
    for (; i < n; i++) out[i] = half_value(h[i]);
}
#endif

typedef void (*WidenHalf)(const uint16_t *, float *, Py_ssize_t);
static WidenHalf widen_half_best = widen_half_portable; /* set when the module loads */

static void pick_widen_half(int fast)
{
    widen_half_best = widen_half_portable;
#ifdef HAVE_F16C_PATHS
    __builtin_cpu_init();
    if (!fast) return;
    if (__builtin_cpu_supports("avx512f")) widen_half_best = widen_half_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        widen_half_best = widen_half_f16c;
#endif
}

/* float16 to float32, exact (inf and NaN payloads kept), by the fastest path this CPU has */
static void widen_half(const uint16_t *h, float *out, Py_ssize_t n) { widen_half_best(h, out, n); }

/* a stretch of 16-bit values widened into a float32 buffer (one that stays in L1) */
VECTOR_CLONES
static void widen_bf16(const uint16_t *h, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) out[i] = bf16_value(h[i]);
}

/* The same pairwise tree over 16-bit values, to the bit: the recursion splits as numpy's,
 * and each leaf (at most PW_BLOCKSIZE values) is summed as the float32 leaf sums the
 * widened values -- 8 running sums r[j] over values j, j + 8, ..., combined as
 * ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail in order. */
typedef float (*Leaf32)(const uint16_t *, Py_ssize_t);
typedef double (*Leaf64)(const uint16_t *, Py_ssize_t);

static float tree32(const uint16_t *a, Py_ssize_t n, Leaf32 leaf)
{
    if (n <= PW_BLOCKSIZE) return leaf(a, n);
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return tree32(a, n2, leaf) + tree32(a + n2, n - n2, leaf);
}

static double tree64(const uint16_t *a, Py_ssize_t n, Leaf64 leaf)
{
    if (n <= PW_BLOCKSIZE) return leaf(a, n);
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return tree64(a, n2, leaf) + tree64(a + n2, n - n2, leaf);
}

/* portable leaves: the values widened into a buffer, then the float32 leaf */
#define PORTABLE_LEAF(NAME, ACC, LEAF32, WIDEN)                                     \
    static ACC NAME(const uint16_t *a, Py_ssize_t n)                               \
    {                                                                               \
        float wide[PW_BLOCKSIZE];                                                   \
        WIDEN(a, wide, n);                                                          \
        return LEAF32(wide, n);                                                     \
    }
PORTABLE_LEAF(leaf32_bf16, float, pairwise_square_f32, widen_bf16)
PORTABLE_LEAF(leaf64_bf16, double, pairwise_square_f64, widen_bf16)
PORTABLE_LEAF(leaf32_half, float, pairwise_square_f32, widen_half)
PORTABLE_LEAF(leaf64_half, double, pairwise_square_f64, widen_half)

#ifdef HAVE_F16C_PATHS
/* AVX2 leaves: the eight running sums are the eight lanes of one vector (no fused
 * multiply-add: each square is rounded, then each sum, as in the scalar leaf) */
#define LOAD8_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(                         \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define LOAD8_HALF(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define AVX2_LEAF32(NAME, LOAD8, VALUE)                                             \
    __attribute__((target("avx2,f16c")))                                            \
    static float NAME(const uint16_t *a, Py_ssize_t n)                              \
    {                                                                               \
        float res = 0.f;                                                            \
        Py_ssize_t i = 0;                                                           \
        if (n >= 8) {                                                               \
            __m256 v = LOAD8(a), r = _mm256_mul_ps(v, v);                           \
            for (i = 8; i < n - (n % 8); i += 8) {                                  \
                v = LOAD8(a + i);                                                   \
                r = _mm256_add_ps(r, _mm256_mul_ps(v, v));                          \
            }                                                                       \
            float l[8];                                                             \
            _mm256_storeu_ps(l, r);                                                 \
            res = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));   \
        }                                                                           \
        for (; i < n; i++) {                                                        \
            float x = VALUE(a[i]);                                                  \
            res += (float)(x * x);                                                  \
        }                                                                           \
        return res;                                                                 \
    }
#define AVX2_LEAF64(NAME, LOAD8, VALUE)                                             \
    __attribute__((target("avx2,f16c")))                                            \
    static double NAME(const uint16_t *a, Py_ssize_t n)                             \
    {                                                                               \
        double res = 0.;                                                            \
        Py_ssize_t i = 0;                                                           \
        if (n >= 8) {                                                               \
            __m256 v = LOAD8(a);                                                    \
            __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));                \
            __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));              \
            __m256d r0 = _mm256_mul_pd(lo, lo), r1 = _mm256_mul_pd(hi, hi);         \
            for (i = 8; i < n - (n % 8); i += 8) {                                  \
                v = LOAD8(a + i);                                                   \
                lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));                    \
                hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));                  \
                r0 = _mm256_add_pd(r0, _mm256_mul_pd(lo, lo));                      \
                r1 = _mm256_add_pd(r1, _mm256_mul_pd(hi, hi));                      \
            }                                                                       \
            double l[8];                                                            \
            _mm256_storeu_pd(l, r0);                                                \
            _mm256_storeu_pd(l + 4, r1);                                            \
            res = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));   \
        }                                                                           \
        for (; i < n; i++) {                                                        \
            double x = (double)VALUE(a[i]);                                         \
            res += x * x;                                                           \
        }                                                                           \
        return res;                                                                 \
    }
AVX2_LEAF32(leaf32_bf16_avx2, LOAD8_BF16, bf16_value)
AVX2_LEAF64(leaf64_bf16_avx2, LOAD8_BF16, bf16_value)
AVX2_LEAF32(leaf32_half_avx2, LOAD8_HALF, half_value)
AVX2_LEAF64(leaf64_half_avx2, LOAD8_HALF, half_value)
#endif

/* the leaves this CPU runs, by kind (1 bfloat16, 2 float16); set when the module loads */
static Leaf32 leaf32_of[3] = {NULL, leaf32_bf16, leaf32_half};
static Leaf64 leaf64_of[3] = {NULL, leaf64_bf16, leaf64_half};

static void pick_leaves(int fast)
{
    leaf32_of[1] = leaf32_bf16;
    leaf64_of[1] = leaf64_bf16;
    leaf32_of[2] = leaf32_half;
    leaf64_of[2] = leaf64_half;
#ifdef HAVE_F16C_PATHS
    __builtin_cpu_init();
    if (fast && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        leaf32_of[1] = leaf32_bf16_avx2;
        leaf64_of[1] = leaf64_bf16_avx2;
        leaf32_of[2] = leaf32_half_avx2;
        leaf64_of[2] = leaf64_half_avx2;
    }
#endif
}

/* metrics._sum_of_squares of the chunk's values as float32 (their largest magnitude
 * given): float32 pairwise squares in [2**-23, 2**50], float64 squares otherwise */
static double sum_of_squares(const void *a, Py_ssize_t n, double largest, int kind)
{
    int narrow = largest >= 0x1p-23 && largest <= 0x1p50;
    switch (kind) {
    case KIND_BFLOAT16:
    case KIND_FLOAT16:
        return narrow ? (double)tree32(a, n, leaf32_of[kind]) : tree64(a, n, leaf64_of[kind]);
    default:
        return narrow ? (double)pairwise_square_f32(a, n) : pairwise_square_f64(a, n);
    }
}

/* ---- buffers ---- */

/* rows * cols, or -1 (with ValueError set) where a dimension is negative or the product
 * overflows */
static Py_ssize_t checked_size(Py_ssize_t rows, Py_ssize_t cols)
{
    if (rows < 0 || cols < 0 || (rows && cols > PY_SSIZE_T_MAX / 4 / rows)) {
        PyErr_SetString(PyExc_ValueError, "bad shape");
        return -1;
    }
    return rows * cols;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *format,
                      Py_ssize_t itemsize, Py_ssize_t count, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (count < 0 || count > PY_SSIZE_T_MAX / itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: bad length", what);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->itemsize != itemsize || view->len != count * itemsize
        || (format && view->format && strcmp(view->format, format) != 0
            && !(format[0] == 'q' && strcmp(view->format, "l") == 0 && sizeof(long) == 8))) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes%s%s", what,
                     count, itemsize, format ? " of type " : "", format ? format : "");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---- tile amax ---- */

VECTOR_CLONES
static void amax_rows(const uint32_t *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t tr,
                      Py_ssize_t tc, uint32_t *out, Py_ssize_t nbc)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        const uint32_t *row = x + i * cols;
        uint32_t *o = out + (i / tr) * nbc;
        for (Py_ssize_t b = 0; b < nbc; b++) {
            Py_ssize_t j0 = b * tc, j1 = j0 + tc < cols ? j0 + tc : cols;
            uint32_t m = o[b];
            for (Py_ssize_t j = j0; j < j1; j++) {
                uint32_t v = row[j] & 0x7FFFFFFFu;
                m = v > m ? v : m;
            }
            o[b] = m;
        }
    }
}

/* The same over 16-bit patterns (bfloat16, float16: their magnitudes order as their bits
 * too, NaN above inf), into 32-bit maxima widened afterwards: widening is monotone in the
 * magnitude's bits, payloads included, so the widened max is the max of the widened. */
VECTOR_CLONES
static void amax_rows16(const uint16_t *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t tr,
                        Py_ssize_t tc, uint32_t *out, Py_ssize_t nbc)
{
    for (Py_ssize_t i = 0; i < rows; i++) {
        const uint16_t *row = x + i * cols;
        uint32_t *o = out + (i / tr) * nbc;
        for (Py_ssize_t b = 0; b < nbc; b++) {
            Py_ssize_t j0 = b * tc, j1 = j0 + tc < cols ? j0 + tc : cols;
            uint16_t m = (uint16_t)o[b];
            for (Py_ssize_t j = j0; j < j1; j++) {
                uint16_t v = row[j] & 0x7FFFu;
                m = v > m ? v : m;
            }
            o[b] = m;
        }
    }
}

/* the buffer's item size for a kind (-1, with ValueError set, for an unknown kind) */
static Py_ssize_t kind_itemsize(int kind)
{
    if (kind == KIND_FLOAT32) return 4;
    if (kind == KIND_BFLOAT16 || kind == KIND_FLOAT16) return 2;
    PyErr_SetString(PyExc_ValueError, "kind: 0 (float32), 1 (bfloat16) or 2 (float16)");
    return -1;
}

/* a chunk's values (float32, or 16-bit patterns of kind) as a buffer of n items */
static int get_values(PyObject *obj, Py_buffer *view, int kind, Py_ssize_t n)
{
    Py_ssize_t itemsize = kind_itemsize(kind);
    if (itemsize < 0) return -1;
    return get_buffer(obj, view, 0, kind == KIND_FLOAT32 ? "f" : NULL, itemsize, n, "x");
}

static PyObject *tile_amax(PyObject *self, PyObject *args)
{
    PyObject *xo, *oo;
    Py_ssize_t rows, cols, tr, tc;
    int kind = KIND_FLOAT32;
    if (!PyArg_ParseTuple(args, "OnnnnO|i", &xo, &rows, &cols, &tr, &tc, &oo, &kind))
        return NULL;
    Py_ssize_t n = checked_size(rows, cols);
    if (n < 0) return NULL;
    if (tr < 1 || tc < 1) {
        PyErr_SetString(PyExc_ValueError, "bad shape");
        return NULL;
    }
    Py_ssize_t nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
    Py_buffer xb, ob;
    if (get_values(xo, &xb, kind, n) < 0) return NULL;
    if (get_buffer(oo, &ob, 1, "f", 4, nbr * nbc, "out") < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    memset(ob.buf, 0, (size_t)ob.len);
    uint32_t *out = (uint32_t *)ob.buf;
    if (kind == KIND_FLOAT32) {
        amax_rows((const uint32_t *)xb.buf, rows, cols, tr, tc, out, nbc);
    } else {
        amax_rows16((const uint16_t *)xb.buf, rows, cols, tr, tc, out, nbc);
        for (Py_ssize_t b = 0; b < nbr * nbc; b++)
            out[b] = bits_of(kind == KIND_BFLOAT16 ? bf16_value((uint16_t)out[b])
                                                   : half_value((uint16_t)out[b]));
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- sum of squares of a chunk (metrics._sum_of_squares of its float32 values) ---- */

static PyObject *sum_squares(PyObject *self, PyObject *args)
{
    PyObject *xo;
    Py_ssize_t n;
    double largest;
    int kind = KIND_FLOAT32;
    if (!PyArg_ParseTuple(args, "Ond|i", &xo, &n, &largest, &kind)) return NULL;
    Py_buffer xb;
    if (get_values(xo, &xb, kind, n) < 0) return NULL;
    double total = sum_of_squares(xb.buf, n, largest, kind);
    PyBuffer_Release(&xb);
    return PyFloat_FromDouble(total);
}

static PyObject *widen_f16(PyObject *self, PyObject *args)
{
    PyObject *ho, *oo;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOn", &ho, &oo, &n)) return NULL;
    Py_buffer hb, ob;
    if (get_buffer(ho, &hb, 0, NULL, 2, n, "half") < 0) return NULL;
    if (get_buffer(oo, &ob, 1, "f", 4, n, "out") < 0) {
        PyBuffer_Release(&hb);
        return NULL;
    }
    widen_half((const uint16_t *)hb.buf, (float *)ob.buf, n);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- the chunk kernel ---- */

typedef struct {
    uint32_t low, high, shift;  /* magic-number clamp (bit patterns) and (23 - m) << 23 */
    float fmax;                 /* clip to it and count values above it (inf: no value of
                                 * the chunk lies above max) */
} Rounding;

/* What stage one found in a stretch of one tile row. */
typedef struct {
    uint32_t maxbits;   /* max |err| as a bit pattern (finite errors order as their bits) */
    uint32_t past;      /* values whose rounding lay past fmax (saturated to it) */
    uint32_t above;     /* values whose |v * s| lies above fmax (past ones included) */
    uint32_t zeros;     /* zero results */
    uint32_t flushed;   /* zero results of nonzero inputs */
    uint32_t edges;     /* relative errors within EDGE_ULPS of a bin edge (to redo) */
    uint32_t kmin, kmax;   /* the histogram keys' range */
    uint32_t relmax;    /* max relative error's bits, NaN (0/0) skipped */
    uint32_t seen;      /* relative errors that are not NaN */
} Found;

static uint32_t exact_key(float q, float v);

/* One value's x_q = round(v * s) / s, nearest-even by the magic number (rounding.
 * round_float32_nearest_even), saturated at fmax; adds 1 to *past for a value whose
 * rounding lay past fmax and 1 to *above for one whose |v * s| lies above fmax
 * (rounding.count_above_max).  Inlined into the vectorised loops. */
static inline float quantize_value(float v, float s, Rounding rd, uint32_t *past,
                                   uint32_t *above)
{
    uint32_t b = bits_of(v * s);
    uint32_t mag = b & 0x7FFFFFFFu;
    uint32_t e = mag & 0x7F800000u;
    e = e < rd.low ? rd.low : e;
    e = e > rd.high ? rd.high : e;
    float m = float_of(e + rd.shift);
    float r = (float_of(mag) + m) - m;
    *above += (uint32_t)(float_of(mag) > rd.fmax);
    *past += (uint32_t)(r > rd.fmax);
    r = r > rd.fmax ? rd.fmax : r;
    return float_of(bits_of(r) | (b & 0x80000000u)) / s;
}

/* Stage one of a tile row: branch-free, vectorised.  Writes err (float32, for the sums)
 * and, per value, the bits of the float32 relative error |err| / |x| -- where x_q is zero
 * (relative error exactly 1) moved to the middle of 1's bin, 0x3F808000: the same key, and
 * no bin edge near it for stage_keys to flag (a nonzero x_q with that error 1 is flagged:
 * its true error may lie below 1); counts in *f, and with
 * WITH_REL the largest relative error (NaN, 0/0, skipped) for the worst blocks.  Values
 * past fmax are set to it (fmax inf: values known to stay in range). */
#define STAGE_ONE(NAME, WITH_REL)                                                   \
    VECTOR_CLONES                                                                   \
    static void NAME(const float *restrict x, float s, Py_ssize_t n, Rounding rd,   \
                     float *restrict err, uint32_t *restrict rel, Found *restrict f) \
    {                                                                               \
        uint32_t past = 0, maxbits = f->maxbits, zeros = 0, flushed = 0;            \
        uint32_t relmax = f->relmax, seen = 0, above = 0;                           \
        for (Py_ssize_t k = 0; k < n; k++) {                                        \
            float v = x[k];                                                         \
            float q = quantize_value(v, s, rd, &past, &above);                      \
            float d = q - v;                                                        \
            float ad = fabsf(d);                                                    \
            err[k] = d;                                                             \
            uint32_t ab = bits_of(ad);                                              \
            maxbits = ab > maxbits ? ab : maxbits;                                  \
            uint32_t rb = bits_of(ad / fabsf(v));                                   \
            uint32_t zero = (uint32_t)(q == 0.0f);                                  \
            rel[k] = rb ^ ((0u - (zero & (uint32_t)(rb == 0x3F800000u))) & 0x8000u); \
            zeros += zero;                                                          \
            flushed += zero & (uint32_t)(v != 0.0f);                                \
            if (WITH_REL) {                                                         \
                uint32_t ordered = (uint32_t)(rb <= 0x7F800000u); /* not NaN */     \
                uint32_t ranked = rb & (0u - ordered);                              \
                relmax = ranked > relmax ? ranked : relmax;                         \
                seen += ordered;                                                    \
            }                                                                       \
        }                                                                           \
        f->maxbits = maxbits;                                                       \
        f->past += past;                                                            \
        f->above += above;                                                          \
        f->zeros += zeros;                                                          \
        f->flushed += flushed;                                                      \
        f->relmax = relmax;                                                         \
        f->seen += seen;                                                            \
    }
STAGE_ONE(stage_one, 0)
STAGE_ONE(stage_one_rel, 1)

/* Stage one's second half, integers only (vectorised; apart, so that stage one keeps its
 * values in registers): each histogram key (the top 16 bits of the relative error),
 * written over rel, and near[k] (nonzero) where that relative error lies within EDGE_ULPS
 * of a bin edge and its float32 bin may be wrong. */
VECTOR_CLONES
static void stage_keys(uint32_t *restrict rel, Py_ssize_t n, uint8_t *restrict near,
                       Found *restrict f)
{
    uint32_t kmin = f->kmin, kmax = f->kmax, edges = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        uint32_t rb = rel[k];
        uint32_t key = rb >> HIST_SHIFT;
        rel[k] = key;
        kmin = key < kmin ? key : kmin;
        kmax = key > kmax ? key : kmax;
        /* 0 < rel < inf (NaN's bits lie above inf's), low bits near an edge */
        uint32_t finite = (uint32_t)(rb - 1u < 0x7F7FFFFFu);
        /* A relative error below 1/4 had an exact err: were x_q - x inexact, x_q and x
         * would lie more than a factor 2 apart (Sterbenz) and |err| >= |x| / 2.  Then the
         * float32 quotient is within half an ulp of the true relative error: only one that
         * landed exactly on a bin edge can belong to the bin below; the others near an edge
         * are in the right bin already (bfloat16 data put 0.5% of values near edges). */
        uint32_t exact_err = (uint32_t)(rb < 0x3E800000u);
        uint32_t on_edge = (uint32_t)((rb & 0xFFFFu) == 0);
        uint32_t edge = finite & (uint32_t)(((rb + EDGE_ULPS) & 0xFFFFu) < 2 * EDGE_ULPS)
                        & ((1u - exact_err) | on_edge);
        edges += edge;
        near[k] = (uint8_t)(edge * (2u - exact_err)); /* 1: err exact, on an edge; 2: redo */
    }
    f->kmin = kmin;
    f->kmax = kmax;
    f->edges += edges;
}

/* Stage two (rare): the relative errors within EDGE_ULPS of a bin edge (near[k]) get their
 * exact keys (metrics._bin_keys).  near[] is scanned eight flags at a time: bfloat16 data
 * flag ~0.5% of values (relative errors of few significant bits land on edges), so most
 * stretches of 128 have one or two, and a flag-by-flag scan cost 0.2 ns a value. */
static void redo_edges(const float *x, float s, Py_ssize_t n, Rounding rd, const float *err,
                       const uint8_t *near, uint32_t *keys, Found *f)
{
    for (Py_ssize_t k0 = 0; k0 < n; k0 += 8) {
        Py_ssize_t k1 = k0 + 8 < n ? k0 + 8 : n;
        if (k1 - k0 == 8) {
            uint64_t word;
            memcpy(&word, near + k0, 8);
            if (!word) continue;
        }
        for (Py_ssize_t k = k0; k < k1; k++) {
            if (!near[k]) continue;
            uint32_t key;
            if (near[k] == 1) {
                /* err exact and |err| / |x| rounded onto the edge E: the true quotient lies
                 * in E's bin unless |err| < E |x| (a float64 product of 8 and 24 bits:
                 * exact) */
                key = keys[k];
                double edge = (double)float_of(key << HIST_SHIFT);
                if ((double)fabsf(err[k]) < edge * (double)fabsf(x[k])) key -= 1;
            } else {
                uint32_t ignored = 0, also_ignored = 0;
                key = exact_key(quantize_value(x[k], s, rd, &ignored, &also_ignored), x[k]);
            }
            keys[k] = key;
            f->kmin = key < f->kmin ? key : f->kmin;
            f->kmax = key > f->kmax ? key : f->kmax;
        }
    }
}

/* The same without what only the histogram needs (scale-search's MSE ranking): returns
 * max |err|'s bits. */
VECTOR_CLONES
static uint32_t stage_one_mse(const float *x, float s, Py_ssize_t n, Rounding rd, float *err,
                              uint32_t maxbits, uint32_t *saturated)
{
    uint32_t past = 0, above = 0; /* (above: not reported by this path) */
    for (Py_ssize_t k = 0; k < n; k++) {
        float v = x[k];
        float q = quantize_value(v, s, rd, &past, &above);
        float d = q - v;
        err[k] = d;
        uint32_t ab = bits_of(d) & 0x7FFFFFFFu;
        maxbits = ab > maxbits ? ab : maxbits;
    }
    *saturated += past;
    return maxbits;
}

/* the exact bin of |q - v| / |v| (metrics._bin_keys, float32 data): the float64
 * quotient rounded toward zero to float32 */
static uint32_t exact_key(float q, float v)
{
    double r64 = fabs((double)q - (double)v) / fabs((double)v);
    float r32 = (float)r64;
    if ((double)r32 > r64) r32 = nextafterf(r32, 0.0f);
    return bits_of(r32) >> HIST_SHIFT;
}

/* four interleaved histograms (module state: see "State" at the top -- one call at a time,
 * the GIL held throughout, and all zero again when a call returns): equal keys in a row
 * then increment different counters, not one chain of loads and stores */
#define HISTS 4
static uint32_t local_hist[HISTS][HIST_BINS];

static void add_keys(const uint32_t *keys, Py_ssize_t n)
{
    Py_ssize_t k = 0;
    for (; k + HISTS <= n; k += HISTS)
        for (int h = 0; h < HISTS; h++) local_hist[h][keys[k + h]]++;
    for (; k < n; k++) local_hist[0][keys[k]]++;
}

/* quantize_chunk(x, scales, shape, tile, rounding, scratch, *, hist=None, flushed=None,
 *                saturated=None, max_rel=None, kind=0): one argument block instead of
 * sixteen positionals -- the chunk's (rows, cols), its tile's (tr, tc), the rounding's
 * (low, high, shift, fmax) as tuples, and the optional outputs by keyword only. */
static PyObject *quantize_chunk(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"x", "scales", "shape", "tile", "rounding", "scratch", "hist",
                               "flushed", "saturated", "max_rel", "kind", NULL};
    PyObject *xo, *so, *eo, *ho = Py_None, *fo = Py_None, *mo = Py_None, *to = Py_None;
    Py_ssize_t rows, cols, tr, tc;
    unsigned int low, high, shift;
    float fmax;
    int kind = KIND_FLOAT32;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO(nn)(nn)(IIIf)O|$OOOOi", keywords, &xo,
                                     &so, &rows, &cols, &tr, &tc, &low, &high, &shift, &fmax,
                                     &eo, &ho, &fo, &to, &mo, &kind))
        return NULL;
    if (rows < 1 || cols < 1 || tr < 1 || tc < 1 || cols % tc || rows % tr) {
        PyErr_SetString(PyExc_ValueError, "a padded chunk of whole tiles is expected");
        return NULL;
    }
    Py_ssize_t n = checked_size(rows, cols);
    if (n < 0) return NULL;
    Py_ssize_t nbr = rows / tr, nbc = cols / tc;
    int full = ho != Py_None; /* every statistic, else the squared errors alone */
    Py_buffer xb, sb, eb, hb = {0}, fb = {0}, mb = {0}, tb = {0};
    int have_h = 0, have_f = 0, have_m = 0, have_t = 0;
    PyObject *result = NULL;
    if (get_values(xo, &xb, kind, n) < 0) return NULL;
    if (get_buffer(so, &sb, 0, "f", 4, nbr * nbc, "scales") < 0) goto fail_x;
    if (get_buffer(eo, &eb, 1, "f", 4, n, "scratch") < 0) goto fail_s;
    if (full) {
        if (get_buffer(ho, &hb, 1, "q", 8, HIST_BINS, "hist") < 0) goto fail;
        have_h = 1;
        if (fo != Py_None) {
            if (get_buffer(fo, &fb, 1, "q", 8, nbr * nbc, "flushed") < 0) goto fail;
            have_f = 1;
        }
        if (mo != Py_None) {
            if (get_buffer(mo, &mb, 1, "f", 4, nbr * nbc, "max_rel") < 0) goto fail;
            have_m = 1;
        }
    }
    if (to != Py_None) {
        if (get_buffer(to, &tb, 1, "q", 8, nbr * nbc, "saturated") < 0) goto fail;
        have_t = 1;
    }
    {
        const char *x = (const char *)xb.buf;
        const float *scales = (const float *)sb.buf;
        Py_ssize_t itemsize = kind_itemsize(kind);
        float *err = (float *)eb.buf;
        int64_t *flushed = have_f ? (int64_t *)fb.buf : NULL;
        float *max_rel = have_m ? (float *)mb.buf : NULL;
        int64_t *block_saturated = have_t ? (int64_t *)tb.buf : NULL;
        Rounding rd = {low, high, shift, fmax};
        Found f = {0, 0, 0, 0, 0, 0, HIST_BINS, 0, 0, 0};
        uint32_t keys[BLOCK_MAX];
        uint8_t near[BLOCK_MAX];
        float wide[BLOCK_MAX]; /* a stretch of 16-bit values, widened */
        if (have_f) memset(flushed, 0, (size_t)(nbr * nbc) * 8);
        if (have_t) memset(block_saturated, 0, (size_t)(nbr * nbc) * 8);
        if (have_m)
            for (Py_ssize_t b = 0; b < nbr * nbc; b++) max_rel[b] = NAN;
        for (Py_ssize_t i = 0; i < rows; i++) {
            const float *srow = scales + (i / tr) * nbc;
            Py_ssize_t brow = (i / tr) * nbc;
            for (Py_ssize_t bj = 0; bj < nbc; bj++) {
                float s = srow[bj];
                /* a tile row longer than the buffers is done in stretches */
                for (Py_ssize_t j0 = bj * tc; j0 < (bj + 1) * tc; j0 += BLOCK_MAX) {
                    Py_ssize_t len = (bj + 1) * tc - j0;
                    if (len > BLOCK_MAX) len = BLOCK_MAX;
                    const float *xv = (const float *)(x + (i * cols + j0) * itemsize);
                    if (kind == KIND_BFLOAT16) {
                        widen_bf16((const uint16_t *)xv, wide, len);
                        xv = wide;
                    } else if (kind == KIND_FLOAT16) {
                        widen_half((const uint16_t *)xv, wide, len);
                        xv = wide;
                    }
                    float *ev = err + i * cols + j0;
                    if (!full) {
                        f.maxbits = stage_one_mse(xv, s, len, rd, ev, f.maxbits, &f.past);
                        continue;
                    }
                    uint32_t past = f.past, flushed_before = f.flushed, edges = f.edges;
                    f.relmax = 0;
                    f.seen = 0;
                    if (max_rel)
                        stage_one_rel(xv, s, len, rd, ev, keys, &f);
                    else
                        stage_one(xv, s, len, rd, ev, keys, &f);
                    stage_keys(keys, len, near, &f);
                    if (f.edges != edges) redo_edges(xv, s, len, rd, ev, near, keys, &f);
                    add_keys(keys, len);
                    if (block_saturated) block_saturated[brow + bj] += f.past - past;
                    if (flushed) flushed[brow + bj] += f.flushed - flushed_before;
                    if (max_rel && f.seen) {
                        float block_rel = float_of(f.relmax);
                        if (isnan(max_rel[brow + bj]) || block_rel > max_rel[brow + bj])
                            max_rel[brow + bj] = block_rel;
                    }
                }
            }
        }
        float maxerr = float_of(f.maxbits);
        int64_t saturated = f.past, above = f.above, zero_results = f.zeros;
        uint32_t kmin = f.kmin, kmax = f.kmax;
        double total_err = reduce_f32(err, n);
        int ok = isfinite(total_err) && isfinite(maxerr);
        int64_t nan_keys = 0;
        if (full && kmin <= kmax) {
            int64_t *hist = (int64_t *)hb.buf;
            for (uint32_t k = kmin; k <= kmax; k++) {
                uint32_t count = 0;
                for (int h = 0; h < HISTS; h++) {
                    count += local_hist[h][k];
                    local_hist[h][k] = 0;
                }
                if (ok && count) {
                    hist[k] += count;
                    if ((k & 0x7FFFu) > FINITE_BINS) nan_keys += count;
                }
            }
        }
        if (!ok) {
            result = Py_None;
            Py_INCREF(result);
        } else {
            double err2 = sum_of_squares(err, n, (double)maxerr, KIND_FLOAT32);
            result = Py_BuildValue("dddLLLL", total_err, (double)maxerr, err2,
                                   (long long)zero_results, (long long)nan_keys,
                                   (long long)saturated, (long long)above);
        }
    }
fail:
    if (have_t) PyBuffer_Release(&tb);
    if (have_m) PyBuffer_Release(&mb);
    if (have_f) PyBuffer_Release(&fb);
    if (have_h) PyBuffer_Release(&hb);
    PyBuffer_Release(&eb);
fail_s:
    PyBuffer_Release(&sb);
fail_x:
    PyBuffer_Release(&xb);
    return result;
}

/* ---- scales from tile amaxes (scaling.amax_to_scale: the amax rule, float32 product) ---- */

/* scale = fl32(fmax / amax) (one float32 division), times 2**-margin in float64, clipped
 * to float32's normal range and rounded to float32; 1 for amax 0, 0 for inf, NaN for NaN:
 * numpy's formulation did ~20 array passes over 2,048 scales per chunk (60 us). */
static PyObject *amax_scales(PyObject *self, PyObject *args)
{
    PyObject *ao, *oo;
    Py_ssize_t n;
    float fmax;
    double factor;
    if (!PyArg_ParseTuple(args, "OOnfd", &ao, &oo, &n, &fmax, &factor)) return NULL;
    Py_buffer ab, ob;
    if (get_buffer(ao, &ab, 0, "f", 4, n, "amax") < 0) return NULL;
    if (get_buffer(oo, &ob, 1, "f", 4, n, "out") < 0) {
        PyBuffer_Release(&ab);
        return NULL;
    }
    const float *amax = (const float *)ab.buf;
    float *out = (float *)ob.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        float a = amax[i], scale;
        if (isnan(a)) {
            scale = NAN;
        } else if (isinf(a)) {
            scale = 0.0f;
        } else if (a > 0.0f) {
            double raw = (double)(fmax / a) * factor;
            /* np.clip: a NaN (inf times a zero factor) stays NaN */
            raw = raw < 0x1p-126 ? 0x1p-126 : raw > (double)FLT_MAX ? (double)FLT_MAX : raw;
            scale = (float)raw;
        } else {
            scale = 1.0f;
        }
        out[i] = scale;
    }
    PyBuffer_Release(&ab);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- distinct scales (results.ScaleSummary): a hash set of bit patterns ---- */

#define SET_BITS 18
/* 0: empty (the pattern 0 is kept apart); module state, empty between calls ("State") */
static uint32_t set_slots[1 << SET_BITS];

/* distinct_bits(bits, n, limit, out) -> count: the distinct 32-bit patterns of bits, in
 * order of first appearance, into out, stopping at limit (then there may be more): one
 * pass instead of sorting every scale (a 524,288-scale grid: 13 ms of sorts). */
static PyObject *distinct_bits(PyObject *self, PyObject *args)
{
    PyObject *bo, *oo;
    Py_ssize_t n, limit;
    if (!PyArg_ParseTuple(args, "OnnO", &bo, &n, &limit, &oo)) return NULL;
    if (limit < 0 || limit > (1 << (SET_BITS - 1))) { /* the set at most half full */
        PyErr_SetString(PyExc_ValueError, "limit: 0 to 131072");
        return NULL;
    }
    Py_buffer bb, ob;
    if (get_buffer(bo, &bb, 0, NULL, 4, n, "bits") < 0) return NULL;
    if (get_buffer(oo, &ob, 1, NULL, 4, limit, "out") < 0) {
        PyBuffer_Release(&bb);
        return NULL;
    }
    const uint32_t *bits = (const uint32_t *)bb.buf;
    uint32_t *out = (uint32_t *)ob.buf;
    const uint32_t mask = (1u << SET_BITS) - 1;
    Py_ssize_t count = 0;
    int zero = 0;
    for (Py_ssize_t i = 0; i < n && count < limit; i++) {
        uint32_t b = bits[i];
        if (b == 0) {
            if (!zero) out[count++] = 0;
            zero = 1;
            continue;
        }
        uint32_t slot = (b * 0x9E3779B1u) >> (32 - SET_BITS);
        while (set_slots[slot] && set_slots[slot] != b) slot = (slot + 1) & mask;
        if (!set_slots[slot]) {
            set_slots[slot] = b;
            out[count++] = b;
        }
    }
    /* empty the set again: only the slots just filled (a cluster's slots all cleared) */
    for (Py_ssize_t k = 0; k < count; k++) {
        uint32_t b = out[k];
        if (!b) continue;
        uint32_t slot = (b * 0x9E3779B1u) >> (32 - SET_BITS);
        while (set_slots[slot]) {
            set_slots[slot] = 0;
            slot = (slot + 1) & mask;
        }
    }
    PyBuffer_Release(&bb);
    PyBuffer_Release(&ob);
    return PyLong_FromSsize_t(count);
}

/* simd(on): the hand-vectorised float16 paths (F16C, AVX-512) where the CPU has them, or
 * the portable code alone (the tests compare the two) */
static PyObject *simd(PyObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    pick_widen_half(on);
    pick_leaves(on);
    Py_RETURN_NONE;
}

/* ---- fmt audit: a quantized chunk's statistics from its stored codes ----
 *
 * audit/stats.py's two passes over a chunk of an already-quantized tensor (its dequantized
 * values, and its element codes counted per scale group) in one pass over the stored
 * bytes, without building either float array.  ``codes`` holds rows x cols elements: one
 * byte each (FP8), or two FP4 nibbles a byte (packing 1: the low nibble first, 2: the high
 * one).  ``table`` gives each code's element value (16 or 256 float64; NaN for a NaN
 * code).  The chunk is cut into tiles tr x tc (edges short), tile (i, j) having the
 * dequantization multiplier grid[i * nbc + j]: an element's value is
 *
 *     x = (float)(((table[code] * grid) * mul) / div)
 *
 * formed in float64 and rounded to float32 once, as the readers form it (every reader's
 * product is exact in float64: a code of at most 4 significant bits times a float32 or
 * float8 scale times a float32 factor; compressed-tensors' NVFP4 divides by its global
 * scale, rounded in float64 first, then to float32, as its reader does).  Per tile the
 * codes are counted in a histogram, with a bitmap of the codes present, so each distinct
 * code's value is formed once per tile: a 128 x 128 FP8 tile is 16,384 increments and
 * its distinct codes, an NVFP4 block of 16 at most 16.
 *
 * Per tile, into tiles_out (7 rows of nbr * nbc float64): the largest |code| (NaN and inf
 * codes count as 0, as stats._group_counts counts them), the codes with |code| >= top,
 * those with |code| == below, the nonzero codes, the tile's elements, "far" = 2 top - the
 * smallest nonzero |code| (0 where none), and the codes with |code| == low (the code near
 * half the max that mx-scale-rule counts).  Into values_out (5 float64): the count, the
 * exact zeros of x, the non-finite x, the largest finite |x|, and the sum of the finite x
 * squared (per tile in float64, then over tiles: not numpy's order, so its last digits
 * may differ from the numpy path's).  Returns False (nothing written) where the
 * histograms would exceed CODE_HIST_CELLS cells (a tile row of millions of one-column
 * tiles): the caller keeps the numpy path.  Packed codes need even cols and tc.
 */

#define CODE_HIST_CELLS (1 << 22)

/* The values of dn codes of value t under multiplier g: added to vals[] (zeros,
 * nonfinite, amax, sum of squares at 1..4). */
static inline void code_values(double t, double g, double mul, double div, int scaled,
                               double dn, double *vals)
{
    double p = t * g;
    float x = scaled ? (float)((p * mul) / div) : (float)p;
    if (!isfinite(x)) {
        vals[2] += dn;
        return;
    }
    double a = fabs((double)x);
    if (a == 0) vals[1] += dn;
    if (a > vals[3]) vals[3] = a;
    vals[4] += dn * (a * a);
}

/* Tiles share their multipliers (an NVFP4 chunk has at most 256 distinct E4M3 block
 * scales, an MX one 256 E8M0 ones): the codes are counted per distinct multiplier in an
 * open-addressed table of CODE_SLOTS (keyed by the multiplier's bits, every NaN one key),
 * and each (multiplier, code) value is formed once per chunk, not once per tile.  The
 * table is flushed into the values when half full, so any grid is right; it pays where
 * multipliers repeat, and costs little where they do not (a 128 x 128 tile per slot). */
#define CODE_SLOTS 512

typedef struct {
    uint64_t key[CODE_SLOTS];
    double g[CODE_SLOTS];
    unsigned char busy[CODE_SLOTS];
    int used[CODE_SLOTS];
    int n_used, ncodes, scaled;
    int pairs, lo_shift, hi_shift;  /* pairs: the counts are of bytes of two FP4 codes */
    double mul, div;
    const double *table;
    Py_ssize_t *counts;  /* CODE_SLOTS x ncodes */
} code_table;

static void code_table_flush(code_table *ct, double *vals)
{
    for (int u = 0; u < ct->n_used; u++) {
        int slot = ct->used[u];
        Py_ssize_t *row = ct->counts + (Py_ssize_t)slot * ct->ncodes;
        for (int c = 0; c < ct->ncodes; c++) {
            if (!row[c]) continue;
            if (ct->pairs) {
                code_values(ct->table[(c >> ct->lo_shift) & 15], ct->g[slot], ct->mul,
                            ct->div, ct->scaled, (double)row[c], vals);
                code_values(ct->table[(c >> ct->hi_shift) & 15], ct->g[slot], ct->mul,
                            ct->div, ct->scaled, (double)row[c], vals);
            } else {
                code_values(ct->table[c], ct->g[slot], ct->mul, ct->div, ct->scaled,
                            (double)row[c], vals);
            }
            row[c] = 0;
        }
        ct->busy[slot] = 0;
    }
    ct->n_used = 0;
}

static Py_ssize_t *code_table_row(code_table *ct, double g, double *vals)
{
    uint64_t key;
    memcpy(&key, &g, 8);
    if (isnan(g)) key = 0x7ff8000000000000ull;
    for (int attempt = 0; attempt < 2; attempt++) {
        int slot = (int)((key * 0x9E3779B97F4A7C15ull) >> 55) & (CODE_SLOTS - 1);
        while (ct->busy[slot] && ct->key[slot] != key) slot = (slot + 1) & (CODE_SLOTS - 1);
        if (ct->busy[slot]) return ct->counts + (Py_ssize_t)slot * ct->ncodes;
        if (ct->n_used < CODE_SLOTS / 2) {
            ct->busy[slot] = 1;
            ct->key[slot] = key;
            ct->g[slot] = g;
            ct->used[ct->n_used++] = slot;
            return ct->counts + (Py_ssize_t)slot * ct->ncodes;
        }
        code_table_flush(ct, vals);
    }
    return NULL;  /* not reached: an empty table always has room */
}

/* One tile's histogram (and the bitmap of the codes it holds) closed: its seven figures
 * into tile[], its counts into the multiplier's row of ct; both left zero.  mag[c]:
 * |table[c]|, 0 for NaN/inf codes. */
static void code_tile_close(Py_ssize_t *hist, uint64_t *present, int words,
                            const double *mag, double top, double below, double low,
                            Py_ssize_t *row, double *tile)
{
    double amax = 0, at_max = 0, at_below = 0, at_low = 0, nonzero = 0, size = 0, far = 0;
    for (int w = 0; w < words; w++) {
        uint64_t bits = present[w];
        present[w] = 0;
        while (bits) {
            int c = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            Py_ssize_t k = hist[c];
            hist[c] = 0;
            row[c] += k;
            double dn = (double)k, m = mag[c];
            size += dn;
            if (m > amax) amax = m;
            if (m >= top) at_max += dn;
            if (m == below) at_below += dn;
            if (m == low) at_low += dn;
            if (m != 0) {
                nonzero += dn;
                if (2 * top - m > far) far = 2 * top - m;
            }
        }
    }
    tile[0] = amax; tile[1] = at_max; tile[2] = at_below; tile[3] = nonzero;
    tile[4] = size; tile[5] = far; tile[6] = at_low;
}

/* Packed FP4 in blocks of tc along each row (tr = 1), a byte at a time: per byte value y,
 * info[y] holds its two codes' counts at the top, at below, at low and at zero (16 bits
 * each: a block of at most 16,383 bytes cannot overflow them), bmax[y] / bmin[y] their
 * largest and smallest nonzero magnitude (inf: none); the byte is counted in its block's
 * multiplier row of ct (code_table_flush decodes it into its two codes' values). */
static void code_pairs(const uint8_t *codes, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t tc,
                       int lo_shift, const double *mag, double top, double below, double low,
                       const double *grid, code_table *ct, double *tiles, double *acc)
{
    uint64_t info[256];
    double bmax[256], bmin[256];
    for (int y = 0; y < 256; y++) {
        double m[2] = {mag[(y >> lo_shift) & 15], mag[(y >> (4 - lo_shift)) & 15]};
        info[y] = 0;
        bmax[y] = 0;
        bmin[y] = INFINITY;
        for (int k = 0; k < 2; k++) {
            info[y] += (uint64_t)(m[k] >= top) | (uint64_t)(m[k] == below) << 16
                       | (uint64_t)(m[k] == low) << 32 | (uint64_t)(m[k] == 0) << 48;
            if (m[k] > bmax[y]) bmax[y] = m[k];
            if (m[k] != 0 && m[k] < bmin[y]) bmin[y] = m[k];
        }
    }
    Py_ssize_t nbc = (cols + tc - 1) / tc, nt = rows * nbc, bytes_per_row = cols / 2;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *row = codes + r * bytes_per_row;
        for (Py_ssize_t b = 0; b < nbc; b++) {
            Py_ssize_t *h = code_table_row(ct, grid[r * nbc + b], acc);
            Py_ssize_t j0 = b * tc / 2, j1 = ((b + 1) * tc < cols ? (b + 1) * tc : cols) / 2;
            uint64_t f = 0;
            double mx = 0, mn = INFINITY;
            for (Py_ssize_t j = j0; j < j1; j++) {
                uint8_t y = row[j];
                f += info[y];
                mx = bmax[y] > mx ? bmax[y] : mx;
                mn = bmin[y] < mn ? bmin[y] : mn;
                h[y]++;
            }
            double n = 2.0 * (double)(j1 - j0);
            Py_ssize_t t = r * nbc + b;
            tiles[t] = mx;
            tiles[nt + t] = (double)(f & 0xFFFF);
            tiles[2 * nt + t] = (double)((f >> 16) & 0xFFFF);
            tiles[3 * nt + t] = n - (double)((f >> 48) & 0xFFFF);
            tiles[4 * nt + t] = n;
            tiles[5 * nt + t] = isinf(mn) ? 0 : 2 * top - mn;
            tiles[6 * nt + t] = (double)((f >> 32) & 0xFFFF);
        }
    }
}

static PyObject *code_stats(PyObject *self, PyObject *args)
{
    PyObject *co, *to, *go, *tiles_o, *vals_o;
    Py_ssize_t rows, cols, tr, tc;
    int packing;
    double mul, div, top, below, low;
    if (!PyArg_ParseTuple(args, "OOO(nnnni)(ddddd)OO", &co, &to, &go, &rows, &cols, &tr,
                          &tc, &packing, &mul, &div, &top, &below, &low, &tiles_o, &vals_o))
        return NULL;
    Py_ssize_t n = checked_size(rows, cols);
    if (n < 0) return NULL;
    if (tr < 1 || tc < 1 || packing < 0 || packing > 2 || (packing && (cols % 2 || tc % 2))) {
        PyErr_SetString(PyExc_ValueError, "bad shape");
        return NULL;
    }
    int ncodes = packing ? 16 : 256, words = packing ? 1 : 4;
    Py_ssize_t nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
    if (nbc > CODE_HIST_CELLS / ncodes) Py_RETURN_FALSE;
    Py_ssize_t bytes_per_row = packing ? cols / 2 : cols;
    Py_buffer cb, tb, gb, ob, vb;
    if (get_buffer(co, &cb, 0, "B", 1, rows * bytes_per_row, "codes") < 0) return NULL;
    if (get_buffer(to, &tb, 0, "d", 8, ncodes, "table") < 0) goto fail_c;
    if (get_buffer(go, &gb, 0, "d", 8, nbr * nbc, "grid") < 0) goto fail_t;
    if (get_buffer(tiles_o, &ob, 1, "d", 8, 7 * nbr * nbc, "tiles_out") < 0) goto fail_g;
    if (get_buffer(vals_o, &vb, 1, "d", 8, 5, "values_out") < 0) goto fail_o;
    Py_ssize_t *hist = PyMem_Calloc((size_t)(nbc * ncodes), sizeof(Py_ssize_t));
    uint64_t *present = PyMem_Calloc((size_t)(nbc * words), sizeof(uint64_t));
    code_table *ct = PyMem_Calloc(1, sizeof(code_table));
    /* FP4 blocks along the rows (NVFP4's 16, MX's 32): counted a byte (two codes) at a
     * time through per-byte tables, one block in flight (code_pairs) */
    int pairs = packing && tr == 1 && tc / 2 <= 16383;
    Py_ssize_t *slot_counts = PyMem_Calloc((size_t)CODE_SLOTS * (pairs ? 256 : ncodes),
                                           sizeof(Py_ssize_t));
    if (!hist || !present || !ct || !slot_counts) {
        PyMem_Free(hist);
        PyMem_Free(present);
        PyMem_Free(ct);
        PyMem_Free(slot_counts);
        PyErr_NoMemory();
        goto fail_v;
    }
    ct->counts = slot_counts;
    ct->ncodes = pairs ? 256 : ncodes;
    ct->pairs = pairs;
    ct->lo_shift = packing == 2 ? 4 : 0;
    ct->hi_shift = 4 - ct->lo_shift;
    ct->table = (const double *)tb.buf;
    ct->mul = mul;
    ct->div = div;
    ct->scaled = mul != 1.0 || div != 1.0;
    const uint8_t *codes = (const uint8_t *)cb.buf;
    const double *table = (const double *)tb.buf, *grid = (const double *)gb.buf;
    double *tiles = (double *)ob.buf, *vals = (double *)vb.buf;
    double mag[256], tile[7], acc[5] = {(double)n, 0, 0, 0, 0};
    for (int c = 0; c < ncodes; c++) {
        mag[c] = fabs(table[c]);
        if (!isfinite(mag[c])) mag[c] = 0;
    }
    int lo_shift = packing == 2 ? 4 : 0, hi_shift = 4 - lo_shift;
    if (pairs) {
        code_pairs(codes, rows, cols, tc, lo_shift, mag, top, below, low, grid, ct, tiles,
                   acc);
        nbr = 0;  /* done */
    }
    for (Py_ssize_t bi = 0; bi < nbr; bi++) {
        Py_ssize_t r1 = (bi + 1) * tr < rows ? (bi + 1) * tr : rows;
        for (Py_ssize_t r = bi * tr; r < r1; r++) {
            const uint8_t *row = codes + r * bytes_per_row;
            for (Py_ssize_t b = 0; b < nbc; b++) {
                Py_ssize_t *h = hist + b * ncodes;
                Py_ssize_t j1 = (b + 1) * tc < cols ? (b + 1) * tc : cols;
                if (!packing) {
                    uint64_t *p = present + b * 4;
                    for (Py_ssize_t j = b * tc; j < j1; j++) {
                        uint8_t c = row[j];
                        h[c]++;
                        p[c >> 6] |= (uint64_t)1 << (c & 63);
                    }
                } else {  /* tc even: a byte never straddles two tiles */
                    uint64_t p = present[b];
                    for (Py_ssize_t j = b * tc >> 1; j < j1 >> 1; j++) {
                        uint8_t c0 = (row[j] >> lo_shift) & 15, c1 = (row[j] >> hi_shift) & 15;
                        h[c0]++;
                        h[c1]++;
                        p |= ((uint64_t)1 << c0) | ((uint64_t)1 << c1);
                    }
                    present[b] = p;
                }
            }
        }
        for (Py_ssize_t b = 0; b < nbc; b++) {
            Py_ssize_t *row = code_table_row(ct, grid[bi * nbc + b], acc);
            code_tile_close(hist + b * ncodes, present + b * words, words, mag, top,
                            below, low, row, tile);
            for (int k = 0; k < 7; k++) tiles[k * nbr * nbc + bi * nbc + b] = tile[k];
        }
    }
    code_table_flush(ct, acc);
    memcpy(vals, acc, sizeof(acc));
    PyMem_Free(hist);
    PyMem_Free(present);
    PyMem_Free(ct);
    PyMem_Free(slot_counts);
    PyBuffer_Release(&vb); PyBuffer_Release(&ob); PyBuffer_Release(&gb);
    PyBuffer_Release(&tb); PyBuffer_Release(&cb);
    Py_RETURN_TRUE;
fail_v: PyBuffer_Release(&vb);
fail_o: PyBuffer_Release(&ob);
fail_g: PyBuffer_Release(&gb);
fail_t: PyBuffer_Release(&tb);
fail_c: PyBuffer_Release(&cb);
    return NULL;
}

static PyMethodDef methods[] = {
    {"tile_amax", tile_amax, METH_VARARGS,
     "tile_amax(x, rows, cols, tr, tc, out, kind=0): max |x| of each tile as float32 (kind: "
     "0 float32, 1 bfloat16, 2 float16 bit patterns)"},
    {"sum_squares", sum_squares, METH_VARARGS,
     "sum_squares(x, n, largest, kind=0): metrics._sum_of_squares of the float32 values"},
    {"widen_f16", widen_f16, METH_VARARGS, "widen_f16(half, out, n): float16 to float32"},
    {"quantize_chunk", (PyCFunction)(void (*)(void))quantize_chunk,
     METH_VARARGS | METH_KEYWORDS,
     "quantize_chunk(x, scales, shape, tile, rounding, scratch, *, hist=None, flushed=None, "
     "saturated=None, max_rel=None, kind=0) -> (sum_err, max_err, sum_err2, zero_results, "
     "nan_keys, saturated, above_max) or None; shape (rows, cols), tile (tr, tc), rounding "
     "(low, high, shift, fmax); hist None: the squared errors alone"},
    {"amax_scales", amax_scales, METH_VARARGS,
     "amax_scales(amax, out, n, fmax, factor): scaling.amax_to_scale's amax rule (float32)"},
    {"distinct_bits", distinct_bits, METH_VARARGS,
     "distinct_bits(bits, n, limit, out) -> count: distinct 32-bit patterns, up to limit"},
    {"code_stats", code_stats, METH_VARARGS,
     "code_stats(codes, table, grid, (rows, cols, tr, tc, packing), (mul, div, top, below, "
     "low), tiles_out, values_out) -> bool: fmt audit's per-tile code counts and value statistics "
     "of a chunk of stored codes (False: too many tiles, nothing written)"},
    {"simd", simd, METH_VARARGS,
     "simd(on): the hand-vectorised float16/bfloat16 paths (where the CPU has them) or the "
     "portable code alone"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "fmtcli's compiled chunk kernel", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    pick_widen_half(1);
    pick_leaves(1);
    return PyModule_Create(&module);
}
