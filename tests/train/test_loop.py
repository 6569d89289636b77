"""fmt train's loop: seeds, determinism, gaps, divergence, progress, the result's JSON."""

from __future__ import annotations

import json
import math
import sys

import pytest

from fmtcli.base.errors import UsageError
from fmtcli.train.results import TrainSettings

torch = pytest.importorskip("torch")

from fmtcli.render.jsonsafe import dumps  # noqa: E402
from fmtcli.train.loop import _diverged, train  # noqa: E402
from fmtcli.train.recipes import get_recipe  # noqa: E402
from fmtcli.train.session import learning_rate  # noqa: E402

TINY = dict(steps=6, layers=1, width=16, heads=2, seq=8, batch=2, log_every=2, warmup=2)


def settings(text: str, **kwargs) -> TrainSettings:
    return TrainSettings(**{**TINY, "data": text, **kwargs})


def losses(result, name: str) -> list:
    return [r.losses for r in result.recipes if r.name == name][0]


def test_same_seed_bit_identical_other_seed_not(text):
    a = train(settings(text), ["tensorwise"])
    b = train(settings(text), ["tensorwise"])
    c = train(settings(text, seed=1), [])
    for name in ("bf16", "tensorwise"):
        assert losses(a, name) == losses(b, name)  # floats compared exactly
    assert losses(a, "bf16") != losses(c, "bf16")
    assert [r.tensors for r in a.recipes] == [r.tensors for r in b.recipes]


def test_result_shape_and_gaps(text):
    result = train(settings(text), ["fp32", "bf16", "fp32"])
    assert [r.name for r in result.recipes] == ["bf16", "fp32"]  # baseline first, once
    base, fp32 = result.recipes
    assert [s for s, _ in base.losses] == [2, 4, 6]
    assert base.gap_to_baseline == 0.0
    assert fp32.gap_to_baseline == pytest.approx((fp32.final_loss - base.final_loss)
                                                 / base.final_loss)
    assert abs(fp32.gap_to_baseline) < 0.01  # fp32 and bf16 are close
    doc = json.loads(dumps(result.to_dict()))
    assert doc["settings"]["steps"] == 6 and doc["baseline"] == "bf16"
    run = doc["recipes"][1]
    for key in ("losses", "final_loss", "gap_to_baseline", "diverged_at", "tensors"):
        assert key in run
    assert {t["role"] for t in run["tensors"]} == {"activation", "weight", "grad_output"}
    assert run["losses"][0] == {"step": 2, "loss": fp32.losses[0][1]}


def test_logged_loss_is_the_window_mean(text, monkeypatch):
    """Each logged loss is the mean of the raw losses of the K steps it closes."""
    from fmtcli.train import session

    seen = []
    original = session.Session.step

    def step(self, n):
        value = original(self, n)
        seen.append(value)
        return value

    monkeypatch.setattr(session.Session, "step", step)
    result = train(settings(text, log_every=3, steps=7), [])
    assert [s for s, _ in result.baseline.losses] == [3, 6, 7]
    assert result.baseline.losses[0][1] == pytest.approx(sum(seen[0:3]) / 3)
    assert result.baseline.losses[2][1] == pytest.approx(sum(seen[4:7]) / 3)


def test_seed_spread_and_progress(text):
    calls = []
    result = train(settings(text, seeds=3), ["fp32"], progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (6 * 4, 6 * 4) and len(calls) == 24  # bf16 x 3 seeds + fp32
    seeds = result.baseline_seeds
    assert len(seeds) == 3 and len(set(seeds)) == 3
    assert result.baseline_spread == pytest.approx((max(seeds) - min(seeds))
                                                   / (sum(seeds) / 3))


def test_divergence_stops_the_recipe(text):
    """A static loss scale of 2^40 overflows FP16's gradients: NaN weights, NaN loss."""
    huge = get_recipe("fp16-static", static_loss_scale=2.0**40)
    calls = []
    result = train(settings(text, steps=8), [huge], progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (16, 16)  # the stopped run's steps count as done
    run = result.recipes[1]
    assert run.diverged_at is not None and run.diverged_at <= 3
    assert run.gap_to_baseline is None and run.final_loss is None
    assert run.steps_done == run.diverged_at
    json.loads(dumps(result.to_dict()))  # strict JSON: the NaN loss is null


def test_divergence_rule():
    assert _diverged(math.nan, 1.0, None, 1, 0.5) is not None
    assert _diverged(3.0, 3.0, [2.0, 2.0], 2, 0.5) is None  # exactly 1.5x: not over
    assert "baseline" in _diverged(3.1, 3.1, [2.0, 2.0], 2, 0.5)
    assert _diverged(9.0, 9.0, None, 2, 0.5) is None  # no reference: the baseline itself


def test_learning_rate_schedule():
    s = TrainSettings(steps=100, warmup=10, lr=1.0)
    assert learning_rate(s, 5) == 0.5 and learning_rate(s, 10) == 1.0
    assert learning_rate(s, 100) == pytest.approx(0.1)


def test_cuda_without_one_is_a_usage_error(text):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(UsageError, match="no CUDA device"):
        train(settings(text, device="cuda"), [])


def test_without_torch_one_usage_error(text, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(UsageError, match="needs PyTorch") as error:
        train(settings(text), [])
    assert "fmtcli[torch]" in error.value.suggestion


def test_unknown_recipe_suggests(text):
    with pytest.raises(UsageError, match="unknown recipe 'tensorwize'"):
        train(settings(text), ["tensorwize"])


@pytest.mark.slow
def test_sanity_unscaled_fp8_worse_and_fp16_underflow(text):
    """At a small scale a reader can rerun: E4M3/E5M2 with scale 1 ends clearly above
    per-tensor scaled FP8; FP16 without a loss scale flushes gradients that the dynamic
    scaler's 2^16 keeps."""
    result = train(settings(text, steps=60, width=32, seq=32, batch=8, log_every=10,
                            warmup=10),
                   ["tensorwise", "fp8-unscaled", "fp16", "fp16-dynamic"])
    runs = {r.name: r for r in result.recipes}
    assert runs["fp8-unscaled"].final_loss > runs["tensorwise"].final_loss
    assert runs["fp8-unscaled"].gap_to_baseline > 3 * abs(runs["tensorwise"].gap_to_baseline)

    def shares(name):
        grads = [t for t in runs[name].tensors if t.role == "grad_output"]
        return (sum(t.fp16_underflow_scaled for t in grads) / len(grads),
                sum(t.fp16_underflow_unscaled for t in grads) / len(grads))

    plain_scaled, plain_true = shares("fp16")
    dynamic_scaled, dynamic_true = shares("fp16-dynamic")
    assert plain_scaled == plain_true > 0.001  # no scale: what the GEMM sees is the truth
    assert dynamic_true > 0.001 and dynamic_scaled < dynamic_true / 10
