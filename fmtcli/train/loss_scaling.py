"""Loss scaling for the FP16 recipes: none, static, or dynamic as ``torch.amp.GradScaler``.

The loss is multiplied by the scale S before the backward pass, so every gradient a GEMM
receives is S times the true one (Micikevicius et al. 2018, §3.2); before the optimizer
step the parameter gradients are divided by S again.

- ``none``: S = 1.
- ``static``: a fixed S (``recipe.static_loss_scale``, 2^15 by default); the step is taken
  whatever the gradients hold, so an overflow shows as a NaN loss (divergence).
- ``dynamic``: GradScaler's rule (torch/amp/grad_scaler.py, ``_amp_update_scale_``): from
  ``init_scale`` (2^16), a step whose unscaled gradients hold an inf or NaN is skipped and
  S is multiplied by ``backoff_factor`` (0.5); after ``growth_interval`` (2000) steps in a
  row with finite gradients S is multiplied by ``growth_factor`` (2).
"""

from __future__ import annotations

import torch

GRAD_SCALER = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
               "growth_interval": 2000}
MODES = ("none", "static", "dynamic")


class LossScaler:
    """The loss scale of one run and its updates."""

    def __init__(self, mode: str = "none", *, static_scale: float = 2.0**15,
                 init_scale: float = GRAD_SCALER["init_scale"],
                 growth_factor: float = GRAD_SCALER["growth_factor"],
                 backoff_factor: float = GRAD_SCALER["backoff_factor"],
                 growth_interval: int = GRAD_SCALER["growth_interval"]) -> None:
        if mode not in MODES:
            raise ValueError(f"loss scaling mode {mode!r} is not one of {MODES}")
        self.mode = mode
        self.scale = {"none": 1.0, "static": float(static_scale),
                      "dynamic": float(init_scale)}[mode]
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean = 0
        self.skipped = 0
        self.min_scale = self.max_scale = self.scale

    @classmethod
    def for_recipe(cls, recipe) -> LossScaler:
        mode = getattr(recipe, "loss_scale", "none")
        options = {"static_scale": getattr(recipe, "static_loss_scale", 2.0**15)}
        for name in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
            value = getattr(recipe, name, None)
            if value is not None:
                options[name] = value
        return cls(mode, **options)

    def unscale(self, parameters) -> bool:
        """Divide the gradients by S; whether they are all finite afterwards."""
        finite = True
        for p in parameters:
            if p.grad is None:
                continue
            if self.scale != 1.0:
                p.grad.div_(self.scale)
            if finite and not bool(torch.isfinite(p.grad).all()):
                finite = False
        return finite

    def update(self, finite: bool) -> bool:
        """After a step's gradients were seen: whether to take the step, and S updated."""
        if self.mode != "dynamic":
            return True
        if not finite:
            self.scale *= self.backoff_factor
            self.clean = 0
            self.skipped += 1
            self.min_scale = min(self.min_scale, self.scale)
            return False
        self.clean += 1
        if self.clean == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean = 0
            self.max_scale = max(self.max_scale, self.scale)
        return True

    def to_dict(self) -> dict:
        return {"mode": self.mode, "final_scale": self.scale, "min_scale": self.min_scale,
                "max_scale": self.max_scale, "skipped_steps": self.skipped,
                "growth_interval": self.growth_interval if self.mode == "dynamic" else None}
