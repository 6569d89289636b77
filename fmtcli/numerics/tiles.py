"""Tiles and the scaled cast: one amax per tile, and ``x_q = cast(x * scale) / scale``.

Every analysis that scales values into a format -- quantize's chunks, attention's Q, K, V
and P, dot's operands, kv's groups -- sees its data as matrices (``..., rows, cols``) cut
into tiles of ``tr x tc`` values that share one scale (``numerics.granularity.ScaleGroup``
says which tile); a ragged last tile (the side does not divide the matrix) is smaller.

Scale direction: multiply by the scale to enter the format's range, ``code = cast(x *
scale)``, ``x_q = code / scale`` (``scaling.amax_to_scale``).  Serving engines and
``torch._scaled_mm`` keep the other direction, *dequantization* scales ``d = 1 / scale``
(``x ~ code * d``: vLLM's ``k_scale``); ``dequant=True`` takes such a ``d`` and computes
``cast(x / d)`` and ``code * d`` as they do (not the same floats as ``x * (1 / d)``).
The product has the dtype of ``x`` and the scale (float32 x float32: a float32 product,
as the kernels compute it).
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.choices import Granularity, OverflowPolicy, RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.rounding import beyond_threshold, round_to_format
from fmtcli.numerics.scaling import amax_to_scale

_MAGNITUDE = {np.dtype(np.float32): (np.uint32, np.uint32(0x7FFFFFFF)),
              np.dtype(np.float64): (np.uint64, np.uint64(0x7FFFFFFFFFFFFFFF))}


# -- formats that are scaled ---------------------------------------------------------------

def is_narrow(spec: FormatSpec) -> bool:
    """Whether ``spec`` (8 bits or fewer: FP8, FP6, FP4) is scaled into range, as FP8
    kernels use it; wider formats (FP16, BF16, FP32) are cast as they are (scale 1):
    scaling them to their max would only overflow the products."""
    return spec.bits <= 8


def check_element_format(spec: FormatSpec, who: str) -> None:
    """Refuse a scale format (E8M0: no sign or no zero) where ``who`` ("attention", "a
    GEMM") needs a signed element format with a zero."""
    if not spec.signed or not spec.has_zero:
        raise UsageError(Param("format", spec.name) + " is a scale format (no sign or no "
                         f"zero): {who} needs a signed element format")


# -- tiles ---------------------------------------------------------------------------------

def tile_amax(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """amax of every (tr x tc) tile of the last two axes of ``x`` (..., rows, cols): an array
    (..., ceil(rows / tr), ceil(cols / tc)) of x's dtype; ragged edges count as smaller tiles.

    float32 and float64 are reduced on their bit patterns with the sign cleared: for IEEE
    floats their order as unsigned integers is the order of the magnitudes, and NaN patterns
    sort above inf, so a tile holding NaN gets a NaN amax (as torch.amax).  Integer max is
    the faster reduction.  Other dtypes take ``max(|x|)``.
    """
    *lead, rows, cols = x.shape
    pr, pc = (-rows) % tr, (-cols) % tc
    magnitude = _MAGNITUDE.get(x.dtype)
    if magnitude is None:
        a = np.abs(x)
    else:
        carrier, mask = magnitude
        a = np.bitwise_and(x.view(carrier), mask)
    if pr or pc:
        a = np.pad(a, ((0, 0),) * len(lead) + ((0, pr), (0, pc)))
    if tr == 1:
        amax = a.reshape(*lead, a.shape[-2], -1, tc).max(axis=-1)
    else:
        amax = a.reshape(*lead, a.shape[-2] // tr, tr, -1, tc).max(axis=(-3, -1))
    return amax if magnitude is None else amax.view(x.dtype)


def per_element(grid: np.ndarray, tr: int, tc: int, shape: tuple[int, int]) -> np.ndarray:
    """A 2-D grid of per-tile values (one per tr x tc tile) repeated over its tiles and cut
    to ``shape`` (rows, cols): every element's value."""
    return np.repeat(np.repeat(grid, tr, axis=0), tc, axis=1)[:shape[0], :shape[1]]


def tile_view(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """``x`` (..., rows, cols) zero-padded to whole tiles and viewed as (..., rows / tr,
    tr, cols / tc, tc): a grid of per-tile values ``g`` broadcasts as
    ``g[..., :, None, :, None]``.  ``untile`` undoes it."""
    *lead, rows, cols = x.shape
    pr, pc = (-rows) % tr, (-cols) % tc
    if pr or pc:
        x = np.pad(x, ((0, 0),) * len(lead) + ((0, pr), (0, pc)))
    return x.reshape(*lead, (rows + pr) // tr, tr, (cols + pc) // tc, tc)


def untile(view: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A ``tile_view`` back as (..., rows, cols), its padding cut (``shape``: rows, cols)."""
    *lead, n_r, tr, n_c, tc = view.shape
    return view.reshape(*lead, n_r * tr, n_c * tc)[..., :shape[0], :shape[1]]


# -- the scaled cast -----------------------------------------------------------------------

def to_codes(x: np.ndarray, spec: FormatSpec, scale, *, dequant: bool = False,
             rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
             overflow: OverflowPolicy = OverflowPolicy.SATURATE,
             count_clipped: bool = False, product_dtype=None):
    """``cast(x * scale)`` (``dequant``: ``cast(x / scale)``, ``scale`` a dequantization
    scale), ``scale`` broadcastable to ``x``; rounded by ``rounding.round_to_format``
    (saturating by default, as scaled recipes cast).  The product is in the dtype of ``x``
    and ``scale`` (``product_dtype``: rounded to it first, as a kernel that holds it in
    float32 does).  The codes are values of ``spec``, in the product's dtype (float64 for
    a format past float32's range).  ``count_clipped``: also how many products reach
    ``rounding.beyond_threshold`` (those that would round past the format's max: 448.01
    rounds to 448 and is not one), as ``(codes, count)``."""
    product = np.divide(x, scale) if dequant else np.multiply(x, scale)
    if product_dtype is not None:
        product = product.astype(product_dtype, copy=False)
    codes = round_to_format(product, spec, rounding, overflow)
    if not count_clipped:
        return codes
    limit = beyond_threshold(spec, rounding, product.dtype)
    return codes, int(np.count_nonzero(np.abs(product) >= limit))


def from_codes(codes: np.ndarray, scale, *, dequant: bool = False) -> np.ndarray:
    """The values the codes stand for: ``codes / scale`` (``dequant``: ``codes * scale``)."""
    return np.multiply(codes, scale) if dequant else np.divide(codes, scale)


def scaled_cast(x: np.ndarray, spec: FormatSpec, scale, *, dequant: bool = False,
                rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                overflow: OverflowPolicy = OverflowPolicy.SATURATE) -> np.ndarray:
    """``x_q = cast(x * scale) / scale`` (``dequant``: ``cast(x / d) * d``): ``to_codes``
    then ``from_codes``."""
    codes = to_codes(x, spec, scale, dequant=dequant, rounding=rounding, overflow=overflow)
    return from_codes(codes, scale, dequant=dequant)


def amax_scaled_cast(x: np.ndarray, spec: FormatSpec, group: ScaleGroup,
                     amax: float | None = None) -> np.ndarray:
    """``x`` (..., rows, cols) as float32 through the scaled cast with the amax rule of
    ``scaling.amax_to_scale`` (float32 product, saturating nearest-even): one scale per
    tile of ``group`` in each matrix of the last two axes, or, for a ``tensor`` group, one
    for all of ``x`` (``amax``: that scale's amax, where ``x`` is part of a larger tensor)."""
    x = np.asarray(x, dtype=np.float32)
    if group.kind is Granularity.TENSOR:
        if amax is None:
            amax = float(tile_amax(x.reshape(1, -1), 1, x.size)[0, 0])
        scale = np.float32(amax_to_scale(np.float64(amax), spec))
        return scaled_cast(x, spec, scale).astype(np.float32, copy=False)
    tr, tc = group.tile_shape(*x.shape[-2:], x.ndim)
    scale = amax_to_scale(tile_amax(x, tr, tc), spec)[..., :, None, :, None]
    out = scaled_cast(tile_view(x, tr, tc), spec, scale).astype(np.float32, copy=False)
    return untile(out, x.shape[-2:])
