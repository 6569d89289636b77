"""``fmt sum``: values added with the running sum held in a format, against the exact sum.

The article: BF16's "coarse precision is why accumulation still happens in FP32", and
master weights stay in FP32 "so small updates are not lost" (Micikevicius et al. 2018,
§3.1).  Both are one effect: once a running sum s is large, a term below half the spacing
of the format at s rounds away -- s + x = s -- and the sum stops growing.  In BF16 (8
significant bits) adding 0.01 again and again stalls near 4 (there the spacing is 2^-5 and
half of it exceeds 0.01); FP32 goes on.

The model: the values are first stored in ``format`` (float32 by default, nearest-even);
each addition of a stored value to the running sum is computed exactly and rounded once to
the accumulator's format by ``rounding`` (``pairs``: TwoSum, then one rounding of the
exact pair).  The exact sum of the stored values (``exactsum``: an integer count of
2^-1074, so a sum beyond float64's range -- 1e308 + 1e308 -- is still exact; shown
correctly rounded to float64, inf beyond it) is the reference, so an accumulator's error
is its own (from the exact difference), and ``inputs_rounded`` says how many values
storing changed.  Stochastic rounding draws one uniform per addition from a generator
seeded with ``seed`` (one generator per accumulator), in the order the additions are made
(pairwise: level by level; blocked: the blocks' j-th additions together, then the block
sums; kahan: four a value, in the order of the algorithm).

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
and blocks in every mode (``pairs.add_arrays``); other cases are a Python loop with float
arithmetic exact to the bit (``pairs.pair_adder``), ~1 µs a value (Kahan ~4 µs), up to
MAX_LOOP (MAX_KAHAN) values.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fmtcli.arithmetic import exactsum
from fmtcli.arithmetic.ops import arithmetic_spec, format_label, is_float64
from fmtcli.arithmetic.pairs import add_arrays, pair_adder
from fmtcli.arithmetic.runs import running_sum
from fmtcli.arithmetic.sum_inputs import (
    DEFAULT_COUNT,
    MAX_VALUES,
    check_count,
    parse_order,
    short_number,
)
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format

DEFAULT_ACCUMULATORS = ("bfloat16", "float16", "float32", "float64")
MAX_LOOP = 2_000_000  # values a Python loop adds (~1 µs each per accumulator)
MAX_KAHAN = 500_000  # values of a Kahan sum (four roundings a value: ~4 µs)
_CHUNK = 1 << 16  # values a loop takes from numpy at a time


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
    exact_text: str = ""

    def to_dict(self) -> dict:
        return {"source": self.source, "count": self.count, "format": self.format,
                "inputs_rounded": self.inputs_rounded, "order": self.order,
                "block": self.block, "rounding": self.rounding, "exact": self.exact,
                "exact_text": self.exact_text,
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
    """fl(a + b) in one format and mode, exact to the bit (``pairs``), on scalars (``add``)
    and on arrays (``add_arrays``); stochastic rounding draws one uniform per addition from
    a generator seeded with ``seed``, in the order the additions are made."""

    def __init__(self, spec: FormatSpec, rounding: RoundingMode, seed: int) -> None:
        self.spec = spec
        self.rounding = rounding
        self.rng = np.random.default_rng(seed) if rounding is RoundingMode.STOCHASTIC \
            else None
        self.add = pair_adder(spec, rounding)

    def uniforms(self, n: int):
        """The uniforms of the next n additions (a list), or zeros without stochastic
        rounding (an endless iterator)."""
        return itertools.repeat(0.0) if self.rng is None else self.rng.random(n).tolist()

    def add_arrays(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise fl(a + b), vectorised in every mode."""
        u = None if self.rng is None else self.rng.random(a.size)
        return add_arrays(a, b, self.spec, self.rounding, u=u)


def _chunks(values: np.ndarray, adder: _Adder, per_value: int = 1):
    """(values, uniforms) a chunk at a time: Python floats, ``per_value`` uniforms each."""
    for start in range(0, values.size, _CHUNK):
        xs = values[start:start + _CHUNK].tolist()
        yield xs, adder.uniforms(len(xs) * per_value)


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


def _held(values: np.ndarray, adder: _Adder, native) -> np.ndarray | None:
    """The values in the accumulator's numpy type where it holds them all exactly and
    rounds to nearest-even (numpy's own arithmetic then is the format's), else None."""
    if native is None or adder.rounding is not RoundingMode.NEAREST_EVEN:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        typed = values.astype(native)
    return typed if np.array_equal(typed.astype(np.float64), values) else None


def _sequential(values: np.ndarray, adder: _Adder, native) -> tuple[float, int | None, int, str]:
    """(sum, stalled_at, absorbed, method) of s = fl(s + x_i)."""
    typed = _held(values, adder, native)
    if typed is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            running = np.add.accumulate(typed, dtype=native)
            stalled, absorbed = _track(running, values)
            return float(running[-1]), stalled, absorbed, \
                f"numpy add.accumulate in {np.dtype(native).name}"
    _check_loop(values.size, "sequential")
    s, last, absorbed = running_sum(values, adder.spec, adder.rounding, adder.rng)
    return s, _stall(last, values, s), absorbed, "runs within binades, vectorised (exact)"


def _kahan(values: np.ndarray, adder: _Adder, native) -> tuple[float, int | None, int, str]:
    """Kahan's compensated sum with every operation rounded to the format."""
    if values.size > MAX_KAHAN:
        raise UsageError(f"{values.size:,} values: a kahan sum runs a Python loop, at most "
                         f"{MAX_KAHAN:,} values")
    typed = _held(values, adder, native)
    if typed is not None:
        xs = typed.tolist() if native is np.float64 else list(typed)
        s = c = 0.0 if native is np.float64 else native(0)
        last = absorbed = 0
        with np.errstate(over="ignore", invalid="ignore"):
            for i, x in enumerate(xs, 1):
                y = x - c
                t = s + y
                c = (t - s) - y
                if t == s or (t != t and s != s):
                    absorbed += x != 0
                else:
                    last = i
                s = t
        return float(s), _stall(last, values, float(s)), absorbed, \
            f"numpy {np.dtype(native).name} scalars"
    s = c = 0.0
    i = last = absorbed = 0
    add = adder.add
    for xs, us in _chunks(values, adder, per_value=4):
        stochastic = not isinstance(us, itertools.repeat)
        quads = zip(us[0::4], us[1::4], us[2::4], us[3::4]) if stochastic else \
            itertools.repeat((0.0, 0.0, 0.0, 0.0))
        for x, (u0, u1, u2, u3) in zip(xs, quads):
            i += 1
            y = add(x, -c, u0)
            t = add(s, y, u1)
            c = add(add(t, -s, u2), -y, u3)
            if t == s or (t != t and s != s):
                absorbed += x != 0
            else:
                last = i
            s = t
    return s, _stall(last, values, s), absorbed, "exact loop (TwoSum pairs)"


def _pairwise(values: np.ndarray, adder: _Adder) -> tuple[float, None, None, str]:
    level = values
    if level.size == 1:
        (u,) = itertools.islice(adder.uniforms(1), 1)
        return adder.add(0.0, float(level[0]), u), None, None, "pairwise levels, vectorised"
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
    _check_loop(blocks, "the block sums of blocked")
    if block <= blocks:  # the blocks' sequential sums side by side: their j-th additions
        partial = np.zeros(blocks)
        for j in range(block):
            partial = adder.add_arrays(partial, grid[:, j])
    else:  # a few long blocks: each one's running sum, with the uniforms of the same order
        _check_loop(values.size, "blocked (a few long blocks)")
        u = None if adder.rng is None else adder.rng.random(blocks * block).reshape(block,
                                                                                    blocks)
        partial = np.array([running_sum(grid[b], adder.spec, adder.rounding,
                                        uniforms=None if u is None else u[:, b])[0]
                            for b in range(blocks)])
    s, last, _ = running_sum(partial, adder.spec, adder.rounding, adder.rng)
    stalled = None
    if last < blocks and math.isfinite(s) and np.any(values[last * block:] != 0):
        stalled = last * block
    how = "side by side" if block <= blocks else "each in runs"
    return s, stalled, None, f"blocks of {block:,} vectorised ({how}), then their sums in order"


def _check_loop(n: int, what: str) -> None:
    if n > MAX_LOOP:
        raise UsageError(f"{n:,} values: a {what} sum in this format and rounding runs a "
                         f"Python loop, at most {MAX_LOOP:,} values (a sequential sum with "
                         "nearest-even of values the accumulator holds -- float16, bfloat16, "
                         "float32, float64 -- runs vectorised: e.g. " + Param("format", "bf16")
                         + " for a bfloat16 accumulator)")


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
    units = exactsum.exact_units(stored)  # the exact sum: units * 2^-1074
    results = [_accumulate(stored, spec, name, block, rounding, seed, units) for spec in specs]
    return SumResult(source=source, count=int(stored.size), format=format_label(store),
                     inputs_rounded=int(np.count_nonzero(stored != given)),
                     order=name if block is None else f"blocked:{block}", block=block,
                     rounding=rounding.value, exact=exactsum.to_float(units),
                     accumulators=tuple(results), exact_text=exactsum.units_text(units))


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
                rounding: RoundingMode, seed: int, units: int) -> AccumulatorResult:
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
    error, rel = exactsum.difference(total, units)
    stalled_value = next_value = None
    if stalled is not None:
        next_value = float(stored[stalled])
        stalled_value = total  # the sum never changed after the stall
    return AccumulatorResult(
        format=format_label(spec), precision_bits=spec.mantissa_bits + 1, sum=total,
        exact=exactsum.to_float(units), abs_error=error, rel_error=rel, stalled_at=stalled,
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
    if steps >= MAX_VALUES:  # the weight and the updates are the sum's values
        raise UsageError(Param("count", steps, f"{steps:,}")
                         + f" updates: at most {MAX_VALUES - 1:,}")
    if not (math.isfinite(update) and math.isfinite(weight)):
        raise UsageError("the update and the weight must be finite")
    store = arithmetic_spec(format)[0] if isinstance(format, str) else format
    u = float(_stored(np.array([update]), store)[0])
    w = float(_stored(np.array([weight]), store)[0])
    values = np.full(steps + 1, -u)
    values[0] = w
    result = sum_values(values, accumulators, store, "sequential", rounding, seed,
                        source=f"w = {short_number(w)}, w -= {short_number(u)}, {steps:,} times")
    exact = exactsum.ratio_to_float(*(Fraction(w) - steps * Fraction(u)).as_integer_ratio())
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
                     accumulators=tuple(rows), exact_text=result.exact_text,
                     update=WeightUpdate(weight=w, update=u, steps=steps, exact=exact))
