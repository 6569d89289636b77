"""The recipes of ``fmt train``: which cast each input of each GEMM of a Linear gets.

A Linear ``y = x W^T`` runs three GEMMs: forward ``y = x W^T`` (inputs x, W), the input
gradient ``dX = dY W`` (dY, W) and the weight gradient ``dW = dY^T X`` (dY, X).  A recipe
gives the cast of each input, every cast along the axis that GEMM sums over (the last axis
of what ``casts.fake_quant`` is handed):

- ``activation`` (x, its features), ``weight`` (W, its input features) in the forward;
- ``grad_output`` (dY, its output features) in ``dX = dY W``;
- ``dgrad_weight``: W^T (its output features) in ``dX = dY W`` where it differs from the
  forward's (blocks or rows along the other axis); None: the forward's W_q is reused;
- ``wgrad_activation``, ``wgrad_grad``: X^T and dY^T (their tokens) in ``dW = dY^T X``
  where they differ (blocks along the tokens, the random Hadamard transform, stochastic
  rounding); None: the forward's x_q and the dgrad's dY_q are reused.

The FP8 recipes that share a name with ``fmt quantize --recipe`` (tensorwise, rowwise,
deepseek, mxfp8, mxfp4, nvfp4) cast with the same scheme (``numerics.schemes.RECIPES``);
tests/train/test_recipes.py checks it.  The training sides are cited where they are set.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from fmtcli.base.choices import Granularity, RoundingMode, ScaleRule
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.schemes import ScaleFormat
from fmtcli.train.casts import Cast
from fmtcli.train.scaling_state import MAX_HISTORY, amax_mode

E4M3, E5M2, FP4 = "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"
TENSOR = ScaleGroup(Granularity.TENSOR)
ROW = ScaleGroup(Granularity.ROW)


def _block(n: int) -> ScaleGroup:
    return ScaleGroup(Granularity.BLOCK, n)


def _tile(r: int, c: int) -> ScaleGroup:
    return ScaleGroup(Granularity.TILE, tile=(r, c))


@dataclass(frozen=True)
class Recipe:
    """One training recipe: the casts of a Linear's GEMM inputs, and its loss scaling."""

    name: str
    description: str
    activation: Cast
    weight: Cast
    grad_output: Cast
    wgrad_activation: Cast | None = None
    wgrad_grad: Cast | None = None
    dgrad_weight: Cast | None = None
    loss_scale: str = "none"  # "none" | "static" | "dynamic"
    static_loss_scale: float = 2.0 ** 15
    delayed: bool = False  # per-tensor scales from an amax history (scaling_state)
    amax_history: int = 16
    amax_mode: str = "max"  # "max" | "most-recent"
    # dynamic loss scaling as torch.amp.GradScaler's defaults (torch/amp/grad_scaler.py)
    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    options: tuple[tuple[str, object], ...] = ()  # the options it was built with

    def casts(self) -> dict[str, Cast | None]:
        """Every role's cast (None: reused, see the module docstring)."""
        return {"activation": self.activation, "weight": self.weight,
                "grad_output": self.grad_output, "wgrad_activation": self.wgrad_activation,
                "wgrad_grad": self.wgrad_grad, "dgrad_weight": self.dgrad_weight}

    def to_dict(self) -> dict:
        out = {"name": self.name, "description": self.description,
               "casts": {role: None if c is None else c.to_dict()
                         for role, c in self.casts().items()},
               "loss_scale": self.loss_scale, "delayed": self.delayed,
               "options": dict(self.options)}
        if self.loss_scale == "static":
            out["static_loss_scale"] = self.static_loss_scale
        if self.loss_scale == "dynamic":
            out.update(init_scale=self.init_scale, growth_factor=self.growth_factor,
                       backoff_factor=self.backoff_factor,
                       growth_interval=self.growth_interval)
        if self.delayed:
            out.update(amax_history=self.amax_history, amax_mode=self.amax_mode)
        return out


def _plain(name: str, description: str, fmt: str, **fields) -> Recipe:
    cast = Cast(fmt)
    return Recipe(name, description, cast, cast, cast, **fields)


def _same(name: str, description: str, act: Cast, weight: Cast, grad: Cast,
          transposed: bool, **fields) -> Recipe:
    """A recipe whose backward casts are the forward's along the other GEMMs' axes
    (``transposed``: blocks, rows or tiles that are not symmetric need X^T, dY^T and W^T
    cast again; a tensor scale or a square tile gives the same values either way)."""
    square = weight.group is not None and weight.group.kind is Granularity.TILE \
        and weight.group.tile[0] == weight.group.tile[1]
    return Recipe(name, description, act, weight, grad,
                  wgrad_activation=act if transposed else None,
                  wgrad_grad=grad if transposed else None,
                  dgrad_weight=weight if transposed and not square else None, **fields)


def _fp8(name: str, group: ScaleGroup | None, rule: ScaleRule, fwd: str, bwd: str,
         description: str, transposed: bool = False, **fields) -> Recipe:
    act = Cast(fwd, group, rule)
    return _same(name, description, act, act, Cast(bwd, group, rule), transposed, **fields)


def _nvfp4(two_d_weights: bool, hadamard: bool, stochastic_grads: bool) -> Recipe:
    """Transformer Engine's NVFP4 training recipe (``NVFP4BlockScaling``: 1x16 blocks,
    E4M3 block scales times a float32 tensor scale; weights in 16x16 blocks
    (``disable_2d_quantization``), the random Hadamard transform on the wgrad inputs
    (``disable_rht``: fp4_quant_fwd_inp and fp4_quant_bwd_grad, columnwise use only) and
    stochastic rounding of the gradients (``disable_stochastic_rounding``: bwd_grad))."""
    two = ScaleFormat.E4M3_FP32
    sr = RoundingMode.STOCHASTIC if stochastic_grads else RoundingMode.NEAREST_EVEN
    rht = 16 if hadamard else 0
    act = Cast(FP4, _block(16), scale_format=two)
    weight = Cast(FP4, _tile(16, 16) if two_d_weights else _block(16), scale_format=two)
    grad = Cast(FP4, _block(16), scale_format=two, rounding=sr)
    parts = ["16x16 weight blocks" if two_d_weights else "1x16 weight blocks",
             "RHT on the wgrad inputs" if hadamard else "no RHT",
             "stochastic rounding of gradients" if stochastic_grads else "nearest-even"]
    return Recipe("nvfp4", "NVFP4 (E2M1, 1x16 blocks, E4M3 x FP32 scales; TE's recipe): "
                  + ", ".join(parts), act, weight, grad,
                  wgrad_activation=replace(act, hadamard=rht),
                  wgrad_grad=replace(grad, hadamard=rht),
                  dgrad_weight=None if two_d_weights else weight)


def _mx(name: str, fmt: str, description: str, rule: ScaleRule) -> Recipe:
    """OCP MX: blocks of 32 along each GEMM's reduction axis (so the backward casts X^T,
    dY^T and W^T again), E8M0 scales.  The rule is ``fmt quantize``'s (OCP's floor) unless
    ``mx_rule`` says otherwise: Transformer Engine's MXFP8 kernels round the E8M0 exponent
    up (``float_to_e8m0``: ``cvt.rp.satfinite.ue8m0x2.f32``, fmt's ``mx-rceil``)."""
    cast = Cast(fmt, _block(32), rule, ScaleFormat.E8M0)
    description = description.replace("(floor rule)", f"({rule.value} rule)")
    return _same(name, description, cast, cast, cast, True)


DESCRIPTIONS = {
    "fp32": "float32 GEMM inputs (no cast)",
    "bf16": "bfloat16 GEMM inputs, float32 accumulation (the baseline)",
    "fp16": "float16 GEMM inputs, no loss scaling",
    "fp16-static": "float16 GEMM inputs, a static loss scale",
    "fp16-dynamic": "float16 GEMM inputs, dynamic loss scaling as torch.amp.GradScaler",
    "tensorwise": "FP8 per-tensor current scaling: E4M3 forward, E5M2 gradients (TE hybrid)",
    "delayed": "FP8 per-tensor delayed scaling from an amax history (TE DelayedScaling)",
    "rowwise": "FP8 E4M3, one power-of-two scale per row (torchao rowwise)",
    "deepseek": "FP8 E4M3, 1x128 tiles for activations and gradients, 128x128 for weights "
                "(DeepSeek-V3 3.3)",
    "mxfp8": "OCP MXFP8: E4M3 (gradients too, as TE), blocks of 32, E8M0 scales (floor rule)",
    "mxfp4": "OCP MXFP4: E2M1, blocks of 32, E8M0 scales (floor rule)",
    "nvfp4": "NVFP4: E2M1, 1x16 blocks, E4M3 x FP32 scales (TE's NVFP4 recipe)",
    "fp8-unscaled": "FP8 E4M3 forward / E5M2 backward with scale 1 (what scaling is for)",
}
RECIPE_NAMES: tuple[str, ...] = tuple(DESCRIPTIONS)
OPTIONS = ("amax_history", "amax_mode", "two_d_weights", "hadamard", "stochastic_grads",
           "growth_interval", "static_loss_scale", "mx_rule")
MX_RULES = (ScaleRule.MX_FLOOR, ScaleRule.MX_CEIL, ScaleRule.MX_EVEN, ScaleRule.MX_RCEIL)


def _build(name: str, o: dict) -> Recipe:
    d = DESCRIPTIONS[name]
    if name in ("fp32", "bf16", "fp16"):
        return _plain(name, d, {"fp32": "float32", "bf16": "bfloat16"}.get(name, "float16"))
    if name == "fp16-static":
        return _plain(name, d, "float16", loss_scale="static",
                      static_loss_scale=o["static_loss_scale"])
    if name == "fp16-dynamic":
        return _plain(name, d, "float16", loss_scale="dynamic",
                      growth_interval=o["growth_interval"])
    if name == "tensorwise":
        return _fp8(name, TENSOR, ScaleRule.AMAX, E4M3, E5M2, d)
    if name == "delayed":
        return _fp8(name, TENSOR, ScaleRule.FIXED, E4M3, E5M2, d, delayed=True,
                    amax_history=o["amax_history"], amax_mode=o["amax_mode"])
    if name == "rowwise":
        return _fp8(name, ROW, ScaleRule.POW2_FLOOR, E4M3, E4M3, d, transposed=True)
    if name == "deepseek":
        act = Cast(E4M3, _tile(1, 128))
        return _same(name, d, act, Cast(E4M3, _tile(128, 128)), act, True)
    if name in ("mxfp8", "mxfp4"):
        return _mx(name, E4M3 if name == "mxfp8" else FP4, d, o["mx_rule"])
    if name == "nvfp4":
        return _nvfp4(o["two_d_weights"], o["hadamard"], o["stochastic_grads"])
    return _fp8(name, None, ScaleRule.AMAX, E4M3, E5M2, d)  # fp8-unscaled


def _options(options: dict) -> dict:
    """The options with their defaults (all of TE's NVFP4 techniques on), checked."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"unknown recipe option '{unknown[0]}'",
                         "options: " + ", ".join(OPTIONS))
    o = {"amax_history": 16, "amax_mode": "max", "two_d_weights": True, "hadamard": True,
         "stochastic_grads": True, "growth_interval": 2000, "static_loss_scale": 2.0 ** 15,
         "mx_rule": ScaleRule.MX_FLOOR}
    o.update({k: v for k, v in options.items() if v is not None})
    history = o["amax_history"]
    if isinstance(history, bool) or not isinstance(history, int) \
            or not 1 <= history <= MAX_HISTORY:
        raise UsageError(Param("amax_history", history)
                         + f": an amax history holds 1 to {MAX_HISTORY} steps")
    o["amax_mode"] = amax_mode(o["amax_mode"])
    interval = o["growth_interval"]
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise UsageError(Param("growth_interval", interval)
                         + ": the growth interval is a number of steps >= 1")
    scale = o["static_loss_scale"]
    if not isinstance(scale, (int, float)) or not 0 < float(scale) < float("inf"):
        raise UsageError(Param("static_loss_scale", scale)
                         + ": a loss scale must be positive and finite")
    o["static_loss_scale"] = float(scale)
    rule = o["mx_rule"]
    if rule not in {r.value for r in MX_RULES} | set(MX_RULES):
        raise UsageError(Param("mx_rule", rule) + ": one of "
                         + ", ".join(r.value for r in MX_RULES))
    o["mx_rule"] = ScaleRule(rule)
    for flag in ("two_d_weights", "hadamard", "stochastic_grads"):
        o[flag] = bool(o[flag])
    return o


def get_recipe(name: str, **options) -> Recipe:
    """The recipe ``name`` (one of ``RECIPE_NAMES``) with ``options``: ``amax_history``,
    ``amax_mode`` (delayed), ``two_d_weights``, ``hadamard``, ``stochastic_grads``
    (nvfp4; all on by default, as TE's recipe), ``growth_interval`` (fp16-dynamic),
    ``static_loss_scale`` (fp16-static), ``mx_rule`` (mxfp8, mxfp4: an ``mx-*`` scale
    rule, ``mx-floor`` by default as ``fmt quantize``, ``mx-rceil`` as TE); an option a
    recipe has no use for is ignored (one command line sets them for every recipe it
    runs), None keeps the default.
    DeepSeek-V3's limited-precision accumulation (``fmt dot``'s 14 bits, promoted every
    128) is not an option yet: every recipe accumulates in float32."""
    key = str(name).strip().lower()
    if key not in DESCRIPTIONS:
        close = difflib.get_close_matches(key, RECIPE_NAMES, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "recipes: " + ", ".join(RECIPE_NAMES)
        raise UsageError(f"unknown recipe '{name}'", hint)
    o = _options(options)
    recipe = _build(key, o)
    used = {"delayed": ("amax_history", "amax_mode"),
            "nvfp4": ("two_d_weights", "hadamard", "stochastic_grads"),
            "fp16-dynamic": ("growth_interval",), "fp16-static": ("static_loss_scale",),
            "mxfp8": ("mx_rule",), "mxfp4": ("mx_rule",)}
    return replace(recipe, options=tuple((k, getattr(o[k], "value", o[k]))
                                         for k in used.get(key, ())))


def parse_recipes(text: str, **options) -> list[Recipe]:
    """A comma-separated list of recipe names (``--recipe A,B``), each once, in order."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise UsageError(Param("recipe", text) + ": name at least one recipe",
                         "recipes: " + ", ".join(RECIPE_NAMES))
    seen: list[Recipe] = []
    for n in names:
        recipe = get_recipe(n, **options)
        if all(r.name != recipe.name for r in seen):
            seen.append(recipe)
    return seen
