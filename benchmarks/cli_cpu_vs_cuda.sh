#!/usr/bin/env bash
# End to end through the CLI on a GPU machine: `fmt quantize` of a 2 GiB and an 8 GiB .npy
# on the CPU engine against the CUDA kernel (torch import, CUDA start-up and the kernel's
# compilation included), and the start-up costs alone.  
#   bash benchmarks/cli_cpu_vs_cuda.sh      (from the repository root; writes /tmp/t.npy)
set -e
export PYTHONPATH=$PWD
python3 -c "
import time; t=time.time(); import torch; t1=time.time(); torch.zeros(1,device='cuda'); torch.cuda.synchronize(); t2=time.time()
from fmtcli.quantize import cuda_kernel as k; k._compiled(128,0,1,k.SHIPPED); t3=time.time()
print(f'import torch {t1-t:.2f} s, CUDA start {t2-t1:.2f} s, kernel compile {t3-t2:.2f} s')"
for gib in 2 8; do
python3 -c "
import numpy as np
n = $gib * 2**28
block = (np.random.default_rng(0).standard_normal(1 << 26, dtype=np.float32) * 0.02)
m = np.lib.format.open_memmap('/tmp/t.npy', mode='w+', dtype=np.float32, shape=(n // 4096, 4096))
flat = m.reshape(-1)
for i in range(0, n, block.size): flat[i:i + block.size] = block[:n - i]
m.flush()"
/usr/bin/time -f "$gib GiB cpu engine: %e s, %M KB" python3 -m fmtcli quantize /tmp/t.npy --compare none --device cpu --json > /tmp/cpu.json
/usr/bin/time -f "$gib GiB cuda kernel: %e s, %M KB" python3 -m fmtcli quantize /tmp/t.npy --compare none --backend torch --device cuda --json > /tmp/cuda.json
python3 -c "import json; a=json.load(open('/tmp/cpu.json'))['tensors'][0]['schemes'][0]; b=json.load(open('/tmp/cuda.json'))['tensors'][0]['schemes'][0]; print('same:', all(a[k]==b[k] for k in ('flushed','median_rel_error','p99_rel_error','max_abs_error','count')))"
done
