"""The running sum s = fl(s + x_i) of ``fmt sum``, vectorised in runs within one binade.

A sequential sum cannot be vectorised across its steps in general: each rounding depends
on the running sum.  But while the exact sums ``s + x`` stay inside one region of uniform
spacing q of the accumulator's format F -- a binade [L, 2L), its mirror (-2L, -L], or the
subnormal range (0, N) or (-N, 0) -- the grid around ``s + x`` is the multiples of q, and
s is one of them, so

    fl(s + x) = s + q * g(x / q)

where g is the mode's rounding to an integer on the real line: floor (``down``), ceil
(``up``), toward zero or nearest-away by the region's sign, ``floor + (u < fraction)``
(stochastic, u the step's uniform), nearest-even except at a tie (whose parity depends on
s).  g does not depend on s, so a block of steps is a cumulative sum of integers
(``numpy.cumsum``, exact below 2^53), accepted up to the first step that leaves the region
(checked exactly: ``x / q`` against integer bounds), ties in nearest-even, results past the
format's max or an exact -0.  That step is made by the scalar adder (``pairs.pair_adder``:
TwoSum and one rounding), and the next block starts.  Where runs stay short (a format of
few bits crosses binades all the time) the scalar adder takes a stretch of steps alone.

The result is the sequential sum to the bit, in every mode (stochastic: the i-th step uses
the i-th uniform of the generator): tests check it against the exact recurrence.  With
long runs (an FP32 or BF16 accumulator far above its terms) a step costs nanoseconds
instead of the scalar adder's microsecond.  Once the sum is inf or NaN it stays so (the
terms are finite): the remaining terms are absorbed.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.arithmetic.pairs import pair_adder
from fmtcli.base.choices import RoundingMode
from fmtcli.numerics.formats import FormatSpec

CHUNK = 1 << 16  # values taken from numpy (and uniforms drawn) at a time
MIN_BLOCK = 64
SHORT = 16  # a run shorter than this: the scalar adder takes a stretch of steps
MIN_STRETCH, MAX_STRETCH = 16, 1024


class _Runs:
    """The vectorised steps in one format and mode (``run``), where the format allows."""

    def __init__(self, spec: FormatSpec, rounding: RoundingMode) -> None:
        self.spec = spec
        self.mode = rounding
        self.m = spec.mantissa_bits
        self.normal = spec.smallest_normal
        self.q_min = spec.smallest_subnormal if spec.subnormals else None

    @staticmethod
    def applies(spec: FormatSpec) -> bool:
        """Signed formats with a zero (not unsigned scale formats such as E8M0)."""
        return spec.signed and spec.has_zero

    def region(self, s: float):
        """(q, S, low, high, positive) for the running sum s = S * q: the exact sum S + y
        must satisfy low <= S + y < high (positive; strict where 0 is a bound) or
        -high < S + y <= -low; None where no region applies (-0, or no subnormals)."""
        if s == 0:
            if math.copysign(1.0, s) < 0 or self.q_min is None:
                return None
            return self.q_min, 0.0, 0.0, self.normal / self.q_min, True
        a = abs(s)
        if a < self.normal:
            if self.q_min is None:
                return None
            q, low, high = self.q_min, 0.0, self.normal / self.q_min
        else:
            q = math.ldexp(1.0, math.frexp(a)[1] - 1 - self.m)
            low, high = float(1 << self.m), float(2 << self.m)
        return q, math.copysign(a / q, s), low, high, s > 0

    def run(self, s: float, xs: np.ndarray, us: np.ndarray | None):
        """How many of the steps s = fl(s + x) over ``xs`` stay in s's region, the sum
        after them, the offset of the last step that changed it (-1: none) and how many
        nonzero terms changed nothing; None where no region applies."""
        region = self.region(s)
        if region is None:
            return None
        q, start, low, high, positive = region
        exponent = math.frexp(q)[1] - 1
        y = np.ldexp(xs, -exponent)  # x / q: exact unless it underflows (then tiny)
        tiny = (y == 0) & (xs != 0)  # or overflows: then far outside the region
        if tiny.any():  # keep the sign: every mode decides a tiny |y| by its sign alone
            y[tiny] = np.copysign(5e-324, xs[tiny])
        whole = np.floor(y)
        fraction = y - whole  # exact
        mode = self.mode
        tie = None
        if mode is RoundingMode.DOWN or (mode is RoundingMode.TOWARD_ZERO and positive):
            k = whole
        elif mode is RoundingMode.UP or mode is RoundingMode.TOWARD_ZERO:
            k = whole + (fraction > 0)
        elif mode is RoundingMode.NEAREST_AWAY:
            k = whole + (fraction >= 0.5 if positive else fraction > 0.5)
        elif mode is RoundingMode.STOCHASTIC:
            k = whole + (us < fraction)
        else:  # nearest-even: a tie's parity depends on s, so a run stops there
            tie = fraction == 0.5
            k = whole + (fraction > 0.5)
        after = start + np.cumsum(k)
        before = np.concatenate(([start], after[:-1]))
        if positive:
            ok = (y >= low - before) if low else (y > -before)
            ok &= y < high - before
        else:
            ok = (y <= -low - before) if low else (y < -before)
            ok &= y > -high - before
            ok &= after != 0  # an exact -0 (or +0): its sign is the scalar adder's
        if tie is not None:
            ok &= ~tie
        if q * high > self.spec.max:  # the top binade: nothing past max
            ok &= np.abs(after) <= self.spec.max / q
        accepted = xs.size if ok.all() else int(np.argmin(ok))
        if accepted == 0:
            return 0, s, -1, 0
        steps = k[:accepted]
        moved = np.flatnonzero(steps)
        absorbed = int(np.count_nonzero((steps == 0) & (xs[:accepted] != 0)))
        total = float(after[accepted - 1]) * q
        return accepted, total, int(moved[-1]) if moved.size else -1, absorbed


def running_sum(values: np.ndarray, spec: FormatSpec, rounding: RoundingMode,
                rng: np.random.Generator | None = None,
                uniforms: np.ndarray | None = None) -> tuple[float, int, int]:
    """(s, last, absorbed) of s = fl(s + x_i) from s = 0 over float64 ``values``: the
    final sum, the count of values after which it never changed (0: never changed), and
    how many nonzero values changed nothing.  Stochastic rounding: the i-th step uses
    ``uniforms[i]``, or else the generator ``rng``'s next uniform."""
    rounding = RoundingMode(rounding)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        return _running_sum(values, spec, rounding, rng, uniforms)


def _running_sum(values, spec, rounding, rng, uniforms):
    add = pair_adder(spec, rounding)
    runs = _Runs(spec, rounding) if _Runs.applies(spec) else None
    s = 0.0
    last = absorbed = 0
    stretch = MIN_STRETCH
    for start in range(0, values.size, CHUNK):
        xs = values[start:start + CHUNK]
        us = None
        if rounding is RoundingMode.STOCHASTIC:
            us = rng.random(xs.size) if uniforms is None else \
                np.ascontiguousarray(uniforms[start:start + CHUNK], dtype=np.float64)
        x_list = xs.tolist()
        u_list = us.tolist() if us is not None else [0.0] * xs.size
        i, block, n = 0, MIN_BLOCK, xs.size
        while i < n:
            if not math.isfinite(s):  # inf or NaN plus a finite term is itself
                rest = values[start + i:]
                return s, last, absorbed + int(np.count_nonzero(rest))
            done = None
            if runs is not None:
                stop = min(n, i + block)
                done = runs.run(s, xs[i:stop], None if us is None else us[i:stop])
            if done is not None:
                accepted, s, moved, lost = done
                absorbed += lost
                if moved >= 0:
                    last = start + i + moved + 1
                i += accepted
                if i == stop:  # the whole block: go on with a larger one
                    block = min(CHUNK, 4 * block)
                    continue
                block = MIN_BLOCK  # the run ended: the next may be short
            # the scalar adder: one step after a long run; after short runs a stretch,
            # longer each time runs stay short (a sum crossing binades all the time)
            if done is not None and done[0] >= SHORT:
                steps, stretch = 1, MIN_STRETCH
            else:
                steps, stretch = stretch, min(MAX_STRETCH, 2 * stretch)
            for j in range(i, min(n, i + steps)):
                x = x_list[j]
                new = add(s, x, u_list[j])
                if new == s or (new != new and s != s):
                    absorbed += x != 0
                else:
                    last = start + j + 1
                s = new
            i = min(n, i + steps)
    return s, last, absorbed
