"""Experiment for issue 12: a numba-compiled one-pass chunk kernel against the numpy one.

    pip install numba          # not a dependency of fmtcli: this script measures whether
    python benchmarks/numba_prototype.py     # it would earn its place

One compiled loop per element does what ``fmtcli.engine.chunk.ChunkKernel`` does in ~15
numpy passes, for the common case (float32 data and product, nearest-even through the
magic-number addition, one scale per block, every scaled value in range, finite data):
x_q = cast(x * scale) / scale with the same float32 operations in the same order, the
relative-error histogram bin (exact, redone in float64 near a bin edge as
``metrics._bin_keys`` does), zeros, flushed per block and the sums (float64, element order).
The script checks that the histogram, flushed counts and max error equal the numpy
kernel's on a few formats, then times both per element on one 256 Ki-element chunk, and
times numba's import and the compiled code's cache load.  Findings: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from fmtcli.streaming.metrics import HIST_SHIFT

EDGE_ULPS = 8  # as metrics.EDGE_ULPS
MIN_ELEMENTS = 1 << 22  # below this many values in a tensor, numba's import does not pay


def _cache_dir() -> None:
    """Point numba's cache at a user directory when the package folder is not writable."""
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.access(here, os.W_OK):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, "fmtcli", "numba")


@functools.lru_cache(maxsize=1)
def kernel():
    """The compiled kernel, or None where numba is missing or fails."""
    try:
        _cache_dir()
        import numba
    except Exception:  # ImportError, or a numba that cannot load its LLVM
        return None
    try:
        return numba.njit(cache=True, nogil=True, error_model="numpy")(_fused_chunk)
    except Exception:
        return None


def available() -> bool:
    return kernel() is not None


def warm_up() -> None:
    """Compile the kernel for the engine's argument types (or load it from the cache) in
    this process, so that forked workers inherit it instead of each compiling it."""
    compiled = kernel()
    if compiled is None:
        return
    x = np.ones((1, 1), np.float32)
    hist = np.zeros((1, 1 << (32 - HIST_SHIFT)), np.int64)[0]  # a row, as the workers' are
    compiled(x, x, 1, 1, np.uint32(0), np.uint32(0), np.uint32(0), hist,
             np.zeros((1, 1), np.int64))


def _fused_chunk(x, scales, tr, tc, low, high, magic_add, hist, flushed):
    """One chunk (rows x cols float32, C order) under one scale per (tr x tc) tile.

    Returns (zeros, zero results, sum of errors, sum of squared errors, sum of squared
    inputs, max |error|); adds relative-error bins to ``hist`` and flushed values per tile
    to ``flushed``.  ``low``/``high``/``magic_add``: the magic-number rounding's constants
    (see ``rounding.round_float32_nearest_even``).  Caller's promise: x finite, every
    |x * scale| below the format's rounding threshold."""
    rows, cols = x.shape
    zeros = 0
    zero_results = 0
    sum_err = 0.0
    sum_err2 = 0.0
    sum_x2 = 0.0
    max_err = np.float32(0.0)
    exp_mask = np.uint32(0x7F800000)
    sign_mask = np.uint32(0x80000000)
    abs_mask = np.uint32(0x7FFFFFFF)
    shift = np.uint32(HIST_SHIFT)
    nbc = scales.shape[1]
    for i in range(rows):
        bi = i // tr
        for bj in range(nbc):
            s = scales[bi, bj]
            j1 = min((bj + 1) * tc, cols)
            block_flushed = 0
            for j in range(bj * tc, j1):
                v = x[i, j]
                xs = np.float32(v * s)
                bits = np.float32(xs).view(np.uint32)
                mag_bits = bits & abs_mask
                magic = mag_bits & exp_mask
                magic = min(max(magic, low), high)
                m = np.uint32(magic + magic_add).view(np.float32)
                mag = np.uint32(mag_bits).view(np.float32)
                r = np.float32(np.float32(mag + m) - m)
                r = np.uint32(np.float32(r).view(np.uint32) | (bits & sign_mask)
                              ).view(np.float32)
                q = np.float32(r / s)
                err = np.float32(q - v)
                sum_err += err
                sum_err2 += np.float64(err) * np.float64(err)
                sum_x2 += np.float64(v) * np.float64(v)
                ae = np.float32(abs(err))
                max_err = max(max_err, ae)
                if q == 0:
                    zero_results += 1
                    if v != 0:
                        block_flushed += 1
                if v == 0:
                    zeros += 1
                    continue  # 0 / 0: no relative error (the numpy path bins it as NaN)
                rel = np.float32(ae / np.float32(abs(v)))
                rbits = np.float32(rel).view(np.uint32)
                key = rbits >> shift
                low16 = (rbits + np.uint32(EDGE_ULPS)) & np.uint32(0xFFFF)
                if low16 < np.uint32(2 * EDGE_ULPS) and rel > 0 and q != 0:
                    exact = abs(np.float64(q) - np.float64(v)) / abs(np.float64(v))
                    r32 = np.float32(exact)
                    rb = np.float32(r32).view(np.uint32)
                    if np.float64(r32) > exact:  # toward zero: stay below an edge
                        rb -= np.uint32(1)
                    key = rb >> shift
                hist[key] += 1
            flushed[bi, bj] += block_flushed
    return zeros, zero_results, sum_err, sum_err2, sum_x2, max_err


def per_value(fn, size: int, n: int = 20) -> float:
    """Best nanoseconds per value of n calls."""
    import time

    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) / size * 1e9


def main() -> None:
    import time

    from fmtcli.streaming.stream import keep_freed_memory

    keep_freed_memory()  # as the engine does: no page faults for each chunk's arrays

    t0 = time.perf_counter()
    compiled = kernel()
    if compiled is None:
        raise SystemExit("numba is not installed (pip install numba)")
    t1 = time.perf_counter()
    warm_up()
    t2 = time.perf_counter()
    print(f"import numba + decorate {t1 - t0:.3f} s; first call (compile, or load the "
          f"cache) {t2 - t1:.3f} s")
    from fmtcli.engine.chunk import ChunkKernel, Plan
    from fmtcli.numerics.formats import get_format
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.streaming.metrics import FINITE_BINS, HIST_BINS

    rng = np.random.default_rng(0)
    data = {"N(0, 0.02)": (rng.standard_normal((64, 4096)) * 0.02).astype(np.float32),
            "heavy-tailed": (rng.standard_normal((64, 4096))
                             * np.exp(rng.normal(0, 2, (64, 4096)))).astype(np.float32)}
    for label, x in data.items():
        for name in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"):
            spec = get_format(name)
            numpy_kernel = ChunkKernel(Plan(build_scheme(block=128, format=spec), (1, 128),
                                            False), 0)
            hist_np = np.zeros(HIST_BINS, np.int64)
            acc, scales, _, facts = numpy_kernel.run(x, (0, 0, x.shape[1]), hist_np, None)
            magic = (np.uint32(np.float32(spec.smallest_normal).view(np.uint32)),
                     np.uint32(np.float32(2.0 ** (spec.max_exponent + 1)).view(np.uint32)),
                     np.uint32((23 - spec.mantissa_bits) << 23))

            def fused_run(hist, flushed, x=x, scales=scales, magic=magic):
                return compiled(x, scales, 1, 128, *magic, hist, flushed)

            hist = np.zeros(HIST_BINS, np.int64)
            flushed = np.zeros(scales.shape, np.int64)
            zeros, zero_results, _, _, _, max_err = fused_run(hist, flushed)
            same = (np.array_equal(hist[:FINITE_BINS], hist_np[:FINITE_BINS])
                    and zero_results - zeros == acc.flushed
                    and np.array_equal(flushed, facts.flushed)
                    and float(max_err) == acc.max_abs_err)
            spare = np.zeros(HIST_BINS, np.int64)
            t_numpy = per_value(lambda k=numpy_kernel, x=x, h=spare: k.run(
                x, (0, 0, x.shape[1]), h, None), x.size)
            t_fused = per_value(lambda f=fused_run, h=spare, shape=scales.shape: f(
                h, np.zeros(shape, np.int64)), x.size)
            print(f"{label:13s} {name:14s} numpy kernel {t_numpy:5.2f} ns/value, fused "
                  f"{t_fused:5.2f} ns/value (+ amax and scales in numpy); "
                  f"identical statistics: {same}")


if __name__ == "__main__":
    main()
