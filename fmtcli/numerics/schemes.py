"""Quantization schemes: element format + granularity + scale rule, and the named recipes.

Every tensor is seen as a matrix: rows = the product of all dimensions but the last,
columns = the last dimension (a 1-D tensor is one row).  Each granularity is a *tile* of
that matrix sharing one scale:

    tensor       all rows x all columns
    row          1 x all columns            (one scale per row)
    column       all rows x 1               (one scale per column)
    block N      1 x N along the last axis, or N x 1 with ``axis=0``
    tile RxC     R x C  (DeepSeek-V3: 128x128 for weights, 1x128 for activations)

A ragged last block or tile (the size does not divide the dimension) is simply smaller.
Scale direction: ``x_q = cast(x * scale) / scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from fmtcli.base.choices import Granularity
from fmtcli.base.errors import Message, Param, UsageError
from fmtcli.numerics.formats import FormatSpec, get_format
from fmtcli.numerics.granularity import HEAD_KINDS, ScaleGroup
from fmtcli.numerics.rounding import OverflowPolicy, RoundingMode
from fmtcli.numerics.scaling import MX_RULES, Product, ScaleRule


class ScaleFormat(str, Enum):
    """How scales are stored: float32, E8M0 powers of two (MX), or NVFP4's two levels
    (an E4M3 scale per block times a float32 scale per tensor)."""

    FLOAT32 = "float32"
    E8M0 = "e8m0"
    E4M3_FP32 = "e4m3+fp32"


@dataclass(frozen=True)
class Scheme:
    """One way to quantize: what format, which elements share a scale, how it is chosen."""

    format: FormatSpec
    granularity: Granularity = Granularity.BLOCK
    block: int = 128
    axis: int = -1
    tile: tuple[int, int] = (1, 128)
    weight_tile: tuple[int, int] | None = None  # tile for weight tensors (DeepSeek recipe)
    scale_rule: ScaleRule = ScaleRule.AMAX
    margin: float = 0
    percentile: float | None = None  # the q of the percentile rule, in percent (99.9)
    fixed_scale: float | None = None  # the scale of the fixed rule
    scale_format: ScaleFormat = ScaleFormat.FLOAT32
    rounding: RoundingMode = RoundingMode.NEAREST_EVEN
    overflow: OverflowPolicy = OverflowPolicy.SATURATE
    recipe: str | None = None
    product: Product = Product.FLOAT32  # the width of x * scale (scaling.Product)

    def __post_init__(self) -> None:
        if self.block < 1:
            raise UsageError(Param("block", self.block) + ": a block size must be >= 1")
        if self.tile[0] < 1 or self.tile[1] < 1:
            raise UsageError(f"tile sides must be >= 1, got {self.tile[0]}x{self.tile[1]}")
        if self.axis not in (0, -1):
            raise UsageError(Param("axis", self.axis) + ": the block axis must be -1 (last) or 0 "
                             "(first)")
        if self.granularity in HEAD_KINDS:
            raise UsageError(f"granularity {self.granularity.value!r} is a KV cache's (fmt "
                             "kv): a scheme takes tensor, row, column, block or tile")
        if not -16 <= self.margin <= 64:
            raise UsageError(Param("margin", self.margin) + ": a margin must be 0..64")
        if (self.scale_rule is ScaleRule.PERCENTILE) != (self.percentile is not None):
            raise UsageError("the percentile rule and percentile= go together")
        if self.percentile is not None and not 0 < self.percentile <= 100:
            raise UsageError(Param("percentile", self.percentile)
                             + ": a percentile must be in (0, 100]")
        if (self.scale_rule is ScaleRule.FIXED) != (self.fixed_scale is not None):
            raise UsageError("the fixed rule and a fixed scale go together")
        if self.fixed_scale is not None:
            if not (math.isfinite(self.fixed_scale) and self.fixed_scale > 0):
                raise UsageError(f"a fixed scale must be positive and finite, got "
                                 f"{self.fixed_scale}")
            if self.granularity is not Granularity.TENSOR:
                raise UsageError("a fixed scale is one scale per tensor (" + Param("per", "tensor")
                                 + ")")
        if self.scale_rule in MX_RULES and self.scale_format is ScaleFormat.FLOAT32:
            object.__setattr__(self, "scale_format", ScaleFormat.E8M0)
        if self.scale_format is ScaleFormat.E8M0 and self.scale_rule not in MX_RULES:
            raise UsageError(f"E8M0 scales need an mx-* scale rule, not {self.scale_rule.value}")
        if self.scale_format is ScaleFormat.E4M3_FP32 and self.scale_rule is not ScaleRule.AMAX:
            raise UsageError("NVFP4 two-level scales use the amax rule")

    @property
    def group(self) -> ScaleGroup:
        """What one scale covers, in the vocabulary every analysis shares."""
        return ScaleGroup(self.granularity, self.block, self.axis, self.tile)

    def tile_shape(self, rows: int, cols: int, ndim: int = 2) -> tuple[int, int]:
        """The (rows, columns) of the tile that shares one scale, clipped to the matrix.

        For a 1-D tensor (one row) both axes name its only axis: blocks run along it."""
        return self.group.tile_shape(rows, cols, ndim)

    @property
    def label(self) -> str:
        """Short column header: 'per-tensor', 'block 128', 'tile 128x128', 'mxfp8', ..."""
        text = self.group.label
        if self.granularity is Granularity.TILE and self.weight_tile:
            text += f" ({self.weight_tile[0]}x{self.weight_tile[1]} weights)"
        return f"{self.recipe}: {text}" if self.recipe else text

    def to_dict(self) -> dict:
        g = self.granularity
        return {
            "label": self.label, "recipe": self.recipe, "format": self.format.name,
            "granularity": g.value,
            "block": self.block if g is Granularity.BLOCK else None,
            "axis": self.axis if g is Granularity.BLOCK else None,
            "tile": list(self.tile) if g is Granularity.TILE else None,
            "weight_tile": list(self.weight_tile) if self.weight_tile else None,
            "scale_rule": self.scale_rule.value, "margin": self.margin,
            "percentile": self.percentile, "fixed_scale": self.fixed_scale,
            "scale_format": self.scale_format.value, "rounding": self.rounding.value,
            "overflow": self.overflow.value, "product": self.product.value,
        }


def parse_tile(text: str) -> tuple[int, int]:
    """'128x128' -> (128, 128)."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        rows, cols = (int(p) for p in parts)
    except ValueError:
        raise UsageError(Param("tile", text) + ": a tile must look like 128x128 or 1x128"
                         ) from None
    if rows < 1 or cols < 1:
        raise UsageError(Param("tile", text) + ": tile sides must be >= 1")
    return rows, cols


# -- recipes -----------------------------------------------------------------------------

#: name -> (description, fields).  Fields left out keep the command's own options.
RECIPES: dict[str, tuple[str, dict]] = {
    "tensorwise": ("one amax scale per tensor, E4M3 (torchao/TE tensorwise FP8)",
                   dict(format="float8_e4m3fn", granularity=Granularity.TENSOR,
                        scale_rule=ScaleRule.AMAX)),
    "rowwise": ("one power-of-two scale per row, E4M3 (torchao rowwise FP8)",
                dict(format="float8_e4m3fn", granularity=Granularity.ROW,
                     scale_rule=ScaleRule.POW2_FLOOR)),
    "deepseek": ("E4M3 with float32 amax scales per 128x128 weight tile (tensors with >= 2 "
                 "dimensions whose key ends in 'weight') or 1x128 activation tile (others) "
                 "(DeepSeek-V3 §3.3)",
                 dict(format="float8_e4m3fn", granularity=Granularity.TILE, tile=(1, 128),
                      weight_tile=(128, 128), scale_rule=ScaleRule.AMAX)),
    "mxfp8": ("OCP MXFP8: E4M3 elements, blocks of 32, E8M0 scale (floor rule)",
              dict(format="float8_e4m3fn", granularity=Granularity.BLOCK, block=32,
                   scale_rule=ScaleRule.MX_FLOOR)),
    "mxfp6": ("OCP MXFP6: E2M3 elements, blocks of 32, E8M0 scale (floor rule)",
              dict(format="float6_e2m3fn", granularity=Granularity.BLOCK, block=32,
                   scale_rule=ScaleRule.MX_FLOOR)),
    "mxfp4": ("OCP MXFP4: E2M1 elements, blocks of 32, E8M0 scale (floor rule)",
              dict(format="float4_e2m1fn", granularity=Granularity.BLOCK, block=32,
                   scale_rule=ScaleRule.MX_FLOOR)),
    "nvfp4": ("NVIDIA NVFP4: E2M1 elements, blocks of 16, E4M3 block scale times a float32 "
              "tensor scale",
              dict(format="float4_e2m1fn", granularity=Granularity.BLOCK, block=16,
                   scale_rule=ScaleRule.AMAX, scale_format=ScaleFormat.E4M3_FP32)),
}
STANDARD_RECIPES = tuple(RECIPES)


def recipe_fields(name: str) -> dict:
    """The fields a recipe sets (format resolved to a spec)."""
    if name not in RECIPES:
        import difflib

        close = difflib.get_close_matches(name, RECIPES, n=2)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(RECIPES)}"
        raise UsageError(f"unknown recipe '{name}'", hint)
    fields = dict(RECIPES[name][1])
    fields["format"] = get_format(fields["format"])
    fields["recipe"] = name
    return fields


def for_tensor(scheme: Scheme, key: str | None, ndim: int) -> Scheme:
    """Resolve per-tensor choices: a ``weight_tile`` applies to tensors with >= 2 dimensions
    whose key ends in 'weight' (DeepSeek-V3's 128x128 weight tiles), else ``tile``."""
    if scheme.weight_tile is None or scheme.granularity is not Granularity.TILE:
        return scheme
    is_weight = ndim >= 2 and key is not None and key.endswith("weight")
    return replace(scheme, tile=scheme.weight_tile if is_weight else scheme.tile,
                   weight_tile=None)


def build_scheme(*, format: FormatSpec | None = None, block: int | None = None,
                 tile: str | None = None, per: Granularity | None = None, axis: int | None = None,
                 scale_rule: ScaleRule | None = None, margin: int | None = None,
                 recipe: str | None = None, rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                 overflow: OverflowPolicy = OverflowPolicy.SATURATE,
                 percentile: float | None = None, fixed_scale: float | None = None) -> Scheme:
    """The scheme from command-line choices: defaults, then the recipe, then explicit options.

    Defaults: float8_e4m3fn, blocks of 128 along the last axis, amax scales.  ``block``,
    ``tile`` and ``per`` are alternatives (at most one).  ``percentile`` (percent) goes with
    the percentile rule, ``fixed_scale`` (x_q = cast(x * fixed_scale) / fixed_scale) with the
    fixed rule; Scheme checks that they do.
    """
    given = [Param(name, value, repr) for name, value in (("block", block), ("tile", tile),
                                                     ("per", per and Granularity(per).value))
             if value is not None]
    if len(given) > 1:
        raise UsageError(Message.joined(given, " and ") + " are alternatives: give one")
    fields: dict = {"format": get_format("float8_e4m3fn"), "granularity": Granularity.BLOCK,
                    "block": 128}
    if recipe is not None:
        fields.update(recipe_fields(recipe))
    if format is not None:
        fields["format"] = format
    if block is not None:
        fields.update(granularity=Granularity.BLOCK, block=block, weight_tile=None)
    if tile is not None:
        fields.update(granularity=Granularity.TILE, tile=parse_tile(tile), weight_tile=None)
    if per is not None:
        if per in (Granularity.BLOCK, Granularity.TILE):
            raise UsageError(Param("per", per, lambda g: repr(Granularity(g).value))
                             + ": per takes tensor, row or column (blocks and tiles: "
                             + Param("block", "N", "N") + " or " + Param("tile", "RxC")
                             + ")")
        fields.update(granularity=per, weight_tile=None)
    if axis is not None:
        fields["axis"] = axis
    if scale_rule is not None:
        fields["scale_rule"] = scale_rule
        if scale_rule not in MX_RULES and fields.get("scale_format") is ScaleFormat.E8M0:
            fields["scale_format"] = ScaleFormat.FLOAT32
        if scale_rule is not ScaleRule.AMAX and fields.get("scale_format") is ScaleFormat.E4M3_FP32:
            raise UsageError("the nvfp4 recipe's two-level scales use the amax rule")
    if margin is not None:
        fields["margin"] = margin
    if percentile is not None:
        fields["percentile"] = percentile
    if fixed_scale is not None:
        fields["fixed_scale"] = fixed_scale
    return Scheme(rounding=RoundingMode(rounding), overflow=OverflowPolicy(overflow), **fields)


def comparison_schemes(main: Scheme, compare: str) -> list[Scheme]:
    """The schemes a run reports: ``tensor`` (default) puts a per-tensor scheme of the same
    format and rule beside ``main``; ``none`` gives ``main`` alone; ``all`` every standard
    recipe (with ``main``'s rounding and overflow policy)."""
    if compare == "none" or (compare == "tensor" and main.granularity is Granularity.TENSOR):
        return [main]
    if compare == "tensor":
        rule = main.scale_rule
        fmt = main.scale_format if main.scale_format is not ScaleFormat.E4M3_FP32 \
            else ScaleFormat.FLOAT32
        baseline = replace(main, granularity=Granularity.TENSOR, weight_tile=None, recipe=None,
                           scale_format=fmt, scale_rule=rule)
        return [baseline, main]
    if compare == "all":
        return [Scheme(rounding=main.rounding, overflow=main.overflow, **recipe_fields(name))
                for name in STANDARD_RECIPES]
    raise UsageError(Param("compare", compare) + ": compare takes tensor, none or all")
