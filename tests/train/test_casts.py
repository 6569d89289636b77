"""``fmt train``'s casts: ``fake_quant`` is, to the bit, what ``fmt quantize``'s engine makes
of the same tensor under the same scheme (``engine.quantize_tensor`` with its kept values),
for every cast of every recipe, on normal and heavy-tailed data; its counts are the
engine's; the random Hadamard transform is Transformer Engine's and cancels in a product;
the amax history is TE's delayed scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fmtcli.base.choices import Granularity, OverflowPolicy, RoundingMode, ScaleRule  # noqa: E402
from fmtcli.base.errors import UsageError  # noqa: E402
from fmtcli.engine.run import quantize_tensor  # noqa: E402
from fmtcli.inputs.source import TensorSource  # noqa: E402
from fmtcli.numerics import native  # noqa: E402
from fmtcli.numerics.formats import get_format  # noqa: E402
from fmtcli.numerics.granularity import ScaleGroup  # noqa: E402
from fmtcli.numerics.schemes import ScaleFormat, Scheme  # noqa: E402
from fmtcli.train import fast_casts, hadamard  # noqa: E402
from fmtcli.train.casts import Cast, CastCount, fake_quant, quantize_matrix  # noqa: E402
from fmtcli.train.recipes import RECIPE_NAMES, get_recipe  # noqa: E402
from fmtcli.train.scaling_state import AmaxHistory  # noqa: E402


def normal(shape=(48, 200), seed=1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def heavy_tailed(shape=(48, 200), seed=2) -> np.ndarray:
    """Student-t (2 degrees of freedom) over many binades, zeros, values far below the
    rest (flushed) and outliers past E4M3's max (saturated under a fixed scale)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(2, shape) * 2.0 ** rng.integers(-12, 4, shape)
    x.flat[::53] = 0
    x.flat[7::61] *= 1e-9
    x.flat[3::89] = 900.0
    return x.astype(np.float32)


DATA = {"normal": normal, "heavy": heavy_tailed}


def engine(x: np.ndarray, scheme: Scheme, key: str = "x", seed: int = 0, **options):
    """The engine's x_q of a 2-D tensor under one scheme, and its accumulator."""
    out = np.zeros(x.shape, np.float32)

    def sink(rs, cs, block):
        out[rs, cs] = block

    source = TensorSource("mem", key, x.shape, "float32", lambda: x)
    runs, _ = quantize_tensor(source, [scheme], keep=0, keep_mode="values", sink=sink,
                              workers=1, seed=seed, **options)
    return out, runs[0].acc


def scheme_of(cast: Cast, scale: float | None) -> Scheme:
    """The engine's scheme of a cast; a fixed scale (delayed, a plain cast: 1) is the
    engine's fixed rule per tensor."""
    if cast.group is not None and cast.scale_rule is not ScaleRule.FIXED:
        return cast.scheme()
    return Scheme(cast.spec, granularity=Granularity.TENSOR, scale_rule=ScaleRule.FIXED,
                  fixed_scale=1.0 if scale is None else scale, rounding=cast.rounding,
                  overflow=cast.overflow_policy)


def recipe_casts():
    seen = {}
    variants = [(name, {}) for name in RECIPE_NAMES] + [
        ("mxfp8", {"mx_rule": "mx-rceil"}),
        ("nvfp4", {"two_d_weights": False, "hadamard": False, "stochastic_grads": False})]
    for name, options in variants:
        for role, cast in get_recipe(name, **options).casts().items():
            if cast is not None and not cast.identity:
                tag = "".join(f"+{k}={v}" for k, v in options.items())
                seen.setdefault(cast, f"{name}{tag}.{role}")
    return [pytest.param(cast, id=label) for cast, label in seen.items()]


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("cast", recipe_casts())
def test_fake_quant_is_the_engines_cast_to_the_bit(cast, data):
    x = DATA[data]()
    scale = 37.5 if cast.scale_rule is ScaleRule.FIXED else None
    m = hadamard.forward(x, cast.hadamard) if cast.hadamard else x
    expected, acc = engine(m, scheme_of(cast, scale), seed=11)
    if cast.hadamard:
        expected = hadamard.inverse(expected, cast.hadamard)
    count = CastCount()
    got = fake_quant(torch.from_numpy(x.copy()), cast, scale=scale, rng=11, count=count)
    assert got.dtype == torch.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))
    assert count.flushed == acc.flushed and count.nonzero == acc.nonzero
    assert count.saturated == acc.saturated  # stochastic rounding's too: its draws'
    assert count.elements == x.size and count.steps == 1


def kernel_casts():
    """The recipes' casts that the compiled kernel does (``train.fast_casts``)."""
    return [p for p in recipe_casts() if p.values[0].format in fast_casts.FORMATS
            and p.values[0].rounding is RoundingMode.NEAREST_EVEN and not p.values[0].hadamard]


needs_kernel = pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built")


@needs_kernel
@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("cast", kernel_casts())
def test_the_kernel_path_is_the_numpy_path_and_the_engines(cast, data):
    """Whole tiles (the shape divides every tile): fake_quant takes the compiled kernel, and
    it is numpy's cast (quantize_matrix) and the engine's, values and counts, to the bit."""
    x = DATA[data]((128, 256))
    scale = 37.5 if cast.scale_rule is ScaleRule.FIXED else None
    t = torch.from_numpy(x.copy())
    assert fast_casts.applies(cast, t)
    assert fast_casts.fast_cast(x.copy(), cast, scale) is not None
    count = CastCount()
    got = fake_quant(t, cast, scale=scale, count=count).numpy()
    numpy_cast = quantize_matrix(x, cast, scale=scale)
    np.testing.assert_array_equal(got.view(np.uint32), numpy_cast.values.view(np.uint32))
    expected, acc = engine(x, scheme_of(cast, scale))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert (count.flushed, count.nonzero, count.saturated) == (acc.flushed, acc.nonzero,
                                                               acc.saturated)
    assert count.saturated == numpy_cast.saturated
    assert (count.scale_min, count.scale_max) == (numpy_cast.scale_min, numpy_cast.scale_max)
    assert count.amax_max == numpy_cast.amax
    np.testing.assert_array_equal(t.numpy(), x)  # the input is untouched


@needs_kernel
@pytest.mark.parametrize("fmt", fast_casts.FORMATS)
def test_the_kernel_path_on_every_kind_of_value_and_scale(fmt):
    """x + (x_q - x) is x_q: random float32 bit patterns over 60 binades (zeros, float32
    subnormals, values that flush, round to the smallest subnormal, saturate far past max),
    fixed scales of every size and per-row amax scales; the same bits as numpy's cast."""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 1 << 23, (64, 512), dtype=np.uint64).astype(np.uint32)
    bits |= rng.integers(95, 155, bits.shape).astype(np.uint32) << np.uint32(23)
    bits |= rng.integers(0, 2, bits.shape).astype(np.uint32) << np.uint32(31)
    x = bits.view(np.float32)
    x[:, ::37] = 0
    x[::5, 3::41] = -0.0
    x[1, :9] = np.float32(1e-40)  # float32 subnormals
    casts = [(Cast(fmt, ScaleGroup(Granularity.TENSOR), scale_rule=ScaleRule.FIXED), s)
             for s in (1.0, 2.0 ** -20, 3.7e-9, 0.3, 1e5, 6.1e11)]
    casts.append((Cast(fmt, ScaleGroup(Granularity.ROW)), None))
    casts.append((Cast(fmt, ScaleGroup(Granularity.BLOCK, 32), scale_rule=ScaleRule.MX_FLOOR,
                       scale_format=ScaleFormat.E8M0), None))
    for cast, scale in casts:
        done = fast_casts.fast_cast(x, cast, scale)
        assert done is not None
        want = quantize_matrix(x, cast, scale=scale)
        np.testing.assert_array_equal(done[0].view(np.uint32), want.values.view(np.uint32))
        assert done[1] == want.saturated


def test_without_the_kernel_the_numpy_path_casts(monkeypatch):
    """FMTCLI_KERNEL=numpy (or no compiled kernel): fast_casts does not apply, and
    fake_quant still gives the engine's values."""
    monkeypatch.setenv("FMTCLI_KERNEL", "numpy")
    cast = get_recipe("mxfp8").activation
    assert not fast_casts.applies(cast, torch.zeros(2, 2))
    x = normal((64, 128))
    got = fake_quant(torch.from_numpy(x), cast).numpy()
    np.testing.assert_array_equal(got, engine(x, cast.scheme())[0])


@pytest.mark.parametrize("name, role", [("tensorwise", "grad_output"), ("nvfp4", "wgrad_grad"),
                                        ("nvfp4", "weight"), ("deepseek", "weight")])
def test_the_engine_in_many_chunks_agrees_too(name, role):
    """The engine cuts a tensor into chunks (a first pass for tensor-wide amaxes, positional
    draws for stochastic rounding): many small chunks give the same values as fake_quant."""
    cast = getattr(get_recipe(name), role)
    x = heavy_tailed((96, 256), seed=4)
    m = hadamard.forward(x, cast.hadamard) if cast.hadamard else x
    expected, _ = engine(m, cast.scheme(), seed=5, chunk_elements=4096)
    if cast.hadamard:
        expected = hadamard.inverse(expected, cast.hadamard)
    got = fake_quant(torch.from_numpy(x), cast, rng=5).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_tensor_is_cast_as_on_the_cpu():
    x = torch.from_numpy(heavy_tailed())
    for name in ("bf16", "fp16", "tensorwise", "mxfp8", "nvfp4"):
        for cast in get_recipe(name).casts().values():
            if cast is None:
                continue
            on_gpu = fake_quant(x.cuda(), cast, rng=3)
            assert on_gpu.device.type == "cuda"
            assert torch.equal(on_gpu.cpu(), fake_quant(x, cast, rng=3)), cast.label()


def test_the_bit_comparison_can_fail():
    """A cast under another rounding than the engine's (toward zero against nearest-even) differs."""
    x = normal()
    cast = Cast("float8_e4m3fn", ScaleGroup(Granularity.BLOCK, 32))
    other = Scheme(cast.spec, block=32, rounding=RoundingMode.TOWARD_ZERO)
    assert not np.array_equal(fake_quant(torch.from_numpy(x), cast).numpy(),
                              engine(x, other)[0])


def test_leading_axes_are_rows_and_the_input_is_untouched():
    x = normal((4, 12, 64))
    keep = x.copy()
    cast = Cast("float8_e4m3fn", ScaleGroup(Granularity.BLOCK, 32))
    got = fake_quant(torch.from_numpy(x), cast)
    assert got.shape == (4, 12, 64)
    np.testing.assert_array_equal(got.numpy().reshape(48, 64),
                                  engine(x.reshape(48, 64), cast.scheme())[0])
    np.testing.assert_array_equal(x, keep)


@pytest.mark.parametrize("shape", [(7,), (), (0, 16), (3, 5, 40)])
def test_any_shape_keeps_its_shape(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    for name in ("bf16", "tensorwise", "nvfp4", "mxfp8", "fp8-unscaled"):
        count = CastCount()
        y = fake_quant(x, get_recipe(name).grad_output, rng=np.random.default_rng(0),
                       count=count)
        assert y.shape == x.shape and y.dtype == torch.float32
        assert count.elements == x.numel()


def test_stochastic_rounding_draws_from_the_generator():
    x = normal()
    cast = Cast("float4_e2m1fn", ScaleGroup(Granularity.BLOCK, 16),
                scale_format=ScaleFormat.E4M3_FP32, rounding=RoundingMode.STOCHASTIC)
    t = torch.from_numpy(x)
    a = fake_quant(t, cast, rng=np.random.default_rng(3)).numpy()
    b = fake_quant(t, cast, rng=np.random.default_rng(3)).numpy()
    c = fake_quant(t, cast, rng=np.random.default_rng(4)).numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    nearest = fake_quant(t, Cast("float4_e2m1fn", ScaleGroup(Granularity.BLOCK, 16),
                                 scale_format=ScaleFormat.E4M3_FP32)).numpy()
    assert not np.array_equal(a, nearest)
    # unbiased: the mean of many draws approaches x (nearest-even's error does not average out)
    draws = np.mean([fake_quant(t, cast, rng=np.random.default_rng(s)).numpy()
                     for s in range(200)], axis=0)
    assert np.abs(draws - x).mean() < 0.25 * np.abs(nearest - x).mean()


def test_counts_flushed_saturated_and_ranges():
    x = np.array([[1e-12, 0.0, 1.0, 1000.0, -2000.0, 3.0, 2.0, 1.0]], np.float32)
    count = CastCount()
    fake_quant(torch.from_numpy(x), Cast("float8_e4m3fn"), count=count)  # scale 1
    assert (count.nonzero, count.flushed, count.saturated) == (7, 1, 2)
    assert count.amax_max == 2000.0 and count.scale_min == count.scale_max == 1.0
    fake_quant(torch.from_numpy(x * 4), Cast("float8_e4m3fn"), count=count)
    assert count.steps == 2 and count.amax_min == 2000.0 and count.amax_max == 8000.0
    d = count.to_dict()
    assert d["flushed_pct"] == pytest.approx(100 * 2 / 14)
    assert d["saturated"] == 4


@pytest.mark.parametrize("name, role", [("nvfp4", "grad_output"), ("nvfp4", "wgrad_grad")])
def test_stochastic_rounding_counts_what_rounded_past_max_as_the_engine(name, role):
    """Under stochastic rounding a product just above max (NVFP4's E4M3-rounded block scale
    puts up to ~6% of max past it) rounds past max only for some draws: saturated counts
    those (the engine's ``apply_range`` count), not every product beyond max."""
    cast = getattr(get_recipe(name), role)
    x = normal((64, 256), seed=3)
    m = hadamard.forward(x, cast.hadamard) if cast.hadamard else x
    _, acc = engine(m, cast.scheme(), seed=5)
    count = CastCount()
    fake_quant(torch.from_numpy(x), cast, rng=5, count=count)
    assert count.saturated == acc.saturated
    assert 0 < count.saturated < x.size // 100


def test_count_to_dict_is_json_safe():
    import json

    empty = CastCount().to_dict()
    assert empty["amax_min"] is None and empty["flushed_pct"] is None
    count = CastCount()
    x = torch.tensor([[math.inf, math.nan, 1.0, 0.0]])
    fake_quant(x, Cast("bfloat16"), count=count)
    text = json.dumps(count.to_dict(), allow_nan=False)
    assert '"nonfinite": 2' in text


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_torchs_own_16_bit_cast_is_round_to_format_to_the_bit(fmt):
    """fake_quant casts plain bfloat16/float16 by torch's conversion (fast, on the device):
    it must be fmt's nearest-even rounding with IEEE overflow for every float32 pattern
    kind: random bit patterns over all exponents, ties, the subnormal edge, max, inf, NaN."""
    from fmtcli.numerics.rounding import round_to_format

    rng = np.random.default_rng(9)
    bits = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    spec = get_format(fmt)
    half_ulp_of_max = 2.0 ** (math.frexp(spec.max)[1] - 2 - spec.mantissa_bits)
    edges = [spec.max, spec.max + half_ulp_of_max, spec.smallest_subnormal,
             spec.smallest_normal, spec.smallest_subnormal / 2, 1 + 2.0 ** -spec.mantissa_bits / 2]
    near = np.array(edges, np.float32)
    with np.errstate(over="ignore"):
        ties = np.concatenate([np.nextafter(near, np.float32(np.inf)),
                               np.nextafter(near, np.float32(0)), near, near * 1.5,
                               [np.inf, -np.inf, np.nan, 0.0, -0.0]]).astype(np.float32)
    x = np.concatenate([bits.view(np.float32), ties, -ties])
    got = fake_quant(torch.from_numpy(x.copy()), Cast(fmt)).numpy()
    want = round_to_format(x, spec, "nearest-even", "ieee")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


def test_fp16_overflows_to_inf_and_fp8_saturates():
    x = torch.tensor([[70000.0, 1.0, -1e6]])
    assert torch.isinf(fake_quant(x, Cast("float16"))).tolist() == [[True, False, True]]
    assert fake_quant(x, Cast("float8_e4m3fn")).tolist() == [[448.0, 1.0, -448.0]]
    assert Cast("float16").overflow_policy is OverflowPolicy.IEEE


def test_a_fixed_rule_needs_its_scale():
    cast = get_recipe("delayed").activation
    with pytest.raises(UsageError):
        fake_quant(torch.ones(2, 4), cast)
    got = fake_quant(torch.full((2, 4), 3.0), cast, scale=64.0)  # 192: on E4M3's grid
    assert torch.all(got == 3.0)
    assert torch.all(fake_quant(torch.full((2, 4), 3.0), cast, scale=100.0) == 2.88)


def test_float32_is_the_identity():
    x = torch.randn(8, 16)
    assert torch.equal(fake_quant(x, Cast("float32")), x)
    count = CastCount()
    assert torch.equal(fake_quant(x, Cast("float32"), count=count), x)
    assert count.flushed == 0 and count.elements == 128


def test_nvfp4_dead_blocks_decode_to_zero_as_the_engine():
    """A block far below the tensor's amax gets an E4M3 decode scale of 0 (TE computes it
    so): the engine writes it as 0, and so does fake_quant."""
    x = normal((4, 64))
    x[0, :16] *= 1e-9
    x[1, 0] = 1e4
    cast = Cast("float4_e2m1fn", ScaleGroup(Granularity.BLOCK, 16),
                scale_format=ScaleFormat.E4M3_FP32)
    got = quantize_matrix(x, cast).values
    assert np.all(got[0, :16] == 0)
    np.testing.assert_array_equal(got, engine(x, cast.scheme())[0])


# -- the random Hadamard transform --------------------------------------------------------

def test_rht_matrix_is_tes_and_orthogonal():
    q = hadamard.rht_matrix(16)
    np.testing.assert_allclose(q @ q.T, np.eye(16), atol=1e-6)
    assert set(np.abs(q).ravel().tolist()) == {0.25}
    # TE's get_rht_matrix: diag(signs) @ H16 / 4, first row = signs[0] * H's first row
    assert q[:, 0].tolist() == [s * 0.25 for s in hadamard.TE_SIGNS]
    h = hadamard.hadamard_matrix(16) * 4
    assert np.array_equal(h, h.T) and np.all(h[0] == 1)


def test_rht_on_both_inputs_leaves_the_product_and_spreads_an_outlier():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((5, 64)).astype(np.float32)
    ra, rb = hadamard.forward(a), hadamard.forward(b)
    np.testing.assert_allclose(ra @ rb.T, a @ b.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(hadamard.inverse(ra), a, atol=1e-6)
    spike = np.zeros((1, 16), np.float32)
    spike[0, 5] = 8.0
    rotated = hadamard.forward(spike)
    assert np.allclose(np.abs(rotated), 2.0)  # 8 / sqrt(16) in every position
    # a ragged tail is left as it is
    tail = rng.standard_normal((2, 20)).astype(np.float32)
    assert np.array_equal(hadamard.forward(tail)[:, 16:], tail[:, 16:])


def test_rht_lowers_the_blocks_crest_factor_of_heavy_tailed_data():
    """What the transform is for: a block's amax over its RMS (how much of the format's
    range its outliers take) falls for heavy-tailed data.  (It does not lower every tensor's
    FP4 error: one huge outlier per block spread over all 16 values can cost more.)"""
    x = heavy_tailed((64, 256), seed=7)
    x[x == 0] = 1e-3

    def crest(m):
        blocks = m.reshape(-1, 16)
        return np.median(np.abs(blocks).max(axis=1) / np.sqrt((blocks ** 2).mean(axis=1)))

    assert crest(hadamard.forward(x)) < 0.8 * crest(x)


def test_a_bad_hadamard_size_is_a_usage_error():
    with pytest.raises(UsageError):
        Cast("float4_e2m1fn", hadamard=12)


# -- delayed scaling ----------------------------------------------------------------------

E4M3 = get_format("float8_e4m3fn")


def test_amax_history_max_and_most_recent():
    h = AmaxHistory(3, "max")
    assert h.scale(E4M3, current=2.0) == np.float32(448 / 2)  # first step: the current amax
    for a in (4.0, 1.0, 2.0):
        h.push(a)
    assert h.scale(E4M3) == np.float32(448 / 4)
    h.push(1.0)  # 4.0 leaves the window of 3
    assert h.scale(E4M3) == np.float32(448 / 2)
    recent = AmaxHistory(3, "most_recent")
    for a in (4.0, 1.0):
        recent.push(a)
    assert recent.scale(E4M3) == 448.0


def test_amax_history_keeps_the_scale_on_zero_or_nonfinite_amax():
    h = AmaxHistory(1, first="one")
    assert h.scale(E4M3, current=5.0) == 1.0  # TE's initial scale
    h.push(8.0)
    assert h.scale(E4M3) == 56.0
    h.push(0.0)
    assert h.scale(E4M3) == 56.0
    h.push(math.inf)
    assert h.scale(E4M3) == 56.0


def test_amax_history_refuses_bad_settings():
    for bad in (dict(length=0), dict(mode="mean"), dict(first="two")):
        with pytest.raises(UsageError):
            AmaxHistory(**bad)
