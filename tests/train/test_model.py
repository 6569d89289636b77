"""fmt train's model, data, quantized GEMMs, settings and loss scaler (tiny sizes)."""

from __future__ import annotations

import math
import sysconfig

import numpy as np
import pytest

from fmtcli.base.errors import DataError, UsageError
from fmtcli.train.data import Batches, load_corpus, needed_bytes, stdlib_bytes
from fmtcli.train.results import MAX_STEPS, TrainSettings

torch = pytest.importorskip("torch")

from fmtcli.train.casts import Cast  # noqa: E402  (imports torch-free, but tested with it)
from fmtcli.train.gemm import GemmContext, quantized_linear  # noqa: E402
from fmtcli.train.loss_scaling import LossScaler  # noqa: E402
from fmtcli.train.model import build_model  # noqa: E402
from fmtcli.train.recipes import get_recipe  # noqa: E402
from fmtcli.train.tensor_stats import TensorStats  # noqa: E402

TINY = dict(steps=4, layers=2, width=16, heads=2, seq=8, batch=2, log_every=2)


def context(name: str) -> GemmContext:
    return GemmContext(get_recipe(name), TensorStats(), np.random.default_rng(0))


# -- the model ----------------------------------------------------------------------------

def test_parameter_count_and_layer_keys():
    settings = TrainSettings(**TINY)
    model = build_model(settings, 0)
    assert sum(p.numel() for p in model.parameters()) == settings.parameters
    keys = [m.key for m in model.quantized()]
    assert keys == ["layers.0.attn.qkv", "layers.0.attn.out", "layers.0.mlp.fc1",
                    "layers.0.mlp.fc2", "layers.1.attn.qkv", "layers.1.attn.out",
                    "layers.1.mlp.fc1", "layers.1.mlp.fc2"]


def test_head_stays_fp32_unless_asked():
    assert "head" not in [m.key for m in build_model(TrainSettings(**TINY), 0).quantized()]
    model = build_model(TrainSettings(**TINY, quantize_head=True), 0)
    assert [m.key for m in model.quantized()][-1] == "head"


def test_same_seed_same_model_other_seed_another():
    settings = TrainSettings(**TINY)
    a, b, c = build_model(settings, 3), build_model(settings, 3), build_model(settings, 4)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.layers[0].mlp.fc1.weight, c.layers[0].mlp.fc1.weight)
    state = torch.random.get_rng_state()
    build_model(settings, 5)
    assert torch.equal(state, torch.random.get_rng_state())  # the global generator untouched


def test_model_is_causal():
    model = build_model(TrainSettings(**TINY), 0)
    model.use(context("bf16"))
    x = torch.randint(0, 256, (1, 8))
    y = x.clone()
    y[0, 5:] = (y[0, 5:] + 1) % 256
    with torch.no_grad():
        assert torch.equal(model(x)[0, :5], model(y)[0, :5])
        assert not torch.equal(model(x)[0, 5:], model(y)[0, 5:])


# -- the GEMMs ---------------------------------------------------------------------------

def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def test_bf16_gemms_match_torch_casts():
    """Forward, dX and dW of a bf16 Linear against the same products written with torch's
    own bfloat16 casts (round to nearest even: the engine's rounding)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=gen, requires_grad=True)
    w = torch.randn(24, 16, generator=gen, requires_grad=True)
    b = torch.randn(24, generator=gen, requires_grad=True)
    dy = torch.randn(3, 5, 24, generator=gen)
    ctx = context("bf16")
    y = quantized_linear(x, w, b, ctx, "layers.0.mlp.fc1")
    y.backward(dy)
    x2, dy2 = x.detach().reshape(15, 16), dy.reshape(15, 24)
    assert torch.equal(y.detach().reshape(15, 24), bf16(x2) @ bf16(w.detach()).t() + b.detach())
    assert torch.equal(x.grad.reshape(15, 16), bf16(dy2) @ bf16(w.detach()))
    assert torch.equal(w.grad, bf16(dy2).t() @ bf16(x2))
    assert torch.equal(b.grad, dy2.sum(0))
    records = {(r.layer, r.role): r for r in ctx.stats.records()}
    assert set(records) == {("layers.0.mlp.fc1", role)
                            for role in ("activation", "weight", "grad_output")}
    assert records[("layers.0.mlp.fc1", "activation")].elements == x.numel()
    assert records[("layers.0.mlp.fc1", "weight")].amax_max == pytest.approx(
        float(w.detach().abs().max()))


def test_fp32_gemms_are_plain_float32():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 16, generator=gen, requires_grad=True)
    w = torch.randn(8, 16, generator=gen, requires_grad=True)
    y = quantized_linear(x, w, None, context("fp32"), "l")
    y.sum().backward()
    torch.testing.assert_close(y, x.detach() @ w.detach().t(), rtol=0, atol=1e-6)
    torch.testing.assert_close(w.grad, torch.ones(7, 8).t() @ x.detach(), rtol=0, atol=1e-6)


def test_unscaled_fp8_flushes_what_tensorwise_keeps():
    """Small activations (1e-4): E4M3 with scale 1 flushes them (below its smallest
    subnormal 2^-9), per-tensor scaling keeps them."""
    x = torch.full((4, 16), 1e-4)
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    for name, flushed in (("fp8-unscaled", x.numel()), ("tensorwise", 0)):
        ctx = context(name)
        quantized_linear(x, w, None, ctx, "l")
        record = [r for r in ctx.stats.records() if r.role == "activation"][0]
        assert record.flushed == flushed, name


def test_wgrad_casts_run_along_the_tokens():
    """A recipe with wgrad casts: dW uses X^T and dY^T cast with the tokens as last axis.
    With mxfp8 (blocks of 32) and 32 tokens, dW equals the product of those casts."""
    from fmtcli.train.casts import fake_quant

    recipe = get_recipe("mxfp8")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(32, 64, generator=gen, requires_grad=True)
    w = torch.randn(32, 64, generator=gen, requires_grad=True)
    dy = torch.randn(32, 32, generator=gen)
    quantized_linear(x, w, None, context("mxfp8"), "l").backward(dy)
    g = fake_quant(dy.t().contiguous(), recipe.wgrad_grad)
    a = fake_quant(x.detach().t().contiguous(), recipe.wgrad_activation)
    assert torch.equal(w.grad, g @ a.t())


# -- data ---------------------------------------------------------------------------------

def test_stdlib_corpus_is_deterministic_and_stdlib_only():
    name, first = stdlib_bytes(1 << 16)
    assert stdlib_bytes(1 << 16)[1] == first and len(first) == 1 << 16
    assert sysconfig.get_paths()["stdlib"] in name
    assert b"site-packages" not in name.encode()


def test_data_file_errors(tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * (needed_bytes(8) - 1))
    with pytest.raises(DataError, match=f"holds {needed_bytes(8) - 1} bytes.*at least "
                                        f"{needed_bytes(8)} bytes"):
        load_corpus(str(small), 8)
    with pytest.raises(DataError, match="cannot read"):
        load_corpus(str(tmp_path / "missing.txt"), 8)
    with pytest.raises(DataError, match="directory"):
        load_corpus(str(tmp_path), 8)
    small.write_bytes(b"x" * needed_bytes(8))
    corpus = load_corpus(str(small), 8)
    assert corpus.train.size >= 9 and corpus.validation.size >= 9


def test_batches_are_seeded_windows():
    data = np.arange(200, dtype=np.uint8)
    a, b, c = Batches(data, 4, 8, 1), Batches(data, 4, 8, 1), Batches(data, 4, 8, 2)
    (xa, ya), (xb, yb), (xc, _) = a.next(), b.next(), c.next()
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb) and not np.array_equal(xa, xc)
    assert xa.shape == (4, 8) and np.array_equal(ya[:, :-1], xa[:, 1:])
    assert np.array_equal(ya[:, -1], xa[:, -1] + 1)  # the next byte


# -- settings -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, fragment", [
    ({"steps": 0}, "steps=0"), ({"steps": MAX_STEPS + 1}, "steps must be"),
    ({"width": 10, "heads": 4}, "not a multiple"), ({"layers": 0}, "layers=0"),
    ({"width": 65536, "layers": 64}, "GiB"), ({"batch": 10**6, "seq": 4096}, "GiB"),
    ({"device": "tpu"}, "cpu or cuda"), ({"capture_steps": (3,)}, "needs a folder"),
    ({"capture_dir": "x", "capture_steps": (999,)}, "must be 1 .. 300"),
    ({"lr": math.nan}, "positive"), ({"warmup": -1}, "warmup=-1"),
    ({"clip": math.inf}, "clip=inf"), ({"threads": 0}, "threads=0"),
])
def test_settings_refused(kwargs, fragment):
    with pytest.raises(UsageError, match=fragment):
        TrainSettings(**kwargs)


def test_absurd_size_refused_before_allocating():
    """The check is arithmetic: 10^6 layers of width 10^5 is refused at once."""
    with pytest.raises(UsageError, match="GiB"):
        TrainSettings(layers=10**6, width=10**5, heads=1)


# -- loss scaling -------------------------------------------------------------------------

def test_dynamic_loss_scaling_is_grad_scalers_rule():
    scaler = LossScaler("dynamic", init_scale=2.0**10, growth_interval=3)
    assert scaler.update(False) is False and scaler.scale == 2.0**9  # skip, back off
    assert all(scaler.update(True) for _ in range(3)) and scaler.scale == 2.0**10  # grow
    assert scaler.update(True) and scaler.scale == 2.0**10  # the count restarted
    assert scaler.to_dict()["skipped_steps"] == 1


def test_grad_scaler_agrees():
    """torch.amp.GradScaler on the CPU (torch >= 2.3) takes the same scales on the same
    sequence of finite / non-finite gradients."""
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler needs torch >= 2.3")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    ours = LossScaler("dynamic", init_scale=2.0**8, growth_interval=2)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    for finite in (True, False, True, True, True, False, True, True):
        theirs.scale(torch.ones(1))
        p.grad = torch.tensor([1.0 if finite else math.inf])
        theirs.step(opt)
        theirs.update()
        ours.update(finite)
        assert ours.scale == theirs.get_scale()


def test_fp16_underflow_counts_with_and_without_the_scale():
    stats = TensorStats()
    stats.count("l", "grad_output", "float16")
    stats.count("l", "grad_output", "float16").add(
        elements=4, nonzero=4, flushed=0, saturated=0, amax=1.0, scale_min=1.0, scale_max=1.0)
    s = 2.0**10
    dy = torch.tensor([2.0**-26, 2.0**-25, 2.0**-24, 1.0]) * s  # the GEMM sees dy * S
    stats.underflow("l", dy, s, "float16")
    record = stats.records()[0]
    assert record.fp16_underflow_scaled == 0.0
    assert record.fp16_underflow_unscaled == 0.5  # 2^-26 and the tie 2^-25 flush unscaled
    assert Cast("float16").spec.smallest_subnormal == 2.0**-24


def test_delayed_scaling_takes_the_scale_from_earlier_steps():
    """The second step's activation is cast with the scale of the first step's amax (the
    history), not its own: an activation 4x larger saturates."""
    ctx = context("delayed")
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    small = torch.linspace(-1, 1, 64).reshape(4, 16)
    quantized_linear(small, w, None, ctx, "l")
    quantized_linear(4 * small, w, None, ctx, "l")
    record = [r for r in ctx.stats.records() if r.role == "activation"][0]
    assert record.scale_min == record.scale_max == pytest.approx(448.0)  # 448 / amax 1, twice
    assert record.saturated > 0
    assert ctx.histories[("l", "activation")].amax() == pytest.approx(4.0)


def test_captured_gradients_are_divided_by_the_loss_scale():
    ctx = context("fp16-static")
    ctx.loss_scale = 2.0**10
    ctx.captured = {}
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    dy = torch.randn(4, 8)
    quantized_linear(x, w, None, ctx, "l").backward(dy * ctx.loss_scale)
    assert torch.equal(ctx.captured["l.grad_output"], dy)
    assert torch.equal(ctx.captured["l.input"], x.detach())
    assert torch.equal(ctx.captured["l.weight"], w.detach())
