"""The compiled chunk kernel against the numpy path, scheme by scheme, in one run.

    python benchmarks/bench_schemes.py [--repeat R] [--file PATH]

Runs ``python -m fmtcli quantize FILE --compare none --json`` with each scheme below, as
whole processes, alternating ``FMTCLI_KERNEL=numpy`` (the numpy formulation alone) and the
default (the compiled kernel where it applies); prints the best wall time of each, the
work (wall time minus the same command on a 128-value file) and the ratio, and checks that
both JSON documents are identical.  FILE: the 64M-element float32 tensor of
``bench_quantize.py`` (made by it if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchfiles import BENCH_FILE, child_env, ensure_bench_file, tiny_file

SCHEMES = {
    "block 128 E4M3": ["--block", "128"],
    "per-tensor E4M3": ["--per", "tensor"],
    "per-row E4M3": ["--per", "row"],
    "tile 128x128 E4M3": ["--tile", "128x128"],
    "MXFP8 (block 32, E8M0)": ["--recipe", "mxfp8"],
    "MXFP4 (block 32, E8M0)": ["--recipe", "mxfp4"],
    "NVFP4 (two-level)": ["--recipe", "nvfp4"],
    "block 128 E4M3 fnuz": ["--block", "128", "--format", "float8_e4m3fnuz"],
}

def run(path: str, args: list[str], kernel: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "fmtcli", "quantize", path, *args,
                          "--compare", "none", "--json"], env=child_env(FMTCLI_KERNEL=kernel),
                         check=True,
                         capture_output=True, cwd="/tmp").stdout
    return time.perf_counter() - start, out.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--file", default=BENCH_FILE)
    args = parser.parse_args()
    ensure_bench_file(args.file)
    tiny = tiny_file(args.file)
    run(tiny, [], "")  # warm-up: the bytecode cache
    start = min(run(tiny, [], k)[0] for k in ("", "numpy") for _ in range(args.repeat))
    os.unlink(tiny)
    print(f"{args.file}: best of {args.repeat}, whole processes; start-up {start:.3f} s")
    print(f"{'scheme':24s} {'numpy s':>8s} {'kernel s':>9s} {'work ratio':>11s}  same JSON")
    for name, scheme in SCHEMES.items():
        times: dict[str, list[float]] = {"numpy": [], "": []}
        outputs = {}
        for _ in range(args.repeat):
            for kernel in ("numpy", ""):
                wall, outputs[kernel] = run(args.file, scheme, kernel)
                times[kernel].append(wall)
        slow, fast = min(times["numpy"]), min(times[""])
        same = json.loads(outputs["numpy"]) == json.loads(outputs[""])
        print(f"{name:24s} {slow:8.3f} {fast:9.3f} {(slow - start) / (fast - start):10.2f}x"
              f"  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
