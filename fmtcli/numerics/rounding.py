"""Round numpy arrays to any FormatSpec, exactly, with a rounding mode and an overflow policy.

The engine works on the input's own float type (float16 and bfloat16 are widened to float32
first, exactly; float64 stays float64), so a float64 input is rounded once, straight to the
target: 68.00000357 becomes 72 in float8_e4m3fn, as in ml_dtypes 0.7.0; ml_dtypes before
0.7.0 casts float64 through float32 first, rounding twice, and gives 64.

How: for each x the unbiased exponent e comes from ``frexp``; the spacing of the target at x
is ``ulp = 2**(max(e, min_exponent) - mantissa_bits)`` (the max() is the subnormal range);
``x / ulp`` is exact (a power-of-two scaling) and is rounded to an integer by the chosen
mode; multiplying back by ``ulp`` is exact again.  That gives the rounding on a grid with
unbounded exponent; ``apply_range`` then handles values beyond ``max``, NaN, and the quirks
of formats without -0, without zero, or without sign.

Special values, by format kind:
- overflow policy ``ieee``: a finite value that rounds past ``max`` becomes inf where the
  format has inf, else NaN (what ml_dtypes and eager torch FP8 casts do).  Directed modes
  follow IEEE 754: toward zero never overflows to inf, ``up`` only for positive values,
  ``down`` only for negative ones.
- overflow policy ``saturate``: clip to +-max (torchao's ``to_fp8_saturated``); inf inputs
  become +-max too.
- formats with neither inf nor NaN (FP6, FP4) always saturate: there is nothing else to be.
- NaN input stays NaN.  In a format without a NaN code (FP6, FP4) the value returned is
  still NaN, to flag that the format cannot hold it (ml_dtypes silently stores a zero there;
  ``encode`` gives that code too, as the only one the hardware could write).
- tapered formats (HiFloat8, ``numerics.tapered``): each binade is rounded at its own
  spacing, ``2**(e - m(e))``; the binades of 0 mantissa bits round as E8M0's below.
- formats with no mantissa bits (E8M0, custom ``e7m0``): "nearest-even" has no even
  neighbour to prefer (every grid point is a power of two, each with mantissa 0), so a tie
  (1.5 * 2**k) goes up in magnitude, to 2**(k+1), as ml_dtypes (from 0.5.3) and torch do;
  ml_dtypes 0.5.0 sends it to the even code, 2**k for odd k; IEEE 754
  leaves this case undefined.
- unsigned formats (E8M0): negative inputs are NaN; formats without zero (E8M0): 0 is NaN
  and positive values below the smallest become the smallest (as ml_dtypes).

The values' bit patterns (``encode``, ``decode``, ``all_values``) are ``numerics.codes``'.
"""

from __future__ import annotations

import functools

import numpy as np

from fmtcli.base.choices import OverflowPolicy, RoundingMode
from fmtcli.base.errors import UsageError

# importable from here too (fmtcli exports them from this module)
from fmtcli.numerics.codes import all_values as all_values
from fmtcli.numerics.codes import decode as decode
from fmtcli.numerics.codes import encode as encode
from fmtcli.numerics.formats import FormatSpec, Specials


def working_array(x) -> np.ndarray:
    """Return ``x`` as float32 or float64, widening narrower floats exactly.

    float64 stays float64 and float32 stays float32; float16, bfloat16 and the FP8/6/4
    types of ml_dtypes become float32; integers become float64.
    """
    x = np.asarray(x)
    if x.dtype == np.float64 or x.dtype == np.float32:
        return x
    if x.dtype.kind in "iub":
        return x.astype(np.float64)
    if x.dtype.kind == "f" or (x.dtype.kind == "V" and _is_ml_float(x.dtype)):
        return x.astype(np.float32)
    raise UsageError(f"cannot round an array of dtype {x.dtype} (real numbers only)")


def _is_ml_float(dtype) -> bool:
    import ml_dtypes

    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


def round_unbounded(x: np.ndarray, spec: FormatSpec, rounding: RoundingMode,
                    rng: np.random.Generator | None = None) -> np.ndarray:
    """Round ``x`` (float32/float64) onto the format's grid, ignoring the top of its range.

    The result may exceed ``spec.max``; ``apply_range`` deals with that.  Exact: every
    step but the rounding itself is a power-of-two scaling.
    """
    m = spec.mantissa_bits
    _, exponent = np.frexp(x)  # |x| in [2**(exponent-1), 2**exponent)
    if spec.taper is not None:  # each binade's own spacing (numerics.tapered)
        exponent = spec.taper.ulp_exponents(exponent - 1)
    else:
        exponent -= 1 + m
        np.maximum(exponent, spec.min_exponent - m, out=exponent)  # ulp exponent
    y = np.ldexp(x, -exponent)  # exact: |y| < 2**(m+1)
    if rounding is RoundingMode.NEAREST_EVEN:
        np.rint(y, out=y)
    elif rounding is RoundingMode.TOWARD_ZERO:
        np.trunc(y, out=y)
    elif rounding is RoundingMode.UP:
        np.ceil(y, out=y)
    elif rounding is RoundingMode.DOWN:
        np.floor(y, out=y)
    elif rounding is RoundingMode.NEAREST_AWAY:
        t = np.trunc(y)
        half_or_more = np.abs(y - t) >= 0.5
        y = t + np.copysign(half_or_more, y).astype(y.dtype)
    elif rounding is RoundingMode.STOCHASTIC:
        if rng is None:
            raise UsageError("stochastic rounding needs a seeded generator")
        floor = np.floor(y)
        frac = y - floor  # exact
        y = np.copysign(floor + (rng.random(y.shape) < frac).astype(y.dtype), y)  # keeps -0
    else:  # pragma: no cover - enum is closed
        raise UsageError(f"unknown rounding mode {rounding!r}")
    return np.ldexp(y, exponent)


_M64 = (1 << 64) - 1
_F32_MAX = float(np.finfo(np.float32).max)


def _mix64(z: int) -> int:
    """splitmix64's finaliser on a Python int (a bijection of 64-bit words, full avalanche)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray, a: int, b: int) -> np.ndarray:
    """A murmur3/splitmix-style finaliser over a uint64 array (multipliers a, b, both odd),
    in place; uint64 array arithmetic wraps modulo 2**64 without a warning."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(a)
    z ^= z >> np.uint64(27)
    z *= np.uint64(b)
    z ^= z >> np.uint64(31)
    return z


class PositionalUniform:
    """Uniform [0, 1) numbers that depend only on (seed, element index): a keyed
    counter-based generator, so stochastic rounding of a tensor gives the same result however
    it is cut into chunks or spread over workers.

    The seed (any integer 0 .. 2**64 - 1) gives three 64-bit keys (k1, k2, and an odd
    multiplier m): the first outputs of splitmix64 seeded with it.  Each index i then goes
    through two rounds, ``z = mix(i * golden ^ k1)``, ``z = mix((z ^ k2) * m)``.  The keys
    enter by XOR and by multiplication, not by addition, so one seed's stream is not another's
    shifted (as it was when the seed was added to the index), and neighbouring seeds give
    unrelated streams.
    The top 53 bits of z make the float64.

    ``random(shape)`` returns the numbers of ``indices`` (uint64, that many elements).
    """

    GOLDEN = 0x9E3779B97F4A7C15

    def __init__(self, seed: int, indices: np.ndarray) -> None:
        seed = int(seed)
        if not 0 <= seed <= _M64:
            raise UsageError(f"a seed must be in 0 .. 2**64 - 1, got {seed}")
        # the first three outputs of splitmix64 seeded with ``seed``
        k1, k2, m = (_mix64(seed + n * self.GOLDEN) for n in (1, 2, 3))
        self.keys = (k1, k2, m | 1)
        self.indices = indices

    def random(self, shape) -> np.ndarray:
        k1, k2, m = self.keys
        z = np.multiply(self.indices.reshape(-1), np.uint64(self.GOLDEN), dtype=np.uint64)
        z ^= np.uint64(k1)
        _mix64_array(z, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
        z ^= np.uint64(k2)
        z *= np.uint64(m)
        _mix64_array(z, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)  # murmur3's fmix64 constants
        return (z >> np.uint64(11)).astype(np.float64).reshape(shape) * 2.0 ** -53


def magic_rounding_applies(spec: FormatSpec) -> bool:
    """Whether ``round_float32_nearest_even`` is exact for this format (see there)."""
    m = spec.mantissa_bits
    return (spec.taper is None and spec.signed and spec.subnormals and m <= 22
            and spec.min_exponent >= -126 and spec.min_exponent - m >= -149
            and spec.max_exponent <= 103 + m)


def round_float32_nearest_even(x: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """Fast unbounded nearest-even rounding of a float32 array (a few integer/float passes).

    For each x, ``M = max(2**floor(log2|x|), smallest_normal) * 2**(23 - m)``; float32
    addition rounds ``|x| + M`` to a multiple of ``ulp(M) = 2**(e - m)``, the target's
    spacing at x, with ties to even, and ``(|x| + M) - M`` is then exact; x's sign goes back
    on last.  The exponent is
    clamped at 2**(max_exponent + 1), where everything is beyond max anyway.  Valid when
    ``magic_rounding_applies(spec)``: float16, FP8, FP6, FP4 (not bfloat16/tf32, whose
    range would overflow M).  Bit-identical to ``round_unbounded`` below max.
    """
    m = spec.mantissa_bits
    magnitude = np.abs(x)
    magic = np.bitwise_and(magnitude.view(np.uint32), np.uint32(0x7F800000))
    low = np.float32(spec.smallest_normal).view(np.uint32)
    high = np.float32(2.0 ** (spec.max_exponent + 1)).view(np.uint32)
    np.clip(magic, low, high, out=magic)
    magic += np.uint32((23 - m) << 23)
    m_float = magic.view(np.float32)
    magnitude += m_float
    magnitude -= m_float
    sign = np.bitwise_and(x.view(np.uint32), np.uint32(0x80000000), out=magic)
    magnitude.view(np.uint32)[...] |= sign  # x's sign (a tiny negative x rounds to -0)
    return magnitude


@functools.lru_cache(maxsize=256)
def beyond_threshold(spec: FormatSpec, rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                     dtype=np.float32) -> float:
    """The smallest magnitude of ``dtype`` (float32 or float64) whose rounding by ``rounding``
    may lie past max: every value of smaller magnitude rounds to at most max, so the range
    step (``apply_range``) can be skipped for it; from it on values saturate or overflow.

    Nearest-even: just above the midpoint between max and the next grid point (or the
    midpoint itself where its tie goes up).  ``stochastic``: the first value above max (any
    of them may round up).  Other modes: found the same way as nearest-even, by bisection
    over the magnitudes, looking at both signs (``up`` rounds +449 past 448 in E4M3, ``down``
    -449).  inf where no finite value of ``dtype`` rounds past max.
    """
    rounding = RoundingMode(rounding)
    dtype = np.dtype(dtype)
    carrier = np.uint32 if dtype == np.float32 else np.uint64
    top = float(np.finfo(dtype).max)
    if spec.max >= top:
        return float("inf")
    if rounding is RoundingMode.STOCHASTIC:
        return float(np.nextafter(dtype.type(spec.max), dtype.type(np.inf)))

    def past(bits: int) -> bool:
        v = np.array([bits], carrier).view(dtype)
        v = np.concatenate([v, -v])
        with np.errstate(invalid="ignore", over="ignore"):
            return bool(np.any(np.abs(round_unbounded(v, spec, rounding)) > spec.max))

    lo = int(np.array([spec.max], dtype).view(carrier)[0])  # max itself never rounds past
    hi = int(np.array([top], dtype).view(carrier)[0])
    if not past(hi):
        return float("inf")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if past(mid):
            hi = mid
        else:
            lo = mid
    return float(np.array([hi], carrier).view(dtype)[0])


def _overflow_value(spec: FormatSpec, rounding: RoundingMode, negative: bool) -> float:
    """What a finite value rounding past max becomes under the ``ieee`` policy."""
    if rounding is RoundingMode.TOWARD_ZERO:
        return spec.max
    if rounding is RoundingMode.UP and negative:
        return spec.max
    if rounding is RoundingMode.DOWN and not negative:
        return spec.max
    return np.inf if spec.has_inf else np.nan


def apply_range(x: np.ndarray, r: np.ndarray, spec: FormatSpec, rounding: RoundingMode,
                overflow: OverflowPolicy, counts: dict | None = None) -> np.ndarray:
    """Finish a rounding: overflow, inf/NaN inputs, -0, zero and sign rules of the format.

    ``x`` is the input, ``r`` its unbounded rounding (modified in place and returned).  When
    ``counts`` is a dict, ``counts["beyond"]`` receives how many values rounded past max and
    ``counts["overflowed"]`` how many of those became inf or NaN (the rest saturated),
    ``counts["above"]`` how many inputs lie beyond max at all (|x| > max, inf included: what a
    clip to +-max touches, including those that round to max anyway); with
    ``counts["where"]`` set true, ``counts["saturated_at"]`` receives the flat indices of the
    saturated ones (for per-block counts).
    """
    fmax = spec.max
    saturate = overflow is OverflowPolicy.SATURATE or not (spec.has_inf or spec.has_nan)
    big = np.abs(r) > fmax  # NaN compares False
    beyond = int(np.count_nonzero(big))
    if beyond:
        infinite_input = np.isinf(x)
        if saturate:
            np.clip(r, -fmax, fmax, out=r)
        else:
            positive = big & (r > 0)
            negative = big & (r < 0)
            r[positive] = _overflow_value(spec, rounding, negative=False)
            r[negative] = -_overflow_value(spec, rounding, negative=True)
            if infinite_input.any():  # inf is exact, not an overflow
                xi = x[infinite_input]
                r[infinite_input] = xi if spec.has_inf else np.copysign(np.nan, xi)
    if spec.specials in (Specials.FNUZ, Specials.INF_NUZ):
        r += 0.0  # -0 becomes +0; no negative zero exists
    if not spec.signed:
        r[(x < 0) | np.signbit(r) & (r == 0)] = np.nan
    if not spec.has_zero:  # below the smallest value there is only the smallest value
        tiny = (r < spec.smallest_normal) & (x != 0)
        if tiny.any():
            r[tiny & (r >= 0)] = spec.smallest_normal
        r[x == 0] = np.nan
    if counts is not None:
        # beyond max: values that rounded past max (not negatives of an unsigned format,
        # not infinities that stay infinite); overflowed: those of them now inf or NaN
        counts["beyond"] = counts["overflowed"] = 0
        counts["above"] = count_above_max(x, spec)
        where = counts.get("where")
        if where:
            counts["saturated_at"] = np.zeros(0, np.intp)
        if beyond:
            counted = big & ~(np.isinf(x) & ~np.isfinite(r))
            if not spec.signed:
                counted &= ~(x < 0)
            counts["beyond"] = int(np.count_nonzero(counted))
            counts["overflowed"] = int(np.count_nonzero(counted & ~np.isfinite(r)))
            if where:
                counts["saturated_at"] = np.flatnonzero(counted & np.isfinite(r))
    return r


def count_above_max(x: np.ndarray, spec: FormatSpec) -> int:
    """How many of ``x`` (values about to be rounded: ``x * scale``) lie beyond the format's
    max, |x| > max (inf included, NaN not; in an unsigned format only x > max): the values
    that a clip to +-max before the cast changes, whether or not their rounding would pass
    max (in E4M3, 448 < |x| < 464 rounds to 448 as it stands)."""
    fmax = spec.max
    if not spec.signed:
        return int(np.count_nonzero(x > fmax))
    return int(np.count_nonzero(np.abs(x) > fmax))


def fits_float32(spec: FormatSpec) -> bool:
    """Whether every finite value of ``spec`` is a float32 value's magnitude or below:
    False for formats reaching past float32's max (``e8m3fn``: 2**128 * 1.875; ``e9m2``),
    whose roundings of float32 data must be held in float64 (float32 would write inf)."""
    return spec.max <= _F32_MAX


def round_to_format(x, spec: FormatSpec, rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                    overflow: OverflowPolicy | str = OverflowPolicy.IEEE,
                    seed: int | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
    """Round every element of ``x`` to the nearest value of ``spec`` (by ``rounding``).

    Returns float32 for float32/float16/bfloat16 input and float64 for float64 input, or
    for any input when the format's max lies beyond float32's (``fits_float32``); the
    values are exactly those the format holds (see the module docstring for inf, NaN and
    formats without them).  Stochastic rounding draws from ``rng`` or a generator seeded
    with ``seed`` (0 when neither is given), so runs are reproducible.
    """
    try:
        rounding = RoundingMode(rounding)
        overflow = OverflowPolicy(overflow)
    except ValueError as error:
        raise UsageError(str(error)) from None
    x = working_array(x)
    if x.dtype == np.float32 and not fits_float32(spec):
        with np.errstate(invalid="ignore"):  # a signalling NaN widened raises 'invalid'
            x = x.astype(np.float64)  # the format's top values are no float32 (e8m3fn: 2**128)
    shape = x.shape
    x = x.reshape(-1)
    if rounding is RoundingMode.STOCHASTIC and rng is None:
        rng = np.random.default_rng(0 if seed is None else seed)
    with np.errstate(invalid="ignore", over="ignore"):
        if (rounding is RoundingMode.NEAREST_EVEN and x.dtype == np.float32
                and magic_rounding_applies(spec)):
            r = round_float32_nearest_even(x, spec)
        else:
            r = round_unbounded(x, spec, rounding, rng)
        return apply_range(x, r, spec, rounding, overflow).reshape(shape)
