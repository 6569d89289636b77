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
exact pair).  The exact sum of the stored values (``numerics.exactsum``: a count of
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

How fast: ``sum_orders`` (numpy's own arithmetic where the accumulator's type holds the
values exactly, else vectorised or loops exact to the bit, up to MAX_LOOP values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fmtcli.arithmetic.sum_inputs import (
    DEFAULT_COUNT,
    MAX_VALUES,
    check_count,
    parse_order,
    short_number,
)
from fmtcli.arithmetic.sum_orders import accumulate
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics import exactsum
from fmtcli.numerics.format_names import arithmetic_spec, format_label, is_float64
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.tapered import check_one_precision

DEFAULT_ACCUMULATORS = ("bfloat16", "float16", "float32", "float64")


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
    for spec in (store, *specs):  # the running sums round at one precision (no HiFloat8)
        check_one_precision(spec, "fmt sum")
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
    total, stalled, absorbed, method = accumulate(stored, spec, order, block, rounding, seed)
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
