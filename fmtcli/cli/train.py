"""``fmt train``: does the loss under a low-precision recipe track a BF16 baseline?"""

from __future__ import annotations

import sys
import time
from enum import Enum
from typing import Annotated, Optional

import typer

from fmtcli.base.errors import Param, UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, check_not_empty
from fmtcli.cli.output import emit, stderr_console

#: The defaults, as ``fmtcli.train.results.TrainSettings`` says them (kept here so that
#: ``fmt --help`` imports nothing of the library; tests/commands/test_train_cli.py checks
#: that the two agree).
DEFAULTS = {"steps": 300, "layers": 2, "width": 128, "heads": 4, "seq": 64, "batch": 16,
            "lr": 3e-3, "seed": 0, "seeds": 1, "log_every": 25}
DEFAULT_RECIPES = "tensorwise,mxfp8"
SEED_MAX = 2**32 - 1


class TrainDevice(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


class AmaxMode(str, Enum):
    MAX = "max"
    MOST_RECENT = "most-recent"


class MxRule(str, Enum):
    FLOOR = "mx-floor"
    CEIL = "mx-ceil"
    EVEN = "mx-even"
    RCEIL = "mx-rceil"


def _int(name: str, metavar: str, text: str, low: int = 1, high: int | None = None):
    return Annotated[int, typer.Option(f"--{name}", metavar=metavar, min=low, max=high,
                                       help=text)]


StepsOption = _int("steps", "N", "Optimizer steps of each run.", 1, 10**6)
LayersOption = _int("layers", "N", "Transformer blocks.")
WidthOption = _int("width", "N", "Model width (a multiple of --heads).")
HeadsOption = _int("heads", "N", "Attention heads.")
SeqOption = _int("seq", "N", "Tokens (bytes) per sequence.")
BatchOption = _int("batch", "N", "Sequences per step.")
SeedsOption = _int("seeds", "N", "Also train the baseline at seed+1 .. seed+N-1: the "
                   "seed-to-seed spread a gap is judged against.", 1, 64)
LogEveryOption = _int("log-every", "K", "Log the mean loss of every K steps (the table's "
                      "rows).")


@app.command("train", cls=UsageWithEllipsis,
             short_help="Does the loss under FP8/FP4/FP16 recipes track a BF16 baseline?")
def train_command(
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", metavar="A,B", help="Recipes trained beside the bf16 baseline: fp32, "
        "bf16, fp16, fp16-static, fp16-dynamic, tensorwise, delayed, rowwise, deepseek, "
        "mxfp8, mxfp4, nvfp4, fp8-unscaled.  [default: " + DEFAULT_RECIPES + "]",
        show_default=False)] = None,
    steps: StepsOption = DEFAULTS["steps"],
    layers: LayersOption = DEFAULTS["layers"],
    width: WidthOption = DEFAULTS["width"],
    heads: HeadsOption = DEFAULTS["heads"],
    seq: SeqOption = DEFAULTS["seq"],
    batch: BatchOption = DEFAULTS["batch"],
    lr: Annotated[float, typer.Option(
        "--lr", metavar="X", help="Peak learning rate (AdamW; warm-up, then a cosine to "
        "a tenth).")] = DEFAULTS["lr"],
    seed: Annotated[int, typer.Option(
        "--seed", metavar="N", min=0, max=SEED_MAX, help="Seed of the model's "
        "initialisation, the batches and stochastic rounding.")] = DEFAULTS["seed"],
    seeds: SeedsOption = DEFAULTS["seeds"],
    device: Annotated[TrainDevice, typer.Option(
        "--device", case_sensitive=False, help="Where the model trains.")] = TrainDevice.CPU,
    data: Annotated[Optional[str], typer.Option(
        "--data", metavar="FILE", help="Train on this file's bytes.  [default: the bytes "
        "of the Python standard library's own source files]", show_default=False)] = None,
    log_every: LogEveryOption = DEFAULTS["log_every"],
    amax_history: Annotated[Optional[int], typer.Option(
        "--amax-history", metavar="N", help="delayed: steps of amax history.  "
        "[default: 16]", show_default=False)] = None,
    amax_mode: Annotated[Optional[AmaxMode], typer.Option(
        "--amax-mode", case_sensitive=False, help="delayed: the scale from the history's "
        "max or its most recent amax.  [default: max]", show_default=False)] = None,
    mx_rule: Annotated[Optional[MxRule], typer.Option(
        "--mx-rule", case_sensitive=False, help="mxfp8, mxfp4: the E8M0 scale's rule "
        "(mx-floor as OCP and fmt quantize; mx-rceil as TE's kernels).  [default: "
        "mx-floor]", show_default=False)] = None,
    no_2d_weights: Annotated[bool, typer.Option(
        "--no-2d-weights", help="nvfp4: 1x16 weight blocks, not TE's 16x16.")] = False,
    no_hadamard: Annotated[bool, typer.Option(
        "--no-hadamard", help="nvfp4: no random Hadamard transform on the weight "
        "gradient's inputs.")] = False,
    no_stochastic_grads: Annotated[bool, typer.Option(
        "--no-stochastic-grads", help="nvfp4: round gradients to nearest, not "
        "stochastically.")] = False,
    capture: Annotated[Optional[str], typer.Option(
        "--capture", metavar="DIR", help="Write the baseline's activations, weights and "
        "gradients of --capture-steps as safetensors into DIR.", show_default=False)] = None,
    capture_steps: Annotated[Optional[str], typer.Option(
        "--capture-steps", metavar="S1,S2", help="The steps --capture writes.  [default: "
        "the last step]", show_default=False)] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Let --capture overwrite files that exist.")] = False,
    threads: Annotated[Optional[int], typer.Option(
        "--threads", metavar="N", min=1, help="torch's CPU threads.  [default: torch's "
        "own]", show_default=False)] = None,
    json_out: JsonOption = False,
) -> None:
    """Train a small byte-level transformer under each recipe beside a BF16 baseline.

    Every block's Linear layers run their three GEMMs (forward, input gradient, weight
    gradient) on fake-quantized inputs -- activations, weights and output gradients cast
    by the recipe through fmt's own rounding and scaling engine, FP32 accumulation, FP32
    master weights and AdamW state.  Prints the loss of every --log-every steps per
    recipe, each recipe's final loss and gap to the baseline beside the baseline's own
    seed-to-seed spread (--seeds), divergence, and what the casts did to each layer's
    tensors: flushed %, saturated %, amax and scale ranges, FP16 gradient underflow.
    """
    check_not_empty(recipe=recipe, data=data, capture=capture)
    from fmtcli.train.loop import require_torch

    require_torch()
    from fmtcli.train import TrainSettings, train
    from fmtcli.train.recipes import parse_recipes

    options = {"amax_history": amax_history, "mx_rule": mx_rule and mx_rule.value,
               "amax_mode": amax_mode and amax_mode.value,
               "two_d_weights": not no_2d_weights, "hadamard": not no_hadamard,
               "stochastic_grads": not no_stochastic_grads}
    recipes = parse_recipes(recipe if recipe is not None else DEFAULT_RECIPES, **options)
    settings = TrainSettings(
        steps=steps, layers=layers, width=width, heads=heads, seq=seq, batch=batch, lr=lr,
        seed=seed, seeds=seeds, device=device.value, data=data, log_every=log_every,
        capture_dir=capture, capture_steps=_capture_steps(capture, capture_steps, steps),
        force=force, threads=threads)
    progress = StepProgress("training")
    try:
        result = train(settings, recipes, progress=progress)
    finally:
        progress.close()
    emit(result, json_out)


def _capture_steps(capture: str | None, text: str | None, steps: int) -> tuple[int, ...]:
    """``--capture-steps 1,100`` as step numbers; the last step where --capture has none."""
    if text is None:
        return (steps,) if capture is not None else ()
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UsageError(Param("capture_steps", text) + ": give step numbers, "
                             "e.g. --capture-steps 1,100")
        if int(part) not in out:
            out.append(int(part))
    return tuple(out)


class StepProgress:
    """A rich bar on stderr of the steps done over all runs, only when stderr is a terminal,
    shown once the work passes ``LATE_SECONDS`` (a short run stays quiet)."""

    LATE_SECONDS = 1.0

    def __init__(self, label: str) -> None:
        self.label, self.start = label, time.monotonic()
        self.bar = self.task = None
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not self.enabled or time.monotonic() - self.start < self.LATE_SECONDS:
                return
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TimeRemainingColumn,
            )

            self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                                MofNCompleteColumn(), TimeRemainingColumn(),
                                console=stderr_console(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
