"""The casts of ``fmt train``: how one GEMM input is fake-quantized, ``x_q = cast(x * s) / s``.

A ``Cast`` names an element format, what one scale covers (a ``ScaleGroup``, or None for a
plain cast with no scale), the scale rule and format, the rounding, and an optional random
Hadamard transform (``hadamard``) applied first.  ``fake_quant`` applies it to a torch
tensor by the project's own numerics, the same functions ``fmt quantize``'s engine runs on
a chunk (``numerics.tiles.tile_amax``, then ``engine.chunk_parts.scales_for`` and
``nvfp4_tensor_scale`` for the scales, the float32 product and ``rounding.round_to_format``
for the cast, as ``numerics.tiles.to_codes`` does), so a recipe in
``train`` rounds to the bit as the same scheme does in ``quantize``
(tests/train/test_casts.py compares them with ``engine.quantize_tensor``).

The tensor is seen as the engine sees a matrix: all leading axes flattened into rows, the
last axis (the GEMM's reduction axis) the columns; a ``row`` group is one scale per row, a
``block N`` one per N values of a row, a ``tile RxC`` one per R x C tile, ``tensor`` one for
all.  On the CPU torch and numpy share the memory (no copy); a CUDA tensor is copied to the
host and back (correct, not fast).

``CastCount`` sums what the casts did to one (layer, role) over the steps: values flushed
to zero, values saturated (those whose rounding lay past the format's max, the engine's
count: ``|x * s|`` at or past ``rounding.beyond_threshold`` under nearest-even, 448.01 ->
448 is not one; under stochastic rounding the draws that went past), and the ranges of
amax and scale.  Nearest-even FP8/FP4 casts of whole tiles go by the engine's compiled
kernel and plain 16-bit casts by torch's conversion, to the bit the same
(``train.fast_casts``).
Scales are fmt's direction (multiply to enter the format's range).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fmtcli.base.choices import Granularity, OverflowPolicy, RoundingMode, ScaleRule
from fmtcli.base.errors import UsageError
from fmtcli.engine.chunk_parts import Plan, nvfp4_tensor_scale, scales_for
from fmtcli.numerics.formats import FormatSpec, get_format
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.rounding import (
    PositionalUniform,
    apply_range,
    beyond_threshold,
    round_to_format,
    round_unbounded,
)
from fmtcli.numerics.schemes import ScaleFormat, Scheme
from fmtcli.numerics.tiles import from_codes, is_narrow, tile_amax, tile_view, untile
from fmtcli.train import fast_casts as fast
from fmtcli.train import hadamard as rht

if TYPE_CHECKING:  # torch is an optional extra: imported where a tensor is cast
    import torch

SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "E4M3",
         "float8_e5m2": "E5M2", "float4_e2m1fn": "E2M1", "float6_e2m3fn": "E2M3",
         "float6_e3m2fn": "E3M2"}
RULE_LABEL = {ScaleRule.AMAX: "amax", ScaleRule.MX_FLOOR: "E8M0", ScaleRule.FIXED: "delayed",
              ScaleRule.POW2_FLOOR: "pow2"}


@dataclass(frozen=True)
class Cast:
    """How one GEMM input is fake-quantized: x_q = cast(x * s) / s (s per group).

    ``format``: a fmt format name ("float32" is no cast at all); ``group``: what one scale
    covers (None: a plain cast, scale 1); ``scale_rule``: ``scaling.amax_to_scale``'s rule
    (MX_FLOOR for MX, FIXED where the scale is given: delayed scaling); ``scale_format``:
    float32, E8M0 (MX) or NVFP4's E4M3 block scale times a float32 tensor scale;
    ``rounding``: nearest-even or stochastic; ``hadamard``: the size of the random Hadamard
    transform applied along the last axis first (0: none; ``train.hadamard``);
    ``overflow``: what lies past max becomes (None: saturate for the scaled narrow formats,
    as scaled recipes cast, IEEE inf for 16-bit and wider, as a dtype conversion does)."""

    format: str
    group: ScaleGroup | None = None
    scale_rule: ScaleRule = ScaleRule.AMAX
    scale_format: ScaleFormat = ScaleFormat.FLOAT32
    rounding: RoundingMode = RoundingMode.NEAREST_EVEN
    hadamard: int = 0
    overflow: OverflowPolicy | None = None

    def __post_init__(self) -> None:
        spec = get_format(self.format)  # an unknown name is a UsageError here
        object.__setattr__(self, "format", spec.name)
        object.__setattr__(self, "scale_rule", ScaleRule(self.scale_rule))
        object.__setattr__(self, "scale_format", ScaleFormat(self.scale_format))
        object.__setattr__(self, "rounding", RoundingMode(self.rounding))
        if self.hadamard:
            rht.check_size(self.hadamard)
        if self.scale_rule in (ScaleRule.PERCENTILE,):
            raise UsageError("a training cast takes the amax, power-of-two, MX or fixed rule")

    @functools.cached_property
    def spec(self) -> FormatSpec:
        return get_format(self.format)

    @property
    def identity(self) -> bool:
        """float32 with no transform: the values pass unchanged."""
        return self.format == "float32" and not self.hadamard

    @property
    def overflow_policy(self) -> OverflowPolicy:
        if self.overflow is not None:
            return OverflowPolicy(self.overflow)
        return OverflowPolicy.SATURATE if is_narrow(self.spec) else OverflowPolicy.IEEE

    def scheme(self) -> Scheme:
        """The engine's ``Scheme`` of a scaled cast (what ``fmt quantize`` runs for it)."""
        if self.group is None or self.scale_rule is ScaleRule.FIXED:
            raise UsageError("a plain or fixed-scale cast has no scheme of its own")
        g = self.group
        return Scheme(self.spec, granularity=g.kind, block=g.block or 128, axis=g.axis,
                      tile=g.tile or (1, 128), scale_rule=self.scale_rule,
                      scale_format=self.scale_format, rounding=self.rounding,
                      overflow=self.overflow_policy)

    def label(self) -> str:
        """'E4M3 1x128 amax', 'E2M1 1x16 e4m3+fp32 RHT16 SR', 'bf16' ..."""
        name = SHORT.get(self.format, self.format)
        if self.group is None:
            parts = [name]
        else:
            g = self.group
            size = {Granularity.TENSOR: "tensor", Granularity.ROW: "row",
                    Granularity.COLUMN: "column"}.get(g.kind)
            if g.kind is Granularity.BLOCK:
                size = f"1x{g.block}" if g.axis == -1 else f"{g.block}x1"
            elif g.kind is Granularity.TILE:
                size = f"{g.tile[0]}x{g.tile[1]}"
            rule = ("e4m3+fp32" if self.scale_format is ScaleFormat.E4M3_FP32
                    else RULE_LABEL.get(self.scale_rule, self.scale_rule.value))
            parts = [name, size, rule]
        if self.hadamard:
            parts.append(f"RHT{self.hadamard}")
        if self.rounding is RoundingMode.STOCHASTIC:
            parts.append("SR")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"label": self.label(), "format": self.format,
                "group": None if self.group is None else self.group.spelling,
                "scale_rule": self.scale_rule.value, "scale_format": self.scale_format.value,
                "rounding": self.rounding.value, "hadamard": self.hadamard,
                "overflow": self.overflow_policy.value}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass
class CastCount:
    """What the casts of one (layer, role) did, summed over the steps seen."""

    elements: int = 0
    nonzero: int = 0
    flushed: int = 0  # nonzero finite inputs that came out 0
    saturated: int = 0  # x * s rounded past the format's max (the engine's count)
    amax_min: float = math.inf
    amax_max: float = -math.inf
    scale_min: float = math.inf
    scale_max: float = -math.inf
    steps: int = 0
    nonfinite: int = 0  # NaN or inf inputs

    def add(self, *, elements: int, nonzero: int, flushed: int, saturated: int,
            amax: float, scale_min: float | None, scale_max: float | None,
            nonfinite: int = 0) -> None:
        """One cast's figures (one call per cast: ``steps`` counts them)."""
        self.elements += int(elements)
        self.nonzero += int(nonzero)
        self.flushed += int(flushed)
        self.saturated += int(saturated)
        self.nonfinite += int(nonfinite)
        if math.isfinite(amax):
            self.amax_min = min(self.amax_min, amax)
            self.amax_max = max(self.amax_max, amax)
        if scale_min is not None and math.isfinite(scale_min):
            self.scale_min = min(self.scale_min, scale_min)
        if scale_max is not None and math.isfinite(scale_max):
            self.scale_max = max(self.scale_max, scale_max)
        self.steps += 1

    def merge(self, other: CastCount) -> None:
        """Add another count's totals (ranges widened)."""
        for name in ("elements", "nonzero", "flushed", "saturated", "steps", "nonfinite"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.amax_min = min(self.amax_min, other.amax_min)
        self.amax_max = max(self.amax_max, other.amax_max)
        self.scale_min = min(self.scale_min, other.scale_min)
        self.scale_max = max(self.scale_max, other.scale_max)

    @property
    def flushed_pct(self) -> float | None:
        """Flushed as a share of the nonzero inputs, in percent."""
        return 100.0 * self.flushed / self.nonzero if self.nonzero else None

    @property
    def saturated_pct(self) -> float | None:
        return 100.0 * self.saturated / self.elements if self.elements else None

    def to_dict(self) -> dict:
        """JSON-safe: a range never seen (or not finite) is None."""
        return {"elements": self.elements, "nonzero": self.nonzero, "flushed": self.flushed,
                "saturated": self.saturated, "nonfinite": self.nonfinite,
                "flushed_pct": self.flushed_pct, "saturated_pct": self.saturated_pct,
                "amax_min": _finite(self.amax_min), "amax_max": _finite(self.amax_max),
                "scale_min": _finite(self.scale_min), "scale_max": _finite(self.scale_max),
                "steps": self.steps}


# -- the cast of a matrix (numpy) -----------------------------------------------------------

@dataclass(frozen=True)
class CastResult:
    """``quantize_matrix``'s answer: ``x_q`` (float32, the matrix's shape) and the figures
    a ``CastCount`` adds."""

    values: np.ndarray
    saturated: int
    amax: float
    scale_min: float | None
    scale_max: float | None


def _draws(rng, padded: tuple[int, int], cols: int):
    """What stochastic rounding draws from, for a matrix of ``cols`` columns padded to
    ``padded`` (rows, cols) whole tiles: a ``np.random.Generator`` as it is (drawn in the
    padded tile view's order), or an int seed (None: 0) for the engine's
    ``PositionalUniform``, keyed by each element's index ``r * cols + c`` in the matrix, as
    ``fmt quantize --rounding stochastic --seed`` draws (padding, zeros, gets indices too)."""
    if rng is not None and not isinstance(rng, (int, np.integer)):
        return rng
    index = (np.arange(padded[0], dtype=np.uint64)[:, None] * np.uint64(cols)
             + np.arange(padded[1], dtype=np.uint64)[None, :])
    return PositionalUniform(int(rng or 0), index)


def _codes(product: np.ndarray, cast: Cast, draws, peak: float) -> tuple[np.ndarray, int]:
    """``numerics.tiles.to_codes`` on a float32 product, with stochastic rounding's draws
    passed on: ``round_to_format`` (saturating or IEEE), and how many products reach
    ``rounding.beyond_threshold`` (those that would round past max).  ``peak``: the
    largest ``fl(amax * scale)`` of the tiles, a bound on every ``|x * scale|`` (rounding
    is monotone, as the engine bounds a chunk): below the threshold nothing is counted."""
    spec = cast.spec
    limit = beyond_threshold(spec, cast.rounding, product.dtype)
    if cast.rounding is RoundingMode.STOCHASTIC and not peak < limit:
        # a product above max rounds past it only for some draws: count those, as the
        # engine's range step does (round_to_format's own steps, with its counts)
        flat = product.reshape(-1)
        counts: dict = {}
        r = apply_range(flat, round_unbounded(flat, spec, cast.rounding, draws), spec,
                        cast.rounding, cast.overflow_policy, counts)
        return r.reshape(product.shape), counts["beyond"] - counts["overflowed"]
    codes = round_to_format(product, spec, cast.rounding, cast.overflow_policy, rng=draws)
    if peak < limit:  # False for NaN: then counted
        return codes, 0
    return codes, int(np.count_nonzero(np.abs(product) >= limit))


def _plain(x: np.ndarray, cast: Cast, scale: float | None, rng) -> CastResult:
    """No group: one given scale (1: a plain cast)."""
    s = np.float32(1.0 if scale is None else scale)
    amax = float(tile_amax(x.reshape(1, -1), 1, x.size)[0, 0])
    draws = (_draws(rng, x.shape, x.shape[1]) if cast.rounding is RoundingMode.STOCHASTIC
             else None)
    with np.errstate(all="ignore"):
        codes, saturated = _codes(np.multiply(x, s), cast, draws,
                                  float(np.float32(amax) * s))
        out = codes if s == 1 else from_codes(codes, s)
    return CastResult(out.astype(np.float32, copy=False), saturated, amax, float(s), float(s))


def quantize_matrix(x: np.ndarray, cast: Cast, *, scale: float | None = None,
                    rng=None) -> CastResult:
    """``x`` (rows, cols), float32, through ``cast`` (its Hadamard transform is the
    caller's): one scale per tile of ``cast.group`` by the engine's rule, or the given
    ``scale``; ``x_q = cast(x * s) / s`` with the float32 product and the engine's rounding."""
    if x.size == 0:
        return CastResult(np.array(x, np.float32), 0, 0.0, None, None)
    if cast.format == "float32":
        return CastResult(x, 0, float(np.max(np.abs(x))), 1.0, 1.0)
    if cast.group is None or scale is not None or cast.scale_rule is ScaleRule.FIXED:
        if cast.scale_rule is ScaleRule.FIXED and scale is None:
            raise UsageError("a delayed (fixed-rule) cast needs its scale")
        return _plain(x, cast, scale, rng)
    scheme = cast.scheme()
    rows, cols = x.shape
    tr, tc = cast.group.tile_shape(rows, cols, 2)
    amax = tile_amax(x, tr, tc)
    plan = Plan(scheme, (tr, tc), False)
    top = float(amax.max()) if amax.size else 0.0
    if scheme.scale_format is ScaleFormat.E4M3_FP32:
        plan.tensor_scale = nvfp4_tensor_scale(top, scheme)
    with np.errstate(all="ignore"):
        grid = scales_for(amax, plan)
    dead = np.isinf(grid)  # NVFP4 blocks whose E4M3 decode scale is 0: they decode to 0
    s4 = np.where(dead, np.float32(0), grid)[:, None, :, None]
    view = tile_view(x, tr, tc)
    draws = None
    if cast.rounding is RoundingMode.STOCHASTIC:
        draws = _draws(rng, (view.shape[0] * tr, view.shape[2] * tc), cols)
    with np.errstate(all="ignore"):
        peak = float(np.max(amax * s4[:, 0, :, 0]))
        codes, saturated = _codes(np.multiply(view, s4), cast, draws, peak)
        out = from_codes(codes, s4)
    if dead.any():
        out[np.broadcast_to(dead[:, None, :, None], out.shape)] = 0
    used = grid[(amax > 0) & np.isfinite(grid)]
    lo, hi = (float(used.min()), float(used.max())) if used.size else (None, None)
    return CastResult(untile(out.astype(np.float32, copy=False), x.shape), saturated,
                      top, lo, hi)


# -- torch ---------------------------------------------------------------------------------

def as_matrix_shape(shape) -> tuple[int, int]:
    """(rows, cols): the leading axes flattened into rows, the last axis the columns."""
    if len(shape) == 0:
        return 1, 1
    return math.prod(shape[:-1]), int(shape[-1])


def fake_quant(x: torch.Tensor, cast: Cast, *, scale: float | None = None,
               rng: np.random.Generator | int | None = None,
               count: CastCount | None = None) -> torch.Tensor:
    """``x`` (any shape, last axis = the GEMM's reduction axis) through ``cast``: a float32
    tensor of the same shape on the same device.  ``scale``: a given per-tensor scale
    (delayed scaling; a plain cast uses 1).  ``rng``: stochastic rounding's draws (a
    Generator, or an int seed for the engine's positional draws).  ``count``: adds this
    cast's figures.  A Hadamard transform (``cast.hadamard``) rotates blocks of the last
    axis, the rotated values are cast, and they are rotated back: the product of two such
    inputs along that axis is the product of the rotated ones (``train.hadamard``)."""
    import torch

    if cast.identity and count is None:
        return x.detach().to(torch.float32)
    if fast.plain_applies(cast, scale):
        return fast.plain_cast(x, cast, count)
    if x.numel() and fast.applies(cast, x):
        done = fast.cast_tensor(x, cast, scale, count)
        if done is not None:
            return done
    device = x.device
    host = x.detach().to(device="cpu", dtype=torch.float32).contiguous()
    rows, cols = as_matrix_shape(tuple(host.shape))
    m = host.numpy().reshape(rows, cols)
    if cast.hadamard:
        m = rht.forward(m, cast.hadamard)
    result = quantize_matrix(m, cast, scale=scale, rng=rng)
    out = result.values
    if count is not None:
        _count(count, m, out, result)
    if cast.hadamard:
        out = rht.inverse(out, cast.hadamard)
    if not out.flags.c_contiguous or out is m:
        out = np.array(out, dtype=np.float32, order="C")
    tensor = torch.from_numpy(out.reshape(tuple(host.shape)))
    return tensor if device.type == "cpu" else tensor.to(device)


def _count(count: CastCount, x: np.ndarray, out: np.ndarray, result: CastResult) -> None:
    """Add one cast's figures.  Flushed: the nonzero inputs whose result is 0; a zero input
    casts to 0 and an inf or NaN one never does (the training formats are signed and have
    a zero), so that is the count of nonzero inputs less the count of nonzero results.
    The nonfinite inputs are counted only where the amax says there are any."""
    nonfinite = 0 if math.isfinite(result.amax) else int(x.size - np.count_nonzero(np.isfinite(x)))
    nonzero = int(np.count_nonzero(x))
    count.add(elements=x.size, nonzero=nonzero - nonfinite,
              flushed=nonzero - int(np.count_nonzero(out)), saturated=result.saturated,
              amax=result.amax, scale_min=result.scale_min, scale_max=result.scale_max,
              nonfinite=nonfinite)
