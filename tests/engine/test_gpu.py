"""The fused CUDA path of quantize equals the CPU engine (runs only where CUDA is).

On a GPU machine: ``pip install -e '.[test]' torch && python -m pytest tests/engine/test_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fmtcli import get_format
from fmtcli.engine.results import SchemeStats
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.scaling import amax_to_scale
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming.metrics import FINITE_BINS, ErrorAccumulator

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EXACT = ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "saturated", "above_max",
         "overflowed", "nan_produced", "median_rel_error", "p99_rel_error", "max_abs_error")


def cases():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 2048)) * 0.02).astype(np.float32)
    x[3, 7] = 40.0
    x[10, :1024] = 0
    y = x.copy()
    y[5, 5], y[6, 6], y[7, 9] = np.nan, np.inf, -np.inf
    sign = np.where(rng.random((32, 1024)) < 0.5, -1, 1).astype(np.float32)
    z = np.exp(rng.normal(-20, 8, (32, 1024))).astype(np.float32) * sign
    # sums of squares beyond float32's range (the kernel's float64 sums)
    w = (rng.standard_normal((16, 1024)) * np.float32(1e25)).astype(np.float32)
    w[::2] *= np.float32(1e-25)
    w[::2] *= np.float32(1e-25)
    return {"outlier": x, "nan-inf": y, "wide": z, "extreme": w}


def cpu_and_gpu(data, scheme, dtype="float32"):
    """SchemeStats of the CPU engine and of the CUDA kernel on the same data."""
    array = data.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else data.astype(dtype)
    source = TensorSource("t", None, data.shape, dtype, lambda: array)
    cpu = quantize([source], [scheme], workers=1).tensors[0].schemes[0]
    from fmtcli.engine.cuda_kernel import quantize_blocks_cuda

    if dtype == "bfloat16":
        x = torch.from_numpy(array.view(np.int16)).cuda().view(torch.bfloat16)
    else:
        x = torch.from_numpy(array).cuda()
    acc, summary = quantize_blocks_cuda(x, scheme)
    return cpu, SchemeStats.from_accumulator(scheme, acc, summary), acc


def assert_same(cpu, gpu):
    for key in EXACT:
        a, b = getattr(cpu, key), getattr(gpu, key)
        assert a == b or (np.isnan(a) and np.isnan(b)), (key, a, b)
    for key in ("rmse", "sqnr_db", "bias"):  # bias is NaN where an error is unbounded
        a, b = getattr(cpu, key), getattr(gpu, key)
        assert (np.isclose(a, b, rtol=1e-5, atol=1e-12) or a == b
                or (np.isnan(a) and np.isnan(b))), (key, a, b)
    assert (gpu.scales.min, gpu.scales.max) == (cpu.scales.min, cpu.scales.max)
    assert gpu.scales.count == cpu.scales.count


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float16", "float6_e2m3fn",
                                 "float4_e2m1fn"])
@pytest.mark.parametrize("block", [1, 4, 32, 128, 1024])
@pytest.mark.parametrize("name", ["outlier", "nan-inf", "wide", "extreme"])
def test_cuda_kernel_equals_the_cpu_engine(fmt, block, name):
    from fmtcli.engine.cuda_kernel import fast_path_applies

    data = cases()[name]
    scheme = build_scheme(format=get_format(fmt), block=block)
    assert fast_path_applies(scheme, data.shape)
    cpu, gpu, _ = cpu_and_gpu(data, scheme)
    assert_same(cpu, gpu)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("block", [8, 128, 512])
def test_half_precision_inputs(dtype, block):
    data = cases()["outlier"]
    scheme = build_scheme(format=get_format("float8_e4m3fn"), block=block)
    cpu, gpu, _ = cpu_and_gpu(data, scheme, dtype)
    assert_same(cpu, gpu)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "e3m4", "float6_e3m2fn"])
def test_every_histogram_bin_equals_the_cpu_engine(fmt):
    """Not only the two quantiles: every finite bin of the relative-error histogram."""
    rng = np.random.default_rng(3)
    data = np.exp(rng.normal(-3, 4, (256, 1024))).astype(np.float32)
    data *= np.where(rng.random(data.shape) < 0.5, -1, 1).astype(np.float32)
    spec = get_format(fmt)
    scheme = build_scheme(format=spec, block=64)
    blocks = data.reshape(-1, 64)
    scale = amax_to_scale(np.abs(blocks).max(axis=1, keepdims=True), spec).astype(np.float32)
    with np.errstate(all="ignore"):
        r = round_to_format(blocks * scale, spec, overflow="saturate")
        xq = (r / scale).astype(np.float32)
    reference = ErrorAccumulator()
    reference.add_chunk(blocks, xq)
    _, _, acc = cpu_and_gpu(data, scheme)
    assert np.array_equal(acc.hist[:FINITE_BINS], reference.hist[:FINITE_BINS])
    assert acc.flushed == reference.flushed and acc.nonzero == reference.nonzero


def test_quantize_takes_the_fast_path_on_cuda():
    data = cases()["outlier"]
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    schemes = [build_scheme(block=128)]
    result = quantize([source], schemes, backend="torch", device="cuda")
    stats = result.tensors[0].schemes[0]
    assert stats.scales.distinct is None  # the CUDA path does not count distinct scales
    cpu = quantize([source], schemes).tensors[0].schemes[0]
    assert (stats.flushed, stats.median_rel_error) == (cpu.flushed, cpu.median_rel_error)


CHECK_DIVISION = r"""
extern "C" __global__ void check_division(const float* r, int nr, const float* s, int ns,
                                          unsigned int* mismatches) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ns) return;
    const float scale = s[i], y = refined_reciprocal(scale);
    unsigned int bad = 0;
    for (int k = 0; k < nr; ++k)
        bad += divide_clean(r[k], scale, y) != __fdiv_rn(r[k], scale);
    atomicAdd(mismatches, bad);
}
"""


@pytest.mark.parametrize("fmt,n_scales", [("float8_e4m3fn", 1 << 18), ("float8_e5m2", 1 << 18),
                                          ("float6_e2m3fn", 1 << 18), ("float4_e2m1fn", 1 << 18),
                                          ("e3m4", 1 << 16), ("float16", 1 << 12)])
def test_the_clean_division_is_ieee_division(fmt, n_scales):
    """The kernel's dequantizing division (reciprocal once per block) equals __fdiv_rn for
    every finite value of the format and log-uniform scales over the range it is used in,
    its two ends and the powers of two there; so does its max / amax."""
    from fmtcli.engine import cuda_kernel as gpu
    from fmtcli.numerics.rounding import all_values

    spec = get_format(fmt)
    lo, hi = gpu.clean_scales(spec)
    assert lo < hi
    values = all_values(spec).astype(np.float32)
    values = values[np.isfinite(values)]
    rng = np.random.default_rng(7)
    scales = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), n_scales)).astype(np.float32)
    powers = np.exp2(np.arange(np.ceil(np.log2(lo)), np.floor(np.log2(hi)) + 1))
    scales = np.concatenate([scales, np.float32([lo, hi]), powers.astype(np.float32)])
    assert mismatches(values, scales) == 0
    # the scale itself, max / amax, for amax in [2**-60, 2**60]
    amaxes = np.exp2(rng.uniform(-60, 60, 1 << 20)).astype(np.float32)
    amaxes = np.concatenate([amaxes, np.float32([2.0 ** -60, 2.0 ** 60])])
    assert mismatches(np.float32([spec.max]), amaxes) == 0


def mismatches(dividends: np.ndarray, divisors: np.ndarray) -> int:
    """How many of the quotients (every dividend by every divisor) the kernel's division
    gets different from __fdiv_rn."""
    from fmtcli.engine import cuda_kernel as gpu

    kernel = gpu.compile_kernel(gpu.kernel_source(128, 0, 0) + CHECK_DIVISION, "check_division")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    r = torch.from_numpy(dividends).cuda()
    s = torch.from_numpy(divisors).cuda()
    kernel(grid=(-(-s.numel() // 256), 1, 1), block=(256, 1, 1),
           args=[r, r.numel(), s, s.numel(), count])
    return int(count.item())


def test_schemes_the_kernel_does_not_take_run_beside_it():
    """Per-tensor scaling (the default comparison row) goes through torch chunk by chunk,
    blocks of 128 through the kernel; both in the order asked, both equal to the CPU."""
    data = cases()["outlier"]
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    schemes = [build_scheme(per=Granularity.TENSOR), build_scheme(block=128)]
    cuda = quantize([source], schemes, backend="torch", device="cuda").tensors[0].schemes
    cpu = quantize([source], schemes).tensors[0].schemes
    assert [s.scheme for s in cuda] == [s.scheme for s in cpu]
    assert cuda[0].scales.distinct is not None and cuda[1].scales.distinct is None
    for a, b in zip(cuda, cpu):
        assert (a.flushed, a.median_rel_error, a.p99_rel_error) == (
            b.flushed, b.median_rel_error, b.p99_rel_error)


def test_the_cli_table_on_cuda(tmp_path):
    """``fmt quantize FILE --backend torch --device cuda`` prints its table (the scales
    cell has no distinct count on this path)."""
    from typer.testing import CliRunner

    from fmtcli.cli import app

    path = tmp_path / "x.npy"
    np.save(path, cases()["outlier"])
    result = CliRunner().invoke(app, ["quantize", str(path), "--backend", "torch",
                                      "--device", "cuda"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "block 128" in result.output and "scales" in result.output


def test_auto_sends_large_tensors_to_the_gpu(monkeypatch):
    """--backend auto --device auto: from AUTO_CUDA_ELEMENTS on (lowered here), the schemes
    the kernel takes run on the GPU, the others on the CPU engine; same statistics."""
    from fmtcli.engine import cuda as q

    data = cases()["outlier"]
    source = TensorSource("t", None, data.shape, "float32", lambda: data)
    schemes = [build_scheme(per=Granularity.TENSOR), build_scheme(block=128)]
    monkeypatch.setattr(q, "AUTO_CUDA_ELEMENTS", data.size)
    auto = quantize([source], schemes, backend="auto", device="auto").tensors[0].schemes
    cpu = quantize([source], schemes).tensors[0].schemes
    assert auto[1].scales.distinct is None  # the kernel's (it does not count them)
    assert auto[0].scales.distinct == cpu[0].scales.distinct
    for a, b in zip(auto, cpu):
        assert (a.flushed, a.median_rel_error) == (b.flushed, b.median_rel_error)
    monkeypatch.setattr(q, "AUTO_CUDA_ELEMENTS", data.size + 1)
    small = quantize([source], schemes, backend="auto", device="auto").tensors[0].schemes
    assert small[1].scales.distinct is not None  # below the threshold: the CPU engine


def _quantize_in_a_fresh_process(path, *options) -> dict:
    """``fmt quantize PATH OPTIONS --json`` as a user runs it (a new process: nothing
    imported beforehand, ml_dtypes included); the document."""
    import json

    from cli_helpers import run_fmt

    done = run_fmt("quantize", path, *options, "--json")
    assert done.returncode == 0, done.stderr.decode()[-800:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("code", ["f2", "f4", "bf16"])
def test_cuda_reads_big_endian_files_from_the_command_line(tmp_path, code):
    """A big-endian .npy ('>f2', '>f4', bfloat16 as '>V2') on --device cuda: the statistics
    of its little-endian twin, on the fused kernel (no distinct-scale count) and on the
    CPU engine alike."""
    dtype = np.dtype(ml_dtypes.bfloat16) if code == "bf16" else np.dtype(code)
    data = cases()["outlier"].astype(dtype)
    paths = {}
    for order in "<>":
        paths[order] = tmp_path / f"{'le' if order == '<' else 'be'}.npy"
        np.save(paths[order], data.astype(dtype.newbyteorder(order)))
    on_gpu = {order: _quantize_in_a_fresh_process(path, "--block", "128", "--device", "cuda",
                                                  "--backend", "torch")
              for order, path in paths.items()}
    cpu = _quantize_in_a_fresh_process(paths["<"], "--block", "128")
    le, be = (on_gpu[o]["tensors"][0]["schemes"] for o in "<>")
    assert be == le
    assert le[1]["scales"]["distinct"] is None  # the fused kernel ran block 128
    for gpu, host in zip(le, cpu["tensors"][0]["schemes"]):
        for key in ("flushed", "saturated", "nan_produced", "median_rel_error",
                    "p99_rel_error", "max_abs_error"):
            assert gpu[key] == host[key], (key, gpu[key], host[key])


@pytest.mark.parametrize("shape", [(64, 32, 64, 1), (64, 200)])
def test_cuda_blocks_the_matrix_view_from_the_command_line(tmp_path, shape):
    """--device cuda blocks the tensor's matrix view as the CPU does: a conv weight
    O x I x K x 1 as O x I*K (the fused kernel takes it: rows of 2048), and rows of 200
    under blocks of 128 (128 + 72: not the kernel's flat blocks) on the CPU engine."""
    rng = np.random.default_rng(7)
    path = tmp_path / "w.npy"
    np.save(path, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    gpu = _quantize_in_a_fresh_process(path, "--block", "128", "--device", "cuda",
                                       "--backend", "torch")
    cpu = _quantize_in_a_fresh_process(path, "--block", "128")
    assert gpu["tensors"][0]["matrix"] == cpu["tensors"][0]["matrix"]
    if shape[-1] == 1:
        assert gpu["tensors"][0]["schemes"][1]["scales"]["distinct"] is None  # the kernel
    for g, c in zip(gpu["tensors"][0]["schemes"], cpu["tensors"][0]["schemes"]):
        assert g["scales"]["count"] == c["scales"]["count"]
        for key in ("flushed", "median_rel_error", "p99_rel_error", "max_abs_error"):
            assert g[key] == c[key], (key, g[key], c[key])
