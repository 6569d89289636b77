"""Q, K, V as an attention kernel in a format sees them (``accuracy``'s module docstring
says what is rounded where): cast to a wide format, or scaled into a narrow one (FP8, FP6,
FP4) with one scale per tensor or per block of rows, after the optional Hadamard
transform of Q and K (FlashAttention-3 §3.3, "incoherent processing").

Scale direction: ``x_q = cast(x * scale) / scale`` (``numerics.tiles``: the one scaled cast
of every analysis; scales by ``scaling.amax_to_scale``'s amax rule).
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.attention.ranges import check_float32_range, first_flagged
from fmtcli.base.choices import Granularity, OverflowPolicy, RoundingMode
from fmtcli.base.errors import DataError, Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.tiles import amax_scaled_cast, is_narrow


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """The unnormalised fast Walsh-Hadamard transform of ``x`` along its last axis (length a
    power of two): ``x @ H`` with H the Sylvester Hadamard matrix, in log2(d) vectorised
    butterfly passes (a new array; float64 stays float64)."""
    n = x.shape[-1]
    if n & (n - 1) or n == 0:
        raise UsageError("the Hadamard transform needs a power-of-two dim, got " + Param("dim", n))
    y = np.array(x, dtype=np.result_type(x.dtype, np.float32), copy=True)
    lead = y.shape[:-1]
    h = 1
    while h < n:
        view = y.reshape(*lead, n // (2 * h), 2, h)
        a = view[..., 0, :].copy()
        b = view[..., 1, :]
        view[..., 0, :] += b
        np.subtract(a, b, out=view[..., 1, :])
        h *= 2
    return y


def random_orthogonal_hadamard(q: np.ndarray, k: np.ndarray, seed: int = 0
                               ) -> tuple[np.ndarray, np.ndarray]:
    """Q and K times the same random orthogonal matrix ``diag(s) H / sqrt(d)`` (s: random
    signs from ``seed``): ``Q' K'^T = Q K^T`` exactly in real arithmetic, while an outlier
    column is spread over all d columns before quantization (FlashAttention-3 §3.3,
    "incoherent processing"; the QuIP idea)."""
    d = q.shape[-1]
    signs = np.random.default_rng([seed, 0x4AD]).choice((-1.0, 1.0), size=d)
    norm = 1.0 / math.sqrt(d)
    return walsh_hadamard(q * signs) * norm, walsh_hadamard(k * signs) * norm


def cast(x: np.ndarray, spec: FormatSpec, saturate: bool = False) -> np.ndarray:
    """``x`` (float32) rounded to ``spec``, nearest-even, as float32 (wide formats beyond
    float32's range keep float64 values, which stay finite here)."""
    policy = OverflowPolicy.SATURATE if saturate else OverflowPolicy.IEEE
    r = round_to_format(np.asarray(x, dtype=np.float32), spec, RoundingMode.NEAREST_EVEN,
                        policy)
    return r.astype(np.float32, copy=False)


def scale_group(granularity: Granularity, rows: int, cols: int) -> ScaleGroup:
    """What one scale covers in a (seq, dim) or (seq_q, seq_k) matrix: the whole tensor
    (``tensor``), or a tile of ``rows`` x ``cols`` (``block``: Q's ``block_q`` rows, K's and
    V's ``block_k``, all ``dim`` columns; P's ``block_q x block_k`` tiles)."""
    if granularity is Granularity.TENSOR:
        return ScaleGroup(Granularity.TENSOR)
    return ScaleGroup(Granularity.TILE, tile=(rows, cols))


def quantize_inputs(q, k, v, spec: FormatSpec, granularity: Granularity, block_q: int,
                    block_k: int, hadamard: bool = False, seed: int = 0,
                    labels: tuple[str, str, str] = ("Q", "K", "V")):
    """Q, K, V (any leading shape, (..., seq, dim)) as the kernel sees them, float32: cast
    to a wide ``spec``, or scaled into a narrow one (module docstring); ``hadamard``
    transforms Q and K first.  A value that float32 cannot hold, or (wide ``spec``, cast
    without a scale) that ``spec`` cannot, is a DataError naming the input (``labels``)."""
    if hadamard:
        q, k = random_orthogonal_hadamard(q, k, seed)
        labels = (f"{labels[0]} after the Hadamard transform",
                  f"{labels[1]} after the Hadamard transform", labels[2])
    out = []
    for x, rows, label in ((q, block_q, labels[0]), (k, block_k, labels[1]),
                           (v, block_k, labels[2])):
        check_float32_range(np.asarray(x), label)
        x32 = np.asarray(x, dtype=np.float32)
        if not is_narrow(spec):
            x_q = cast(x32, spec)
            bad = ~np.isfinite(x_q)
            if bad.any():
                raise DataError(f"{label} holds {first_flagged(bad, x32)}, beyond {spec.name}'s "
                                f"range (max {spec.max:g}): attention in {spec.name} casts "
                                "it without a scale; give smaller inputs or a wider format")
            out.append(x_q)
            continue
        lead = x32.shape[:-2]
        flat = x32.reshape(-1, *x32.shape[-2:])
        group = scale_group(granularity, rows, x32.shape[-1])
        out.append(amax_scaled_cast(flat, spec, group).reshape(*lead, *x32.shape[-2:]))
    return tuple(out)
