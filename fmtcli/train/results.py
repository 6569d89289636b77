"""The settings and results of ``fmt train``: frozen dataclasses with ``to_dict()``.

``TrainSettings`` checks itself before anything is allocated (``__post_init__``): sizes of
at least 1, a width the heads divide, steps in 1..10^6 and an estimate of the run's memory
(parameters, AdamW state and the activations one step keeps for its backward pass) under
``MAX_BYTES``.  No torch here: the checks and the results are plain Python.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from fmtcli.base.errors import Param, UsageError

#: The most steps a run takes.
MAX_STEPS = 10**6
#: The most bytes a run's estimate (``TrainSettings.estimated_bytes``) may reach.
MAX_BYTES = 8 << 30
#: The byte vocabulary: every token is one byte of the text.
VOCAB = 256
#: The roles of a GEMM input, in the order the tables list them.
ROLES = ("activation", "weight", "grad_output")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TrainSettings:
    """One ``fmt train`` run: the model's sizes, the optimisation and the report.

    Defaults: bf16 plus two FP8 recipes (``loop.DEFAULT_RECIPES``: tensorwise, mxfp8) in
    under three minutes on two CPU cores: 94 s for the three runs (57, 90 and 146 ms a
    step, the standard library's 4 MiB read once) on two idle cores of an x86-64 host
    (``taskset -c 0,1``, torch 2.11, 2026-12-02); 270 s on this project's shared two-core
    development machine while other jobs loaded it (load average 3-4).

    ``log_every`` K: a logged loss is the mean training loss of the K steps it closes;
    ``divergence`` r: a recipe has diverged at the first step its loss is not finite or its
    K-step mean exceeds the baseline's at that step by the factor 1 + r.
    ``seeds`` N: the baseline also runs with seeds seed+1 .. seed+N-1 (its spread)."""

    steps: int = 300
    layers: int = 2
    width: int = 128
    heads: int = 4
    seq: int = 64
    batch: int = 16
    lr: float = 3e-3
    seed: int = 0
    seeds: int = 1
    device: str = "cpu"
    log_every: int = 25
    divergence: float = 0.5
    warmup: int = 30
    weight_decay: float = 0.1
    clip: float = 1.0
    data: str | None = None
    quantize_head: bool = False
    capture_dir: str | None = None
    capture_steps: tuple[int, ...] = ()
    force: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "capture_steps", tuple(int(s) for s in self.capture_steps))
        for name in ("layers", "width", "heads", "seq", "batch", "seeds", "log_every"):
            if getattr(self, name) < 1:
                raise UsageError(Param(name, getattr(self, name)) + ": must be >= 1")
        if not 1 <= self.steps <= MAX_STEPS:
            raise UsageError(Param("steps", self.steps) + f": steps must be 1 .. {MAX_STEPS}")
        if self.width % self.heads:
            raise UsageError(Param("width", self.width) + " is not a multiple of "
                             + Param("heads", self.heads), "give a width the heads divide")
        for name in ("lr", "divergence"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(Param(name, value) + ": must be a positive number")
        for name in ("warmup", "weight_decay", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(Param(name, value) + ": must be a number >= 0")
        if self.threads is not None and self.threads < 1:
            raise UsageError(Param("threads", self.threads) + ": must be >= 1")
        if self.device not in DEVICES:
            raise UsageError(Param("device", self.device) + ": the device is cpu or cuda")
        self._check_capture()
        self._check_size()

    def _check_capture(self) -> None:
        if self.capture_steps and self.capture_dir is None:
            raise UsageError(Param("capture_steps", ",".join(map(str, self.capture_steps)))
                             + " needs a folder to write to",
                             "name one with " + Param("capture_dir", "DIR"))
        for step in self.capture_steps:
            if not 1 <= step <= self.steps:
                raise UsageError(Param("capture_steps", step) + f": a captured step must be "
                                 f"1 .. {self.steps}, the steps of the run")

    def _check_size(self) -> None:
        need = self.estimated_bytes
        if need > MAX_BYTES:
            raise UsageError(f"a run of {self.layers} layers of width {self.width}, "
                             f"{self.batch} x {self.seq} tokens a step needs about "
                             f"{need / 2**30:.1f} GiB, over the {MAX_BYTES >> 30} GiB fmt "
                             "train allows", "use fewer or smaller layers, a smaller "
                             "batch or a shorter seq")

    @property
    def parameters(self) -> int:
        """The model's parameter count (``model.TinyGPT``)."""
        w = self.width
        block = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (4 * w * w + 4 * w) + (4 * w * w + w)
        return VOCAB * w + self.seq * w + self.layers * block + 2 * w + w * VOCAB

    @property
    def estimated_bytes(self) -> int:
        """About the bytes a run holds: float32 parameters, gradients and AdamW's two
        moments (4 copies), and one step's saved activations: per layer and token ~20 w
        floats (inputs of four GEMMs, their casts, LayerNorms, GELU) and the attention
        matrix (heads x seq per token, twice), with the logits (and their gradient)."""
        tokens = self.batch * self.seq
        per_layer = tokens * (20 * self.width + 2 * self.heads * self.seq)
        activations = self.layers * per_layer + 3 * tokens * VOCAB
        return 4 * (4 * self.parameters + activations)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["capture_steps"] = list(self.capture_steps)
        out["parameters"] = self.parameters
        return out


@dataclass(frozen=True)
class TensorRecord:
    """What a recipe's cast did to one GEMM input (``layer``, ``role``) over the steps:
    the figures of its ``casts.CastCount`` and, for a gradient cast to float16, the share
    of the nonzero gradients below half FP16's smallest subnormal (2^-25, where
    round-to-nearest flushes them) with the run's loss scale applied (``scaled``) and
    without it (``unscaled``: the true gradients)."""

    layer: str
    role: str
    format: str
    elements: int
    nonzero: int
    flushed: int
    saturated: int
    amax_min: float | None
    amax_max: float | None
    scale_min: float | None
    scale_max: float | None
    steps: int
    fp16_underflow_scaled: float | None = None
    fp16_underflow_unscaled: float | None = None

    @property
    def flushed_share(self) -> float | None:
        """Flushed nonzero inputs as a share of the nonzero ones."""
        return self.flushed / self.nonzero if self.nonzero else None

    @property
    def saturated_share(self) -> float | None:
        return self.saturated / self.elements if self.elements else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["flushed_share"] = self.flushed_share
        out["saturated_share"] = self.saturated_share
        return out


@dataclass(frozen=True)
class RecipeRun:
    """One recipe's run: ``losses`` (step, mean loss of the window it closes) every
    ``log_every`` steps and at the last; ``final_loss`` the last of them; ``gap_to_baseline``
    ``(final_loss - base) / base`` (None for a diverged run); ``diverged_at`` the step
    (None if it did not) and why; ``val_loss`` on the held-out split at the end."""

    name: str
    description: str
    seed: int
    losses: tuple[tuple[int, float], ...]
    final_loss: float | None
    gap_to_baseline: float | None
    diverged_at: int | None
    divergence_reason: str | None
    val_loss: float | None
    tensors: tuple[TensorRecord, ...]
    step_seconds: float
    steps_done: int
    loss_scale: dict | None = None
    recipe: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "description": self.description, "seed": self.seed,
            "losses": [{"step": s, "loss": v} for s, v in self.losses],
            "final_loss": self.final_loss, "gap_to_baseline": self.gap_to_baseline,
            "diverged_at": self.diverged_at, "divergence_reason": self.divergence_reason,
            "val_loss": self.val_loss, "steps_done": self.steps_done,
            "step_seconds": self.step_seconds, "loss_scale": self.loss_scale,
            "recipe": self.recipe,
            "tensors": [t.to_dict() for t in self.tensors],
        }


@dataclass(frozen=True)
class TrainResult:
    """The runs: ``recipes`` with the baseline (``baseline``, bf16 at ``settings.seed``)
    first; ``baseline_seeds`` the baseline's final losses for seeds seed .. seed+N-1 and
    ``baseline_spread`` their (max - min) / mean (None with one seed): a gap smaller than
    this is within the seed-to-seed noise.  ``data`` names the text trained on,
    ``captured`` the files written."""

    settings: TrainSettings
    data: str
    data_bytes: int
    recipes: tuple[RecipeRun, ...]
    baseline_seeds: tuple[float | None, ...]
    baseline_spread: float | None
    captured: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def baseline(self) -> RecipeRun:
        return self.recipes[0]

    def to_dict(self) -> dict:
        return {
            "settings": self.settings.to_dict(), "data": self.data,
            "data_bytes": self.data_bytes, "baseline": self.baseline.name,
            "baseline_seeds": list(self.baseline_seeds),
            "baseline_spread": self.baseline_spread,
            "recipes": [r.to_dict() for r in self.recipes],
            "captured": list(self.captured), "notes": list(self.notes),
        }
