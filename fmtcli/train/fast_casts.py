"""The fast paths of ``fmt train``'s casts: the engine's compiled chunk kernel, and torch's
own 16-bit conversion, each to the bit what ``casts.quantize_matrix`` makes.

``casts.quantize_matrix`` casts with numpy, in about fifteen passes over the tensor
(``rounding.round_to_format``'s magic-number rounding, its range step, the division).  For
the common case of training, a finite tensor of whole tiles cast to E4M3, E5M2 or E2M1 by
nearest-even with saturation, ``fast_cast`` runs what ``fmt quantize``'s engine runs on
such a chunk: ``quantize_chunk`` of the compiled kernel (``numerics/_native.c``, called as
``engine.chunk_native.compiled_pass`` calls it), one pass computing ``x_q = round(x * s) /
s`` by the same magic-number rounding of the float32 product, saturated at max, with the
engine's scales (``engine.chunk_parts.scales_for`` on ``chunk_amax``).  Its squared-error
path writes ``err = x_q - x`` per value; ``x + err`` is ``x_q`` again, exactly, wherever
that difference is exact: every value not clipped at max (``x_q`` and ``x`` lie within a
factor of two of each other, or ``x_q`` is 0: Sterbenz), and a zero's sign is put back by
``copysign`` (``x_q`` has ``x``'s sign).  The clipped values (``|x * s|`` at or past
``rounding.beyond_threshold``: the kernel's count of values past max) are set to
``+-max / s`` directly.  Where the kernel is not built (or ``FMTCLI_KERNEL=numpy``), or
anything else does not apply (a tile that does not divide the matrix, a non-finite value or
scale, a dead NVFP4 block, stochastic rounding, a Hadamard transform: the caller's), the
numpy path casts.  tests/train/test_casts.py compares both with the engine.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fmtcli.base.choices import OverflowPolicy, RoundingMode, ScaleRule
from fmtcli.engine.chunk_native import magic, scratch
from fmtcli.engine.chunk_parts import Plan, chunk_amax, nvfp4_tensor_scale, scales_for
from fmtcli.numerics import native
from fmtcli.numerics.rounding import beyond_threshold
from fmtcli.numerics.schemes import ScaleFormat
from fmtcli.numerics.tiles import tile_amax

if TYPE_CHECKING:
    import torch

#: the formats ``fast_cast`` takes (signed, with a zero, magic-number rounding exact)
FORMATS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn")


def applies(cast, x) -> bool:
    """Whether ``fast_cast`` may take this cast of this tensor (before looking at values)."""
    return (cast.format in FORMATS and x.device.type == "cpu" and not cast.hadamard
            and cast.rounding is RoundingMode.NEAREST_EVEN
            and cast.overflow_policy is OverflowPolicy.SATURATE
            and native.module() is not None)


def _grid(m: np.ndarray, cast, scale: float | None):
    """(tile shape, amax grid, scale grid), float32, or None where the fast path does not
    apply (a ragged tile, a non-finite amax, a scale that is not finite and positive)."""
    rows, cols = m.shape
    if cast.group is None or scale is not None or cast.scale_rule is ScaleRule.FIXED:
        if scale is None and cast.group is not None:
            return None  # a fixed rule without its scale: the numpy path says so
        amax = chunk_amax(m, rows, cols)
        grid = np.full((1, 1), np.float32(1.0 if scale is None else scale))
        return (rows, cols), amax, grid
    tr, tc = cast.group.tile_shape(rows, cols, 2)
    if rows % tr or cols % tc:
        return None
    amax = chunk_amax(m, tr, tc)
    top = float(amax.max())
    if not math.isfinite(top):
        return None
    plan = Plan(cast.scheme(), (tr, tc), False)
    if cast.scale_format is ScaleFormat.E4M3_FP32:
        plan.tensor_scale = nvfp4_tensor_scale(top, plan.scheme)
    with np.errstate(all="ignore"):
        grid = np.ascontiguousarray(scales_for(amax, plan), dtype=np.float32)
    if not (np.isfinite(grid).all() and (grid > 0).all()):
        return None
    return (tr, tc), amax, grid


def fast_cast(m: np.ndarray, cast, scale: float | None):
    """``m`` (rows, cols), float32, C-contiguous, through ``cast`` by the compiled kernel:
    (x_q, the saturated count, amax, scale min, scale max), or None where the numpy path
    must cast.  Saturated: the values whose rounding lay past max (the engine's count)."""
    module = native.module()
    found = None if module is None else _grid(m, cast, scale)
    if found is None:
        return None
    (tr, tc), amax, grid = found
    spec = cast.spec
    with np.errstate(all="ignore"):
        peak = float(np.max(amax * grid))
    top = float(amax.max())
    if not (math.isfinite(peak) and math.isfinite(top)):
        return None
    rows, cols = m.shape
    err = scratch(m.size)
    fmax = np.inf if peak <= spec.max else spec.max  # the engine's: inf, nothing to clip
    got = module.quantize_chunk(m, grid, (rows, cols), (tr, tc), (*magic(spec), fmax), err)
    if got is None:
        return None
    with np.errstate(all="ignore"):
        out = np.add(m, err.reshape(m.shape))
        np.copysign(out, m, out=out)
    saturated = int(got[5])
    if saturated and _clip(m, out, amax, grid, (tr, tc), spec) != saturated:
        return None  # not the kernel's count: let numpy decide (never seen)
    used = grid[amax > 0]
    lo, hi = (float(used.min()), float(used.max())) if used.size else (None, None)
    if cast.group is None or scale is not None:
        lo = hi = float(grid[0, 0])
    return out, saturated, top, lo, hi


def _clip(m: np.ndarray, out: np.ndarray, amax: np.ndarray, grid: np.ndarray, tile,
          spec) -> int:
    """Set the values whose product rounds past max to ``+-max / s`` (what the kernel
    computed for them; ``x + err`` need not be it there), looking only at the tiles whose
    ``fl(amax * s)`` reaches the threshold (rounding is monotone): how many there were."""
    tr, tc = tile
    rows, cols = m.shape
    limit = beyond_threshold(spec, RoundingMode.NEAREST_EVEN, np.float32)
    ri, ci = np.nonzero(amax * grid >= limit)
    view = m.reshape(rows // tr, tr, cols // tc, tc)[ri, :, ci, :]  # (hot tiles, tr, tc)
    s = grid[ri, ci][:, None, None]
    past = np.abs(view * s) >= limit
    o4 = out.reshape(rows // tr, tr, cols // tc, tc)
    o4[ri, :, ci, :] = np.where(past, np.copysign(np.float32(spec.max) / s, view),
                                o4[ri, :, ci, :])
    return int(np.count_nonzero(past))


def cast_tensor(x: torch.Tensor, cast, scale: float | None, count):
    """``casts.fake_quant`` by ``fast_cast`` (``applies`` holds), the figures added to
    ``count`` (a ``CastCount`` or None) as ``casts._count`` adds them (the values are finite
    here: nothing nonfinite); None where ``fast_cast`` does not apply."""
    import torch

    host = x.detach().to(torch.float32).contiguous()
    shape = tuple(host.shape)
    m = host.numpy().reshape((math.prod(shape[:-1]), shape[-1]) if shape else (1, 1))
    done = fast_cast(m, cast, scale)
    if done is None:
        return None
    out, saturated, amax, lo, hi = done
    result = torch.from_numpy(out.reshape(shape))
    if count is not None:  # numpy's count: one thread (torch's would wake its pool)
        nonzero = int(np.count_nonzero(m))
        count.add(elements=m.size, nonzero=nonzero,
                  flushed=nonzero - int(np.count_nonzero(out)), saturated=saturated,
                  amax=amax, scale_min=lo, scale_max=hi)
    return result


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
