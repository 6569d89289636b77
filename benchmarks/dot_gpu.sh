#!/bin/bash
# fmt dot on a CUDA GPU: the CUDA test of tests/test_dot.py, then torch._scaled_mm (with and
# without use_fast_accum) beside the emulation, and the sweep of emulated accumulator widths
# that finds the one closest to the hardware.  From the repository root, OUT set:
#   OUT=/tmp/out bash benchmarks/dot_gpu.sh      (figures: benchmarks/RESULTS.md, "fmt dot")
set -u
export PYTHONPATH=$PWD COLUMNS=100
python3 -c "import torch, sys; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider tests/test_dot.py 2>&1 | tail -3
else
  echo "pytest absent: the CUDA test is the fmt dot --device cuda runs below"
fi
run() {
  echo "\$ fmt dot $*"
  start=$(date +%s.%N)
  python3 -m fmtcli dot "$@"
  echo "($(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall)"
}
run --device cuda
run --device cuda --promote-every 128
run --device cuda --scale-granularity row
run --device cuda --scale-granularity block:128 --promote-every 128
python3 -m fmtcli dot --device cuda --json > "$OUT/dot_cuda.json"
python3 -m fmtcli dot --device cuda --promote-every 128 --json > "$OUT/dot_cuda_promote128.json"
echo "\$ python3 benchmarks/dot_match.py 256 256 4096"
python3 benchmarks/dot_match.py 256 256 4096 | tee "$OUT/dot_match.txt"
