"""fmt train's ``tensorwise`` recipe against a peer: torchao's float8 training, emulated.

Issue 25's cross-check: the same model, seed and batches trained by fmt's casts and by
torchao's ``Float8Linear`` (``convert_to_float8_training``, ``Float8LinearConfig(emulate=
True)``: per-tensor current scaling, E4M3 forward, E5M2 output gradients) must give loss
curves that agree within the BF16 baseline's seed-to-seed spread.  Skips where torchao is
not installed or cannot run beside this torch (``peer.torchao_missing`` says why).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from fmtcli.train import peer  # noqa: E402

_MISSING = peer.torchao_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

from fmtcli.train.casts import fake_quant  # noqa: E402
from fmtcli.train.data import load_corpus  # noqa: E402
from fmtcli.train.recipes import get_recipe  # noqa: E402
from fmtcli.train.results import TrainSettings  # noqa: E402
from fmtcli.train.session import Session  # noqa: E402

TINY = dict(steps=30, layers=1, width=32, heads=2, seq=16, batch=4, log_every=5, warmup=5)


def torchao_cast(x, dtype):
    """torchao's per-tensor cast and dequantization, as its emulated GEMM sees the input
    (torchao's internals of 0.18: a release that moves them skips, not fails)."""
    try:
        from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8
        from torchao.float8.float8_utils import tensor_to_scale
    except ImportError as exc:
        pytest.skip(f"torchao's float8 internals moved: {exc}")

    t = hp_tensor_and_scale_to_float8(x, tensor_to_scale(x, dtype), dtype)
    return t._data.float() / t._scale


@pytest.mark.parametrize("role, dtype", [("activation", "float8_e4m3fn"),
                                         ("grad_output", "float8_e5m2")])
def test_tensorwise_cast_is_torchaos_to_the_bit(role, dtype):
    dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(7)
    cast = getattr(get_recipe("tensorwise"), role)
    unscaled = getattr(get_recipe("fp8-unscaled"), role)
    for exponent in (-9, -4, 0, 3):
        x = torch.randn(48, 80, generator=gen) * 10.0**exponent
        x[3, 5] = 40 * x.abs().max()  # an outlier sets the scale
        theirs = torchao_cast(x, dtype)
        assert torch.equal(fake_quant(x, cast), theirs)
        assert not torch.equal(fake_quant(x, unscaled), theirs)


def test_peer_model_is_converted_and_shares_the_parameters(text):
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as exc:
        pytest.skip(f"torchao's Float8Linear moved: {exc}")

    settings = TrainSettings(**{**TINY, "data": text, "layers": 2})
    session = peer.torchao_session(settings, 0, load_corpus(text, settings.seq))
    converted = [n for n, m in session.model.named_modules() if isinstance(m, Float8Linear)]
    assert converted == [f"layers.{i}.{n}" for i in range(2)
                         for n in ("attn.qkv", "attn.out", "mlp.fc1", "mlp.fc2")]
    optimised = {id(p) for p in session.parameters}
    assert all(id(p) in optimised for p in session.model.parameters())
    assert type(session.model.head).__name__ == "QuantLinear"  # the head stays FP32


def curve(name: str, settings, seed: int, corpus) -> list[float]:
    session = Session(get_recipe(name), settings, seed, corpus)
    return [v for _, v in peer.window_means(peer.step_losses(session, settings.steps),
                                            settings.log_every)]


def agrees(a: list[float], b: list[float], seeds: list[list[float]],
           share: float = 1.0) -> bool:
    """Every logged loss of ``a`` within ``share`` of the baseline seeds' range (max - min
    of their losses at that logged step) of ``b``'s."""
    return all(abs(x - y) <= share * (max(s) - min(s)) for x, y, *s in zip(a, b, *seeds))


#: fmt's casts are torchao's to the bit (the test above), and both run float32 GEMMs of the
#: dequantized values, so the curves may differ by float32 summation order alone: a
#: hundredth of the seed spread is the tolerance that FP8 with scale 1 must break.
TIGHT = 0.01


@pytest.mark.slow
def test_tensorwise_tracks_torchao_within_the_seed_spread(text):
    settings = TrainSettings(**{**TINY, "data": text})
    corpus = load_corpus(text, settings.seq)
    result = peer.compare(settings, corpus)
    ours = [v for _, v in result.fmt_losses]
    theirs = [v for _, v in result.peer_losses]
    seeds = [curve("bf16", settings, s, corpus) for s in range(3)]
    assert len(ours) == len(theirs) == settings.steps // settings.log_every
    assert theirs[-1] < theirs[0] - 0.5  # it trains
    assert agrees(ours, theirs, seeds), (result.to_dict(), seeds)  # issue 25's criterion
    assert agrees(ours, theirs, seeds, TIGHT), (result.to_dict(), seeds)
    # the check can fail: FP8 with scale 1 does not track torchao's scaled FP8 (at this
    # small size it stays inside the seed spread, not inside the tolerance)
    unscaled = curve("fp8-unscaled", settings, 0, corpus)
    assert not agrees(unscaled, theirs, seeds, TIGHT), (unscaled, theirs, seeds)
