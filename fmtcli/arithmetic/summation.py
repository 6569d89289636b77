"""``fmt sum``: values added with the running sum held in a format, against the exact sum.

The article: BF16's "coarse precision is why accumulation still happens in FP32", and
master weights stay in FP32 "so small updates are not lost" (Micikevicius et al. 2018,
§3.1).  Both are one effect: once a running sum s is large, a term below half the spacing
of the format at s rounds away -- s + x = s -- and the sum stops growing.  In BF16 (8
significant bits) adding 0.01 again and again stalls near 4 (there the spacing is 2^-5 and
half of it exceeds 0.01); FP32 goes on.

The model: the values are first stored in ``format`` (float32 by default, nearest-even);
each addition of a stored value to the running sum is computed exactly and rounded once to
the accumulator's format by ``rounding`` (``ops``).  The exact sum of the stored values
(``math.fsum``: correctly rounded to float64) is the reference, so an accumulator's error
is its own, and ``inputs_rounded`` says how many values storing changed.

Orders (``order``):
- ``sequential``: s = fl(s + x_i), i = 1..n;
- ``pairwise``: a balanced tree: adjacent pairs added, then pairs of those, level by level
  (an odd element is carried up), each sum rounded: error growth ~ log2(n) u instead of n u;
- ``kahan``: compensated summation (Kahan 1965), every operation rounded to the format:
  y = fl(x - c); t = fl(s + y); c = fl(fl(t - s) - y); s = t;
- ``blocked:B``: sequential sums of blocks of B values, then a sequential sum of the block
  sums (Blanchard, Higham & Mary 2020, "A class of fast and accurate summation algorithms":
  error ~ (B + n/B) u): the shape of a GEMM's tiles.

``stalled_at``: the count of values added after which the running sum never changed again
although nonzero values were still added (sequential and kahan: per value; blocked: per
block, counted in values; pairwise has no running sum: None).  With stochastic rounding
nothing stalls for sure -- every addition moves the sum with probability |x| / spacing --
so ``stalled_at`` is None there.  ``absorbed``: how many nonzero values changed nothing
when added (sequential and kahan: the lost additions).

How fast: a sequential sum whose values the accumulator holds exactly (float16, bfloat16,
float32, float64; nearest-even) runs as numpy's ``add.accumulate`` in that dtype, one
rounding per step (float16 and bfloat16 add through float32: 24 >= 2p + 2 bits, so no
double rounding -- Figueroa 1995); pairwise and blocked sums are vectorised across pairs
and blocks (``rounding.round_to_format`` of float64 sums, made exact by TwoSum where a
float64 sum was inexact); other cases are a Python loop with float arithmetic exact to the
bit (``ops.float_rounder``), ~1 µs a value (Kahan ~4 µs), up to MAX_LOOP (MAX_KAHAN)
values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..choices import RoundingMode
from ..errors import UsageError
from ..formats import FormatSpec
from ..rounding import round_to_format
from .ops import (
    Arithmetic,
    arithmetic_spec,
    float_rounder,
    format_label,
    is_float64,
    round_rational,
)
from .sum_inputs import DEFAULT_COUNT, MAX_VALUES, check_count, parse_order, short_number

DEFAULT_ACCUMULATORS = ("bfloat16", "float16", "float32", "float64")
MAX_LOOP = 2_000_000  # values a Python loop adds (~1 µs each per accumulator)
MAX_KAHAN = 500_000  # values of a Kahan sum (four roundings a value: ~4 µs)


@dataclass(frozen=True)
class AccumulatorResult:
    """One accumulator: its ``format``, the final ``sum``, the ``exact`` sum (float64,
    correctly rounded), ``abs_error`` = sum - exact and ``rel_error`` = |sum - exact| /
    |exact| (both from the exact difference), ``stalled_at`` (count, or None),
    ``stalled_value`` (the running sum there) and ``next_value`` (the first value lost),
    ``absorbed`` (nonzero values that changed nothing; None where not tracked), and
    ``method`` (how it was computed)."""

    format: str
    precision_bits: int
    sum: float
    exact: float
    abs_error: float
    rel_error: float
    stalled_at: int | None
    stalled_value: float | None
    next_value: float | None
    absorbed: int | None
    method: str

    def to_dict(self) -> dict:
        return {"format": self.format, "precision_bits": self.precision_bits,
                "sum": self.sum, "exact": self.exact, "abs_error": self.abs_error,
                "rel_error": self.rel_error, "stalled_at": self.stalled_at,
                "stalled_value": self.stalled_value, "next_value": self.next_value,
                "absorbed": self.absorbed, "method": self.method}


@dataclass(frozen=True)
class WeightUpdate:
    """The weight-update view: ``weight`` (initial), ``update`` (lr * grad, stored in the
    input format) subtracted ``steps`` times; ``exact`` = weight - steps * update."""

    weight: float
    update: float
    steps: int
    exact: float

    def to_dict(self) -> dict:
        return {"weight": self.weight, "update": self.update, "steps": self.steps,
                "exact": self.exact}


@dataclass(frozen=True)
class SumResult:
    """``fmt sum``: what was summed (``source``, ``count`` values stored in ``format``,
    ``inputs_rounded`` of them changed by storing), in which ``order`` (``block`` for
    blocked) and ``rounding``, the ``exact`` sum, and one ``AccumulatorResult`` per
    accumulator.  ``update`` is set for the weight-update view (then each accumulator is
    the weight's format, ``absorbed`` the updates lost and ``stalled_at`` counts updates)."""

    source: str
    count: int
    format: str
    inputs_rounded: int
    order: str
    block: int | None
    rounding: str
    exact: float
    accumulators: tuple[AccumulatorResult, ...]
    update: WeightUpdate | None = None

    def to_dict(self) -> dict:
        return {"source": self.source, "count": self.count, "format": self.format,
                "inputs_rounded": self.inputs_rounded, "order": self.order,
                "block": self.block, "rounding": self.rounding, "exact": self.exact,
                "accumulators": [a.to_dict() for a in self.accumulators],
                "update": None if self.update is None else self.update.to_dict()}


# -- the accumulation ------------------------------------------------------------------

_NATIVE = {"float16": np.float16, "float32": np.float32}


def _native_dtype(spec: FormatSpec):
    """numpy's or ml_dtypes' type holding exactly this format, where it has one."""
    if is_float64(spec):
        return np.float64
    if spec.name in _NATIVE:
        return _NATIVE[spec.name]
    if spec.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return None


class _Adder:
    """fl(a + b) in one format and mode, exact to the bit, on scalars (``add``, a closure
    with the format's figures bound) and on arrays (``add_arrays``)."""

    def __init__(self, spec: FormatSpec, rounding: RoundingMode, seed: int) -> None:
        self.spec = spec
        self.rounding = rounding
        self.arithmetic = Arithmetic(spec, rounding, seed=seed)
        self.rng = self.arithmetic.rng
        self.plain64 = is_float64(spec) and rounding is RoundingMode.NEAREST_EVEN
        self.add = self._scalar_adder()

    def _scalar_adder(self):
        rounded = float_rounder(self.spec, self.rounding, rng=self.rng)
        spec, rounding, rng, special = self.spec, self.rounding, self.rng, self.arithmetic.add
        isfinite = math.isfinite
        plain64 = self.plain64

        def add(a: float, b: float) -> float:
            t = a + b
            if t != 0 and isfinite(t):
                if plain64:
                    return t  # float64's own addition is the correctly rounded sum
                bb = t - a
                if (a - (t - bb)) + (b - bb) == 0:  # TwoSum: t is the exact sum
                    return rounded(t)
                return round_rational(Fraction(a) + Fraction(b), spec, rounding, rng=rng)
            return special(a, b)[1]  # zeros, inf, NaN, beyond float64

        return add

    def add_arrays(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise fl(a + b): float64 sums rounded by the engine; where TwoSum says a
        float64 sum was inexact, or it is zero or not finite, the scalar path decides."""
        with np.errstate(over="ignore", invalid="ignore"):
            t = a + b
            bb = t - a
            err = (a - (t - bb)) + (b - bb)
            out = t.copy() if self.plain64 else \
                round_to_format(t, self.spec, self.rounding, rng=self.rng)
        suspect = ~np.isfinite(t) | (t == 0)
        if not self.plain64:
            suspect |= err != 0
        fix = np.flatnonzero(suspect)
        for i in fix.tolist():
            out[i] = self.add(float(a[i]), float(b[i]))
        return out


def _track(running: np.ndarray, values: np.ndarray) -> tuple[int | None, int]:
    """From the running sums after each value: (stalled_at, absorbed)."""
    previous = np.concatenate([[0.0], running[:-1].astype(np.float64)])
    current = running.astype(np.float64)
    same = (current == previous) | (np.isnan(current) & np.isnan(previous))
    absorbed = int(np.count_nonzero(same & (values != 0)))
    changed = np.flatnonzero(~same)
    last = int(changed[-1]) + 1 if changed.size else 0
    return _stall(last, values, current[-1]), absorbed


def _stall(last: int, values: np.ndarray, final: float) -> int | None:
    """The count after which the sum never changed, if nonzero values came after it and
    the sum is a finite number."""
    if last < values.size and math.isfinite(final) and np.any(values[last:] != 0):
        return last
    return None


def _sequential(values: np.ndarray, adder: _Adder, native) -> tuple[float, int | None, int, str]:
    """(sum, stalled_at, absorbed, method) of s = fl(s + x_i)."""
    if native is not None and adder.rounding is RoundingMode.NEAREST_EVEN:
        typed = values.astype(native)
        if np.array_equal(typed.astype(np.float64), values):
            running = np.add.accumulate(typed, dtype=native)
            stalled, absorbed = _track(running, values)
            return float(running[-1]), stalled, absorbed, \
                f"numpy add.accumulate in {np.dtype(native).name}"
    _check_loop(values.size, "sequential")
    s = 0.0
    last = absorbed = 0
    add = adder.add
    for i, x in enumerate(values.tolist(), 1):
        new = add(s, x)
        if new == s or (new != new and s != s):
            absorbed += x != 0
        else:
            last = i
        s = new
    return s, _stall(last, values, s), absorbed, "exact loop (ops.float_rounder)"


def _kahan(values: np.ndarray, adder: _Adder, native) -> tuple[float, int | None, int, str]:
    """Kahan's compensated sum with every operation rounded to the format."""
    if values.size > MAX_KAHAN:
        raise UsageError(f"{values.size:,} values: a kahan sum runs a Python loop, at most "
                         f"{MAX_KAHAN:,} values")
    if native is not None and adder.rounding is RoundingMode.NEAREST_EVEN and \
            np.array_equal(values.astype(native).astype(np.float64), values):
        xs = values.astype(native).tolist() if native is np.float64 else \
            list(values.astype(native))
        s = c = 0.0 if native is np.float64 else native(0)
        method = f"numpy {np.dtype(native).name} scalars"

        def step(s, c, x):
            y = x - c
            t = s + y
            return t, (t - s) - y
    else:
        xs = values.tolist()
        s = c = 0.0
        add = adder.add
        method = "exact loop (ops.float_rounder)"

        def step(s, c, x):
            y = add(x, -c)
            t = add(s, y)
            return t, add(add(t, -s), -y)
    last = absorbed = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for i, x in enumerate(xs, 1):
            t, c = step(s, c, x)
            if t == s or (t != t and s != s):
                absorbed += x != 0
            else:
                last = i
            s = t
    return float(s), _stall(last, values, float(s)), absorbed, method


def _pairwise(values: np.ndarray, adder: _Adder) -> tuple[float, None, None, str]:
    level = values
    if level.size == 1:
        return adder.add(0.0, float(level[0])), None, None, "pairwise levels, vectorised"
    while level.size > 1:
        half = level.size // 2
        summed = adder.add_arrays(level[0:2 * half:2], level[1:2 * half:2])
        level = np.concatenate([summed, level[2 * half:]])
    return float(level[0]), None, None, "pairwise levels, vectorised"


def _blocked(values: np.ndarray, adder: _Adder, block: int
             ) -> tuple[float, int | None, None, str]:
    block = min(block, values.size)
    blocks = -(-values.size // block)
    grid = np.zeros(blocks * block)
    grid[:values.size] = values
    grid = grid.reshape(blocks, block)
    partial = np.zeros(blocks)
    for j in range(block):  # the blocks' sequential sums, all blocks at once
        partial = adder.add_arrays(partial, grid[:, j])
    _check_loop(blocks, "the block sums of blocked")
    s = 0.0
    last = 0
    for k, x in enumerate(partial.tolist(), 1):
        new = adder.add(s, x)
        if not (new == s or (new != new and s != s)):
            last = k
        s = new
    stalled = None
    if last < blocks and math.isfinite(s) and np.any(values[last * block:] != 0):
        stalled = last * block
    return s, stalled, None, f"blocks of {block:,} vectorised, then their sums in order"


def _check_loop(n: int, what: str) -> None:
    if n > MAX_LOOP:
        raise UsageError(f"{n:,} values: a {what} sum in this format and rounding runs a "
                         f"Python loop, at most {MAX_LOOP:,} values (a sequential sum with "
                         "nearest-even of values the accumulator holds -- float16, bfloat16, "
                         "float32, float64 -- runs vectorised: e.g. format='bf16' for a "
                         "bfloat16 accumulator)")


def _fsum(values: np.ndarray, first: float | None = None, negate: bool = False) -> float:
    """math.fsum of ``first`` and the values (negated with ``negate``): the exact sum,
    correctly rounded to float64; the values go to Python a chunk at a time (no list of
    ten million floats)."""
    def chunks():
        if first is not None:
            yield first
        for start in range(0, values.size, 1 << 16):
            chunk = values[start:start + (1 << 16)]
            yield from (-chunk if negate else chunk).tolist()

    return math.fsum(chunks())


def _relative(values: np.ndarray, total: float, exact: float) -> tuple[float, float]:
    """(total - exact, |total - exact| / |exact|) from the exact difference (fsum)."""
    if not math.isfinite(total):
        return (total - exact if not math.isnan(total) else math.nan), \
            (math.inf if not math.isnan(total) else math.nan)
    difference = _fsum(values, total, negate=True)
    if difference == 0:
        return 0.0, 0.0
    if exact == 0:
        return difference, math.inf
    return difference, abs(difference) / abs(exact)


def sum_values(values, accumulators=DEFAULT_ACCUMULATORS, format: str | FormatSpec = "float32",
               order: str = "sequential", rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
               seed: int = 0, source: str = "the given values") -> SumResult:
    """Add ``values`` with the running sum held in each of ``accumulators`` (names or
    specs; float64 is e11m52), after storing them in ``format``; ``order`` one of
    sequential, pairwise, kahan, blocked:B; every addition rounded once by ``rounding``
    (``seed``: stochastic rounding).  See the module docstring for the model."""
    try:
        rounding = RoundingMode(rounding)
    except ValueError as error:
        raise UsageError(str(error)) from None
    name, block = parse_order(order)
    given = np.asarray(values, dtype=np.float64).reshape(-1)
    if given.size == 0:
        raise UsageError("no values to sum")
    if given.size > MAX_VALUES:
        raise UsageError(f"{given.size:,} values: at most {MAX_VALUES:,}")
    store = arithmetic_spec(format)[0] if isinstance(format, str) else format
    stored = _stored(given, store)
    specs = [arithmetic_spec(a)[0] if isinstance(a, str) else a for a in accumulators]
    if not specs:
        raise UsageError("no accumulators given", "e.g. accumulators=['bf16', 'fp32']")
    exact = _fsum(stored)
    results = [_accumulate(stored, spec, name, block, rounding, seed, exact) for spec in specs]
    return SumResult(source=source, count=int(stored.size), format=format_label(store),
                     inputs_rounded=int(np.count_nonzero(stored != given)),
                     order=name if block is None else f"blocked:{block}", block=block,
                     rounding=rounding.value, exact=exact, accumulators=tuple(results))


def _stored(given: np.ndarray, spec: FormatSpec) -> np.ndarray:
    if not np.all(np.isfinite(given)):
        index = int(np.argmax(~np.isfinite(given)))
        raise UsageError(f"the values must be finite: value {index:,} is {given[index]}")
    if is_float64(spec):
        return given.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        stored = round_to_format(given, spec).astype(np.float64)
    bad = ~np.isfinite(stored)
    if bad.any():
        index = int(np.argmax(bad))
        raise UsageError(f"value {index:,} = {given[index]:g} is beyond "
                         f"{format_label(spec)}'s range (max {spec.max:g}): store the values "
                         "in a wider format")
    return stored


def _accumulate(stored: np.ndarray, spec: FormatSpec, order: str, block: int | None,
                rounding: RoundingMode, seed: int, exact: float) -> AccumulatorResult:
    if not spec.signed and np.any(stored < 0):
        raise UsageError(f"{spec.name} has no negative numbers: it cannot hold these sums")
    adder = _Adder(spec, rounding, seed)
    native = _native_dtype(spec)
    if order == "sequential":
        total, stalled, absorbed, method = _sequential(stored, adder, native)
    elif order == "kahan":
        total, stalled, absorbed, method = _kahan(stored, adder, native)
    elif order == "pairwise":
        total, stalled, absorbed, method = _pairwise(stored, adder)
    else:
        total, stalled, absorbed, method = _blocked(stored, adder, block)
    if rounding is RoundingMode.STOCHASTIC:
        stalled = None  # each later addition still moves the sum with some probability
    error, rel = _relative(stored, total, exact)
    stalled_value = next_value = None
    if stalled is not None:
        next_value = float(stored[stalled])
        stalled_value = total  # the sum never changed after the stall
    return AccumulatorResult(
        format=format_label(spec), precision_bits=spec.mantissa_bits + 1, sum=total,
        exact=exact, abs_error=error, rel_error=rel, stalled_at=stalled,
        stalled_value=stalled_value, next_value=next_value, absorbed=absorbed,
        method=method)


def weight_update(update: float, steps: int = DEFAULT_COUNT, weight: float = 1.0,
                  accumulators=("bfloat16", "float32"), format: str | FormatSpec = "float32",
                  rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                  seed: int = 0) -> SumResult:
    """The weight update w <- w - update applied ``steps`` times (``update`` = lr * grad,
    stored in ``format`` as computed in FP32) to a weight held in each accumulator format:
    bf16 without a master copy vs an fp32 master copy (Micikevicius et al. 2018, §3.1).
    Each accumulator's ``absorbed`` is the updates lost (w - update rounded back to w) and
    ``stalled_at`` the updates applied before the weight stopped moving."""
    check_count(steps, "steps")
    if not (math.isfinite(update) and math.isfinite(weight)):
        raise UsageError("the update and the weight must be finite")
    store = arithmetic_spec(format)[0] if isinstance(format, str) else format
    u = float(_stored(np.array([update]), store)[0])
    w = float(_stored(np.array([weight]), store)[0])
    values = np.full(steps + 1, -u)
    values[0] = w
    result = sum_values(values, accumulators, store, "sequential", rounding, seed,
                        source=f"w = {short_number(w)}, w -= {short_number(u)}, {steps:,} times")
    exact = float(Fraction(w) - steps * Fraction(u))
    rows = []
    for a in result.accumulators:
        stalled = None if a.stalled_at is None else a.stalled_at - 1
        lost = a.absorbed
        rows.append(AccumulatorResult(
            format=a.format, precision_bits=a.precision_bits, sum=a.sum, exact=a.exact,
            abs_error=a.abs_error, rel_error=a.rel_error, stalled_at=stalled,
            stalled_value=a.stalled_value, next_value=a.next_value, absorbed=lost,
            method=a.method))
    return SumResult(source=result.source, count=steps, format=result.format,
                     inputs_rounded=result.inputs_rounded, order="sequential", block=None,
                     rounding=result.rounding, exact=result.exact,
                     accumulators=tuple(rows),
                     update=WeightUpdate(weight=w, update=u, steps=steps, exact=exact))
