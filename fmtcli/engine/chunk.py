"""The per-chunk arithmetic of ``fmt quantize``: scale, scaled cast, divide back, statistics.

Direction: ``x_q = cast(x * scale) / scale``.  One ``ChunkKernel`` applies one scheme to one
2-D float32 (or float64) chunk of a tensor's matrix view; ``chunk_pass`` streams the chunks.
A bfloat16 or float16 chunk may come as stored: the compiled kernel reads it so
(``chunk_native``), and the numpy path widens it to float32 first (``widened``).  Tile
amax, scales and plans are ``chunk_parts``.

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
from fmtcli.engine.chunk_native import accumulator, compiled_pass, magic
from fmtcli.engine.chunk_parts import (
    BlockFacts,
    Plan,
    chunk_amax,
    scales_for,
    tile_percentile,
    widened,
)
from fmtcli.numerics import native
from fmtcli.numerics.backends import Backend, Device, cast_with_policy
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
from fmtcli.numerics.scaling import Product, ScaleRule
from fmtcli.numerics.schemes import OverflowPolicy, ScaleFormat
from fmtcli.numerics.tiles import tile_amax
from fmtcli.streaming.blocks import block_sizes
from fmtcli.streaming.metrics import ErrorAccumulator


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


@dataclass
class _Chunk:
    """One chunk as a scheme's pass sees it: ``x`` as read (unpadded; 16-bit as stored
    where the compiled kernel reads it), ``xp`` padded to whole tiles of ``tile`` with
    zeros, ``xw`` what gets scaled (float32, or float64 under the exact product; None for a
    chunk as stored), and ``origin`` (first row, first column, columns of the matrix)."""

    x: np.ndarray
    xp: np.ndarray
    xw: np.ndarray | None
    tile: tuple[int, int]
    origin: tuple[int, int, int]

    @property
    def padding(self) -> int:
        return self.xp.size - self.x.size

    @property
    def shape4(self) -> tuple[int, int, int, int]:
        """The padded chunk's tile view: (tile rows, tr, tile columns, tc)."""
        tr, tc = self.tile
        return (self.xp.shape[0] // tr, tr, self.xp.shape[1] // tc, tc)


@dataclass
class _Scales:
    """A chunk's scales under one plan: ``scale`` per tile; for local tiles (scales of the
    chunk's own) also ``local`` (the same, returned to the grid), their ``amax``, the
    chunk's max |x| ``x_max``, ``peak`` (a bound on every |x * scale|) and ``in_range``
    (known that nothing rounds past max under the scheme's rounding)."""

    scale: np.ndarray
    local: np.ndarray | None = None
    amax: np.ndarray | None = None
    x_max: float | None = None
    peak: float | None = None
    in_range: bool = False


def _padded(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """``x`` padded with zeros to whole (tr x tc) tiles (itself where it has them)."""
    pr, pc = (-x.shape[0]) % tr, (-x.shape[1]) % tc
    return np.pad(x, ((0, pr), (0, pc))) if (pr or pc) else x


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
                      and self.spec.has_negative_zero)  # not fnuz, not HiFloat8
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
            self.magic = magic(self.spec)  # its rounding constants

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
        """``run`` (under its errstate): the compiled kernel where it applies, else numpy."""
        scheme = self.plan.scheme
        # a bfloat16/float16 chunk as stored goes to the compiled kernel as it is (no
        # widened copy); what else needs float32 values widens it (once per chunk)
        as_stored = x.dtype.itemsize == 2
        if as_stored and (self.native is None or keep is not None
                          or scheme.scale_rule is ScaleRule.PERCENTILE):
            x, as_stored = widened(x, shared), False
        tr, tc = self.plan.tile
        if self.plan.is_global:
            tr = x.shape[0]  # the chunk is one band of the global tiles
            tc = min(tc, x.shape[1])  # a tile spanning a long row: the chunk is part of one
        xp = _padded(x, tr, tc)
        # what gets scaled: float32, or float64 (exact product); the kernel's own for a
        # chunk as stored
        chunk = _Chunk(x, xp, None if as_stored else self._working(xp), (tr, tc), origin)
        scales = self._scales(chunk)
        if (self.native is not None and keep is None
                and (as_stored or xp.dtype == np.float32)):
            done = self._run_native(chunk, scales, hist, shared)
            if done is not None:
                return done
        if as_stored:  # the kernel left the chunk to numpy: its float32 values
            x = widened(x, shared)
            xp = _padded(x, tr, tc)
            chunk = _Chunk(x, xp, self._working(xp), (tr, tc), origin)
        return self._run_numpy(chunk, scales, hist, keep, shared)

    def _scales(self, chunk: _Chunk) -> _Scales:
        """The chunk's scales: the plan's (global tiles), or its tiles' own from their amax
        (or percentile) with the bound ``peak`` on every scaled value."""
        plan, scheme = self.plan, self.plan.scheme
        if plan.is_global:
            return _Scales(plan.scales)
        x, xw, (tr, tc) = chunk.x, chunk.xw, chunk.tile
        # the unpadded chunk where it is what gets scaled (padding is zeros, which never
        # raise an amax): the compiled kernel's one pass, no padded copy
        amax = (chunk_amax(x, tr, tc) if xw is None or x.dtype == xw.dtype
                else tile_amax(xw, tr, tc))
        if scheme.scale_rule is ScaleRule.PERCENTILE:
            rows, cols = x.shape
            scale = scales_for(tile_percentile(xw[:rows, :cols], tr, tc,
                                               scheme.percentile), plan)
        else:
            scale = scales_for(amax, plan)
        # |x * scale| <= fl(amax * scale) in the data's own arithmetic (rounding is
        # monotone), so this bounds every scaled value exactly
        peak = float(np.max(amax * scale.astype(amax.dtype)))
        # all round to at most max (under this scheme's rounding mode); False for NaN
        return _Scales(scale, scale, amax, float(amax.max()), peak,
                       peak < self.thresholds[amax.dtype])

    def _run_numpy(self, chunk: _Chunk, scales: _Scales, hist, keep, shared):
        """The chunk by numpy: scale, cast, divide back, accumulate (``run``'s result)."""
        spec = self.spec
        shape4, (rows, cols) = chunk.shape4, chunk.x.shape
        scale, dead = scales.scale, None
        if self.two_level and np.isinf(scale).any():  # NVFP4 blocks that decode to 0
            dead = np.isinf(scale)
            scale = np.where(dead, np.float32(0), scale)  # x * 0: no spurious saturation
        s4 = scale[:, None, :, None]
        xs = np.multiply(chunk.xw.reshape(shape4), s4.astype(chunk.xw.dtype, copy=False))
        flat = xs.reshape(-1)
        if self.wide and flat.dtype == np.float32:  # its roundings may lie past float32's max
            flat = flat.astype(np.float64)
        r, counts = self._cast(flat, chunk, scales.in_range and self.plain and keep != "codes")
        overflowed = counts["overflowed"]
        saturated = counts["beyond"] - overflowed
        # |x * scale| > max; where the range step was skipped nothing rounded past max, but
        # values between max and the rounding threshold may lie above it
        above = counts.get("above")
        if above is None:
            above = (count_above_max(flat, spec) if scales.peak is None or scales.peak > spec.max
                     else 0)
        x_q4 = self._divide(r, xs, s4, dead, shape4)
        x_q = x_q4.reshape(chunk.xp.shape)
        if chunk.padding and not spec.has_zero:  # padding is 0, which such formats make NaN
            x_q[rows:, :] = 0
            x_q[:, cols:] = 0
        kept = None
        if keep == "codes":
            kept = r.reshape(chunk.xp.shape)[:rows, :cols].copy()
        acc = ErrorAccumulator(hist=hist)
        acc.add_chunk(chunk.xp, x_q, saturated, overflowed, chunk.padding, x_max=scales.x_max,
                      shared=shared, mse_only=self.mse_only, raw=chunk.x, above_max=above)
        facts = None
        if not self.plan.is_global and not self.mse_only:
            facts = self._facts(chunk.xp.reshape(shape4), x_q4, (rows, cols), shape4,
                                acc.flushed, counts.get("saturated_at"), scales.amax,
                                scales.local)
        if keep == "values":
            kept = x_q[:rows, :cols]
        return acc, scales.local, kept, facts

    def _cast(self, flat: np.ndarray, chunk: _Chunk, skip_range: bool):
        """The scaled values rounded to the format and its range rules applied: (rounded
        values, counts of those beyond max as ``rounding.apply_range`` reports them).
        ``skip_range``: nothing rounds past max and the format has no other range rule."""
        spec, scheme = self.spec, self.plan.scheme
        with np.errstate(invalid="ignore", over="ignore"):
            if self.backend is not Backend.NUMPY:  # the cast of ml_dtypes or torch itself
                return self._backend_cast(flat)
            if self.fast and flat.dtype == np.float32:
                r = round_float32_nearest_even(flat, spec)
            else:
                rng = None
                if scheme.rounding is RoundingMode.STOCHASTIC:
                    rng = PositionalUniform(self.seed, _positions(chunk.origin, chunk.xp.shape,
                                                                  chunk.shape4))
                r = round_unbounded(flat, spec, scheme.rounding, rng)
            counts = {"beyond": 0, "overflowed": 0, "where": not self.plan.is_global}
            if not skip_range:  # values beyond max, or the format's own rules
                r = apply_range(flat, r, spec, scheme.rounding, scheme.overflow, counts)
        return r, counts

    def _backend_cast(self, flat: np.ndarray):
        """The cast of ml_dtypes or torch (saturate: clamp to max first, as recipes do;
        ieee: the backend's own cast), with what lay beyond max counted as the engine counts
        it: what nearest-even puts past max."""
        spec = self.spec
        r = cast_with_policy(flat, spec, self.backend, self.device, self.plan.scheme.overflow)
        past = np.flatnonzero(np.abs(flat) > spec.max)
        ub = round_unbounded(flat[past], spec, RoundingMode.NEAREST_EVEN)
        counted = (np.abs(ub) > spec.max) & ~(np.isinf(flat[past]) & ~np.isfinite(r[past]))
        if not spec.signed:
            counted &= flat[past] >= 0
        return r, {"beyond": int(np.count_nonzero(counted)),
                   "above": count_above_max(flat[past], spec),
                   "overflowed": int(np.count_nonzero(counted & ~np.isfinite(r[past]))),
                   "saturated_at": past[counted & np.isfinite(r[past])]}

    @staticmethod
    def _divide(r: np.ndarray, xs: np.ndarray, s4: np.ndarray, dead, shape4) -> np.ndarray:
        """x_q = r / scale in the tile view (into ``xs``, the scaled values, where the
        dtypes agree); NVFP4's ``dead`` blocks (a decode scale of 0) are 0."""
        with np.errstate(invalid="ignore", divide="ignore"):
            if r.dtype == xs.dtype:
                x_q = np.divide(r.reshape(shape4), s4, out=xs)
            else:  # a wide format's float64 rounding of the float32 product (_wide_quotient)
                x_q = _wide_quotient(r.reshape(shape4), s4)
            if dead is not None:
                x_q[np.broadcast_to(dead[:, None, :, None], shape4)] = 0
        return x_q

    def _run_native(self, chunk: _Chunk, scales: _Scales, hist, shared):
        """The chunk by the compiled kernel: the same statistics as the numpy path, to the
        bit.  None where it does not apply (inf or NaN in the chunk or its scales, a value
        that rounds past max under an overflow policy that does not saturate, a result that
        is not finite): the numpy path then does the chunk."""
        plan, x, (tr, tc) = self.plan, chunk.x, chunk.tile
        rows, cols = chunk.xp.shape
        scale = np.ascontiguousarray(scales.scale, dtype=np.float32)
        if scale.shape != (rows // tr, cols // tc):
            return None
        x_max, peak, in_range = scales.x_max, scales.peak, scales.in_range
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
        blocks = not plan.is_global and not self.mse_only
        # max where a value may lie above it (clipped where its rounding passes max,
        # counted in any case), else inf: nothing to clip or count
        fmax = np.inf if peak <= self.spec.max else self.spec.max
        found = compiled_pass(self.native, chunk.xp, scale, chunk.tile, self.magic, fmax,
                              None if self.mse_only else hist, blocks,
                              blocks and not in_range, blocks and bool(self.worst))
        if found is None:
            return None
        acc = accumulator(self.native, found, x, chunk.padding, hist, x_max, shared,
                          self.mse_only)
        facts = None
        if blocks:
            facts = BlockFacts(found.flushed, block_sizes(x.shape[0], x.shape[1], tr, tc),
                               0 if found.saturating is None
                               else int(np.count_nonzero(found.saturating)),
                               scales.amax, scale, found.max_rel)
        return acc, None if plan.is_global else scale, None, facts

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
