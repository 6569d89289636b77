"""The per-chunk arithmetic of ``fmt quantize``: tile amax, scales, scaled cast, statistics.

Direction: ``x_q = cast(x * scale) / scale``.  One ``ChunkKernel`` applies one scheme to one
2-D float32 (or float64) chunk of a tensor's matrix view; ``quantize`` streams the chunks.
A bfloat16 or float16 chunk may come as stored: the compiled kernel reads it so, and the
numpy path widens it to float32 first (``widened``).

The product ``x * scale`` follows the scheme's ``product`` (``scaling.Product``): under
``float32`` the chunk is taken as float32 (float64 data rounded to float32; a finite value
beyond float32's range is a ``DataError``), the scales are float32 and so is the product;
under ``exact`` data, scales and product are float64.  Statistics compare ``x_q`` with the
data as read (float64 stays float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.base.errors import DataError, Param, shown
from fmtcli.numerics import native
from fmtcli.numerics.backends import Backend, Device, cast_with_policy
from fmtcli.numerics.formats import Specials, get_format
from fmtcli.numerics.rounding import (
    PositionalUniform,
    RoundingMode,
    apply_range,
    beyond_threshold,
    count_above_max,
    fits_float32,
    magic_rounding_applies,
    round_float32_nearest_even,
    round_unbounded,
)
from fmtcli.numerics.scaling import (
    F32_MAX,
    F32_TINY,
    NVFP4_SCALE_FORMAT,
    Product,
    ScaleRule,
    amax_to_scale,
    scale_to_e4m3,
)
from fmtcli.numerics.schemes import OverflowPolicy, ScaleFormat, Scheme
from fmtcli.numerics.tiles import tile_amax
from fmtcli.streaming.blocks import block_sizes
from fmtcli.streaming.metrics import ErrorAccumulator
from fmtcli.streaming.stream import widen


@dataclass
class Plan:
    """One scheme applied to one tensor: its tile and, if global, its precomputed scales."""

    scheme: Scheme
    tile: tuple[int, int]
    is_global: bool  # its tiles span every row (or the whole single row): scales come first
    needs_tensor_amax: bool = False  # NVFP4's two-level scales need the tensor's amax first
    scales: np.ndarray | None = None  # global schemes: (1, n_tile_columns)
    tensor_scale: float | None = None  # NVFP4's float32 per-tensor scale


def chunk_amax(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """``numerics.tiles.tile_amax`` as float32 (float64 data: float64), by the compiled
    kernel for a contiguous float32, bfloat16 or float16 chunk where it is built (one pass,
    no padded or widened copy), else by numpy."""
    kernel = native.module()
    if kernel is None or native.kind_of(x.dtype) is None or not x.flags.c_contiguous:
        return tile_amax(x if x.dtype.itemsize > 2 else widen(x, np.float32), tr, tc)
    rows, cols = x.shape
    out = np.empty((-(-rows // tr), -(-cols // tc)), np.float32)
    buffer, kind = native.values(x)
    kernel.tile_amax(buffer, rows, cols, tr, tc, out, kind)
    return out


def widened(x: np.ndarray, shared: dict) -> np.ndarray:
    """A chunk read as stored (bfloat16, float16: ``ChunkReader.read(as_stored=True)``) as
    float32, widened once per chunk and kept in ``shared`` for the chunk's other schemes;
    float32 and float64 chunks as they are."""
    if x.dtype.itemsize > 2:
        return x
    if "widened" not in shared:
        shared["widened"] = widen(x, np.float32)
    return shared["widened"]


def tile_percentile(x: np.ndarray, tr: int, tc: int, q: float) -> np.ndarray:
    """The q-th percentile (in percent, linear interpolation) of |x| in every (tr x tc) tile
    of an unpadded chunk; a ragged edge tile counts only its own elements, and a tile
    holding NaN gets NaN (as its amax would)."""
    rows, cols = x.shape
    pr, pc = (-rows) % tr, (-cols) % tc
    a = np.abs(x)
    if pr or pc:
        a = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    grid = a.reshape(a.shape[0] // tr, tr, a.shape[1] // tc, tc).transpose(0, 2, 1, 3)
    flat = grid.reshape(grid.shape[0], grid.shape[1], tr * tc)
    if pr or pc:
        result = np.nanpercentile(flat, q, axis=2)
        result[np.isnan(tile_amax(x, tr, tc))] = np.nan  # NaN of the data, not the padding
    else:
        result = np.percentile(flat, q, axis=2)
    return result.astype(x.dtype)


def scales_for(amax: np.ndarray, plan: Plan) -> np.ndarray:
    """Scales for tile amaxes under the plan's scheme (x_q = cast(x*scale)/scale): float32,
    float64 under the exact product (``scaling.amax_to_scale``); NVFP4's are float32 always
    (its scale format is pinned: E4M3 times float32)."""
    scheme = plan.scheme
    if scheme.scale_format is ScaleFormat.E4M3_FP32:
        # NVFP4: decode scale per block d = e4m3(amax / max_elem * g), g the tensor scale;
        # the element is cast(x * g / d).  d may be an E4M3 subnormal or 0, as Transformer
        # Engine computes it (torchao clamps d up to 2**-6, E4M3's smallest normal; blocks far
        # below the tensor's amax then differ).  A block whose d underflows to 0 decodes to 0.
        # Its scale g / 0 is inf; the kernel writes its x_q as 0.
        g = np.float32(plan.tensor_scale)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            decode = scale_to_e4m3(amax.astype(np.float32) / np.float32(scheme.format.max) * g)
            scale = g / decode
        return np.where(amax == 0, np.float32(1), scale).astype(np.float32)
    kernel = native.module()
    if (kernel is not None and scheme.scale_rule is ScaleRule.AMAX
            and scheme.product is Product.FLOAT32 and amax.dtype == np.float32
            and scheme.format.max <= F32_MAX and amax.flags.c_contiguous):
        out = np.empty(amax.shape, np.float32)  # the same rule in one compiled loop
        kernel.amax_scales(amax, out, amax.size, np.float32(scheme.format.max),
                           2.0 ** -scheme.margin)
        return out
    return amax_to_scale(amax, scheme.format, scheme.scale_rule, scheme.margin, scheme.product)


def nvfp4_tensor_scale(amax: float, scheme: Scheme) -> float:
    """NVFP4's per-tensor float32 scale: amax maps to max_elem * max_e4m3 (6 * 448: the
    largest value a block can hold, its largest E4M3 block scale times FP4's max), kept in
    float32's normal range (beyond it, under the exact product, the largest values saturate
    rather than the scale becoming 0 or inf)."""
    if not (amax > 0) or not math.isfinite(amax):
        return 1.0
    block_scale_max = get_format(NVFP4_SCALE_FORMAT).max  # 448
    return float(np.float32(min(max(scheme.format.max * block_scale_max / amax, F32_TINY),
                                F32_MAX)))


def _positions(origin: tuple[int, int, int], padded: tuple[int, int], shape4) -> np.ndarray:
    """Element index in the whole matrix of every element of a padded chunk, in the order of
    its tile view (padding gets indices too; it holds zeros, which round to zero anyway)."""
    row0, col0, cols = origin
    rows = np.arange(row0, row0 + padded[0], dtype=np.uint64) * np.uint64(cols)
    index = rows[:, None] + np.arange(col0, col0 + padded[1], dtype=np.uint64)[None, :]
    return index.reshape(shape4)


def _wide_quotient(r: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``r / scale`` for a float64 rounding ``r`` of a float32 product (a format reaching
    past float32's max): the float32 quotient where it is finite, as the float32 rule
    divides (float64 division then one rounding to float32 is the correctly rounded float32
    quotient: 53 >= 2 * 24 + 2 bits), else the float64 one (2**128 / 0.5 is no float32)."""
    wide = r / scale.astype(np.float64)
    narrow = wide.astype(np.float32).astype(np.float64)
    return np.where(np.isfinite(narrow) | ~np.isfinite(wide), narrow, wide)


_SCRATCH = [np.empty(0, np.float32)]


def scratch(size: int) -> np.ndarray:
    """A float32 work array of ``size`` values for the compiled kernel, one per process
    and reused by every kernel and chunk: a fresh array per scheme costs a page fault per
    page written (measured: 29 candidate scales of a 384 x 384 tensor ran at 2.6 ns a
    value instead of 0.4)."""
    if _SCRATCH[0].size < size:
        _SCRATCH[0] = np.empty(max(size, 2 * _SCRATCH[0].size), np.float32)
    return _SCRATCH[0][:size]


@dataclass
class BlockFacts:
    """What one chunk's blocks did (schemes whose blocks fit in a chunk): per block, values
    flushed to zero and values in it; how many blocks saturated a value; with worst blocks
    asked for, each block's largest relative error (NaN where it has no nonzero value)."""

    flushed: np.ndarray  # (block rows, block columns) of the chunk
    sizes: np.ndarray
    saturating: int
    amax: np.ndarray
    scale: np.ndarray
    max_rel: np.ndarray | None = None


class ChunkKernel:
    """The per-chunk work of one scheme: scale, cast, divide back, accumulate statistics."""

    def __init__(self, plan: Plan, seed: int, backend: Backend = Backend.NUMPY,
                 device: Device = Device.CPU, name: str = "tensor", worst: int = 0,
                 mse_only: bool = False) -> None:
        self.plan = plan
        self.mse_only = mse_only  # only the squared errors (scale-search's MSE search)
        self.worst = worst  # > 0: each block's largest relative error too (worst blocks)
        self.name = name  # the tensor's, for messages
        self.exact = plan.scheme.product is Product.EXACT
        self.spec = plan.scheme.format
        self.seed = seed
        self.backend, self.device = backend, device
        # below it no value can round past max under this rounding mode (per working dtype)
        self.thresholds = {dtype: beyond_threshold(self.spec, plan.scheme.rounding, dtype)
                           for dtype in (np.dtype(np.float32), np.dtype(np.float64))}
        # a format reaching past float32's max (e8m3fn): float32 products round in float64
        self.wide = not fits_float32(self.spec)
        self.fast = (plan.scheme.rounding is RoundingMode.NEAREST_EVEN
                     and magic_rounding_applies(self.spec))
        self.two_level = plan.scheme.scale_format is ScaleFormat.E4M3_FP32
        # Formats whose only range rule is max (no -0 rule, zero and sign as float32 has).
        self.plain = (self.spec.signed and self.spec.has_zero
                      and self.spec.specials is not Specials.FNUZ)
        # the compiled kernel (native.py) takes what the magic-number rounding of a float32
        # product does, on the numpy backend, for formats whose only range rule is max; fnuz
        # formats too (their -0 becomes +0, which no statistic tells apart; codes are never
        # written by the kernel)
        self.native = (native.module() if self.fast and not self.wide and not self.exact
                       and self.spec.signed and self.spec.has_zero
                       and backend is Backend.NUMPY else None)
        # values past max saturate (the policy, or a format with no inf or NaN)
        self.saturates = (plan.scheme.overflow is OverflowPolicy.SATURATE
                          or not (self.spec.has_inf or self.spec.has_nan))
        if self.native is not None:
            m = self.spec.mantissa_bits
            self.magic = (int(np.float32(self.spec.smallest_normal).view(np.uint32)),
                          int(np.float32(2.0 ** (self.spec.max_exponent + 1))
                              .view(np.uint32)),
                          (23 - m) << 23)

    def run(self, x: np.ndarray, origin: tuple[int, int, int], hist: np.ndarray,
            keep: str | None, shared: dict | None = None):
        """Quantize one chunk; returns (accumulator, scales of its tiles or None, kept array,
        ``BlockFacts`` or None: schemes whose tiles span the chunk's rows have none).

        ``origin``: (first row, first column, columns of the whole matrix), which places the
        chunk's elements for stochastic rounding.  ``keep``: None, "values" (x_q) or "codes"
        (the rounded x * scale, on the format's grid).  ``shared``: a dict shared by the
        schemes of one chunk (cached sums).
        """
        with np.errstate(all="ignore"):  # NaN/inf in the data are counted, not warned about
            return self._run(x, origin, hist, keep, {} if shared is None else shared)

    def _working(self, xp: np.ndarray) -> np.ndarray:
        """The chunk as the product sees it: float32 (the float32 rule; float64 data rounded,
        a finite value beyond float32's range refused) or float64 (exact)."""
        if self.exact:
            return xp.astype(np.float64, copy=False)
        if xp.dtype == np.float32:
            return xp
        xw = xp.astype(np.float32)
        if np.isinf(xw).any():
            beyond = np.isinf(xw) & np.isfinite(xp)
            if beyond.any():
                big = float(np.max(np.abs(xp[beyond])))
                raise DataError(f"{shown(self.name)}: a value of magnitude {big:.4g} lies "
                                "beyond float32's range (3.4e38), where the float32 product "
                                "x * scale cannot hold it",
                                "use " + Param("product", "exact")
                                + ": float64 scales and products")
        return xw

    def _run(self, x, origin, hist, keep, shared):
        plan, spec, scheme = self.plan, self.spec, self.plan.scheme
        # a bfloat16/float16 chunk as stored goes to the compiled kernel as it is (no
        # widened copy); what else needs float32 values widens it (once per chunk)
        as_stored = x.dtype.itemsize == 2
        if as_stored and (self.native is None or keep is not None
                          or scheme.scale_rule is ScaleRule.PERCENTILE):
            x, as_stored = widened(x, shared), False
        tr, tc = plan.tile
        rows, cols = x.shape
        if plan.is_global:
            tr = rows  # the chunk is one band of the global tiles
            tc = min(tc, cols)  # a tile spanning a long row: the chunk is part of one tile
        pr, pc = (-rows) % tr, (-cols) % tc
        xp = np.pad(x, ((0, pr), (0, pc))) if (pr or pc) else x
        padding = xp.size - x.size
        # what gets scaled: float32, or float64 (exact product); the kernel's own for a
        # chunk as stored
        xw = None if as_stored else self._working(xp)
        local_scales = local_amax = x_max = None
        in_range = False  # known that no |x * scale| exceeds the format's max
        peak = None  # max |x * scale| bound of the chunk (local scales)
        if plan.is_global:
            scale = plan.scales
        else:
            # the unpadded chunk where it is what gets scaled (padding is zeros, which never
            # raise an amax): the compiled kernel's one pass, no padded copy
            amax = (chunk_amax(x, tr, tc) if as_stored or x.dtype == xw.dtype
                    else tile_amax(xw, tr, tc))
            x_max = float(amax.max())
            if scheme.scale_rule is ScaleRule.PERCENTILE:
                scale = scales_for(tile_percentile(xw[:rows, :cols], tr, tc,
                                                   scheme.percentile), plan)
            else:
                scale = scales_for(amax, plan)
            local_scales = scale
            local_amax = amax
            # |x * scale| <= fl(amax * scale) in the data's own arithmetic (rounding is
            # monotone), so this bounds every scaled value exactly
            peak = float(np.max(amax * scale.astype(amax.dtype)))
            # all round to at most max (under this scheme's rounding mode); False for NaN
            in_range = peak < self.thresholds[amax.dtype]
        plain = self.plain and keep != "codes"
        if self.native is not None and keep is None and (as_stored or xp.dtype == np.float32):
            done = self._run_native(x, xp, scale, (tr, tc), padding, hist, shared, x_max,
                                    in_range, peak, local_amax)
            if done is not None:
                return done
        if as_stored:  # the kernel left the chunk to numpy: its float32 values
            x = widened(x, shared)
            xp = np.pad(x, ((0, pr), (0, pc))) if (pr or pc) else x
            xw = self._working(xp)
        shape4 = (xp.shape[0] // tr, tr, xp.shape[1] // tc, tc)
        dead = None
        if self.two_level and np.isinf(scale).any():  # NVFP4 blocks that decode to 0
            dead = np.isinf(scale)
            scale = np.where(dead, np.float32(0), scale)  # x * 0: no spurious saturation
        s4 = scale[:, None, :, None]
        xs = np.multiply(xw.reshape(shape4), s4.astype(xw.dtype, copy=False))
        flat = xs.reshape(-1)
        if self.wide and flat.dtype == np.float32:  # its roundings may lie past float32's max
            flat = flat.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            if self.backend is not Backend.NUMPY:  # the cast of ml_dtypes or torch itself
                # saturate: clamp to max first, as recipes do; ieee: the backend's own cast
                r = cast_with_policy(flat, spec, self.backend, self.device, scheme.overflow)
                # beyond max as the engine counts it: what nearest-even puts past max
                past = np.flatnonzero(np.abs(flat) > spec.max)
                ub = round_unbounded(flat[past], spec, RoundingMode.NEAREST_EVEN)
                counted = (np.abs(ub) > spec.max) & ~(np.isinf(flat[past])
                                                     & ~np.isfinite(r[past]))
                if not spec.signed:
                    counted &= flat[past] >= 0
                counts = {"beyond": int(np.count_nonzero(counted)),
                          "above": count_above_max(flat[past], spec),
                          "overflowed": int(np.count_nonzero(counted & ~np.isfinite(r[past]))),
                          "saturated_at": past[counted & np.isfinite(r[past])]}
            elif self.fast and flat.dtype == np.float32:
                r = round_float32_nearest_even(flat, spec)
            else:
                rng = None
                if scheme.rounding is RoundingMode.STOCHASTIC:
                    rng = PositionalUniform(self.seed, _positions(origin, xp.shape, shape4))
                r = round_unbounded(flat, spec, scheme.rounding, rng)
            if self.backend is Backend.NUMPY:
                counts = {"beyond": 0, "overflowed": 0, "where": not plan.is_global}
                if not (in_range and plain):  # values beyond max, or the format's own rules
                    r = apply_range(flat, r, spec, scheme.rounding, scheme.overflow, counts)
        overflowed = counts["overflowed"]
        saturated = counts["beyond"] - overflowed
        # |x * scale| > max; where the range step was skipped nothing rounded past max, but
        # values between max and the rounding threshold may lie above it
        above = counts.get("above")
        if above is None:
            above = count_above_max(flat, spec) if peak is None or peak > spec.max else 0
        with np.errstate(invalid="ignore", divide="ignore"):
            if r.dtype == xs.dtype:
                x_q = np.divide(r.reshape(shape4), s4, out=xs)
            else:  # a wide format's float64 rounding of the float32 product (see _wide_quotient)
                x_q = _wide_quotient(r.reshape(shape4), s4)
            if dead is not None:
                x_q[np.broadcast_to(dead[:, None, :, None], shape4)] = 0
        x_q4 = x_q
        x_q = x_q.reshape(xp.shape)
        if padding and not spec.has_zero:  # padding is 0, which such formats make NaN
            x_q[rows:, :] = 0
            x_q[:, cols:] = 0
        kept = None
        if keep == "codes":
            kept = r.reshape(xp.shape)[:rows, :cols].copy()
        acc = ErrorAccumulator(hist=hist)
        acc.add_chunk(xp, x_q, saturated, overflowed, padding, x_max=x_max, shared=shared,
                      mse_only=self.mse_only, raw=x, above_max=above)
        facts = None
        if not plan.is_global and not self.mse_only:
            facts = self._facts(xp.reshape(shape4), x_q4, (rows, cols), shape4, acc.flushed,
                                counts.get("saturated_at"), local_amax, local_scales)
        if keep == "values":
            kept = x_q[:rows, :cols]
        return acc, local_scales, kept, facts

    def _run_native(self, x, xp, scale, tile, padding, hist, shared, x_max, in_range, peak,
                    amax):
        """The chunk by the compiled kernel: the same statistics as the numpy path below,
        to the bit.  None where it does not apply (inf or NaN in the chunk or its scales,
        a value that rounds past max under an overflow policy that does not saturate, a
        result that is not finite): the numpy path then does the chunk."""
        plan = self.plan
        tr, tc = tile
        rows, cols = xp.shape
        scale = np.ascontiguousarray(scale, dtype=np.float32)
        if scale.shape != (rows // tr, cols // tc):
            return None
        if plan.is_global:  # |x * s| <= fl(max|x| * max s): the whole chunk in range?
            if "amax" not in shared:  # the same for every scheme of the chunk
                shared["amax"] = chunk_amax(x, *x.shape)[0, 0]
            largest = shared["amax"]
            x_max = float(largest)
            peak = float(largest * scale.max())
            in_range = peak < self.thresholds[np.dtype(np.float32)]
        if not math.isfinite(peak):  # inf or NaN in the chunk or its scales
            return None
        if not in_range and not self.saturates:
            return None
        xp = np.ascontiguousarray(xp)
        facts = not plan.is_global and not self.mse_only
        flushed = np.empty(scale.shape, np.int64) if facts else None
        saturating = np.empty(scale.shape, np.int64) if facts and not in_range else None
        max_rel = np.empty(scale.shape, np.float32) if facts and self.worst else None
        low, high, shift = self.magic
        # max where a value may lie above it (clipped where its rounding passes max,
        # counted in any case), else inf: nothing to clip or count
        fmax = np.inf if peak <= self.spec.max else self.spec.max
        values, kind = native.values(xp)
        got = self.native.quantize_chunk(values, scale, rows, cols, tr, tc, low, high, shift,
                                         fmax, scratch(xp.size),
                                         None if self.mse_only else hist, flushed,
                                         saturating, max_rel, kind)
        if got is None:
            return None
        sum_err, max_err, sum_err2, zero_results, nan_keys, saturated, above = got
        acc = ErrorAccumulator(hist=hist)
        size = xp.size - padding
        acc.count = acc.finite_pairs = size
        acc.max_abs_err = max_err
        acc.sum_err2 = sum_err2
        if not self.mse_only:  # (mse_only: the squared errors alone, as the numpy path)
            acc.saturated = saturated
            acc.above_max = above
            acc.sum_err = sum_err
            if "sum_x2" not in shared:  # as ErrorAccumulator._add takes it, over the raw chunk
                raw, kind = native.values(np.ascontiguousarray(x))
                shared["sum_x2"] = (self.native.sum_squares(raw, raw.size, x_max, kind),
                                    0.0, 0.0)
            acc.sum_x2 = shared["sum_x2"][0]
            zeros = nan_keys - padding  # 0/0: the zeros, the padding's included
            acc.flushed = zero_results - nan_keys
            acc.zeros = zeros
            acc.nonzero = size - zeros
        block_facts = None
        if facts:
            block_facts = BlockFacts(flushed, block_sizes(x.shape[0], x.shape[1], tr, tc),
                                     0 if saturating is None
                                     else int(np.count_nonzero(saturating)),
                                     amax, scale, max_rel)
        return acc, None if plan.is_global else scale, None, block_facts

    def _facts(self, x4, x_q4, shape, shape4, any_flushed, saturated_at, amax, scale
               ) -> BlockFacts:
        """Per-block facts of the chunk (``x4``, ``x_q4``: the padded chunk in its block
        view; ``any_flushed``: the chunk's count, so that the usual chunk without a flushed
        value costs no pass).  Flushed: a nonzero finite input whose result is zero (padding
        is zero: never)."""
        flushed = np.zeros((shape4[0], shape4[2]), np.intp)
        if any_flushed:  # zero results are few: find them, then keep the nonzero inputs
            at = np.flatnonzero(x_q4 == 0)
            x = x4.reshape(-1)[at]
            at = at[(x != 0) & np.isfinite(x)]
            a, _, c, _ = np.unravel_index(at, shape4)
            np.add.at(flushed, (a, c), 1)
        saturating = 0
        if saturated_at is not None and saturated_at.size:
            a, _, c, _ = np.unravel_index(saturated_at, shape4)
            saturating = int(np.count_nonzero(np.bincount(a * shape4[2] + c)))
        tr, tc = shape4[1], shape4[3]
        facts = BlockFacts(flushed, block_sizes(shape[0], shape[1], tr, tc), saturating,
                           amax, scale)
        if self.worst:
            rel = np.abs(x_q4 - x4) / np.abs(x4)  # NaN for 0 / 0 (zeros, padding)
            facts.max_rel = np.fmax.reduce(np.fmax.reduce(rel, axis=3), axis=1)  # NaN skipped
        return facts


