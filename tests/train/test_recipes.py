"""``fmt train``'s recipes: each recipe's casts (formats, groups, rules, the backward's own
casts), the names shared with ``fmt quantize --recipe`` casting with quantize's scheme, the
options (TE's NVFP4 switches, the amax history, GradScaler's parameters) and the errors."""

from __future__ import annotations

import json

import pytest

from fmtcli.base.choices import Granularity, RoundingMode, ScaleRule
from fmtcli.base.errors import UsageError
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.schemes import ScaleFormat, build_scheme, for_tensor
from fmtcli.train.recipes import RECIPE_NAMES, get_recipe, parse_recipes

TENSOR = ScaleGroup(Granularity.TENSOR)
ROW = ScaleGroup(Granularity.ROW)


def block(n):
    return ScaleGroup(Granularity.BLOCK, n)


def tile(r, c):
    return ScaleGroup(Granularity.TILE, tile=(r, c))


def fg(cast):
    """(format, group) of a cast, None for a reused one."""
    return None if cast is None else (cast.format, cast.group)


def test_every_name_of_the_issue_is_a_recipe():
    assert set(RECIPE_NAMES) == {"fp32", "bf16", "fp16", "fp16-static", "fp16-dynamic",
                                 "tensorwise", "delayed", "rowwise", "deepseek", "mxfp8",
                                 "mxfp4", "nvfp4", "fp8-unscaled"}
    for name in RECIPE_NAMES:
        recipe = get_recipe(name)
        assert recipe.name == name and recipe.description
        json.dumps(recipe.to_dict(), allow_nan=False)


@pytest.mark.parametrize("name, fmt", [("fp32", "float32"), ("bf16", "bfloat16"),
                                       ("fp16", "float16"), ("fp16-static", "float16"),
                                       ("fp16-dynamic", "float16")])
def test_wide_recipes_are_plain_casts(name, fmt):
    r = get_recipe(name)
    for cast in (r.activation, r.weight, r.grad_output):
        assert (cast.format, cast.group) == (fmt, None)
    assert r.wgrad_activation is r.wgrad_grad is r.dgrad_weight is None
    assert r.loss_scale == {"fp16-static": "static", "fp16-dynamic": "dynamic"}.get(name, "none")


def test_fp16_dynamic_is_gradscalers_defaults():
    r = get_recipe("fp16-dynamic")
    assert (r.init_scale, r.growth_factor, r.backoff_factor, r.growth_interval) == \
        (65536.0, 2.0, 0.5, 2000)
    assert get_recipe("fp16-dynamic", growth_interval=50).growth_interval == 50
    assert get_recipe("fp16-static", static_loss_scale=1024).static_loss_scale == 1024.0
    d = get_recipe("fp16-dynamic").to_dict()
    assert d["init_scale"] == 65536.0 and d["growth_interval"] == 2000


def test_tensorwise_and_delayed_are_te_hybrid():
    t = get_recipe("tensorwise")
    assert fg(t.activation) == fg(t.weight) == ("float8_e4m3fn", TENSOR)
    assert fg(t.grad_output) == ("float8_e5m2", TENSOR)
    assert t.activation.scale_rule is ScaleRule.AMAX and not t.delayed
    assert t.wgrad_activation is t.wgrad_grad is t.dgrad_weight is None
    d = get_recipe("delayed", amax_history=4, amax_mode="most_recent")
    assert d.delayed and (d.amax_history, d.amax_mode) == (4, "most-recent")
    assert fg(d.grad_output) == ("float8_e5m2", TENSOR)
    assert d.activation.scale_rule is ScaleRule.FIXED
    assert get_recipe("delayed").amax_history == 16


def test_fp8_unscaled_casts_with_scale_one():
    r = get_recipe("fp8-unscaled")
    assert fg(r.activation) == fg(r.weight) == ("float8_e4m3fn", None)
    assert fg(r.grad_output) == ("float8_e5m2", None)


def test_rowwise_deepseek_and_mx_cast_the_backward_along_its_own_axes():
    r = get_recipe("rowwise")
    assert all(fg(c) == ("float8_e4m3fn", ROW) for c in r.casts().values())
    assert r.activation.scale_rule is ScaleRule.POW2_FLOOR
    d = get_recipe("deepseek")
    assert fg(d.activation) == fg(d.grad_output) == ("float8_e4m3fn", tile(1, 128))
    assert fg(d.weight) == ("float8_e4m3fn", tile(128, 128))
    assert fg(d.wgrad_activation) == fg(d.wgrad_grad) == ("float8_e4m3fn", tile(1, 128))
    assert d.dgrad_weight is None  # a 128x128 tile of W^T holds the same values
    for name, fmt in (("mxfp8", "float8_e4m3fn"), ("mxfp4", "float4_e2m1fn")):
        m = get_recipe(name)
        for cast in m.casts().values():
            assert fg(cast) == (fmt, block(32))
            assert (cast.scale_rule, cast.scale_format) == (ScaleRule.MX_FLOOR,
                                                             ScaleFormat.E8M0)


def test_nvfp4_is_tes_recipe_with_every_switch():
    r = get_recipe("nvfp4")
    two = ScaleFormat.E4M3_FP32
    assert fg(r.activation) == fg(r.grad_output) == ("float4_e2m1fn", block(16))
    assert fg(r.weight) == ("float4_e2m1fn", tile(16, 16)) and r.dgrad_weight is None
    assert all(c.scale_format is two for c in r.casts().values() if c is not None)
    assert r.activation.rounding is RoundingMode.NEAREST_EVEN
    assert r.weight.rounding is RoundingMode.NEAREST_EVEN
    assert r.grad_output.rounding is RoundingMode.STOCHASTIC
    assert (r.wgrad_activation.hadamard, r.wgrad_grad.hadamard) == (16, 16)
    assert r.activation.hadamard == r.grad_output.hadamard == r.weight.hadamard == 0
    assert r.wgrad_grad.rounding is RoundingMode.STOCHASTIC
    assert r.wgrad_activation.rounding is RoundingMode.NEAREST_EVEN
    off = get_recipe("nvfp4", two_d_weights=False, hadamard=False, stochastic_grads=False)
    assert fg(off.weight) == fg(off.dgrad_weight) == ("float4_e2m1fn", block(16))
    assert off.wgrad_activation.hadamard == off.wgrad_grad.hadamard == 0
    assert all(c.rounding is RoundingMode.NEAREST_EVEN
               for c in off.casts().values() if c is not None)
    assert dict(off.options) == {"two_d_weights": False, "hadamard": False,
                                 "stochastic_grads": False}
    assert "RHT16 SR" in r.wgrad_grad.label()


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "deepseek", "mxfp8", "mxfp4",
                                  "nvfp4"])
def test_shared_names_cast_with_quantizes_scheme(name):
    """A recipe of both commands: train's forward casts are quantize's scheme for an
    activation and for a weight (deepseek's 128x128 weight tiles)."""
    r = get_recipe(name, two_d_weights=False)
    for cast, key in ((r.activation, "layers.0.mlp.fc1.input"), (r.weight, "fc1.weight")):
        q = for_tensor(build_scheme(recipe=name), key, 2)
        s = cast.scheme()
        assert (s.format, s.group, s.scale_rule, s.scale_format) == \
            (q.format, q.group, q.scale_rule, q.scale_format), key


def test_mx_rule_option():
    r = get_recipe("mxfp8", mx_rule="mx-rceil")
    assert all(c.scale_rule is ScaleRule.MX_RCEIL for c in r.casts().values())
    assert "mx-rceil" in r.description and dict(r.options) == {"mx_rule": "mx-rceil"}
    assert get_recipe("mxfp4").activation.scale_rule is ScaleRule.MX_FLOOR
    with pytest.raises(UsageError):
        get_recipe("mxfp8", mx_rule="amax")


def test_an_unknown_recipe_suggests_the_closest():
    with pytest.raises(UsageError) as error:
        get_recipe("nvpf4")
    assert "unknown recipe 'nvpf4'" in str(error.value)
    assert "nvfp4" in str(error.value.suggestion)
    with pytest.raises(UsageError) as error:
        get_recipe("zzzz")
    assert "bf16" in str(error.value.suggestion)


def test_bad_options_are_usage_errors():
    for bad in (dict(amax_history=0), dict(amax_history=2.5), dict(amax_mode="mean"),
                dict(growth_interval=0), dict(static_loss_scale=-1.0), dict(colour=1)):
        with pytest.raises(UsageError):
            get_recipe("delayed", **bad)
    assert get_recipe("bf16", amax_history=None).name == "bf16"


def test_parse_recipes_keeps_order_and_drops_repeats():
    assert [r.name for r in parse_recipes("bf16, nvfp4,BF16")] == ["bf16", "nvfp4"]
    with pytest.raises(UsageError):
        parse_recipes(" , ")
    with pytest.raises(UsageError):
        parse_recipes("bf16,fp9")
