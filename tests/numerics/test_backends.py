"""Cast backends (engine, ml_dtypes, torch on CPU; CUDA where present) and check-backends."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, json_of

from fmtcli.base.errors import UsageError
from fmtcli.inputs.tensors import example_tensor
from fmtcli.numerics.backends import Backend, Device, cast, resolve
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TORCH_SATURATES = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 12)
E4M3 = get_format("float8_e4m3fn")
X = np.array([0, -0.0, 1, 3, 0.1, 1e-3, 1e-9, 300, 464, 465, 1e6, np.inf, -np.inf, np.nan, -5],
             dtype=np.float32)


def same(a, b):
    return np.array_equal(a, b, equal_nan=True)


def test_engine_and_ml_dtypes_backends_are_what_they_say():
    assert same(cast(X, E4M3, "numpy"), round_to_format(X, E4M3))
    assert same(cast(X, E4M3, "ml_dtypes"), X.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e5m2"])
def test_torch_cpu_matches_the_engine_where_both_are_ieee(name):
    spec = get_format(name)
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    assert same(cast(x, spec, "torch", "cpu"), round_to_format(x, spec))


def test_torch_e4m3fn_eager_cast_saturates_where_the_engine_gives_nan():
    got = cast(np.array([465.0, 1e6, -1e6], np.float32), E4M3, "torch", "cpu")
    if TORCH_SATURATES:
        assert got.tolist() == [448.0, 448.0, -448.0]
    else:
        assert np.isnan(got).all()
    assert np.isnan(round_to_format(np.array([465.0], np.float32), E4M3)).all()


def test_resolve_usage_errors():
    with pytest.raises(UsageError, match="needs backend='torch'"):
        resolve("numpy", "cuda", E4M3)
    with pytest.raises(UsageError, match="no eager cast"):
        resolve("torch", "cpu", get_format("float6_e2m3fn"))
    with pytest.raises(UsageError, match="ml_dtypes has no"):
        resolve("ml_dtypes", "cpu", get_format("tf32"))
    assert resolve("auto", "cpu", E4M3) == (Backend.NUMPY, Device.CPU)
    # device auto is the CPU for one format; only quantize moves large tensors to a GPU
    assert resolve("auto", "auto", E4M3) == (Backend.NUMPY, Device.CPU)
    assert resolve("ml_dtypes", "auto", E4M3) == (Backend.ML_DTYPES, Device.CPU)


def test_auto_stays_on_the_cpu_without_a_gpu(monkeypatch):
    """Over the size threshold but with no NVIDIA device node: the CPU engine (which,
    unlike the CUDA path, counts distinct scales)."""
    from fmtcli.engine import cuda
    from fmtcli.inputs.tensors import TensorSource
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    data = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    monkeypatch.setattr(cuda, "AUTO_CUDA_ELEMENTS", 1)
    monkeypatch.setattr(cuda, "gpu_present", lambda: False)
    # the cheap check decides: torch is not even asked
    monkeypatch.setattr(cuda, "cuda_available", lambda: pytest.fail("asked torch for CUDA"))
    stats = quantize([source], [build_scheme(block=128)], backend="auto",
                       device="auto").tensors[0].schemes[0]
    assert stats.scales.distinct is not None


def test_torch_backend_without_torch_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(UsageError) as error:
        resolve("torch", "cpu", E4M3)
    assert "pip install" in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_a_gpu_is_a_usage_error():
    assert_usage_error(invoke("quantize", "--backend", "torch", "--device", "cuda"), "CUDA")


@pytest.mark.parametrize("backend", ["ml_dtypes", "torch"])
def test_quantize_backends_agree_with_the_engine_in_range(backend):
    schemes = [build_scheme(per=Granularity.TENSOR), build_scheme(block=32)]
    ours = quantize([example_tensor()], schemes, backend="numpy").tensors[0].schemes
    theirs = quantize([example_tensor()], schemes, backend=backend).tensors[0].schemes
    for a, b in zip(ours, theirs):
        assert (a.flushed, a.saturated, a.median_rel_error, a.max_abs_error) == \
            (b.flushed, b.saturated, b.median_rel_error, b.max_abs_error)


def test_quantize_backends_follow_the_overflow_policy():
    """saturate: every backend clamps first (as recipes do); ieee: each shows its own cast."""
    by = {}
    for overflow in ("saturate", "ieee"):
        scheme = [build_scheme(per=Granularity.TENSOR, margin=-2, overflow=overflow)]  # x4
        by[overflow] = {b: quantize([example_tensor()], scheme, backend=b).tensors[0].schemes[0]
                        for b in ("numpy", "ml_dtypes", "torch")}
    for b in ("numpy", "ml_dtypes", "torch"):
        assert by["saturate"][b].saturated == 1 and by["saturate"][b].nan_produced == 0
    assert by["ieee"]["numpy"].overflowed == 1 and by["ieee"]["numpy"].nan_produced == 1
    assert by["ieee"]["ml_dtypes"].overflowed == 1 and by["ieee"]["ml_dtypes"].nan_produced == 1
    if TORCH_SATURATES:  # eager FP8 casts saturate from torch 2.12 on
        assert by["ieee"]["torch"].saturated == 1 and by["ieee"]["torch"].nan_produced == 0
    else:
        assert by["ieee"]["torch"].overflowed == 1 and by["ieee"]["torch"].nan_produced == 1


def test_underflow_backend_option():
    def status(backend):
        return json_of("underflow", "500", "--format", "e4m3fn", "--backend", backend)[0]["status"]
    assert status("numpy") == "overflow"
    assert status("torch") == ("saturated" if TORCH_SATURATES else "overflow")


@pytest.mark.slow
def test_check_backends_json_classes():
    reports = {(r["format"], r["backend"], r["device"]): r
               for r in json_of("check-backends", "e4m3fn", "fp16", "tf32")["reports"]}
    assert reports[("float16", "ml_dtypes", "cpu")]["agrees"]
    assert reports[("float16", "torch", "cpu")]["agrees"]
    e4 = reports[("float8_e4m3fn", "torch", "cpu")]
    classes = {(m["class"], m["kind"]) for m in e4["mismatches"]}
    assert ("nan", "nan_payload") in classes  # NaN payloads told apart from values
    if TORCH_SATURATES:
        assert ("overflow", "value") in classes and not e4["agrees"]
        example = next(m for m in e4["mismatches"] if m["class"] == "overflow")["examples"][0]
        assert example["reference"] == "nan" and abs(example["backend"]) == 448
    assert reports[("float8_e4m3fn", "ml_dtypes", "cpu")]["agrees"]
    assert reports[("tfloat32", "-", "cpu")]["error"].startswith("no backend")


def test_check_backends_table():
    result = invoke("check-backends", "fp16")
    assert result.exit_code == 0 and "agrees" in result.stdout and "nan_payload" in result.stdout


@cuda
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float16"])
def test_torch_cuda_matches_torch_cpu(name):
    spec = get_format(name)
    x = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32) * 64
    assert same(cast(x, spec, "torch", "cuda"), cast(x, spec, "torch", "cpu"))


@cuda
def test_quantize_on_cuda_agrees_with_the_engine():
    schemes = [build_scheme(block=128)]
    ours = quantize([example_tensor()], schemes).tensors[0].schemes[0]
    gpu = quantize([example_tensor()], schemes, backend="torch", device="cuda").tensors[0].schemes[0]
    assert (ours.flushed, ours.median_rel_error, ours.max_abs_error) == \
        (gpu.flushed, gpu.median_rel_error, gpu.max_abs_error)
