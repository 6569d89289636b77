"""The fast path of ``fmt train``'s FP8 casts: torch's own float8 conversion, to the bit.

``casts.quantize_matrix`` casts with numpy, in about fifteen passes over the tensor
(``rounding.round_to_format``'s magic-number rounding, its range step, the division).  For
the common case of training, a finite CPU tensor cast to E4M3 or E5M2 by nearest-even and
saturation, torch's conversion does the rounding in one pass: ``clamp(x * s, -max, max)``
then ``.to(torch.float8_e4m3fn or float8_e5m2)`` is ``round_to_format(x * s, spec,
"nearest-even", "saturate")`` for every finite float32 value (the engine's own torch
backend casts so too: ``engine.chunk._backend_cast``, clamp first); the product ``x * s``
and the division ``codes / s`` are IEEE float32 in torch as in numpy.  The scales are the
engine's (``engine.chunk_parts.scales_for`` on the tiles' amaxes), so ``fast_cast`` returns
exactly what ``casts.quantize_matrix`` does.  ``agrees`` checks, once per format and
process, that the installed torch's conversion is that rounding on every kind of float32
pattern; where it is not, or anything else does not apply (a tile that does not divide the
matrix, a non-finite value or scale, stochastic rounding, NVFP4's two-level scales, a
Hadamard transform, a GPU tensor), ``fast_cast`` returns None and the numpy path casts.
tests/train/test_casts.py compares the two, and both with the engine.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from fmtcli.base.choices import OverflowPolicy, RoundingMode, ScaleRule
from fmtcli.engine.chunk_parts import Plan, scales_for
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import beyond_threshold, round_to_format
from fmtcli.numerics.schemes import ScaleFormat
from fmtcli.numerics.tiles import tile_amax

if TYPE_CHECKING:
    import torch


#: the fmt formats that are torch dtypes of the same name, converted to on the CPU
FP8 = ("float8_e4m3fn", "float8_e5m2")


def applies(cast, x: torch.Tensor) -> bool:
    """Whether ``fast_cast`` may take this cast of this tensor (before looking at values)."""
    return (cast.format in FP8 and x.device.type == "cpu" and not cast.hadamard
            and cast.rounding is RoundingMode.NEAREST_EVEN
            and cast.overflow_policy is OverflowPolicy.SATURATE
            and cast.scale_format is not ScaleFormat.E4M3_FP32 and agrees(cast.format))


def _patterns(spec: FormatSpec) -> np.ndarray:
    """Float32 patterns to check a conversion on: random bits over every exponent, random
    mantissas at the format's exponents, and the edges (max, the midpoint past it, the
    smallest subnormal and normal, their halves, ties), both signs, zeros."""
    rng = np.random.default_rng(8)
    bits = rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0, 1 << 23, 1 << 16, dtype=np.uint64).astype(np.uint32)
    exps = rng.integers(100, 150, 1 << 16).astype(np.uint32) << np.uint32(23)
    step = 2.0 ** (math.frexp(spec.max)[1] - 2 - spec.mantissa_bits)
    edges = np.array([spec.max, spec.max + step, spec.max + 2 * step, spec.smallest_subnormal,
                      spec.smallest_normal, spec.smallest_subnormal / 2,
                      1.5 * spec.smallest_subnormal, 1 + 2.0 ** -spec.mantissa_bits / 2,
                      0.0], np.float32)
    with np.errstate(over="ignore"):
        ties = np.concatenate([np.nextafter(edges, np.float32(np.inf)),
                               np.nextafter(edges, np.float32(0)), edges])
    x = np.concatenate([bits.view(np.float32), (near | exps).view(np.float32), ties])
    x = np.concatenate([x, -x]).astype(np.float32)
    return x[np.isfinite(x)]


@functools.cache
def agrees(name: str) -> bool:
    """Whether this torch's clamped conversion to ``name`` is fmt's saturating nearest-even
    rounding, to the bit (zeros' signs included), on ``_patterns``: checked once."""
    import torch

    from fmtcli.numerics.formats import get_format

    spec = get_format(name)
    x = _patterns(spec)
    want = round_to_format(x, spec, RoundingMode.NEAREST_EVEN, OverflowPolicy.SATURATE)
    got = _convert(torch.from_numpy(x.copy()), name, spec.max).numpy()
    return bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))


def _convert(p: torch.Tensor, name: str, fmax: float) -> torch.Tensor:
    """``p`` (float32, finite) rounded to ``name`` saturating: float32 values (in place)."""
    import torch

    p.clamp_(-fmax, fmax)
    return p.to(getattr(torch, name)).to(torch.float32)


def _grid(m: torch.Tensor, cast, scale: float | None):
    """(tile shape, amax grid, scale grid) as numpy float32, or None where the fast path
    does not apply (a ragged tile, a non-finite amax or scale)."""
    rows, cols = m.shape
    if cast.group is None or scale is not None or cast.scale_rule is ScaleRule.FIXED:
        if scale is None and cast.group is not None:
            return None  # a fixed rule without its scale: the numpy path says so
        amax = np.float32(float(m.abs().max()))
        grid = np.full((1, 1), np.float32(1.0 if scale is None else scale))
        return (rows, cols), np.full((1, 1), amax), grid
    tr, tc = cast.group.tile_shape(rows, cols, 2)
    if rows % tr or cols % tc:
        return None
    a = m.view(rows // tr, tr, cols // tc, tc).abs().amax(dim=(1, 3))
    amax = a.numpy().astype(np.float32, copy=False)
    if not np.isfinite(amax).all():
        return None
    with np.errstate(all="ignore"):
        grid = scales_for(amax, Plan(cast.scheme(), (tr, tc), False))
    grid = np.asarray(grid, np.float32)
    if not (np.isfinite(grid).all() and (grid > 0).all()):
        return None
    return (tr, tc), amax, grid


def fast_cast(m: torch.Tensor, cast, scale: float | None, counting: bool):
    """``m`` (rows, cols), float32, contiguous, on the CPU, through ``cast``: (x_q, the
    saturated count, amax, scale min, scale max), or None where the numpy path must cast.
    Saturated: products at or past ``beyond_threshold`` (nearest-even puts them past max),
    counted only where ``counting`` and the tiles' peak reaches it."""
    import torch

    found = _grid(m, cast, scale)
    if found is None:
        return None
    (tr, tc), amax, grid = found
    top = float(amax.max())
    if not math.isfinite(top):
        return None
    rows, cols = m.shape
    s4 = torch.from_numpy(np.ascontiguousarray(grid[:, None, :, None]))
    view = m.view(rows // tr, tr, cols // tc, tc)
    p = view * s4
    spec = cast.spec
    with np.errstate(all="ignore"):
        peak = float(np.max(amax * grid))
    if not math.isfinite(peak):
        return None
    saturated = 0
    limit = beyond_threshold(spec, RoundingMode.NEAREST_EVEN, np.float32)
    if counting and peak >= limit:
        saturated = int(torch.count_nonzero(p.abs() >= limit))
    out = _convert(p, cast.format, spec.max).div_(s4).view(rows, cols)
    used = grid[amax > 0]
    lo, hi = (float(used.min()), float(used.max())) if used.size else (None, None)
    if cast.group is None or scale is not None:
        lo = hi = float(grid[0, 0])
    return out, saturated, top, lo, hi


def cast_tensor(x: torch.Tensor, cast, scale: float | None, count):
    """``casts.fake_quant`` of an FP8 cast by torch's conversion (``applies`` holds), the
    figures added to ``count`` (a ``CastCount`` or None) as ``casts._count`` adds them (the
    values are finite here: nothing nonfinite); None where ``fast_cast`` does not apply."""
    import torch

    host = x.detach().to(torch.float32).contiguous()
    shape = tuple(host.shape)
    m = host.view(math.prod(shape[:-1]), shape[-1]) if shape else host.view(1, 1)
    done = fast_cast(m, cast, scale, count is not None)
    if done is None:
        return None
    out, saturated, amax, lo, hi = done
    if count is not None:
        nonzero = int(torch.count_nonzero(m))
        count.add(elements=m.numel(), nonzero=nonzero,
                  flushed=nonzero - int(torch.count_nonzero(out)), saturated=saturated,
                  amax=amax, scale_min=lo, scale_max=hi)
    return out.view(shape)


#: The plain casts torch's own conversion does as ``round_to_format`` does, to the bit
#: (nearest-even, subnormals, overflow to inf, NaN: tests/train/test_casts.py checks it):
#: done by torch, on the tensor's device, with no copy to numpy.
TORCH_CASTS = {"bfloat16": "bfloat16", "float16": "float16"}


def plain_applies(cast, scale: float | None) -> bool:
    return (cast.format in TORCH_CASTS and cast.group is None and not cast.hadamard
            and scale in (None, 1.0) and cast.rounding is RoundingMode.NEAREST_EVEN
            and cast.overflow_policy is OverflowPolicy.IEEE)


def plain_cast(x: torch.Tensor, cast, count) -> torch.Tensor:
    """A bfloat16 or float16 cast by torch's conversion, counted as ``casts._count``
    counts (on the CPU by numpy on the same memory; on a GPU by torch there)."""
    import torch

    x = x.detach().to(torch.float32)
    out = x.to(getattr(torch, TORCH_CASTS[cast.format])).to(torch.float32)
    if count is None:
        return out
    limit = beyond_threshold(cast.spec, cast.rounding, np.float32)
    if x.device.type == "cpu":
        m = x.contiguous().numpy().reshape(-1)
        amax = float(tile_amax(m.reshape(1, -1), 1, m.size)[0, 0]) if m.size else 0.0
        saturated = 0 if amax < limit else int(np.count_nonzero(np.abs(m) >= limit))
        nonfinite = 0 if math.isfinite(amax) else int(m.size - np.count_nonzero(np.isfinite(m)))
        nonzero = int(np.count_nonzero(m))
        count.add(elements=m.size, nonzero=nonzero - nonfinite,
                  flushed=nonzero - int(np.count_nonzero(out.numpy())), saturated=saturated,
                  amax=amax, scale_min=1.0, scale_max=1.0, nonfinite=nonfinite)
        return out
    a = x.abs()
    amax = float(a.max()) if x.numel() else 0.0
    nonfinite = 0 if math.isfinite(amax) else int(x.numel() - torch.isfinite(x).sum())
    count.add(elements=x.numel(), nonzero=int(torch.count_nonzero(x)) - nonfinite,
              flushed=int(torch.count_nonzero(x)) - int(torch.count_nonzero(out)),
              saturated=int(torch.count_nonzero(a >= limit)), amax=amax, scale_min=1.0,
              scale_max=1.0, nonfinite=nonfinite)
    return out
