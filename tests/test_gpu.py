"""The fused CUDA path of quantize equals the CPU engine (runs only where CUDA and Triton are)."""

from __future__ import annotations

import numpy as np
import pytest

from fmtcli import get_format
from fmtcli.quantize import quantize
from fmtcli.results import SchemeStats
from fmtcli.schemes import build_scheme
from fmtcli.tensors import TensorSource

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EXACT = ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "saturated", "overflowed",
         "nan_produced", "median_rel_error", "p99_rel_error", "max_abs_error")


def cases():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 512)) * 0.02).astype(np.float32)
    x[3, 7] = 40.0
    x[10, :128] = 0
    y = x.copy()
    y[5, 5], y[6, 6], y[7, 9] = np.nan, np.inf, -np.inf
    sign = np.where(rng.random((32, 256)) < 0.5, -1, 1).astype(np.float32)
    z = np.exp(rng.normal(-20, 8, (32, 256))).astype(np.float32) * sign
    return {"outlier": x, "nan-inf": y, "wide": z}


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float16", "float6_e2m3fn",
                                 "float4_e2m1fn"])
@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("name", ["outlier", "nan-inf", "wide"])
def test_cuda_kernel_equals_the_cpu_engine(fmt, block, name):
    from fmtcli.gpu import fast_path_applies, quantize_blocks_cuda

    data = cases()[name]
    scheme = build_scheme(format=get_format(fmt), block=block)
    assert fast_path_applies(scheme, data.shape)
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    cpu = quantize([source], [scheme], workers=1).tensors[0].schemes[0]
    acc, summary = quantize_blocks_cuda(torch.from_numpy(data).cuda(), scheme)
    gpu = SchemeStats.from_accumulator(scheme, acc, summary)
    for key in EXACT:
        a, b = getattr(cpu, key), getattr(gpu, key)
        assert a == b or (np.isnan(a) and np.isnan(b)), (key, a, b)
    for key in ("rmse", "sqnr_db", "bias"):
        a, b = getattr(cpu, key), getattr(gpu, key)
        assert np.isclose(a, b, rtol=1e-5, atol=1e-12) or a == b, (key, a, b)
    assert (gpu.scales["min"], gpu.scales["max"]) == (cpu.scales["min"], cpu.scales["max"])


def test_quantize_takes_the_fast_path_on_cuda():
    data = cases()["outlier"]
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    schemes = [build_scheme(block=128)]
    result = quantize([source], schemes, backend="torch", device="cuda")
    stats = result.tensors[0].schemes[0]
    assert stats.scales["distinct"] is None  # the CUDA path does not count distinct scales
    cpu = quantize([source], schemes).tensors[0].schemes[0]
    assert (stats.flushed, stats.median_rel_error) == (cpu.flushed, cpu.median_rel_error)
