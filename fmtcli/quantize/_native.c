/* The CPU engine's per-chunk work in one compiled pass (an optional extension module).
 *
 * fmtcli/quantize/native.py is its only caller; chunk.py uses it for the common case (a
 * float32 chunk, nearest-even rounding by the magic number, every scaled value in the
 * format's range) and keeps the numpy formulation for everything else.  Each function
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HIST_SHIFT 16
#define HIST_BINS (1 << (32 - HIST_SHIFT))
#define FINITE_BINS (0x7F800000u >> HIST_SHIFT)
#define EDGE_ULPS 8
#define PW_BLOCKSIZE 128
#define BLOCK_MAX 4096 /* tile widths up to this run the two-stage inner loop */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* AVX2 twice the lanes of the baseline SSE2; same IEEE results (no FMA is enabled) */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

static inline uint32_t bits_of(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float float_of(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

/* ---- numpy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src) ---- */

#define PAIRWISE(NAME, ACC, LEAF)                                                   \
    static ACC NAME(const float *a, Py_ssize_t n)                                  \
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
PAIRWISE(pairwise_f32, float, LEAF_SAME)
PAIRWISE(pairwise_square_f32, float, LEAF_SQUARE_F32)
PAIRWISE(pairwise_square_f64, double, LEAF_SQUARE_F64)

/* np.add.reduce of a contiguous 1-D float32 array */
static double reduce_f32(const float *a, Py_ssize_t n) { return (double)pairwise_f32(a, n); }

/* metrics._sum_of_squares for float32 values (their largest magnitude given):
 * float32 pairwise squares in [2**-23, 2**50], float64 squares otherwise */
static double sum_of_squares(const float *a, Py_ssize_t n, double largest)
{
    if (largest >= 0x1p-23 && largest <= 0x1p50) return (double)pairwise_square_f32(a, n);
    return pairwise_square_f64(a, n);
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

static PyObject *tile_amax(PyObject *self, PyObject *args)
{
    PyObject *xo, *oo;
    Py_ssize_t rows, cols, tr, tc;
    if (!PyArg_ParseTuple(args, "OnnnnO", &xo, &rows, &cols, &tr, &tc, &oo)) return NULL;
    Py_ssize_t n = checked_size(rows, cols);
    if (n < 0) return NULL;
    if (tr < 1 || tc < 1) {
        PyErr_SetString(PyExc_ValueError, "bad shape");
        return NULL;
    }
    Py_ssize_t nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
    Py_buffer xb, ob;
    if (get_buffer(xo, &xb, 0, "f", 4, n, "x") < 0) return NULL;
    if (get_buffer(oo, &ob, 1, "f", 4, nbr * nbc, "out") < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    memset(ob.buf, 0, (size_t)ob.len);
    amax_rows((const uint32_t *)xb.buf, rows, cols, tr, tc, (uint32_t *)ob.buf, nbc);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- sum of squares of a chunk (metrics._sum_of_squares, float32 data) ---- */

static PyObject *sum_squares(PyObject *self, PyObject *args)
{
    PyObject *xo;
    Py_ssize_t n;
    double largest;
    if (!PyArg_ParseTuple(args, "Ond", &xo, &n, &largest)) return NULL;
    Py_buffer xb;
    if (get_buffer(xo, &xb, 0, "f", 4, n, "x") < 0) return NULL;
    double total = sum_of_squares((const float *)xb.buf, n, largest);
    PyBuffer_Release(&xb);
    return PyFloat_FromDouble(total);
}

/* ---- float16 to float32 (numpy's astype runs ~1.6 ns a value without F16C) ---- */

VECTOR_CLONES
static void widen_half(const uint16_t *h, uint32_t *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = h[i];
        uint32_t sign = (v & 0x8000u) << 16;
        uint32_t mag = v & 0x7FFFu;
        /* normal and subnormal: exponent rebias by 2**112 as a float multiply (exact: a
         * subnormal half is an integer times 2**-24, every such value is a normal float);
         * inf/NaN: exponent all ones, payload kept */
        uint32_t finite = bits_of(float_of(mag << 13) * 0x1p112f);
        uint32_t special = (mag << 13) | 0x7F800000u;
        uint32_t is_special = 0u - (uint32_t)(mag >= 0x7C00u);
        out[i] = (special & is_special) | (finite & ~is_special) | sign;
    }
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
    widen_half((const uint16_t *)hb.buf, (uint32_t *)ob.buf, n);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- the chunk kernel ---- */

typedef struct {
    uint32_t low, high, shift;  /* magic-number clamp (bit patterns) and (23 - m) << 23 */
    float fmax;                 /* saturate to it (inf: nothing can round past max) */
} Rounding;

/* What stage one found in a stretch of one tile row. */
typedef struct {
    uint32_t maxbits;   /* max |err| as a bit pattern (finite errors order as their bits) */
    uint32_t past;      /* values whose rounding lay past fmax (saturated to it) */
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
 * rounding lay past fmax.  Inlined into the vectorised loops. */
static inline float quantize_value(float v, float s, Rounding rd, uint32_t *past)
{
    uint32_t b = bits_of(v * s);
    uint32_t mag = b & 0x7FFFFFFFu;
    uint32_t e = mag & 0x7F800000u;
    e = e < rd.low ? rd.low : e;
    e = e > rd.high ? rd.high : e;
    float m = float_of(e + rd.shift);
    float r = (float_of(mag) + m) - m;
    *past += (uint32_t)(r > rd.fmax);
    r = r > rd.fmax ? rd.fmax : r;
    return float_of(bits_of(r) | (b & 0x80000000u)) / s;
}

/* Stage one of a tile row: branch-free, vectorised.  Writes err (float32, for the sums)
 * and each value's histogram key (the top 16 bits of the float32 |err| / |x|), and
 * near[k] (nonzero) where that relative error lies within EDGE_ULPS of a bin edge; counts
 * in *f.  Values past fmax are set to it (fmax inf: values known to stay in range). */
VECTOR_CLONES
static void stage_one(const float *x, float s, Py_ssize_t n, Rounding rd, float *err,
                      uint32_t *keys, uint8_t *near, Found *f)
{
    uint32_t past = 0, maxbits = f->maxbits, zeros = 0, flushed = 0, edges = 0;
    uint32_t kmin = f->kmin, kmax = f->kmax, relmax = f->relmax, seen = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        float v = x[k];
        float q = quantize_value(v, s, rd, &past);
        float d = q - v;
        float ad = fabsf(d);
        err[k] = d;
        uint32_t ab = bits_of(ad);
        maxbits = ab > maxbits ? ab : maxbits;
        uint32_t rb = bits_of(ad / fabsf(v));
        uint32_t key = rb >> HIST_SHIFT;
        keys[k] = key;
        kmin = key < kmin ? key : kmin;
        kmax = key > kmax ? key : kmax;
        uint32_t zero = (uint32_t)(q == 0.0f);
        zeros += zero;
        flushed += zero & (uint32_t)(v != 0.0f);
        /* 0 < rel < inf (NaN's bits lie above inf's), x_q nonzero, low bits near an edge */
        uint32_t finite = (uint32_t)(rb - 1u < 0x7F7FFFFFu);
        /* Where x_q and x lie within a factor 2, err is exact (Sterbenz), so the float32
         * quotient is within half an ulp of the true relative error: only one that landed
         * exactly on a bin edge can belong to the bin below; the others near an edge are
         * in the right bin already (bfloat16 data put 0.5% of values near edges). */
        float aq = fabsf(q), av = fabsf(v);
        uint32_t exact_err = (uint32_t)(aq <= 2.0f * av) & (uint32_t)(av <= 2.0f * aq);
        uint32_t on_edge = (uint32_t)((rb & 0xFFFFu) == 0);
        uint32_t edge = finite & (1u - zero)
                        & (uint32_t)(((rb + EDGE_ULPS) & 0xFFFFu) < 2 * EDGE_ULPS)
                        & ((1u - exact_err) | on_edge);
        edges += edge;
        near[k] = (uint8_t)(edge * (2u - exact_err)); /* 1: err exact, on an edge; 2: redo */
        uint32_t ordered = (uint32_t)(rb <= 0x7F800000u); /* not NaN (0/0) */
        uint32_t ranked = rb & (0u - ordered);
        relmax = ranked > relmax ? ranked : relmax;
        seen += ordered;
    }
    f->maxbits = maxbits;
    f->past += past;
    f->zeros += zeros;
    f->flushed += flushed;
    f->edges += edges;
    f->kmin = kmin;
    f->kmax = kmax;
    f->relmax = relmax;
    f->seen += seen;
}

/* Stage two (rare): the relative errors within EDGE_ULPS of a bin edge (near[k]) get their
 * exact keys (metrics._bin_keys). */
static void redo_edges(const float *x, float s, Py_ssize_t n, Rounding rd, const float *err,
                       const uint8_t *near, uint32_t *keys, Found *f)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!near[k]) continue;
        uint32_t key;
        if (near[k] == 1) {
            /* err exact and |err| / |x| rounded onto the edge E: the true quotient lies in
             * E's bin unless |err| < E |x| (a float64 product of 8 and 24 bits: exact) */
            key = keys[k];
            double edge = (double)float_of(key << HIST_SHIFT);
            if ((double)fabsf(err[k]) < edge * (double)fabsf(x[k])) key -= 1;
        } else {
            uint32_t ignored = 0;
            key = exact_key(quantize_value(x[k], s, rd, &ignored), x[k]);
        }
        keys[k] = key;
        f->kmin = key < f->kmin ? key : f->kmin;
        f->kmax = key > f->kmax ? key : f->kmax;
    }
}

/* The same without what only the histogram needs (scale-search's MSE ranking): returns
 * max |err|'s bits. */
VECTOR_CLONES
static uint32_t stage_one_mse(const float *x, float s, Py_ssize_t n, Rounding rd, float *err,
                              uint32_t maxbits, uint32_t *saturated)
{
    uint32_t past = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        float v = x[k];
        float q = quantize_value(v, s, rd, &past);
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

/* four interleaved histograms (one call at a time: the GIL is held throughout): equal
 * keys in a row then increment different counters, not one chain of loads and stores */
#define HISTS 4
static uint32_t local_hist[HISTS][HIST_BINS];

static void add_keys(const uint32_t *keys, Py_ssize_t n)
{
    Py_ssize_t k = 0;
    for (; k + HISTS <= n; k += HISTS)
        for (int h = 0; h < HISTS; h++) local_hist[h][keys[k + h]]++;
    for (; k < n; k++) local_hist[0][keys[k]]++;
}

static PyObject *quantize_chunk(PyObject *self, PyObject *args)
{
    PyObject *xo, *so, *ho, *fo, *mo, *eo, *to;
    Py_ssize_t rows, cols, tr, tc;
    unsigned int low, high, shift;
    float fmax;
    if (!PyArg_ParseTuple(args, "OOnnnnIIIfOOOOO", &xo, &so, &rows, &cols, &tr, &tc, &low,
                          &high, &shift, &fmax, &eo, &ho, &fo, &to, &mo))
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
    if (get_buffer(xo, &xb, 0, "f", 4, n, "x") < 0) return NULL;
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
        const float *x = (const float *)xb.buf, *scales = (const float *)sb.buf;
        float *err = (float *)eb.buf;
        int64_t *flushed = have_f ? (int64_t *)fb.buf : NULL;
        float *max_rel = have_m ? (float *)mb.buf : NULL;
        int64_t *block_saturated = have_t ? (int64_t *)tb.buf : NULL;
        Rounding rd = {low, high, shift, fmax};
        Found f = {0, 0, 0, 0, 0, HIST_BINS, 0, 0, 0};
        uint32_t keys[BLOCK_MAX];
        uint8_t near[BLOCK_MAX];
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
                    const float *xv = x + i * cols + j0;
                    float *ev = err + i * cols + j0;
                    if (!full) {
                        f.maxbits = stage_one_mse(xv, s, len, rd, ev, f.maxbits, &f.past);
                        continue;
                    }
                    uint32_t past = f.past, flushed_before = f.flushed, edges = f.edges;
                    f.relmax = 0;
                    f.seen = 0;
                    stage_one(xv, s, len, rd, ev, keys, near, &f);
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
        int64_t saturated = f.past, zero_results = f.zeros;
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
            double err2 = sum_of_squares(err, n, (double)maxerr);
            result = Py_BuildValue("dddLLL", total_err, (double)maxerr, err2,
                                   (long long)zero_results, (long long)nan_keys,
                                   (long long)saturated);
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

static PyMethodDef methods[] = {
    {"tile_amax", tile_amax, METH_VARARGS,
     "tile_amax(x, rows, cols, tr, tc, out): max |x| of each tile, as bit patterns"},
    {"sum_squares", sum_squares, METH_VARARGS,
     "sum_squares(x, n, largest): metrics._sum_of_squares of float32 values"},
    {"widen_f16", widen_f16, METH_VARARGS, "widen_f16(half, out, n): float16 to float32"},
    {"quantize_chunk", quantize_chunk, METH_VARARGS,
     "quantize_chunk(x, scales, rows, cols, tr, tc, low, high, shift, fmax, scratch, hist, "
     "flushed, saturated, max_rel) -> (sum_err, max_err, sum_err2, zero_results, "
     "nan_keys, saturated) or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "fmtcli's compiled chunk kernel", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
