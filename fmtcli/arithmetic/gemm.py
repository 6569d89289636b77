"""The emulated FP8 GEMM of ``fmt dot`` (``arithmetic.dot``'s module docstring says what
is computed): the operands quantized per tile (``numerics.tiles``: the one tile amax and
scaled cast, ``code = cast(x * scale)``, ``x_q = code * d`` with the float32
dequantization scale ``d = 1 / scale``), the limited accumulator (the aligned-and-cut
tensor-core model, or an ordinary format), promotion to FP32 every NC elements of K, run
tile by tile of the outputs.  Every value is float32 or float64 (units of the inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fmtcli.base.choices import AccumulationRounding, Granularity, OverflowPolicy, RoundingMode
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.scaling import amax_to_scale
from fmtcli.numerics.tiles import is_narrow, per_element, tile_amax, to_codes

#: Products added in one fused step: the K of one Hopper FP8 wgmma (m64nNk32).
GROUP = 32
#: The default accumulator: 13 fraction bits (14 significant), DeepSeek-V3's "around 14 bits".
DEFAULT_BITS = 13
#: Bytes of one tile's products (M_t x group x N_t): the emulation runs tile by tile.
TILE_BYTES = 32 << 20


def tiles(m: int, n: int, group: int, itemsize: int = 8) -> tuple[int, int]:
    """Rows and columns of the output tiles: one tile's products (rows x group x cols) fill
    at most TILE_BYTES (whole rows where they fit)."""
    per_column = group * itemsize
    cols = min(n, max(1, TILE_BYTES // per_column))
    rows = min(m, max(1, TILE_BYTES // (per_column * cols)))
    return rows, cols



# -- quantization --------------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """One quantized operand: its codes (float32 values of the format), its float32
    dequantization scales ``d = 1 / scale`` in their own grid, and ``x_q = code * d``."""

    codes: np.ndarray
    dequant: np.ndarray
    values: np.ndarray  # float64, code * d (exact)


def quantize_operand(x: np.ndarray, spec: FormatSpec, rows: int, cols: int) -> Operand:
    """``x`` scaled per tile of rows x cols (the whole matrix for a tensor scale), cast to
    ``spec`` (float32 product, saturating nearest-even), with its dequantization scales;
    a wide format (``is_narrow`` false) is cast with scale 1."""
    x32 = np.asarray(x, dtype=np.float32)
    rows, cols = min(rows, x.shape[0]), min(cols, x.shape[1])  # a tile beyond x: all of x
    amax = tile_amax(x32, rows, cols)
    if is_narrow(spec):
        scale = amax_to_scale(amax, spec).astype(np.float32)
    else:
        scale = np.ones(amax.shape, dtype=np.float32)
    dequant = (np.float32(1.0) / scale).astype(np.float32)
    codes = to_codes(x32, spec, per_element(scale, rows, cols, x.shape))
    # products of codes must be exact: float32 holds 24 significant bits, 2 x 12 at most
    exact32 = codes.dtype != np.float64 and spec.mantissa_bits <= 11
    codes = np.asarray(codes, dtype=np.float32 if exact32 else np.float64)
    d = per_element(dequant, rows, cols, x.shape).astype(np.float64)
    return Operand(codes, dequant, codes.astype(np.float64) * d)


def operand_groups(kind: str, block: int | None) -> tuple[ScaleGroup, ScaleGroup]:
    """What one scale covers in A (M x K) and in B (K x N) for ``fmt dot``'s granularity:
    ``tensor`` both; ``row`` a row of A and a column of B (torch's rowwise scaling);
    ``block`` (DeepSeek-V3 §3.3.1) a 1 x BS block of A along K and a BS x BS tile of B."""
    if kind == "tensor":
        return ScaleGroup(Granularity.TENSOR), ScaleGroup(Granularity.TENSOR)
    if kind == "row":
        return ScaleGroup(Granularity.ROW), ScaleGroup(Granularity.COLUMN)
    return (ScaleGroup(Granularity.BLOCK, block),
            ScaleGroup(Granularity.TILE, tile=(block, block)))


def quantize_operands(a: np.ndarray, b: np.ndarray, spec: FormatSpec, kind: str,
                      block: int | None) -> tuple[Operand, Operand]:
    """A and B quantized with the tiles of ``kind`` (``operand_groups``; ``arithmetic.dot``'s
    module docstring, item 1)."""
    group_a, group_b = operand_groups(kind, block)
    return (quantize_operand(a, spec, *group_a.tile_shape(*a.shape)),
            quantize_operand(b, spec, *group_b.tile_shape(*b.shape)))


# -- the accumulator -----------------------------------------------------------------------

def _cut(x: np.ndarray, rounding: AccumulationRounding) -> np.ndarray:
    """To an integer: toward zero, or to nearest with ties to even."""
    return np.trunc(x) if rounding is AccumulationRounding.TOWARD_ZERO else np.rint(x)


def round_to_bits(x: np.ndarray, bits: int, rounding: AccumulationRounding) -> np.ndarray:
    """``x`` (float64) to a float of ``bits`` fraction bits (bits + 1 significant), with an
    unbounded exponent."""
    _, e = np.frexp(x)  # x = f * 2**e, 0.5 <= |f| < 1: the leading bit is worth 2**(e - 1)
    inverse = np.ldexp(1.0, bits + 1 - e)
    return _cut(x * inverse, rounding) / inverse


def aligned_step(acc: np.ndarray, products: np.ndarray, bits: int,
                 rounding: AccumulationRounding) -> np.ndarray:
    """One fused step of the tensor-core model: ``acc`` (M x N, float64) plus
    ``products`` (M x g x N): every term aligned to the largest exponent among them and cut
    to ``bits`` fraction bits below its leading bit, the cut terms added exactly, the sum cut
    to ``bits`` fraction bits again (module docstring, item 3)."""
    top = np.maximum(np.abs(acc), np.abs(products).max(axis=1))
    _, e = np.frexp(top)
    inverse = np.ldexp(1.0, bits + 1 - e)  # one unit of the aligned grid is 1 / inverse
    if products.dtype == np.float32 and bits <= 22:  # exact in float32: the cheap path
        inverse_w = inverse.astype(np.float32)[:, None, :]
    else:
        inverse_w = inverse[:, None, :]
    terms = _cut(products * inverse_w, rounding).sum(axis=1, dtype=np.float64)
    total = (terms + _cut(acc * inverse, rounding)) / inverse
    return round_to_bits(total, bits, rounding)


def format_step(acc: np.ndarray, products: np.ndarray, spec: FormatSpec,
                rounding: AccumulationRounding) -> np.ndarray:
    """One step of an ordinary accumulator in ``spec``: ``acc + sum(products)`` (exact in
    float64 for FP8 products) rounded once to ``spec``."""
    total = acc + products.sum(axis=1, dtype=np.float64)
    mode = RoundingMode(rounding.value)
    return np.asarray(round_to_format(total, spec, mode, OverflowPolicy.IEEE), dtype=np.float64)


def _k_factor(a: Operand, b: Operand, kind: str, block: int | None, k0: int,
              n: int, c0: int = 0) -> np.ndarray | np.float32:
    """The float32 dequantization factor ``d_a * d_b`` of the K range starting at k0 (one
    scale block), per output or for all; B's columns start at ``c0`` (a tile)."""
    if kind == "tensor":
        return np.float32(a.dequant[0, 0] * b.dequant[0, 0])
    if kind == "row":
        return (a.dequant[:, :1] * b.dequant[:1, :]).astype(np.float32)
    kb = k0 // block
    db = b.dequant[kb:kb + 1, np.arange(c0, c0 + n) // block]  # each column's block
    return (a.dequant[:, kb:kb + 1] * db).astype(np.float32)


def emulate_gemm(a: Operand, b: Operand, kind: str, block: int | None, *,
                 bits: int | None = DEFAULT_BITS, accumulator: FormatSpec | None = None,
                 rounding: AccumulationRounding = AccumulationRounding.TOWARD_ZERO,
                 promote_every: int | None = None, group: int = GROUP) -> np.ndarray:
    """The float32 output C of the GEMM of two quantized operands with the limited
    accumulator (``bits`` or ``accumulator``) in steps of ``group`` products, promoted to
    FP32 every ``promote_every`` elements of K (None: never)."""
    m, k = a.codes.shape
    n = b.codes.shape[1]
    interval = k if promote_every is None else promote_every
    if kind == "block" and k > block and block % interval:
        if promote_every is None:
            raise UsageError(f"block:{block} scales change along K every {block}: promote "
                             f"the partial sums within each block (e.g. "
                             + Param("promote_every", block) + ")")
        raise UsageError(Param("promote_every", interval) + " does not divide the scale block "
                         f"{block}: a partial sum must stay within one block")
    out = np.zeros((m, n), dtype=np.float32)
    wide = a.codes.dtype == np.float64 or b.codes.dtype == np.float64
    rows, cols = tiles(m, n, group, 8 if wide else 4)
    for r0 in range(0, m, rows):  # every output depends on its row of A and column of B
        ta = Operand(a.codes[r0:r0 + rows], a.dequant if kind == "tensor" else
                     a.dequant[r0:r0 + rows], a.values[r0:r0 + rows])
        for c0 in range(0, n, cols):
            tb = Operand(b.codes[:, c0:c0 + cols], b.dequant if kind == "tensor" else
                         b.dequant[:, c0:c0 + cols] if kind == "row" else b.dequant,
                         b.values[:, c0:c0 + cols])
            out[r0:r0 + rows, c0:c0 + cols] = _emulate_tile(
                ta, tb, kind, block, c0, bits, accumulator, rounding, interval, group, wide)
    return out


def _emulate_tile(a: Operand, b: Operand, kind: str, block: int | None, c0: int,
                  bits: int | None, accumulator: FormatSpec | None,
                  rounding: AccumulationRounding, interval: int, group: int,
                  wide: bool) -> np.ndarray:
    """The outputs of one tile: A's rows and B's columns (from column ``c0`` of B, which
    keeps its whole block scales), K in steps of ``group``, promoted every ``interval``."""
    m, k = a.codes.shape
    n = b.codes.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    for start in range(0, k, interval):
        stop = min(start + interval, k)
        acc = np.zeros((m, n), dtype=np.float64)
        for g0 in range(start, stop, group):
            g1 = min(g0 + group, stop)
            pa = a.codes[:, g0:g1]
            pb = b.codes[g0:g1, :]
            if wide:
                pa, pb = pa.astype(np.float64), pb.astype(np.float64)
            products = pa[:, :, None] * pb[None, :, :]  # (M, g, N), exact
            if accumulator is None:
                acc = aligned_step(acc, products, bits, rounding)
            else:
                acc = format_step(acc, products, accumulator, rounding)
        factor = _k_factor(a, b, kind, block, start, n, c0)
        with np.errstate(over="ignore", invalid="ignore"):
            out = (out + acc.astype(np.float32) * factor).astype(np.float32)
    return out


def exact_products(a: Operand, b: Operand) -> np.ndarray:
    """The float64 product of the quantized inputs (the accumulation's reference)."""
    return a.values @ b.values
