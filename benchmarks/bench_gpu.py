"""fmt quantize's CUDA path against the GPU's copy bandwidth and an eager-torch baseline.

    python benchmarks/bench_gpu.py [--gib 1] [--repeat 10] [--json PATH]

On one CUDA device, in one run: a seeded float32 tensor of GIB GiB (N(0, 0.02), rare x100
outliers, rows of 4096) is quantized with blocks of 128 in float8_e4m3fn (amax scales,
saturation), computing every statistic of ``fmt quantize``:

- copy: ``y.copy_(x)``, device to device; bandwidth counts bytes read and written;
- fmtcli: ``gpu.quantize_blocks_cuda`` (one fused kernel, one pass; the copy of the
  statistics back to the host included); throughput counts the bytes of the input;
- eager: the same statistics written plainly in eager torch (median and p99 by sorting).

Agreement: the CUDA results against fmtcli's CPU engine on the same data (computed first,
before CUDA starts, in worker processes): counts and max error equal, quantiles equal,
sums to 1e-5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fmtcli.engine.results import SchemeStats
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize


def make(elements: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(elements, dtype=np.float32) * np.float32(0.02)
    hits = rng.random(elements) < 1.5e-5
    x[hits] *= 100
    return x.reshape(-1, 4096)


def timed(fn, repeat: int) -> float:
    """Best seconds of ``repeat`` calls (CUDA-synchronised wall time)."""
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def eager_stats(x, fmax: float = 448.0):
    """The statistics in plain eager torch: the baseline."""
    import torch

    xb = x.view(-1, 128)
    amax = xb.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    xs = (xb * scale).clamp(-fmax, fmax)
    xq = xs.to(torch.float8_e4m3fn).to(torch.float32) / scale
    err = xq - xb
    nonzero = xb != 0
    rel = (err.abs() / xb.abs())[nonzero]
    ordered = rel.sort().values
    n = ordered.numel()
    return {
        "flushed": int(((xq == 0) & nonzero).sum()),
        "median_rel_error": float(ordered[max(0, -(-n // 2) - 1)]),
        "p99_rel_error": float(ordered[max(0, -(-99 * n // 100) - 1)]),
        "max_abs_error": float(err.abs().max()),
        "rmse": float(err.pow(2).mean().sqrt()),
        "bias": float(err.mean()),
        "sqnr_db": float(10 * torch.log10(xb.pow(2).sum() / err.pow(2).sum())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    elements = int(args.gib * 2**30 / 4) // 4096 * 4096
    data = make(elements)
    scheme = build_scheme(format=get_format("float8_e4m3fn"), block=128)
    source = TensorSource("bench", None, data.shape, "float32", lambda: data)
    start = time.perf_counter()
    cpu = quantize([source], [scheme]).tensors[0].schemes[0]  # forks workers: before CUDA
    cpu_seconds = time.perf_counter() - start

    import torch

    from fmtcli.engine.cuda_kernel import quantize_blocks_cuda

    x = torch.from_numpy(data).cuda()
    size = x.numel() * 4
    y = torch.empty_like(x)
    copy = timed(lambda: y.copy_(x), args.repeat)
    ours = timed(lambda: quantize_blocks_cuda(x, scheme), args.repeat)
    eager = timed(lambda: eager_stats(x), max(1, args.repeat // 3))
    acc, summary = quantize_blocks_cuda(x, scheme)
    gpu = SchemeStats.from_accumulator(scheme, acc, summary)
    base = eager_stats(x)
    copy_bw = 2 * size / copy
    report = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "elements": elements, "bytes": size,
        "copy_seconds": copy, "copy_tb_s_read_plus_write": copy_bw / 1e12,
        "fmtcli_seconds": ours, "fmtcli_tb_s_input": size / ours / 1e12,
        "fmtcli_fraction_of_copy": size / ours / copy_bw,
        "eager_seconds": eager, "fmtcli_over_eager": eager / ours,
        "cpu_engine_seconds": cpu_seconds,
        "agreement": {}, "eager_baseline": base,
    }
    for key in ("count", "nonzero", "zeros", "flushed", "saturated", "nan_produced",
                "max_abs_error", "median_rel_error", "p99_rel_error"):
        report["agreement"][key] = {"cpu": getattr(cpu, key), "cuda": getattr(gpu, key),
                                    "equal": getattr(cpu, key) == getattr(gpu, key)}
    for key in ("rmse", "sqnr_db", "bias"):
        a, b = getattr(cpu, key), getattr(gpu, key)
        report["agreement"][key] = {"cpu": a, "cuda": b,
                                    "equal": bool(np.isclose(a, b, rtol=1e-5, atol=1e-12))}
    text = json.dumps(report, indent=2)
    print(text)
    print(f"\ncopy {copy_bw / 1e12:.2f} TB/s (read+write); fmtcli {size / ours / 1e12:.2f} TB/s "
          f"of input = {100 * size / ours / copy_bw:.0f}% of the copy; "
          f"{eager / ours:.1f}x eager torch; all statistics agree with the CPU engine: "
          f"{all(v['equal'] for v in report['agreement'].values())}")
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
