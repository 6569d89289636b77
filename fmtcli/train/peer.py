"""``fmt train``'s model through a peer's FP8 training: torchao's ``Float8Linear``.

The cross-check of issue 25: the same model, seed and batches trained once by fmt's
``tensorwise`` recipe (every block Linear's GEMM inputs fake-quantized by fmt's own casts,
``gemm``) and once by torchao's float8 training (``torchao.float8``), whose
``convert_to_float8_training`` swaps each ``torch.nn.Linear`` for a ``Float8Linear``.
fmt's block Linears are its own ``QuantLinear`` (not ``nn.Linear`` subclasses), so the
peer run builds the ``fp32`` recipe's session (the same initial weights, optimizer and
batches as any run of that seed: ``session.Session``), replaces each Linear the recipe
would cast by an ``nn.Linear`` holding the *same* ``Parameter`` objects (the optimizer
still steps them; ``Float8Linear.from_float`` keeps them too) and lets torchao convert
those.  What stays in FP32 is what stays in FP32 for fmt (the head unless
``quantize_head``, attention's batched products, LayerNorms...).

torchao's defaults are per-tensor dynamic ("current") scaling: E4M3 for the input and the
weight, E5M2 for the output gradient, scale ``fp8_max / max(amax, 1e-12)`` computed in
float64 and rounded to float32, values multiplied by it, clamped to +-max and cast by
torch; ``emulate=True`` replaces ``torch._scaled_mm`` by a float32 ``torch.mm`` of the
dequantized values (``data.float() / scale``), so it runs on the CPU (torchao
``float8_utils.amax_to_scale``, ``float8_ops``, ``float8_linear``; torchao 0.18.0).

torchao is not a dependency of fmt: ``torchao_missing()`` says why it cannot be used here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fmtcli.train.recipes import get_recipe


def torchao_missing() -> str | None:
    """None where torchao's float8 training can run here, else why not (one line)."""
    try:
        import torchao  # noqa: F401
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: F401
    except Exception as exc:  # ImportError, or a torchao built for another torch
        return f"torchao's float8 training does not import: {type(exc).__name__}: {exc}"
    try:
        Float8LinearConfig(emulate=True)
    except TypeError as exc:
        return f"this torchao's Float8LinearConfig has no emulate option: {exc}"
    return None


def torchao_config(power_of_2_scales: bool = False):
    """torchao's per-tensor current scaling (its defaults), emulated on the CPU."""
    from torchao.float8 import Float8LinearConfig

    return Float8LinearConfig(emulate=True, round_scales_to_power_of_2=power_of_2_scales)


def plain_linears(model) -> list[str]:
    """Replace every Linear of ``model`` that a recipe casts (``model.quantized()``) by an
    ``nn.Linear`` sharing its weight and bias Parameters; their names, in model order."""
    import torch
    from torch import nn

    names = []
    for module in model.quantized():
        parent, _, attr = module.key.rpartition(".")
        fan_out, fan_in = module.weight.shape
        with torch.device("meta"):  # no memory: the Parameters are the model's
            linear = nn.Linear(fan_in, fan_out, bias=module.bias is not None)
        linear.weight, linear.bias = module.weight, module.bias
        setattr(model.get_submodule(parent) if parent else model, attr, linear)
        names.append(module.key)
    return names


def torchao_session(settings, seed: int, corpus, config=None):
    """The ``fp32`` session of ``seed`` with its cast Linears converted by torchao
    (``config``: ``torchao_config()`` by default)."""
    from torchao.float8 import convert_to_float8_training

    from fmtcli.train.session import Session

    session = Session(get_recipe("fp32"), settings, seed, corpus)
    names = set(plain_linears(session.model))
    convert_to_float8_training(session.model, config=config or torchao_config(),
                               module_filter_fn=lambda _m, fqn: fqn in names)
    return session


def step_losses(session, steps: int) -> list[float]:
    """``steps`` optimizer steps of ``session``: each step's loss (before its update)."""
    return [session.step(step) for step in range(1, steps + 1)]


def window_means(losses: list[float], log_every: int) -> list[tuple[int, float]]:
    """The logged losses as ``loop.run_recipe`` logs them: the mean of the ``log_every``
    steps each logged step closes, at every K-th step and the last."""
    out = []
    for step in range(1, len(losses) + 1):
        if step % log_every == 0 or step == len(losses):
            window = losses[max(0, step - log_every):step]
            out.append((step, sum(window) / len(window)))
    return out


@dataclass(frozen=True)
class PeerComparison:
    """fmt's recipe against torchao on the same model, seed and batches."""

    recipe: str
    seed: int
    steps: int
    fmt_losses: tuple       # (step, K-step mean loss) at the logged steps
    peer_losses: tuple
    max_abs_diff: float     # over the logged steps
    max_rel_diff: float
    first_step_diff: float  # |diff| of step 1's loss (before any update: casts of the forward)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "seed": self.seed, "steps": self.steps,
                "fmt_losses": [list(p) for p in self.fmt_losses],
                "peer_losses": [list(p) for p in self.peer_losses],
                "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "first_step_diff": self.first_step_diff}


def compare(settings, corpus, recipe: str = "tensorwise", seed: int | None = None,
            config=None) -> PeerComparison:
    """Train ``recipe`` by fmt and the torchao-converted model from the same start; their
    logged losses and the largest differences.  ``corpus``: ``data.load_corpus``'s."""
    from fmtcli.train.session import Session

    seed = settings.seed if seed is None else seed
    ours = step_losses(Session(get_recipe(recipe), settings, seed, corpus), settings.steps)
    theirs = step_losses(torchao_session(settings, seed, corpus, config), settings.steps)
    a = window_means(ours, settings.log_every)
    b = window_means(theirs, settings.log_every)
    diffs = [abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf
             for (_, x), (_, y) in zip(a, b)]
    rel = [d / abs(y) if y else math.inf for d, (_, y) in zip(diffs, b)]
    return PeerComparison(recipe, seed, settings.steps, tuple(a), tuple(b), max(diffs),
                          max(rel), abs(ours[0] - theirs[0]))
