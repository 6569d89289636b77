"""Time variants of the fused CUDA kernel (tile size, iterations, warps, histogram on/off)
on a 1 GiB tensor: where the time goes.  python benchmarks/tune_gpu.py"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from fmtcli.formats import get_format
from fmtcli.gpu import quantize_blocks_cuda
from fmtcli.schemes import build_scheme

x = torch.randn(2**28, device="cuda") * 0.02
scheme = build_scheme(format=get_format("float8_e4m3fn"), block=128)
y = torch.empty_like(x)


def best(fn, repeat=5):
    fn()
    torch.cuda.synchronize()
    t = float("inf")
    for _ in range(repeat):
        s = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t = min(t, time.perf_counter() - s)
    return t


copy = best(lambda: y.copy_(x))
print(f"copy {2 * x.numel() * 4 / copy / 1e12:.2f} TB/s r+w")
for tile, iters, warps, hist in [(4096, 16, 4, True), (4096, 16, 4, False), (2048, 8, 4, True),
                                 (2048, 8, 4, False), (1024, 16, 4, True), (8192, 8, 8, True)]:
    t = best(lambda t=tile, i=iters, w=warps, h=hist: quantize_blocks_cuda(
        x, scheme, tile_elements=t, iterations=i, num_warps=w, histogram=h))
    print(f"tile {tile:5d} iters {iters:3d} warps {warps} hist {hist!s:5}: {t * 1e3:7.2f} ms "
          f"{x.numel() * 4 / t / 1e12:.3f} TB/s input")
