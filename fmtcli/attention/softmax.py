"""The online softmax of one query, block by block, in any format (``fmt softmax``).

Attention's output for one query is the softmax-weighted average of the values,
``o = sum_i exp(s_i) v_i / sum_i exp(s_i)`` over its scores ``s_i`` against the keys.
FlashAttention (Dao et al. 2022, §3.1) computes it while the keys arrive a block at a time,
never holding every score at once, with the online softmax of Milakov & Gimelshein (2018,
"Online normalizer calculation for softmax", Algorithm 3): keep a running max ``m``, a
running sum ``l = sum exp(s_i - m)`` and a running weighted sum ``acc = sum exp(s_i - m) v_i``;
when a block brings a larger max, multiply what was accumulated by ``exp(m_old - m_new)``
first.  After any block, ``acc / l`` is the exact softmax average of the keys seen so far.
Each block's exponentials are taken against the new running max directly (as
FlashAttention-2's Algorithm 1 does) rather than against the block's own max and rescaled
afterwards (FlashAttention's Algorithm 1): the same result with one rescale instead of two.

The arithmetic, per block ``j``, in the format F (``fl``: round to F)::

    block_max   = max_i s_i                          exact (a comparison)
    m_j         = max(m_{j-1}, block_max)            exact; m_0 = -inf
    rescale_j   = fl(exp(fl(m_{j-1} - m_j)))         1 when the max did not change
    p_i         = fl(exp(fl(s_i - m_j)))
    block_sum   = fl(..fl(fl(p_1 + p_2) + p_3)..)    in key order, one rounding per add
    l_j         = fl(fl(rescale_j * l_{j-1}) + block_sum)
    acc_j       = the same with fl(p_i * v_i)        per component of the values
    output_j    = fl(acc_j / l_j)

Scores and values are stored in F first (nearest-even, as a cast stores a kernel's inputs,
whatever ``rounding`` the arithmetic uses); the reference is the exact softmax-weighted
average of those stored inputs, so ``abs_error`` is the arithmetic's alone, and
``input_rounding_error`` says how far storing the inputs moved the exact answer.

How ``fl`` rounds: each +, -, *, / is computed in float64 and rounded once to F with the
project's engine (``rounding.round_to_format``).  For a format of p <= 25 significand bits
(float32, bfloat16, float16, FP8, ...) that is the correctly rounded result of the operation
on F's values: double rounding is innocuous when float64's 53 bits are at least 2p + 2
(Figueroa 1995).  ``exp`` is numpy's float64 exp (within an ulp of float64), rounded once to
F.  Directed and stochastic modes round the float64 result; products and most sums of F's
values are exact in float64, so those too are the modes' own results.  Float64 itself is
numpy's float64 arithmetic (nearest-even), with nothing rounded again.

The reference is computed in extended precision: exponentials and products in
``np.longdouble`` (64 significand bits on x86), each sum exact to well below longdouble's
rounding (the products' float64 high parts added pairwise without error, by TwoSum, the low
parts beside them: ``numerics.exactsum.column_sums``), one division: within a few 1e-19 of
the average of ``|v|`` (relative) where longdouble is x87's, a few 1e-16 where it is
float64.  Products are scaled by a power of two where their sum could pass float64's max
(values near 1e308), and the scale put back after the division.  All of it is vectorised
over keys and components: 2**20 keys of 16 components take seconds.

The recurrence across blocks is a Python loop (each block needs the one before); ``l`` and
``acc`` are rounded together (one call per step), and a rescale of exactly 1 (the max did
not change, the common case) is skipped, since ``1 * x`` is ``x`` in F in every mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.attention.limits import (
    SOFTMAX_MAX_BLOCK,
    SOFTMAX_MAX_BLOCKS,
    SOFTMAX_MAX_ELEMENTS,
    SOFTMAX_MAX_KEYS,
    SOFTMAX_MAX_TRACE,
)
from fmtcli.attention.reference import magnitude as _magnitude
from fmtcli.attention.reference import weighted_averages as _weighted_averages
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.format_names import arithmetic_spec, format_label, is_float64
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format

#: The article's worked example: one query, four keys, blocks of two.
ARTICLE_SCORES = (1.0, 3.0, 2.0, 0.0)
ARTICLE_VALUES = (10.0, 20.0, 30.0, 40.0)
ARTICLE_BLOCK = 2
#: Block size when none is given for inputs other than the article's (its random test).
DEFAULT_BLOCK = 32
#: Limits that keep one trace within seconds and its JSON within memory (``limits``).
MAX_KEYS = SOFTMAX_MAX_KEYS
MAX_ELEMENTS = SOFTMAX_MAX_ELEMENTS  # keys x components of the values
MAX_BLOCK = SOFTMAX_MAX_BLOCK  # keys summed one after another in a block
MAX_BLOCKS = SOFTMAX_MAX_BLOCKS
MAX_TRACE = SOFTMAX_MAX_TRACE  # blocks x components recorded in the trace
ARITHMETIC = "max exact; s-m, exp, every product, every sum and acc/l rounded to {f} ({how})"



def _exp(x: np.ndarray) -> np.ndarray:
    """exp of float64 values by the C library (``math.exp``: correctly rounded on glibc
    for these arguments), not numpy's SIMD exp, which numpy 1.26 computes 1 ulp off on
    AVX-512 CPUs (exp(-1): 0.3678794411714424 vs 0.36787944117144233): the emulation's
    ``fl(exp(x))`` must not depend on the CPU or the numpy release."""
    x = np.asarray(x, dtype=np.float64)
    return np.fromiter(map(_exp_one, x.ravel().tolist()), np.float64, x.size).reshape(x.shape)


def _exp_one(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:  # past float64's range, as numpy's exp says it
        return math.inf


@dataclass(frozen=True)
class SoftmaxBlock:
    """One block of the trace: its keys ``start:stop`` (0-based, as a Python slice), their
    scores as stored in F, and the running statistics after it.  ``rescale`` is what the
    running sums were multiplied by (None for block 1: nothing was accumulated); vectors
    (``weighted_sum``, ``output``) are tuples, one entry per component of the values."""

    block: int
    start: int
    stop: int
    scores: tuple[float, ...]
    block_max: float
    running_max: float
    rescale: float | None
    block_sum: float
    running_sum: float
    weighted_sum: float | tuple[float, ...]
    output: float | tuple[float, ...]

    def to_dict(self) -> dict:
        return {"block": self.block, "start": self.start, "stop": self.stop,
                "scores": list(self.scores), "block_max": self.block_max,
                "running_max": self.running_max, "rescale": self.rescale,
                "block_sum": self.block_sum, "running_sum": self.running_sum,
                "weighted_sum": _plain(self.weighted_sum), "output": _plain(self.output)}


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class SoftmaxTrace:
    """The online softmax of one query in ``format``, block by block, beside the exact
    softmax-weighted average.  ``dim`` is None for scalar values, else their components;
    ``output``, ``reference`` and ``abs_error`` are floats or tuples accordingly;
    ``worst`` is the component with the largest error (0 for scalars).  ``rel_error`` is
    ``max_abs_error`` over the softmax-weighted average of ``|v|`` (the largest over the
    components): |reference| itself when the values have one sign, and unlike it, not near
    zero when positive and negative values cancel.  ``running_sum`` is the final ``l`` (the
    sum of ``exp(s_i - m)`` with ``m`` the largest score), ``sum_reference`` its exact value
    and ``sum_rel_error`` their relative difference: what a running sum kept in F loses.
    ``inputs_rounded`` counts the scores and values that changed when stored in F, and
    ``input_rounding_error`` is how far that moved the exact answer (max over components)."""

    format: str
    rounding: str
    precision_bits: int
    eps: float
    block: int
    keys: int
    dim: int | None
    source: str
    blocks: tuple[SoftmaxBlock, ...]
    output: float | tuple[float, ...]
    reference: float | tuple[float, ...]
    abs_error: float | tuple[float, ...]
    max_abs_error: float
    rel_error: float
    running_sum: float
    sum_reference: float
    sum_rel_error: float
    worst: int
    inputs_rounded: int
    input_rounding_error: float
    arithmetic: str

    def to_dict(self) -> dict:
        return {"format": self.format, "rounding": self.rounding,
                "precision_bits": self.precision_bits, "eps": self.eps, "block": self.block,
                "keys": self.keys, "dim": self.dim, "source": self.source,
                "blocks": [b.to_dict() for b in self.blocks],
                "output": _plain(self.output), "reference": _plain(self.reference),
                "abs_error": _plain(self.abs_error), "max_abs_error": self.max_abs_error,
                "rel_error": self.rel_error, "running_sum": self.running_sum,
                "sum_reference": self.sum_reference, "sum_rel_error": self.sum_rel_error,
                "worst": self.worst,
                "inputs_rounded": self.inputs_rounded,
                "input_rounding_error": self.input_rounding_error,
                "arithmetic": self.arithmetic}


class _Rounder:
    """``fl``: float64 results rounded once to the format (float64 itself: as they are)."""

    def __init__(self, spec: FormatSpec, rounding: RoundingMode, seed: int) -> None:
        self.spec = spec
        self.rounding = rounding
        self.exact = is_float64(spec)
        self.rng = np.random.default_rng([seed, 1]) \
            if rounding is RoundingMode.STOCHASTIC else None

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.exact:
            return x
        return round_to_format(x, self.spec, self.rounding, rng=self.rng)


def _as_inputs(scores, values) -> tuple[np.ndarray, np.ndarray]:
    """Scores as a float64 vector and values as a float64 vector or (keys, dim) matrix,
    checked: the same number of keys, at least one, all finite."""
    try:
        s = np.asarray(scores, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise UsageError(f"scores and values must be numbers ({error})") from None
    if s.ndim != 1:
        raise UsageError(f"scores must be a vector (one per key), got shape {s.shape}")
    if v.ndim not in (1, 2) or (v.ndim == 2 and v.shape[1] == 0):
        raise UsageError("values must be a vector or a matrix with one row per key, got "
                         f"shape {v.shape}")
    if s.size == 0:
        raise UsageError("no scores: give at least one key")
    if v.shape[0] != s.size:
        count = f"{v.shape[0]:,} {'row' if v.ndim == 2 else 'value'}" \
            + ("" if v.shape[0] == 1 else "s")
        raise UsageError(f"{s.size:,} score{'' if s.size == 1 else 's'} but {count}: give "
                         "one value (or one row of values) per score")
    for name, a in (("scores", s), ("values", v)):
        bad = ~np.isfinite(a)
        if bad.any():
            index = np.unravel_index(int(np.argmax(bad)), a.shape)
            raise UsageError(f"{name} must be finite: {name}[{', '.join(map(str, index))}] "
                             f"is {a[index]}")
    return s, v


def _check_size(keys: int, dim: int, block: int) -> int:
    """The block size used (at most ``keys``), within the limits."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise UsageError("block must be at least 1, got " + Param("block", block))
    if keys > MAX_KEYS:
        raise UsageError(f"{keys:,} keys: at most {MAX_KEYS:,}")
    if keys * dim > MAX_ELEMENTS:
        raise UsageError(f"{keys:,} keys x {dim:,} components: at most {MAX_ELEMENTS:,} values")
    block = min(int(block), keys)
    blocks = -(-keys // block)
    if block > MAX_BLOCK:
        raise UsageError(f"blocks of {block:,} keys: at most {MAX_BLOCK:,} (give a smaller "
                         "block)")
    if blocks > MAX_BLOCKS:
        raise UsageError(f"{keys:,} keys in blocks of {block:,} make {blocks:,} blocks: at "
                         f"most {MAX_BLOCKS:,} (give a larger block)")
    if blocks * dim > MAX_TRACE:
        raise UsageError(f"{blocks:,} blocks x {dim:,} components: too long a trace (at most "
                         f"{MAX_TRACE:,} numbers; give a larger block)")
    return block


def _stored(x: np.ndarray, fl: _Rounder, name: str) -> np.ndarray:
    """``x`` as F holds it; a value that F cannot hold (beyond its max) is refused."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = fl(x)
    bad = ~np.isfinite(y)
    if bad.any():
        index = np.unravel_index(int(np.argmax(bad)), x.shape)
        raise UsageError(f"{name}[{', '.join(map(str, index))}] = {x[index]:g} is beyond "
                         f"{format_label(fl.spec)}'s range (max {fl.spec.max:g})")
    return y


def softmax_reference(scores, values) -> np.ndarray:
    """The exact softmax-weighted average ``sum exp(s_i) v_i / sum exp(s_i)`` as longdouble
    (a 0-d array for scalar values, one entry per component for vectors): exponentials and
    products in longdouble, each sum exact to longdouble precision (see the module
    docstring), also where the sums pass float64's range."""
    s, v = _as_inputs(scores, values)
    out, _ = _weighted_averages(s, v.reshape(v.shape[0], -1))
    return out.reshape(()) if v.ndim == 1 else out


def online_softmax(scores, values, block: int = DEFAULT_BLOCK,
                   format: FormatSpec | str = "float32",
                   rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
                   seed: int = 0, source: str = "") -> SoftmaxTrace:
    """The online softmax of one query (``scores``: one per key) over ``values`` (one
    number or one row per key), in blocks of ``block`` keys, every operation of the running
    statistics rounded to ``format`` (see the module docstring for which, and how); its
    trace, final output, exact reference and error.  ``seed`` seeds stochastic rounding."""
    spec = arithmetic_spec(format)[0] if isinstance(format, str) else format
    try:
        rounding = RoundingMode(rounding)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not spec.signed:
        raise UsageError(f"{spec.name} has no negative numbers, and s - m is never positive: "
                         "give a signed format")
    if is_float64(spec) and rounding is not RoundingMode.NEAREST_EVEN:
        raise UsageError(Param("rounding", rounding) + " needs a format narrower than float64 "
                         "(float64 arithmetic here is numpy's, nearest-even)")
    s_given, v_given = _as_inputs(scores, values)
    keys, dim = s_given.size, (None if v_given.ndim == 1 else v_given.shape[1])
    block = _check_size(keys, dim or 1, block)
    fl = _Rounder(spec, rounding, seed)
    cast = _Rounder(spec, RoundingMode.NEAREST_EVEN, seed)  # inputs: stored as a cast does
    s, v = _stored(s_given, cast, "scores"), _stored(v_given, cast, "values")
    blocks = -(-keys // block)
    width = dim or 1
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        # the scores and values as (blocks, block) grids; padding adds exact zeros
        grid = np.full(blocks * block, -np.inf)
        grid[:keys] = s
        grid = grid.reshape(blocks, block)
        vgrid = np.zeros((blocks * block, width))
        vgrid[:keys] = v.reshape(keys, width)
        vgrid = vgrid.reshape(blocks, block, width)
        block_max = grid.max(axis=1)
        running_max = np.maximum.accumulate(block_max)
        rescale = np.ones(blocks)  # block 1's is never used: nothing was accumulated
        rescale[1:] = fl(_exp(fl(running_max[:-1] - running_max[1:])))
        real = np.arange(blocks * block).reshape(blocks, block) < keys
        p = np.zeros((blocks, block))  # the padding's exponentials: exact zeros
        p[real] = fl(_exp(fl((grid - running_max[:, None])[real])))
        # column 0: the weights (for l), then their products with each component (acc):
        # l and acc go through the same roundings together, one call per step
        terms = np.empty((blocks, block, width + 1))
        terms[:, :, 0] = p
        terms[:, :, 1:] = fl(p[:, :, None] * vgrid)
        sums = terms[:, 0]
        for j in range(1, block):  # one rounding per add, in key order, all blocks at once
            sums = fl(sums + terms[:, j])
        del terms
        state = np.empty((blocks, width + 1))
        state[0] = sums[0]
        for j in range(1, blocks):  # the recurrence across blocks (Milakov & Gimelshein)
            # rescale 1 (the max did not change): 1 * x is x, in F, in every mode
            old = state[j - 1] if rescale[j] == 1 else fl(rescale[j] * state[j - 1])
            state[j] = fl(old + sums[j])
        running_sum, weighted, block_sum = state[:, 0], state[:, 1:], sums[:, 0]
        output = fl(weighted / running_sum[:, None])
    matrix = v.reshape(keys, width)
    reference, denominator = _weighted_averages(s, matrix)
    magnitude = _magnitude(s, matrix)
    error = np.abs(output[-1].astype(np.longdouble) - reference).astype(np.float64)
    worst = int(np.argmax(np.where(np.isnan(error), np.inf, error)))
    exact_sum = float(denominator)
    changed = int(np.count_nonzero(s != s_given) + np.count_nonzero(v != v_given))
    moved = 0.0
    if changed:
        given = _weighted_averages(s_given, v_given.reshape(keys, width))[0]
        moved = float(np.max(np.abs(given - reference)))
    how = ("numpy float64, nearest-even" if fl.exact else
           f"each computed in float64 and rounded once, {rounding.value}")
    return SoftmaxTrace(
        format=format_label(spec), rounding=rounding.value,
        precision_bits=spec.mantissa_bits + 1, eps=float(spec.eps), block=block, keys=keys,
        dim=dim, source=source,
        blocks=tuple(_block(j, block, keys, grid, block_max, running_max, rescale, block_sum,
                            running_sum, weighted, output, dim) for j in range(blocks)),
        output=_vector(output[-1], dim), reference=_vector(reference.astype(np.float64), dim),
        abs_error=_vector(error, dim), max_abs_error=float(error[worst]),
        rel_error=_relative(float(error[worst]), magnitude), running_sum=float(running_sum[-1]),
        sum_reference=exact_sum,
        sum_rel_error=_relative(abs(float(running_sum[-1]) - exact_sum), exact_sum),
        worst=worst, inputs_rounded=changed, input_rounding_error=moved,
        arithmetic=ARITHMETIC.format(f=format_label(spec), how=how))


def _relative(error: float, magnitude: float) -> float:
    if math.isnan(error) or magnitude > 0:
        return error / magnitude if magnitude > 0 else error
    return 0.0 if error == 0 else math.inf


def _vector(row: np.ndarray, dim: int | None) -> float | tuple[float, ...]:
    return float(row[0]) if dim is None else tuple(float(x) for x in row)


def _block(j, block, keys, grid, block_max, running_max, rescale, block_sum, running_sum,
           weighted, output, dim) -> SoftmaxBlock:
    stop = min(keys, (j + 1) * block)
    return SoftmaxBlock(
        block=j + 1, start=j * block, stop=stop,
        scores=tuple(float(x) for x in grid[j, :stop - j * block]),
        block_max=float(block_max[j]), running_max=float(running_max[j]),
        rescale=None if j == 0 else float(rescale[j]), block_sum=float(block_sum[j]),
        running_sum=float(running_sum[j]), weighted_sum=_vector(weighted[j], dim),
        output=_vector(output[j], dim))

