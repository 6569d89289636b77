"""``train``: the baseline and each recipe trained from the same start on the same batches.

Every run of one seed starts from the same initial model (``model.build_model``) and sees
the same batches (``data.Batches``), so two recipes differ only by their casts.  The
optimizer is AdamW (betas 0.9, 0.95; weight decay on the matrices) on FP32 master weights
and FP32 moments, the gradients clipped to norm ``clip`` after unscaling; the learning rate
warms up linearly over ``warmup`` steps and then follows a cosine to a tenth of ``lr``.

The report's losses: each logged loss is the mean training loss of the ``log_every``
steps it closes (a window mean, not an EMA: every step counts once), logged at every
K-th step and at the last; ``final_loss`` is the last of them, and the gap to the baseline
is ``(final_loss - base) / base``.  The baseline (bf16) always runs first, at ``seed``;
with ``seeds`` N it also runs at seed+1 .. seed+N-1, and the spread of its final losses,
(max - min) / mean, says how large a gap the seed alone makes.  A recipe has diverged at
the first step whose loss is NaN or inf, or whose running K-step mean exceeds the
baseline's at the same step by the factor 1 + ``divergence``; its run stops there.

On the CPU the same settings give bit-identical losses (tests/train/test_loop.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from fmtcli.base.errors import Param, UsageError
from fmtcli.train.data import Corpus, load_corpus
from fmtcli.train.results import RecipeRun, TrainResult, TrainSettings

BASELINE = "bf16"
DEFAULT_RECIPES = ("tensorwise", "mxfp8")


def require_torch():
    """torch, or the one-line UsageError that says how to install it."""
    try:
        import torch
    except ImportError:
        raise UsageError("fmt train needs PyTorch", "pip install 'fmtcli[torch]'") from None
    return torch


def check_device(device: str) -> None:
    torch = require_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(Param("device", device) + ": no CUDA device is available "
                         "(torch.cuda.is_available() is False)", "use the cpu")


def resolve_recipes(recipes: Sequence) -> list:
    """The baseline first, then each recipe asked for (names through ``get_recipe``, Recipe
    objects as they are), the baseline and repeats once."""
    from fmtcli.train.recipes import get_recipe

    out = [get_recipe(BASELINE)]
    for recipe in recipes:
        recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        if recipe.name not in [r.name for r in out]:
            out.append(recipe)
    return out


def train(settings: TrainSettings, recipes: Sequence = DEFAULT_RECIPES,
          progress: Callable[[int, int], None] | None = None) -> TrainResult:
    """Train the baseline (and its other seeds) and every recipe; ``progress(done, total)``
    is called after every step of every run."""
    torch = require_torch()
    check_device(settings.device)
    runs = resolve_recipes(recipes)
    corpus = load_corpus(settings.data, settings.seq)
    capture = None
    if settings.capture_dir is not None:
        from fmtcli.train.capture import Capture
        capture = Capture.plan(settings.capture_dir, settings.capture_steps, settings.force)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    total = settings.steps * (len(runs) + settings.seeds - 1)
    ticker = Ticker(progress, total)
    with _fp32_matmuls(torch):
        base, curve = run_recipe(runs[0], settings, settings.seed, corpus, None, ticker, capture)
        seeds = [base.final_loss]
        for k in range(1, settings.seeds):
            other, _ = run_recipe(runs[0], settings, settings.seed + k, corpus, None, ticker)
            seeds.append(other.final_loss)
        done = [base]
        for recipe in runs[1:]:
            run, _ = run_recipe(recipe, settings, settings.seed, corpus, curve, ticker)
            done.append(run)
    done = [_with_gap(run, base.final_loss) for run in done]
    return TrainResult(settings, corpus.name, corpus.size, tuple(done), tuple(seeds),
                       _spread(seeds), tuple(capture.written) if capture else (),
                       _notes(base))


class Ticker:
    """Counts the steps of all runs for the ``progress`` callback."""

    def __init__(self, progress, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def step(self, count: int = 1) -> None:
        """``count`` steps done (a diverged run's remaining steps count as done at once)."""
        if count < 1:
            return
        self.done += count
        if self.progress is not None:
            self.progress(self.done, self.total)


class _fp32_matmuls:
    """On CUDA, float32 matmuls in full FP32 (TF32 off) while training; restored after."""

    def __init__(self, torch) -> None:
        self.torch = torch

    def __enter__(self):
        self.saved = self.torch.backends.cuda.matmul.allow_tf32
        self.torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc) -> None:
        self.torch.backends.cuda.matmul.allow_tf32 = self.saved


def _spread(losses: list) -> float | None:
    values = [v for v in losses if v is not None and math.isfinite(v)]
    if len(values) < 2 or len(values) != len(losses):
        return None
    return (max(values) - min(values)) / (sum(values) / len(values))


def _with_gap(run: RecipeRun, base: float | None) -> RecipeRun:
    from dataclasses import replace

    if run.final_loss is None or base is None or run.diverged_at is not None:
        return run
    return replace(run, gap_to_baseline=(run.final_loss - base) / base)


def _notes(base: RecipeRun) -> tuple[str, ...]:
    if base.diverged_at is None:
        return ()
    return (f"the baseline {base.name} diverged at step {base.diverged_at}: no gaps to it",)


def run_recipe(recipe, settings: TrainSettings, seed: int, corpus: Corpus,
               reference: list | None, ticker: Ticker, capture=None
               ) -> tuple[RecipeRun, list]:
    """One run; the second value is its running K-step mean loss at every step (the
    reference a recipe's divergence is judged against)."""
    from fmtcli.train.session import Session

    session = Session(recipe, settings, seed, corpus)
    window: list[float] = []
    losses, curve, diverged, reason = [], [], None, None
    started = time.perf_counter()
    for step in range(1, settings.steps + 1):
        if capture is not None and step in capture.steps:
            session.context.captured = {}
        loss = session.step(step)
        if session.context.captured is not None:
            capture.write(step, session.context.captured)
            session.context.captured = None
        ticker.step()
        window.append(loss)
        if len(window) > settings.log_every:
            window.pop(0)
        mean = sum(window) / len(window)
        curve.append(mean)
        if step % settings.log_every == 0 or step == settings.steps:
            losses.append((step, mean))
        reason = _diverged(loss, mean, reference, step, settings.divergence)
        if reason is not None:
            diverged = step
            losses.append((step, loss if not math.isfinite(loss) else mean))
            break
    ticker.step(settings.steps - len(curve))  # a run stopped early: the bar still fills
    seconds = (time.perf_counter() - started) / max(1, len(curve))
    final = None if diverged is not None else losses[-1][1]
    val = session.validation_loss() if diverged is None else None
    run = RecipeRun(recipe.name, recipe.description, seed, _finite_losses(losses), final,
                    None, diverged, reason, val, session.context.stats.records(), seconds,
                    len(curve), session.scaler.to_dict(), recipe.to_dict())
    return run, curve


def _finite_losses(losses: list) -> tuple:
    """The logged losses with a non-finite one as None (JSON has no NaN), no step twice."""
    out, seen = [], set()
    for step, value in losses:
        if step not in seen:
            seen.add(step)
            out.append((step, value if math.isfinite(value) else None))
    return tuple(out)


def _diverged(loss: float, mean: float, reference: list | None, step: int,
              threshold: float) -> str | None:
    if not math.isfinite(loss):
        return f"the loss is {loss}"
    if reference is None or step > len(reference) or not math.isfinite(reference[step - 1]):
        return None
    base = reference[step - 1]
    if mean > base * (1 + threshold):
        return (f"the mean loss {mean:.4g} is over {1 + threshold:g}x the baseline's "
                f"{base:.4g}")
    return None
