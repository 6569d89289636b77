"""The quantize engine's doors: the GPU routing decision, the fence around torch's private
CUDA API, and the kernel source shipped as a file (all checkable without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from fmtcli.engine import cuda, cuda_kernel, torch_cuda
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.schemes import Granularity, build_scheme


def source(n: int = 1024) -> TensorSource:
    data = np.ones((4, n // 4), np.float32)
    return TensorSource("t", None, data.shape, "float32", lambda: data)


def test_the_kernel_source_is_the_shipped_file_behind_its_defines():
    text = cuda_kernel.kernel_source(128, 0, 1)
    assert text.startswith("#define V 16\n#define L 8\n#define G 1\n#define DTYPE 0\n")
    assert "__global__" in text and text.endswith(cuda_kernel.shipped_source())
    assert "fmt_quantize_stats" in cuda_kernel.shipped_source()


def test_a_tuning_changes_the_launch_shape_and_may_bring_its_own_source():
    tuned = cuda_kernel.Tuning(elements=32, min_blocks=1, source="// variant\n")
    text = cuda_kernel.kernel_source(128, 2, 0, tuned)
    assert "#define V 32\n#define L 4\n" in text and "#define MIN_BLOCKS 1\n" in text
    assert text.endswith("// variant\n") and "__global__" not in text
    assert cuda_kernel.layout(1024, tuned) == (32, 32, 1)
    assert cuda_kernel.layout(8) == (16, 1, 2)  # the shipped default


def test_torch_versions_are_read_from_their_strings(monkeypatch):
    torch = pytest.importorskip("torch")
    for text, expected in (("2.11.0+cu128", (2, 11)), ("2.8.0", (2, 8)), ("2.10.0a0", (2, 10)),
                           ("3.0", (3, 0))):
        monkeypatch.setattr(torch, "__version__", text)
        assert torch_cuda.torch_version() == expected


def test_an_old_torch_or_a_missing_private_api_turns_the_fused_path_off(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for version, has_api, words in (("2.7.1", True, "older than 2.8"),
                                    ("2.11.0", False, "has no torch.cuda._compile_kernel")):
        torch_cuda.unusable_reason.cache_clear()
        monkeypatch.setattr(torch, "__version__", version)
        if not has_api:
            monkeypatch.delattr(torch.cuda, "_compile_kernel", raising=False)
        assert words in torch_cuda.unusable_reason()
    torch_cuda.unusable_reason.cache_clear()


def test_without_a_gpu_the_fused_path_is_unavailable_and_says_why():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    torch_cuda.unusable_reason.cache_clear()
    assert torch_cuda.unusable_reason() == "torch sees no CUDA device"
    cuda_kernel.available.cache_clear()
    assert cuda_kernel.available() is False


def test_routing_keeps_every_cpu_run_off_the_kernel(monkeypatch):
    """A CPU run never asks whether the kernel can run (which would import torch)."""
    monkeypatch.setattr(cuda_kernel, "available",
                        lambda: pytest.fail("asked for the kernel on a CPU run"))
    schemes = [build_scheme(per=Granularity.TENSOR), build_scheme(block=128)]
    for backend, device in (("numpy", "cpu"), ("ml_dtypes", "cpu"), ("auto", "cpu"),
                            ("auto", "auto"), ("numpy", "auto")):
        casts, fast = cuda.route(source(), schemes, backend, device, writes_output=False)
        assert fast == [False, False]
        assert all(d is Device.CPU for _, d in casts)


def test_auto_goes_to_the_gpu_only_for_large_tensors_with_a_gpu(monkeypatch):
    schemes = [build_scheme(per=Granularity.TENSOR), build_scheme(block=128)]
    monkeypatch.setattr(cuda, "gpu_present", lambda: True)
    monkeypatch.setattr(cuda, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda, "fits_on_gpu", lambda s: True)
    # the kernel takes the block scheme wherever the cast is torch on CUDA
    monkeypatch.setattr(cuda, "kernel_takes", lambda s, sc, c: [False, c[1] == cuda.ON_GPU])
    monkeypatch.setattr(cuda, "AUTO_CUDA_ELEMENTS", 1024)
    casts, fast = cuda.route(source(1024), schemes, "auto", "auto", writes_output=False)
    assert fast == [False, True]
    assert casts == [(Backend.NUMPY, Device.CPU), (Backend.TORCH, Device.CUDA)]
    # one element fewer than the threshold, or an --out run: the CPU engine alone
    monkeypatch.setattr(cuda, "AUTO_CUDA_ELEMENTS", 1025)
    assert cuda.route(source(1024), schemes, "auto", "auto", writes_output=False)[1] == \
        [False, False]
    monkeypatch.setattr(cuda, "AUTO_CUDA_ELEMENTS", 1024)
    assert cuda.route(source(1024), schemes, "auto", "auto", writes_output=True)[1] == \
        [False, False]
    # no room on the GPU: nothing moves
    monkeypatch.setattr(cuda, "fits_on_gpu", lambda s: False)
    casts, fast = cuda.route(source(1024), schemes, "auto", "auto", writes_output=False)
    assert fast == [False, False] and all(c == (Backend.NUMPY, Device.CPU) for c in casts)
