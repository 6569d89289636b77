"""``fmt kv``'s scales (vLLM's direction, ``x ~ q * k_scale``): the round trip as vLLM
applies it, each candidate rule per group, the MSE search, and what a checkpoint holds
(``checkpoint_factor``: e4m3fnuz scales are written halved, since vLLM doubles them on fnuz
GPUs; see the package's docstring)."""

from __future__ import annotations

import numpy as np

from fmtcli.base.choices import Granularity
from fmtcli.base.errors import DataError, Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.tiles import from_codes, tile_amax, to_codes

CANDIDATES = ("unit", "amax", "amax-x2", "p99.99", "mse")
FLOAT32_TINY = 2.0 ** -126  # float32's smallest normal: the smallest scale written


def checkpoint_factor(spec: FormatSpec) -> float:
    """What ``--out`` multiplies the applied scales by: 1/2 for float8_e4m3fnuz, whose
    scales vLLM doubles on loading (on fnuz GPUs, the only ones with an e4m3fnuz cache),
    1 for the OCP formats, whose scales it applies as loaded."""
    return 0.5 if spec.name == "float8_e4m3fnuz" else 1.0


class TinyScale(DataError):
    """A group of values too small for a float32 scale (its amax / fp8_max < 2^-126)."""


#: What one scale covers in a KV cache (``numerics.granularity``): a layer's K or V, a head
#: of it, a token's head.
KV_KINDS = (Granularity.TENSOR, Granularity.HEAD, Granularity.TOKEN_HEAD)


def _group_axes(granularity: str) -> tuple[int, ...]:
    """The axes of (tokens, heads, dim) a scale spans."""
    return {Granularity.TENSOR: (0, 1, 2), Granularity.HEAD: (0, 2),
            Granularity.TOKEN_HEAD: (2,)}[Granularity(granularity)]


def group_amax(x: np.ndarray, granularity: str) -> np.ndarray:
    """amax of every group of x (tokens, heads, dim), broadcastable to x (kept dims): the
    tiles of ``granularity`` in the matrix (tokens, heads x dim), by ``numerics.tiles``."""
    tokens, heads, dim = x.shape
    group = ScaleGroup(Granularity(granularity))
    tr, tc = group.tile_shape(tokens, heads * dim, head_dim=dim)
    amax = tile_amax(x.reshape(tokens, heads * dim), tr, tc)
    return amax.reshape(amax.shape[0], -1, 1)


def round_trip(x: np.ndarray, k_scale: np.ndarray, spec: FormatSpec
               ) -> tuple[np.ndarray, int]:
    """vLLM's round trip: q = saturating cast(x / k_scale), x_hat = q * k_scale (float32:
    ``numerics.tiles``' scaled cast in the dequantization direction); the dequantized values
    and how many clipped (those that would have rounded past the format's max:
    ``rounding.beyond_threshold``; 448.01 rounds to 448 and is not clipped)."""
    q, clipped = to_codes(x, spec, k_scale, dequant=True, count_clipped=True,
                          product_dtype=np.float32)
    with np.errstate(over="ignore"):  # q * k_scale past float32's max is inf, as in vLLM
        return from_codes(q, k_scale, dequant=True).astype(np.float32, copy=False), clipped


def _squared_error(x: np.ndarray, x_hat: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Per group: the sum of squared errors (float32 differences, summed in float64: only
    the MSE search's choice rests on it; the figures reported come from ``measure``)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an inf error loses the search
        e = np.subtract(x_hat, x)
        return np.add.reduce(np.square(e, out=e), axis=axes, keepdims=True, dtype=np.float64)


def smallest_scale(spec: FormatSpec) -> float:
    """The smallest scale fmt applies: the one whose checkpoint value is float32's
    smallest normal (2^-126; 2^-125 for e4m3fnuz, written halved)."""
    return FLOAT32_TINY / checkpoint_factor(spec)


def candidate_scale(x: np.ndarray, granularity: str, candidate: str, spec: FormatSpec
                    ) -> np.ndarray:
    """The dequantization scale (vLLM's direction) of every group, broadcastable to x,
    computed in float64 and given as float32 (never below ``smallest_scale``).  Raises
    ``TinyScale`` where a nonzero group's amax / fp8_max is below it."""
    axes = _group_axes(granularity)
    amax = group_amax(x, granularity).astype(np.float64)
    base = np.where(amax > 0, amax / spec.max, 1.0)
    floor = smallest_scale(spec)
    if candidate != "unit" and (base < floor).any():
        small = float(amax[base < floor].max())
        where = {"tensor": "", "head": " in a head", "token-head": " in a token's head"}
        raise TinyScale(f"|x| is at most {small:.3g}{where[granularity]}: its scale, amax / "
                        f"{spec.max:g} = {small / spec.max:.3g}, is below float32's "
                        "smallest normal (2^-126 ~ 1.18e-38), the width of vLLM's scales",
                        "multiply the dump by a power of two, say 2^64, and divide its "
                        "scales by it")
    if candidate == "unit":
        return np.ones_like(base, dtype=np.float32)
    if candidate == "amax":
        return base.astype(np.float32)
    if candidate == "amax-x2":
        return (2 * base).astype(np.float32)
    if candidate == "p99.99":
        q = np.quantile(np.abs(x), 0.9999, axis=axes, keepdims=True)
        return np.maximum(np.where(q > 0, q / spec.max, base), floor).astype(np.float32)
    if candidate == "mse":
        return _mse_scale(x, base, axes, spec, floor)
    raise UsageError(Param("candidate", candidate) + f": one of {', '.join(CANDIDATES)}")


def _mse_scale(x, base, axes, spec, floor) -> np.ndarray:
    """Per group, the amax scale times 2**-m of least squared error: m on scale-search's
    coarse grid, then its fine steps around each group's best (no scale below ``floor``)."""
    from fmtcli.numerics.scaling import COARSE, FINE_STEP

    def scale(m: np.ndarray) -> np.ndarray:
        return np.maximum(base * 2.0 ** -m, floor).astype(np.float32)

    def best(margins: np.ndarray) -> np.ndarray:  # margins: (n, *group shape)
        errors = np.stack([_squared_error(x, round_trip(x, scale(m), spec)[0], axes)
                           for m in margins])
        return np.take_along_axis(margins, np.argmin(errors, axis=0)[None], 0)[0]

    coarse = best(np.broadcast_to(COARSE.reshape((-1,) + (1,) * base.ndim),
                                  (len(COARSE),) + base.shape))
    fine = coarse[None] + (np.arange(-8, 9) * FINE_STEP).reshape((-1,) + (1,) * base.ndim)
    return scale(best(fine))
