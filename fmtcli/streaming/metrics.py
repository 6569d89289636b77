"""Error statistics of a quantization, accumulated chunk by chunk and merged exactly.

Counts and extrema merge exactly; sums are float64 (they can differ in the last bits between
chunkings).  Median and p99 of the relative error come from a histogram whose bins are the
top 16 bits of the float32 relative error (sign, exponent and 7 mantissa bits): every bin
spans a factor of 1 + 2**-7.  A quantile is reported as the lower edge of its bin, so the
true value q satisfies ``reported <= q < reported * (1 + REL_ERROR_RESOLUTION)`` (exact 0
and exact 1 -- a flushed value -- come out exactly).  The bin is exact: a relative error
computed in float32 (or float64) that lands within 8 float32 ulp of a bin edge is redone
exactly (``_bin_keys``), as the CUDA kernel redoes its fast division.  Histograms of chunks
add up exactly: quantiles do not depend on the chunk size at all.

Populations:
- ``count`` every element; ``nonzero`` the finite nonzero inputs, over which relative errors,
  ``flushed`` and the quantiles are taken.
- ``saturated``: values whose rounding lay past max and that came out as +-max (clipped: in
  E4M3 under nearest-even, |x * scale| >= 464, max plus half its ulp); ``above_max``: values
  whose scaled magnitude |x * scale| exceeds max at all (> 448 in E4M3; inf inputs
  included), what a clip-then-cast recipe clamps (torchao), the saturated and overflowed
  ones among them; those between max and the rounding threshold round to max anyway.  A
  result that is inf or NaN for such an input counts as an infinite relative error (it
  ranks last).
- ``rmse``/``mse``, ``bias`` (mean signed error x_q - x), ``max_abs_error`` and ``sqnr_db``
  cover the elements whose input is finite.  A result that is inf or NaN for a finite input
  (``unbounded``: overflow under ``--overflow ieee``, a backend's NaN) is an unbounded error:
  when there is one, ``rmse`` = ``mse`` = ``max_abs_error`` = inf, ``sqnr_db`` = -inf and
  ``bias`` = NaN (undefined: the mean of errors that include inf or NaN).  So a policy
  that makes NaN never reports a better error than one that saturates.  inf/NaN inputs are
  left out of these figures (``nonfinite_inputs`` counts them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

HIST_SHIFT = 16
HIST_BINS = 1 << (32 - HIST_SHIFT)
FINITE_BINS = 0x7F800000 >> HIST_SHIFT  # bins at and above this index hold inf and NaN
ONE_BIN = 0x3F800000 >> HIST_SHIFT  # the bin of a relative error of exactly 1 (float32 1.0)
NAN_BINS = np.r_[FINITE_BINS + 1:0x8000, 0x8000 + FINITE_BINS + 1:HIST_BINS]  # NaN, either sign
REL_ERROR_RESOLUTION = 2.0 ** -(23 - HIST_SHIFT)  # bin width relative to its lower edge


BIG = 2.0 ** 500  # float64 values from here on have squares summed scaled (no overflow)
BIG_SHIFT = 600  # ... as (v * 2**-600)**2: sums of squares are small + big * 2**1200
TINY_SUM = 2.0 ** -800  # a float64 chunk's sum of squares below this is redone scaled up


def _sum_of_squares(values: np.ndarray, largest: float | None) -> tuple[float, float, float]:
    """(small, big, tiny): the sum of squares of one chunk (at most 2**40 values) is
    ``small + big * 2**(2 * BIG_SHIFT) + tiny * 2**(-2 * BIG_SHIFT)``, so float64 data near
    its top (1e300) does not overflow and data near its bottom (1e-300) does not underflow
    to a sum of 0; big and tiny are 0 for every float32 chunk.

    float32 squares summed pairwise in float32 (relative error ~1e-7) when the largest value
    L lies in [2**-23, 2**50]: then every square that float32 flushes is below
    (L * 2**-40)**2, which all of them together cannot lift above 2**-40 of L**2, and nothing
    overflows.  Otherwise (tiny gradients, unknown L) float64.
    """
    if (largest is not None and 2.0 ** -23 <= largest <= 2.0 ** 50
            and values.dtype == np.float32):
        return float(np.add.reduce(np.square(values), dtype=np.float32)), 0.0, 0.0
    if values.dtype == np.float64 and not (largest is not None and largest < BIG):
        big = np.abs(values) >= BIG
        if big.any():
            scaled = np.ldexp(values[big], -BIG_SHIFT)
            return (float(np.sum(np.square(values[~big]))),
                    float(np.sum(np.square(scaled))), 0.0)
    total = float(np.sum(np.square(values, dtype=np.float64)))
    if values.dtype == np.float64 and total < TINY_SUM:  # every |v| < 2**-400: scale up
        return 0.0, 0.0, float(np.sum(np.square(np.ldexp(values, BIG_SHIFT))))
    return total, 0.0, 0.0


def scaled_sum(small: float, big: float, tiny: float = 0.0) -> tuple[float, int]:
    """``small + big * 2**(2 * BIG_SHIFT) + tiny * 2**(-2 * BIG_SHIFT)`` as (value, power of
    two) for logs and roots."""
    if big:
        return math.ldexp(small, -2 * BIG_SHIFT) + big, 2 * BIG_SHIFT
    if small or not tiny:
        return small + math.ldexp(tiny, -2 * BIG_SHIFT), 0
    return tiny, -2 * BIG_SHIFT


SMALL_CHUNK = 4096  # chunks this small add to the histogram element by element
EDGE_ULPS = 8  # a computed relative error this close to a bin edge is checked exactly


def _truncated_keys(rel64: np.ndarray) -> np.ndarray:
    """Bin keys of float64 relative errors, rounding toward zero to float32 (a float64
    just below a bin edge stays below it, where rounding to nearest would cross it)."""
    r32 = rel64.astype(np.float32)
    over = r32 > rel64
    r32[over] = np.nextafter(r32[over], np.float32(0))
    return np.right_shift(r32.view(np.uint32), HIST_SHIFT)


def _bin_keys(rel: np.ndarray, x: np.ndarray, x_q: np.ndarray) -> np.ndarray:
    """Histogram keys (top 16 bits of the float32 relative error) that are exact: the bin
    holding the true |x_q - x| / |x|, not a rounded one.

    ``rel`` was computed in float32 (float32 data: within 3 ulp of the truth) or float64.
    Elements within ``EDGE_ULPS`` float32 ulp of a bin edge are redone: in float64 for
    float32 x and x_q (the difference of two float32 values and the quotient's side of an
    8-bit edge are then decided exactly: |q - edge| >= 2**-48 q unless q == edge), with
    fractions for float64 data (rare elements).  Zero, one for flushed values, inf and NaN
    are exact already."""
    if rel.dtype == np.float32:
        bits = rel.view(np.uint32)
        keys = np.right_shift(bits, HIST_SHIFT)
    else:
        bits = rel.astype(np.float32).view(np.uint32)  # its low bits: the distance to an edge
        keys = _truncated_keys(rel)
    # low 16 bits in [0, EDGE_ULPS) or [2**16 - EDGE_ULPS, 2**16): their uint16 plus
    # EDGE_ULPS wraps below 2 * EDGE_ULPS (two passes over half-width integers)
    low = bits.astype(np.uint16)  # the low 16 bits
    low += np.uint16(EDGE_ULPS)
    candidates = np.flatnonzero(low < np.uint16(2 * EDGE_ULPS))
    if not candidates.size:
        return keys
    r = rel[candidates]
    index = candidates[(r > 0) & (r < np.inf) & (x_q[candidates] != 0)]  # NaN compares False
    if not index.size:
        return keys
    xi, qi = x[index], x_q[index]
    if xi.dtype == np.float32 and qi.dtype == np.float32:
        xi, qi = xi.astype(np.float64), qi.astype(np.float64)
        keys[index] = _truncated_keys(np.abs(qi - xi) / np.abs(xi))
        return keys
    from fractions import Fraction

    for i, xv, qv in zip(index.tolist(), xi.tolist(), qi.tolist()):
        q = abs(Fraction(qv) - Fraction(xv)) / abs(Fraction(xv))
        key = int(_truncated_keys(np.array([float(q)]))[0])
        edge = Fraction(float(np.uint32(key << HIST_SHIFT).view(np.float32)))
        keys[i] = key - 1 if q < edge else key
    return keys


@dataclass
class ErrorAccumulator:
    """Mergeable running statistics; ``add_chunk`` for data, ``merge`` for partial results."""

    count: int = 0
    nonzero: int = 0
    zeros: int = 0
    nonfinite_inputs: int = 0
    flushed: int = 0
    saturated: int = 0
    above_max: int = 0  # |x * scale| > max (the saturated and overflowed ones among them)
    overflowed: int = 0
    nan_produced: int = 0
    unbounded: int = 0  # finite inputs whose result is inf or NaN
    finite_pairs: int = 0
    sum_err: float = 0.0
    sum_err2: float = 0.0
    sum_x2: float = 0.0
    sum_err2_big: float = 0.0  # squares of errors >= BIG, scaled by 2**(-2 * BIG_SHIFT)
    sum_x2_big: float = 0.0
    sum_err2_tiny: float = 0.0  # squares of tiny float64 errors, scaled by 2**(2 * BIG_SHIFT)
    sum_x2_tiny: float = 0.0
    max_abs_err: float = 0.0
    hist: np.ndarray | None = field(default_factory=lambda: np.zeros(HIST_BINS, dtype=np.int64))

    def add_chunk(self, x: np.ndarray, x_q: np.ndarray, saturated: int = 0,
                  overflowed: int = 0, padding: int = 0, work: np.ndarray | None = None,
                  x_max: float | None = None, shared: dict | None = None,
                  mse_only: bool = False, raw: np.ndarray | None = None,
                  above_max: int = 0) -> None:
        """Add one chunk: float32 arrays of equal shape, ``x`` the input, ``x_q`` the result;
        ``saturated``, ``overflowed``, ``above_max``: the chunk's counts (module docstring).

        ``padding`` trailing zeros were added to the chunk to fill whole blocks: they are
        not counted.  ``work`` is an optional float32 scratch array of the same size;
        ``x_max`` max|x| if the caller knows it (it picks the summation's precision).
        ``shared``: a dict kept across the schemes of one chunk, which caches sum(x**2),
        taken over ``raw`` (the chunk without padding, when given) so that it is the same
        for every scheme whatever its padding.
        ``mse_only``: only what ``mse()`` needs (count, finite pairs, the squared errors),
        computed exactly as the full statistics compute it; chunks holding inf or NaN take
        the full path.
        """
        with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
            if mse_only and self._add_squared_errors(x.reshape(-1), x_q.reshape(-1), padding):
                return
            self._add(x.reshape(-1), x_q.reshape(-1), saturated, overflowed, padding, work,
                      x_max, {} if shared is None else shared,
                      x.reshape(-1) if raw is None else raw.reshape(-1))
            self.above_max += above_max

    def _add_squared_errors(self, x, x_q, padding) -> bool:
        """The ``mse_only`` part of ``_add`` for a chunk whose errors are all finite (False
        otherwise, having added nothing)."""
        err = np.subtract(x_q, x)
        if not math.isfinite(float(np.add.reduce(err))):
            return False
        self.count += x.size - padding
        self.finite_pairs += x.size - padding
        self._add_abs_errors(err)
        return True

    def _add_abs_errors(self, err: np.ndarray) -> None:
        """Max |error| and the sum of squared errors of finite errors (``err`` becomes
        |err|, in place); shared by the full statistics and the ``mse_only`` path, so both
        sum exactly alike."""
        abs_err = np.abs(err, out=err)
        max_err = float(abs_err.max()) if abs_err.size else 0.0
        self.max_abs_err = max(self.max_abs_err, max_err)
        small, big, tiny = _sum_of_squares(abs_err, max_err)
        self.sum_err2 += small
        self.sum_err2_big += big
        self.sum_err2_tiny += tiny

    def mse(self) -> float:
        """Mean squared error over the finite pairs (inf for an unbounded error, NaN with
        no pair); the figure ``results.SchemeStats`` reports."""
        pairs = self.finite_pairs
        if self.unbounded:
            return math.inf
        if not pairs:
            return math.nan
        err2, err_power = scaled_sum(self.sum_err2, self.sum_err2_big, self.sum_err2_tiny)
        if not err_power:
            return err2 / pairs
        rmse = math.ldexp(math.sqrt(err2 / pairs), err_power // 2)
        return rmse * rmse  # inf (0) where only the root fits in a float64

    def _add(self, x, x_q, saturated, overflowed, padding, work, x_max, shared, raw) -> None:
        err = np.subtract(x_q, x, out=work.reshape(-1) if work is not None else None)
        # Pairwise summation in the data's precision (float32: ~1e-7 of the sum of |err|);
        # inf/NaN anywhere make it non-finite, which selects the careful path below.
        total_err = float(np.add.reduce(err))
        self.count += x.size - padding
        self.saturated += saturated
        self.overflowed += overflowed
        zero_results = None
        if math.isfinite(total_err):
            # Every input and result is finite, and a zero input gave a zero result: the
            # zeros are the 0/0 = NaN relative errors (counted from the histogram below),
            # and flushed values are the zero results that are not zero inputs.
            zero_results = int(np.count_nonzero(x_q == 0))
            self.finite_pairs += x.size - padding
            finite_err, finite_x = err, x
        else:  # rare: inf/NaN in input or result; restrict the sums to finite pairs
            finite_in = np.isfinite(x)
            zeros = int(np.count_nonzero(x == 0)) - padding
            nonfinite_in = x.size - int(np.count_nonzero(finite_in))
            self.zeros += zeros
            self.nonfinite_inputs += nonfinite_in
            self.nonzero += x.size - padding - zeros - nonfinite_in
            self.flushed += int(np.count_nonzero((x_q == 0) & (x != 0) & finite_in))
            self.nan_produced += int(np.count_nonzero(np.isnan(x_q) & ~np.isnan(x)))
            self.unbounded += int(np.count_nonzero(finite_in & ~np.isfinite(x_q)))
            keep = np.isfinite(err)
            finite_err, finite_x = err[keep], x[keep]
            self.finite_pairs += finite_err.size - padding
            total_err = float(np.sum(finite_err, dtype=np.float64))
        self.sum_err += total_err
        self._add_abs_errors(finite_err)
        abs_err = finite_err
        if finite_x is x:  # the same for every scheme of this chunk (padding adds zeros)
            if "sum_x2" not in shared:
                # the summation is chosen by the chunk's own max|x|, known or taken here,
                # so that it does not depend on which scheme reaches the chunk first
                largest = x_max if x_max is not None else (float(np.abs(raw).max())
                                                           if raw.size else 0.0)
                shared["sum_x2"] = _sum_of_squares(raw, largest)
            small, big, tiny = shared["sum_x2"]
        else:
            small, big, tiny = _sum_of_squares(finite_x, x_max)
        self.sum_x2 += small
        self.sum_x2_big += big
        self.sum_x2_tiny += tiny
        if finite_err is err:
            rel = np.divide(abs_err, np.abs(x), out=abs_err)
        else:
            rel = np.abs(x_q - x) / np.abs(x)
        keys = _bin_keys(rel, x, x_q)
        if self.hist is None:
            self.hist = np.zeros(HIST_BINS, dtype=np.int64)
        if keys.size < SMALL_CHUNK:  # no 512 KiB bincount for a handful of values
            np.add.at(self.hist, keys, 1)
            nan_keys = int(np.count_nonzero((keys & np.uint32(0x7FFF)) > FINITE_BINS))
        else:
            counts = np.bincount(keys, minlength=HIST_BINS)
            self.hist += counts
            nan_keys = int(counts[NAN_BINS].sum())
        if zero_results is not None:
            zeros = nan_keys  # 0/0: the zeros, the padding's included
            self.flushed += zero_results - zeros
            zeros -= padding
            self.zeros += zeros
            self.nonzero += x.size - padding - zeros

    COUNTS = ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "saturated",
              "above_max", "overflowed", "nan_produced", "unbounded", "finite_pairs")
    SUMMED = COUNTS + ("sum_err", "sum_err2", "sum_x2", "sum_err2_big", "sum_x2_big",
                       "sum_err2_tiny", "sum_x2_tiny")
    PACKED = SUMMED + ("max_abs_err",)

    def pack(self, out: np.ndarray) -> None:
        """Write the scalar statistics into a float64 vector of len(PACKED) (counts stay
        exact below 2**53)."""
        out[:] = [getattr(self, name) for name in self.PACKED]

    @classmethod
    def unpack(cls, row: np.ndarray) -> ErrorAccumulator:
        """The scalars of ``pack``, with an empty histogram."""
        acc = cls(hist=None)
        for name, value in zip(cls.PACKED, row.tolist()):
            setattr(acc, name, int(value) if name in cls.COUNTS else value)
        return acc

    def merge(self, other: ErrorAccumulator, hist: bool = True) -> None:
        """Add another accumulator's statistics; ``hist=False`` to leave the histogram (when
        the histograms are gathered separately)."""
        for name in self.SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        if hist:
            self.hist += other.hist

    def quantile(self, q: float) -> float:
        """The q-quantile of the relative error over the nonzero finite inputs (the lower
        edge of its histogram bin; inf when it falls among results that are inf/NaN)."""
        return histogram_quantile(self.hist, self.nonzero, q)


def histogram_quantile(hist: np.ndarray, population: int, q: float) -> float:
    """The q-quantile of ``population`` values whose histogram (bins: the top 16 bits of the
    float32 value, as ``ErrorAccumulator.hist``) is ``hist``: the lower edge of its bin; inf
    when it falls among the values not in a finite bin (inf, NaN); NaN for no value."""
    if population == 0:
        return math.nan
    rank = max(1, math.ceil(q * population))  # 1-based rank of the order statistic
    cumulative = np.cumsum(hist[:FINITE_BINS])
    if rank > cumulative[-1]:
        return math.inf
    index = int(np.searchsorted(cumulative, rank))
    return float(np.uint32(index << HIST_SHIFT).view(np.float32))


def value_keys(values: np.ndarray) -> np.ndarray:
    """Histogram keys of nonnegative float64 values (``histogram_quantile``'s bins), each
    rounded toward zero to float32 first, so that a value is never put above its bin."""
    return _truncated_keys(np.asarray(values, dtype=np.float64))
