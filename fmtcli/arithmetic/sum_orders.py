"""The four orders of ``fmt sum``, each addition rounded once to the accumulator's format.

``accumulate(values, spec, order, block, rounding, seed)`` adds values already stored in
the input format with the running sum held in ``spec`` (``summation`` has the model, and
what ``stalled_at`` and ``absorbed`` mean): ``sequential``, ``kahan``, ``pairwise`` and
``blocked`` with blocks of ``block`` values.

How fast: a sequential sum whose values the accumulator holds exactly (float16, bfloat16,
float32, float64; nearest-even) runs as numpy's ``add.accumulate`` in that dtype, one
rounding per step (float16 and bfloat16 add through float32: 24 >= 2p + 2 bits, so no
double rounding -- Figueroa 1995); pairwise and blocked sums are vectorised across pairs
and blocks in every mode (``pairs.add_arrays``); other sequential sums run in runs within
one binade (``runs.running_sum``); a Kahan sum outside numpy's types is a Python loop with
float arithmetic exact to the bit (``pairs.pair_adder``, ~4 µs a value).  Loops are bounded
by MAX_LOOP (MAX_KAHAN) values.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from fmtcli.arithmetic.pairs import add_arrays, pair_adder
from fmtcli.arithmetic.runs import running_sum
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.format_names import is_float64
from fmtcli.numerics.formats import FormatSpec

MAX_LOOP = 2_000_000  # values a Python loop adds (~1 µs each per accumulator)
MAX_KAHAN = 500_000  # values of a Kahan sum (four roundings a value: ~4 µs)
_CHUNK = 1 << 16  # values a loop takes from numpy at a time

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


def accumulate(values: np.ndarray, spec: FormatSpec, order: str, block: int | None,
               rounding: RoundingMode, seed: int) -> tuple[float, int | None, int | None, str]:
    """(sum, stalled_at, absorbed, method) of ``values`` (float64, stored in the input
    format) added in ``order`` (sequential, kahan, pairwise, or blocked in blocks of
    ``block``) with the running sum held in ``spec``, each addition rounded once by
    ``rounding`` (``seed``: stochastic rounding's generator)."""
    adder = _Adder(spec, rounding, seed)
    native = _native_dtype(spec)
    if order == "sequential":
        return _sequential(values, adder, native)
    if order == "kahan":
        return _kahan(values, adder, native)
    if order == "pairwise":
        return _pairwise(values, adder)
    return _blocked(values, adder, block)
