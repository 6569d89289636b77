"""One training run's state: the model, its optimizer, the loss scaler and the GEMM context.

``Session.step`` is one optimizer step of ``loop.run_recipe``: a batch forward with the
recipe's casts, the loss times the loss scale backward, the gradients unscaled and checked,
clipped, and AdamW's update (skipped where the dynamic scaler says so).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fmtcli.train.data import Batches, Corpus
from fmtcli.train.gemm import GemmContext
from fmtcli.train.loss_scaling import LossScaler
from fmtcli.train.model import build_model
from fmtcli.train.results import VOCAB, TrainSettings
from fmtcli.train.tensor_stats import TensorStats

#: Batches of the validation split the final validation loss averages.
VALIDATION_BATCHES = 8
#: The seed of the validation batches: the same for every run and seed.
VALIDATION_SEED = 1234


def learning_rate(settings: TrainSettings, step: int) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine from ``lr`` to ``lr / 10``."""
    warmup = min(settings.warmup, settings.steps)
    if step <= warmup:
        return settings.lr * step / max(1, warmup)
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batches_for(corpus: Corpus, settings: TrainSettings, seed: int) -> Batches:
    return Batches(corpus.train, settings.batch, settings.seq, seed)


def validation_batches(corpus: Corpus, settings: TrainSettings) -> list:
    batches = Batches(corpus.validation, settings.batch, settings.seq, VALIDATION_SEED)
    return [batches.next() for _ in range(VALIDATION_BATCHES)]


def to_numpy_rng(seed: int) -> np.random.Generator:
    """The generator of stochastic rounding's draws for a run at ``seed``."""
    return np.random.default_rng([seed, 0x5EED])


class Session:
    def __init__(self, recipe, settings, seed: int, corpus) -> None:
        self.recipe, self.settings = recipe, settings
        self.device = torch.device(settings.device)
        self.model = build_model(settings, seed, settings.device)
        self.context = GemmContext(recipe, TensorStats(), to_numpy_rng(seed))
        self.model.use(self.context)
        self.scaler = LossScaler.for_recipe(recipe)
        self.optimizer = torch.optim.AdamW(self._groups(), lr=settings.lr,
                                           betas=(0.9, 0.95), eps=1e-8)
        self.batches = batches_for(corpus, settings, seed)
        self.validation = lambda: validation_batches(corpus, settings)
        self.parameters = [p for group in self.optimizer.param_groups for p in group["params"]]

    def _groups(self) -> list[dict]:
        """Weight decay on the matrices only (not on biases, LayerNorms)."""
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": self.settings.weight_decay},
                {"params": rest, "weight_decay": 0.0}]

    def loss(self, inputs, targets) -> torch.Tensor:
        x = torch.from_numpy(inputs).to(self.device)
        y = torch.from_numpy(targets).to(self.device)
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def step(self, step: int) -> float:
        """One optimizer step; the batch's loss (before the update)."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.settings, step)
        self.optimizer.zero_grad(set_to_none=True)
        self.context.loss_scale = self.scaler.scale
        loss = self.loss(*self.batches.next())
        (loss * self.scaler.scale).backward()
        finite = self.scaler.unscale(self.parameters)
        if self.scaler.update(finite):
            if self.settings.clip:
                torch.nn.utils.clip_grad_norm_(self.parameters, self.settings.clip)
            self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def validation_loss(self) -> float | None:
        """The mean loss over the validation batches, the recipe's forward casts uncounted."""
        self.context.counting = False
        try:
            values = [float(self.loss(*batch)) for batch in self.validation()]
        finally:
            self.context.counting = True
        mean = sum(values) / len(values)
        return mean if mean == mean and abs(mean) != float("inf") else None
