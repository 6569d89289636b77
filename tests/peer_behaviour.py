"""What the installed peers do where their releases differ, found by trying them on a few
inputs (never read from a version number), so that a test of a peer holds for every release
that pyproject allows.

ml_dtypes, by casting.  Seen so far (0.5.0, 0.5.3, 0.6.0, 0.7.0):

- float64 input: 0.5 and 0.6 cast through float32 (rounding twice: 68.00000357 becomes 64
  in float8_e4m3fn); 0.7 rounds once, as the engine (72);
- E8M0, float32 subnormals in (2**-127, 1.5 * 2**-127): 0.5 and 0.6 round them up to
  2**-126; 0.7 to the nearest, 2**-127, as the engine;
- E8M0 ties 1.5 * 2**k: 0.5.0 goes to the even code (2**k for odd k: 3 becomes 2); 0.5.3,
  0.6 and 0.7 up in magnitude, as the engine (3 becomes 4).

numpy, by summing (``sum_order``): the order in which ``np.add.reduce`` adds a contiguous
1-D float32 or float64 array.  numpy 2.3.0 and later (seen: 2.3.0, 2.4.0, 2.4.6): one
pairwise tree over the whole array, the tree the compiled kernel implements.  numpy 1.26.0,
2.0.0, 2.1.0 and 2.2.0: the same tree within blocks of ``np.getbufsize()`` values (8192),
the blocks' sums added in order -- the reduction always ran buffered (numpy issue 17649:
``PyUFunc_ReduceWrapper`` sets ``NPY_ITER_BUFFERED``, which splits the loop into chunks of
the buffer size).  Checked on an x86-64 CPU with AVX2 and no AVX-512.

Each detector asserts that the peer does one of the known things: a release (or a CPU)
that does a third thing fails the tests until someone looks at it.  Imports nothing from
fmtcli.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np


def ml_cast(x: np.ndarray, name: str) -> np.ndarray:
    """x cast to ml_dtypes' ``name`` and back to x's dtype."""
    with np.errstate(all="ignore"):
        return x.astype(getattr(ml_dtypes, name)).astype(x.dtype)


@functools.cache
def rounds_float64_through_float32(name: str) -> bool:
    """Whether ml_dtypes casts float64 to ``name`` through float32: just above and just below
    the tie between 1 and the next value of the format (closer than float32 resolves), a
    single rounding gives the two neighbours; through float32 both are the tie's value."""
    low, high = 1.0, 1.0 + float(ml_dtypes.finfo(getattr(ml_dtypes, name)).eps)
    tie = (low + high) / 2
    x = np.array([tie * (1 + 2.0**-40), tie * (1 - 2.0**-40)])
    got = ml_cast(x, name).tolist()
    if got == [high, low]:
        return False
    assert np.array_equal(got, ml_cast(x.astype(np.float32).astype(np.float64), name)), \
        f"ml_dtypes {ml_dtypes.__version__}: {x} -> {got} in {name}, neither rounded once " \
        "nor through float32"
    return True


@functools.cache
def e8m0_subnormals_round_up() -> bool:
    """Whether ml_dtypes rounds the float32 subnormals just above 2**-127 up to 2**-126 in
    E8M0 (else to the nearest, 2**-127)."""
    got = float(ml_cast(np.array([1.25 * 2.0**-127], np.float32), "float8_e8m0fnu")[0])
    assert got in (2.0**-127, 2.0**-126), (ml_dtypes.__version__, got)
    return got == 2.0**-126


@functools.cache
def e8m0_ties_to_even_code() -> bool:
    """Whether ml_dtypes sends an E8M0 tie 1.5 * 2**k to the even code (2**k for odd k;
    3 -> 2) rather than up in magnitude (3 -> 4)."""
    got = float(ml_cast(np.array([3.0], np.float32), "float8_e8m0fnu")[0])
    assert got in (2.0, 4.0), (ml_dtypes.__version__, got)
    return got == 2.0


def e8m0_differences(x32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the installed ml_dtypes' E8M0 differs from the nearest-even-up rule (a mask over
    float32 ``x32``), and the values it stores there (float32)."""
    a = np.abs(x32.astype(np.float64))
    mask = np.zeros(x32.shape, bool)
    alternative = np.zeros(x32.shape, np.float32)
    positive = (x32 > 0) & np.isfinite(x32)
    if e8m0_subnormals_round_up():
        sub = positive & (a > 2.0**-127) & (a < 1.5 * 2.0**-127)
        mask |= sub
        alternative[sub] = 2.0**-126
    if e8m0_ties_to_even_code():
        with np.errstate(invalid="ignore"):
            mantissa, exponent = np.frexp(a)
        k = exponent - 1  # x = 1.5 * 2**k
        ties = positive & (mantissa == 0.75) & (k >= -126) & (k <= 127) & (k % 2 != 0)
        mask |= ties
        alternative[ties] = (a[ties] / 1.5).astype(np.float32)
    return mask, alternative


# -- numpy's summation order ------------------------------------------------------------------

PW_BLOCKSIZE = 128  # numpy's leaf: at most this many values, in 8 running sums


def pairwise_sum(a: np.ndarray):
    """The sum of contiguous 1-D ``a`` (float32 or float64) by numpy's pairwise summation
    (``pairwise_sum`` in numpy/_core/src/umath/loops_utils.h.src), in ``a``'s dtype, every
    addition rounded once: fewer than 8 values added in order; up to ``PW_BLOCKSIZE`` in 8
    running sums over values j, j + 8, ... (an elementwise add of 8-value slices), combined
    as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail in order; longer
    arrays split in two at half the length rounded down to a multiple of 8.  Written from
    that description with numpy's elementwise arithmetic only (no reduction): a numpy
    scalar of ``a``'s dtype."""
    t = a.dtype.type
    n = a.size
    if n < 8:
        res = t(0)
        for v in a:
            res = t(res + v)
        return res
    if n <= PW_BLOCKSIZE:
        r = a[:8].copy()
        m = n - n % 8
        for i in range(8, m, 8):
            r += a[i:i + 8]
        res = t(t(t(r[0] + r[1]) + t(r[2] + r[3])) + t(t(r[4] + r[5]) + t(r[6] + r[7])))
        for v in a[m:]:
            res = t(res + v)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return t(pairwise_sum(a[:n2]) + pairwise_sum(a[n2:]))


def blocked_sum(a: np.ndarray, block: int):
    """numpy < 2.3's order: ``pairwise_sum`` of each ``block`` values, added in order."""
    t = a.dtype.type
    res = t(0)
    for start in range(0, a.size, block):
        res = t(res + pairwise_sum(a[start:start + block]))
    return res


@functools.cache
def sum_order(dtype_name: str = "float32") -> int | None:
    """How ``np.add.reduce`` adds a contiguous 1-D array of ``dtype_name`` here: None for
    one pairwise tree over the whole array (``pairwise_sum``), or the block length B of
    ``blocked_sum`` (pairwise within blocks of B, the blocks added in order)."""
    return order_of(lambda x: np.add.reduce(x, dtype=x.dtype), dtype_name)


def order_of(reduce, dtype_name: str, block: int | None = None) -> int | None:
    """``sum_order`` of the summation ``reduce`` (an array to its sum), the block length to
    try being ``np.getbufsize()`` unless given: found on probe arrays of awkward lengths
    (around 8, 128 and 8192, and several blocks long) whose sums depend on the order;
    anything else fails here."""
    rng = np.random.default_rng(17)
    block = int(np.getbufsize()) if block is None else block
    lengths = (1, 7, 9, 127, 129, 1000, 8191, 8193, 16411, 20001, 65543, 100003)
    pairwise = blocked = True
    for n in lengths:
        x = (rng.standard_normal(n) * np.exp2(rng.uniform(-20, 20, n))).astype(dtype_name)
        got = reduce(x)
        pairwise &= bool(got == pairwise_sum(x))
        blocked &= bool(got == blocked_sum(x, block))
    assert pairwise or blocked, \
        f"numpy {np.__version__}: np.add.reduce of {dtype_name} is neither numpy's pairwise " \
        f"tree nor that tree in blocks of {block} added in order"
    return None if pairwise else block


def sums_are_pairwise() -> bool:
    """Whether numpy's float32 and float64 sums here are one pairwise tree (the compiled
    kernel's, so its sums equal the numpy path's to the bit)."""
    return sum_order("float32") is None and sum_order("float64") is None


def pairwise_depth(n: int) -> int:
    """The most additions any one value goes through in ``pairwise_sum`` of n values."""
    if n < 8:
        return max(n - 1, 0)
    if n <= PW_BLOCKSIZE:
        return n // 8 - 1 + 3 + n % 8
    n2 = n // 2 - (n // 2) % 8
    return 1 + max(pairwise_depth(n2), pairwise_depth(n - n2))


def sum_gap(n: int, dtype_name: str = "float32") -> float:
    """A bound on |a - b| / sum(|x_i|) for a = ``pairwise_sum`` and b = numpy's sum here of
    the same n values (at most n, per sum, where a figure adds several sums).  A sum whose
    every value goes through at most d additions is within gamma_d * sum(|x_i|) of the exact
    sum, gamma_d = d u / (1 - d u), u the unit roundoff (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., 2002, section 4.2); the two orders' d are
    ``pairwise_depth(n)`` and, in blocks of B, ``pairwise_depth(B)`` + n / B.  0 where the
    orders are the same."""
    block = sum_order(dtype_name)
    if block is None:
        return 0.0
    u = float(np.finfo(dtype_name).eps) / 2

    def gamma(d: int) -> float:
        return d * u / (1 - d * u)

    blocked = max(pairwise_depth(min(n, block)), pairwise_depth(n % block)) + math.ceil(n / block)
    return gamma(pairwise_depth(n)) + gamma(blocked)


def assert_numpy_s_sum(got: float, want: float, n: int, scale: float, what) -> None:
    """``got`` (a pairwise sum of n terms whose magnitudes sum to ``scale``) is numpy's sum
    ``want`` of them to the bit where numpy sums by that tree here (``sum_order``), else
    within the two orders' error bound (``sum_gap``)."""
    gap = sum_gap(n)
    if not gap:
        assert np.float64(got).tobytes() == np.float64(want).tobytes(), (what, got, want)
    else:
        assert abs(got - want) <= 1.01 * gap * scale, (
            f"{what}: {got!r} vs numpy {np.__version__}'s {want!r}, more apart than the error "
            f"bound of pairwise vs blocks of {sum_order()} ({gap:.3g} x {scale:.6g})")
