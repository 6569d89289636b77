"""Every command that takes ``--device cuda``, run as a user runs it: ``python -m fmtcli`` in a
fresh process (skips without a CUDA GPU).

A test process has long imported what the command line loads lazily (ml_dtypes, torch,
the engine), so in-process GPU tests passed while ``fmt quantize x.npy --device cuda``
crashed on every float32 file (``np.dtype("bfloat16")`` before ml_dtypes was imported).
These tests start a new interpreter for each command, and compare the figures with the
same command on the CPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import cuda_available, run_fmt
from oracle import write_safetensors

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")

SAME = ("count", "flushed", "saturated", "overflowed", "nan_produced", "median_rel_error",
        "p99_rel_error")


def data() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 1024)) * 0.01).astype(np.float32)
    x[5, 17] = 100.0
    return x


def fmt_json(*args) -> dict:
    """Run ``fmt ARGS --json`` in a new process: exit 0, no traceback, one JSON document."""
    done = run_fmt(*args, "--json", timeout=300)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return json.loads(done.stdout)


def schemes(document: dict) -> list[dict]:
    return document["tensors"][0]["schemes"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same values as float32/float16 .npy and bfloat16 .safetensors."""
    import ml_dtypes

    root = tmp_path_factory.mktemp("gpu_cli")
    x = data()
    paths = {"float32": root / "x32.npy", "float16": root / "x16.npy",
             "bfloat16": root / "xbf16.safetensors"}
    np.save(paths["float32"], x)
    np.save(paths["float16"], x.astype(np.float16))
    write_safetensors(paths["bfloat16"], {"w": x.astype(ml_dtypes.bfloat16)})
    return paths


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_quantize_on_cuda_equals_the_cpu(files, dtype, backend):
    """The headline path: ``fmt quantize FILE --block 128 --device cuda`` in a new process,
    each stored dtype, the fused kernel (auto) and torch's casts; figures equal the CPU's."""
    path = files[dtype]
    gpu = fmt_json("quantize", path, "--block", "128", "--backend", backend, "--device", "cuda")
    cpu = fmt_json("quantize", path, "--block", "128")
    for g, c in zip(schemes(gpu), schemes(cpu)):
        for key in SAME:
            assert g[key] == c[key], (dtype, backend, g["label"], key)


def test_scale_search_and_loss_scale_on_cuda(files):
    """The other engines that cast through torch on the GPU, in a new process each."""
    path = files["float32"]
    searched = fmt_json("scale-search", path, "--backend", "torch", "--device", "cuda")
    assert searched  # one JSON document: the parse above is the check
    swept = fmt_json("loss-scale", path, "--backend", "torch", "--device", "cuda")
    assert swept


def test_underflow_on_cuda_equals_the_cpu():
    gpu = fmt_json("underflow", "1e-5", "3e-8", "--backend", "torch", "--device", "cuda")
    cpu = fmt_json("underflow", "1e-5", "3e-8", "--backend", "torch", "--device", "cpu")
    assert gpu == cpu


def test_dot_on_cuda_runs_the_real_gemm():
    document = fmt_json("dot", "--m", "64", "--n", "64", "--k", "512", "--device", "cuda")
    assert document


def test_attention_on_cuda():
    document = fmt_json("attention", "--seq", "256", "--dim", "64", "--device", "cuda")
    assert document
