"""Delayed scaling: a per-tensor scale from the amaxes of earlier steps (an amax history).

Transformer Engine's ``DelayedScaling`` recipe keeps, per FP8 tensor, the amax of its last
``amax_history_len`` steps and computes the scale a step casts with from that history
rather than from the tensor itself (``transformer_engine/pytorch/quantization.py``:
``_default_get_amax_and_update_history`` reduces the history by ``amax_compute_algo``,
"max" over the window or "most_recent", then rolls it; ``_default_sf_compute`` turns the
amax into ``scale = (fp8_max / amax) / 2**margin``, keeping the previous scale where the
amax is 0 or not finite).  A value that grew since the history was taken saturates: that
is the risk delayed scaling trades for not reading the tensor before casting it.

``AmaxHistory(length, mode)``: ``scale(spec, current)`` is the scale of this step from the
amaxes pushed before it; ``push(amax)`` records this step's amax afterwards.  The amax ->
scale rule is fmt's ``scaling.amax_to_scale`` (the amax rule: one float32 division, as TE
computes it; margin 0).  One difference from TE, by the recipe contract of ``fmt train``:
on the first step (an empty history) fmt uses the current amax (current scaling for one
step), where TE casts with its initial scale of 1.0 (``first="one"`` does that).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.scaling import amax_to_scale

#: The reductions of the history (TE's amax_compute_algo; "most_recent" its spelling).
MODES = ("max", "most-recent")
MAX_HISTORY = 1 << 16


def amax_mode(text: str) -> str:
    """"max" or "most-recent" (TE's "most_recent" too)."""
    mode = str(text).strip().lower().replace("_", "-")
    if mode not in MODES:
        raise UsageError(Param("amax_mode", text) + ": one of max, most-recent")
    return mode


class AmaxHistory:
    """The amax history of one tensor (one GEMM input of one layer)."""

    def __init__(self, length: int = 16, mode: str = "max", first: str = "current") -> None:
        if not isinstance(length, int) or not 1 <= length <= MAX_HISTORY:
            raise UsageError(Param("amax_history", length)
                             + f": an amax history holds 1 to {MAX_HISTORY} steps")
        if first not in ("current", "one"):
            raise UsageError(Param("first", first) + ": one of current, one")
        self.length = length
        self.mode = amax_mode(mode)
        self.first = first
        self.history: deque[float] = deque(maxlen=length)
        self.last_scale = 1.0  # kept where the history's amax is 0 or not finite (TE)

    def __len__(self) -> int:
        return len(self.history)

    def amax(self) -> float | None:
        """The history's reduction: max over the window, or the most recent amax (None:
        nothing pushed yet).  A NaN in the window makes the max NaN, as torch.max does."""
        if not self.history:
            return None
        if self.mode == "most-recent":
            return self.history[-1]
        values = list(self.history)
        return math.nan if any(math.isnan(v) for v in values) else max(values)

    def scale(self, spec: FormatSpec, current: float | None = None) -> float:
        """The scale this step casts with (fmt's direction, ``x * scale``).  An empty
        history: the ``current`` amax (``first="current"``; 1.0 without one) or 1.0
        (``first="one"``, TE's initial scale)."""
        amax = self.amax()
        if amax is None:
            if self.first == "one" or current is None:
                return self.last_scale
            amax = current
        if not (amax > 0) or not math.isfinite(amax):
            return self.last_scale
        self.last_scale = float(amax_to_scale(np.float64(amax), spec))
        return self.last_scale

    def push(self, amax: float) -> None:
        """Record a step's amax (after the step has cast with ``scale``)."""
        self.history.append(float(amax))

    def to_dict(self) -> dict:
        amax = self.amax()
        return {"length": self.length, "mode": self.mode, "steps": len(self.history),
                "amax": amax if amax is not None and math.isfinite(amax) else None,
                "scale": self.last_scale}
