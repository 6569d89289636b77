"""The quantized GEMMs of ``fmt train``: one ``torch.autograd.Function`` per Linear.

A Linear ``y = x W^T + b`` runs three GEMMs, and each gets its inputs through the recipe's
casts (``casts.fake_quant``, the project's own rounding and scaling), as Transformer
Engine's ``Linear`` does with real FP8/FP4 inputs:

- forward ``y = x_q W_q^T``: the activation ``x`` by ``recipe.activation``, the weight
  ``W`` (the FP32 master) by ``recipe.weight``;
- backward, data gradient ``dX = dY_q W_q``: the output gradient by ``recipe.grad_output``
  and the weight as cast for the forward pass, or, where the recipe has ``dgrad_weight``
  (blocks along the other axis), ``W^T`` cast by it along the output features;
- backward, weight gradient ``dW = dY^T X``, a GEMM over the tokens: where the recipe has
  wgrad casts of its own (``wgrad_grad``, ``wgrad_activation``: another axis for the
  scale groups, a random Hadamard transform), ``dY`` and ``x`` are transposed so that the
  tokens are the last axis (the one a ``Cast`` groups along and rotates) and cast by them;
  otherwise the forward's ``x_q`` and the data gradient's ``dY_q`` are reused.

Every product is a float32 matmul of the dequantized values: FP32 accumulation (on CUDA
TF32 is off, ``loop``).  The bias is added and its gradient summed in FP32.  What each cast
did is counted per (layer, role), role one of ``activation``, ``weight``, ``grad_output``
(``tensor_stats``; the wgrad casts are not counted apart).  Delayed scaling
(``recipe.delayed``) takes each (layer, role)'s scale from its amax history.
"""

from __future__ import annotations

import math

import torch

from fmtcli.train.casts import fake_quant
from fmtcli.train.tensor_stats import TensorStats

ROLES = ("activation", "weight", "grad_output")


class GemmContext:
    """What the quantized GEMMs of one run share: the recipe, the counts
    (``stats``), the amax histories of delayed scaling, the generator of stochastic
    rounding, the loss scale the gradients carry (``loss_scale``, for FP16's underflow
    shares and for unscaling what ``capture`` keeps), and the tensors of a captured step
    (``captured``: name -> float32 CPU tensor, or None when not capturing)."""

    def __init__(self, recipe, stats: TensorStats, rng, history_factory=None) -> None:
        self.recipe = recipe
        self.stats = stats
        self.rng = rng
        self.history_factory = history_factory or _histories_of(recipe)
        self.histories: dict = {}
        self.loss_scale = 1.0
        self.counting = True
        self.captured: dict | None = None
        #: the recipe's limited-precision accumulator (None: FP32 accumulation)
        self.accumulation = getattr(recipe, "accumulation", None)

    def product(self, a, a_q, a_cast, b, b_q, b_cast) -> torch.Tensor:
        """``a_q @ b_q^T``: the GEMM of two cast operands, ``a`` (M, K) and ``b`` (N, K),
        both cast along K by ``a_cast`` / ``b_cast`` (``a``, ``b`` their values before the
        cast; a cast reused from the forward pass is a square tile or a tensor scale, the
        same along either axis).  FP32 accumulation, or the recipe's ``accumulation``."""
        if self.accumulation is None:
            return a_q @ b_q.t()
        return self.accumulation.product(a, a_q, a_cast, b, b_q, b_cast)

    def cast(self, x: torch.Tensor, cast, layer: str, role: str,
             counted: bool = True) -> torch.Tensor:
        """``x`` through ``cast`` (None: unchanged); counted under (layer, role) where
        ``counted`` and counting is on (the backward's extra casts of W^T, X^T and dY^T
        are not counted apart)."""
        if cast is None:
            return x
        count = None
        if counted and self.counting:
            count = self.stats.count(layer, role, cast.format)
        scale = None
        if getattr(self.recipe, "delayed", False) and cast.group is not None:
            scale = self._delayed_scale(x, cast, layer, role)
        return fake_quant(x, cast, scale=scale, rng=self.rng, count=count)

    def _delayed_scale(self, x: torch.Tensor, cast, layer: str, role: str) -> float:
        """The scale from (layer, role)'s amax history, then this tensor's amax pushed
        (the first step, with an empty history, scales by its own amax: TE's behaviour)."""
        history = self.histories.get((layer, role))
        if history is None:
            history = self.histories[(layer, role)] = self.history_factory()
        amax = float(x.detach().abs().max()) if x.numel() else 0.0
        if not math.isfinite(amax):
            amax = 0.0  # a NaN/inf tensor leaves the history as it was
        scale = history.scale(cast.spec, current=amax)
        history.push(amax)
        return scale

    def keep(self, name: str, tensor: torch.Tensor, unscale: bool = False) -> None:
        """Keep a captured tensor (float32, on the CPU; a gradient divided by the loss scale)."""
        if self.captured is None:
            return
        value = tensor.detach().to(device="cpu", dtype=torch.float32)
        if unscale and self.loss_scale != 1.0:
            value = value / self.loss_scale
        elif value.data_ptr() == tensor.data_ptr():
            value = value.clone()  # the weight is updated in place before the file is written
        self.captured[name] = value.contiguous()


def _histories_of(recipe):
    """A new amax history of the recipe's length and mode (``scaling_state.AmaxHistory``)."""
    from fmtcli.train.scaling_state import AmaxHistory

    return lambda: AmaxHistory(getattr(recipe, "amax_history", 16),
                               getattr(recipe, "amax_mode", "max"))


class QuantLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with every GEMM input cast by the recipe (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, context: GemmContext, layer: str):
        recipe = context.recipe
        x2 = x.reshape(-1, x.shape[-1])
        context.keep(f"{layer}.input", x2)
        context.keep(f"{layer}.weight", weight)
        x_q = context.cast(x2, recipe.activation, layer, "activation")
        w_q = context.cast(weight, recipe.weight, layer, "weight")
        y = context.product(x2, x_q, recipe.activation, weight, w_q, recipe.weight)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x2, x_q, weight, w_q)
        ctx.context, ctx.layer, ctx.has_bias, ctx.shape = context, layer, bias is not None, x.shape
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, x_q, weight, w_q = ctx.saved_tensors
        context, layer = ctx.context, ctx.layer
        recipe = context.recipe
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.float32)
        context.keep(f"{layer}.grad_output", dy2, unscale=True)
        context.stats.underflow(layer, dy2, context.loss_scale, recipe.grad_output.format)
        dy_q = context.cast(dy2, recipe.grad_output, layer, "grad_output")
        # dX = dY W reduces over the output features: W^T (input features, outputs)
        wt = _transposed_cast(context, weight, w_q, recipe, "dgrad_weight", layer)
        dx = context.product(dy2, dy_q, recipe.grad_output, weight.t(), wt.t(),
                             _cast_of(recipe, "dgrad_weight", recipe.weight))
        # dW = dY^T X reduces over the tokens: a wgrad cast sees them as its last axis
        g = _transposed_cast(context, dy2, dy_q, recipe, "wgrad_grad", layer)
        a = _transposed_cast(context, x2, x_q, recipe, "wgrad_activation", layer)
        dw = context.product(dy2.t(), g.t(), _cast_of(recipe, "wgrad_grad", recipe.grad_output),
                             x2.t(), a.t(),
                             _cast_of(recipe, "wgrad_activation", recipe.activation))
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.shape), dw, db, None, None


def _transposed_cast(context: GemmContext, value, reused, recipe, name: str, layer: str):
    """``value`` cast along its first axis by the recipe's cast ``name`` (``value^T`` cast
    with that axis last, transposed back), or ``reused`` (the cast already made) where the
    recipe has none: the input of a backward GEMM that sums over the other axis."""
    cast = getattr(recipe, name, None)
    if cast is None:
        return reused
    return context.cast(value.t().contiguous(), cast, layer, name, counted=False).t()


def _cast_of(recipe, name: str, reused):
    """The cast the recipe gives a backward GEMM input, or the forward's it reuses."""
    cast = getattr(recipe, name, None)
    return reused if cast is None else cast


def quantized_linear(x, weight, bias, context: GemmContext, layer: str):
    return QuantLinearFunction.apply(x, weight, bias, context, layer)
