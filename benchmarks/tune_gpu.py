"""Where the CUDA kernel's time goes: variants of it on a 1 GiB float32 tensor.

    PYTHONPATH=$PWD python3 benchmarks/tune_gpu.py

Times (best of 10 whole calls, CUDA-synchronised; ``bench_gpu.timed``) the kernel as
shipped for a few launch sizes, block sizes, formats and input dtypes, the fixed costs of a
call, then variants with one part of the work removed or changed by editing the kernel's
source (shared-memory atomics, the relative error, the prefetch), against a plain copy and
a read-only reduction of the same tensor.  The variants compute wrong statistics on
purpose: they only place the time.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
from bench_gpu import timed  # benchmarks/, this script's folder

from fmtcli.engine import cuda_kernel as gpu
from fmtcli.engine.cuda_kernel import Tuning
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import build_scheme


def best(fn, repeat: int = 10) -> float:
    """Best seconds of ``repeat`` whole calls, CUDA-synchronised (``bench_gpu.timed``)."""
    return timed(fn, repeat)


x = torch.randn(2**28, device="cuda") * 0.02
size = x.numel() * 4
y = torch.empty_like(x)


def report(what, t, data=x):
    print(f"{what:48s} {t * 1e3:7.3f} ms  {data.numel() * data.element_size() / t / 1e12:6.2f} "
          "TB/s of input", flush=True)


def gpu_time(fn, n=20):
    """Seconds per call of n calls queued back to back, between CUDA events: GPU time."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n / 1e3


copy = best(lambda: y.copy_(x))
print(f"copy {2 * size / copy / 1e12:.2f} TB/s read+write ({copy * 1e3:.3f} ms)")
report("x.abs().amax() (read-only reduction)", best(lambda: x.abs().amax()))
e4m3 = build_scheme(format=get_format("float8_e4m3fn"), block=128)
flat = x.reshape(-1)
report("kernel alone (back to back, CUDA events)", gpu_time(lambda: gpu.launch(flat, e4m3)))
small = flat[: 1 << 16]
report("whole call on 64K elements (fixed costs)",
       best(lambda: gpu.quantize_blocks_cuda(small, e4m3), 50), small)
report("launch alone on 64K elements (GPU time)",
       gpu_time(lambda: gpu.launch(small, e4m3), 50), small)
buffers = gpu.launch(small, e4m3)
torch.cuda.synchronize()
head = buffers.host[: gpu.HEAD + gpu.WINDOW].copy()
report("unpack on the host",
       best(lambda: gpu._unpack(head, np.zeros(gpu.HIST_BINS, np.int64), small.numel(), 128),
            50), small)


for elements, min_blocks in ((8, 4), (32, 1)):
    t = Tuning(elements=elements, min_blocks=min_blocks)
    report(f"{elements} elements per thread, at least {min_blocks} blocks per SM",
           best(lambda t=t: gpu.quantize_blocks_cuda(x, e4m3, tuning=t)))
for per_sm in (2, 4, 8, 16):
    t = Tuning(blocks_per_sm=per_sm)
    report(f"shipped, blocks of 128, {per_sm} thread blocks per SM",
           best(lambda t=t: gpu.quantize_blocks_cuda(x, e4m3, tuning=t)))
for block in (1, 32, 1024):
    s = build_scheme(format=get_format("float8_e4m3fn"), block=block)
    report(f"shipped, blocks of {block}", best(lambda s=s: gpu.quantize_blocks_cuda(x, s)))
for fmt in ("float8_e5m2", "float6_e2m3fn", "float4_e2m1fn"):
    s = build_scheme(format=get_format(fmt), block=128)
    report(f"shipped, {fmt}", best(lambda s=s: gpu.quantize_blocks_cuda(x, s)))
report("shipped, e4m3 with the magic-number cast",
       best(lambda: gpu.quantize_blocks_cuda(x, e4m3, hardware_cast=False)))
for dtype in (torch.bfloat16, torch.float16):
    h = x.to(dtype)
    report(f"shipped, {dtype} input", best(lambda h=h: gpu.quantize_blocks_cuda(h, e4m3)), h)

VARIANTS = {  # name: (edits of the source, (elements per thread, min blocks per SM))
    "no shared-memory atomics": ([("atomicAdd(&window[slot], 1u);", "t.nan += slot;")],
                                 (16, 2)),
    "no relative error (one bin for all)": ([(
        "const u32 bits = __float_as_uint(__fmul_rn(fabsf(err), inv));",
        "const u32 bits = 0x3c000000u;")], (16, 2)),
    "no prefetch, at least 3 blocks per SM": ([
        ("load(src, c + stride, c + stride < n_chunks, next);  // in flight while this one runs",
         ""),
        ("        for (int i = 0; i < V; ++i) x[i] = next[i];",
         "        load(src, c + stride, c + stride < n_chunks, x);")], (16, 3)),
    "no work: launch, zeroing, copy back only": ([("for (; c0 < n_chunks; c0 += stride) {",
                                                   "for (; c0 < 0; c0 += stride) {")], (16, 2)),
}
original = gpu.shipped_source()
for name, (edits, (elements, min_blocks)) in VARIANTS.items():
    source = original
    for old, new in edits:
        assert old in source, name
        source = source.replace(old, new)
    t = Tuning(elements=elements, min_blocks=min_blocks, source=source)
    report(f"variant: {name}", best(lambda t=t: gpu.quantize_blocks_cuda(x, e4m3, tuning=t)))
