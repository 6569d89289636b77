#!/bin/bash
# fmt attention on a CUDA GPU: the CUDA tests of tests/test_attention.py, then torch's SDPA
# backends timed (math, flash, efficient, cudnn) at two shapes.  Run from the repository
# root with OUT set to a folder for the outputs:  OUT=/tmp/out bash benchmarks/attention_gpu.sh
# (Figures and the run that gave them: benchmarks/RESULTS.md, "fmt attention on a GPU".)
set -u
export PYTHONPATH=$PWD COLUMNS=100
python3 -c "import torch, sys; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider tests/test_attention.py 2>&1 | tail -5
else  # no pytest on this machine: the CUDA test by hand, pytest's decorators stubbed
  python3 - <<'PY'
import sys, types
stub = types.ModuleType("pytest")
class Mark:
    def __getattr__(self, name):
        return lambda *a, **k: (lambda f: f)
stub.mark, stub.skip = Mark(), lambda *a, **k: None
stub.fixture = lambda *a, **k: (lambda f: f)
stub.approx = lambda x, **k: x
sys.modules["pytest"] = stub
sys.path[:0] = ["tests"]
import test_attention as t
t.test_sdpa_backends_on_cuda()
t.test_fa3_setup_orders_per_tensor_block_and_hadamard()
t.test_io_model_of_gpt2_medium_by_hand()
print("CUDA test (pytest absent, run by hand): passed")
PY
fi
run() {  # the command as typed and its table
  echo "\$ fmt attention $*"
  start=$(date +%s.%N)
  python3 -m fmtcli attention "$@"
  echo "($(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall, CPU emulation included)"
}
run --time --batch 1 --heads 16 --seq 4096 --dim 64 --format float16
python3 -m fmtcli attention --time --batch 1 --heads 16 --seq 4096 --dim 64 --format float16 \
  --json > "$OUT/attention_seq4096.json"
run --time --batch 64 --heads 16 --seq 1024 --dim 64 --format float16 --causal
