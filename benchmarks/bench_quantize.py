"""fmt quantize vs the hand-written numpy + ml_dtypes baseline, in one run, on one file.

    python benchmarks/bench_quantize.py [--elements N] [--repeat R] [--file PATH]

Makes (or reuses) a float32 .npy of N elements (default 64M = 256 MiB; a 2-D 16384 x 4096
activation-like matrix of N(0, 0.02) with rare x100 outliers, seeded), then runs, each as its
own process and R times (best wall time kept):

- baseline: ../shared/bench/naive_quantize.py FILE 128 float8_e4m3fn
- fmtcli:   python -m fmtcli quantize FILE --block 128 --format float8_e4m3fn --compare none --json

Both compute the same block-128 E4M3 statistics (fmtcli computes more).  Prints wall time,
throughput (input bytes / wall second), the throughput ratio, each one's peak resident memory
(from wait4) against the file size, and whether the statistics agree.  Each process pays
its interpreter's start-up (imports) once; a second ratio leaves that out: the baseline's
own "seconds" (it times itself after its imports) against fmtcli's wall time minus the wall
time of the same command on a 128-element file (the same imports and set-up, no work;
``fmt --version`` no longer loads numpy, so it no longer measures the start-up of a run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAIVE = os.path.join(ROOT, "..", "shared", "bench", "naive_quantize.py")


def make_tensor(path: str, elements: int, seed: int = 0) -> None:
    """Write the benchmark tensor in pieces (no full-size temporary beyond the output)."""
    cols = 4096
    rows = max(1, elements // cols)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    rng = np.random.default_rng(seed)
    step = 1024
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = rng.standard_normal((stop - start, cols), dtype=np.float32) * np.float32(0.02)
        hits = rng.random(block.shape) < 1.5e-5
        block[hits] *= 100
        out[start:stop] = block
    out.flush()
    del out


def run(command: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes and stdout of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(command)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss * 1024, stdout.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--file", default=None, help="tensor path (made if missing)")
    parser.add_argument("--naive", default=NAIVE)
    parser.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = args.file or os.path.join("/tmp", f"fmtcli-bench-{args.elements}.npy")
    if args.make:
        make_tensor(path, args.elements)
        return
    if not os.path.exists(path):
        print(f"writing {path} ...", file=sys.stderr)
        # in a child process, so that this one stays small: a forked child starts with its
        # parent's resident memory, which would inflate the peak memory measured below
        subprocess.run([sys.executable, __file__, "--make", "--file", path, "--elements",
                        str(args.elements)], check=True)
    size = os.path.getsize(path)
    baseline_cmd = [sys.executable, args.naive, path, "128", "float8_e4m3fn"]
    ours_cmd = [sys.executable, "-m", "fmtcli", "quantize", path, "--block", "128",
                "--format", "float8_e4m3fn", "--compare", "none", "--json"]
    tiny = path + ".tiny.npy"
    np.save(tiny, np.linspace(-1, 1, 128, dtype=np.float32))
    startup = min(run([*ours_cmd[:4], tiny, *ours_cmd[5:]])[0] for _ in range(args.repeat))
    os.unlink(tiny)
    results = {}
    for name, command in (("baseline", baseline_cmd), ("fmtcli", ours_cmd)):
        runs = [run(command) for _ in range(args.repeat)]
        wall = min(r[0] for r in runs)
        rss = max(r[1] for r in runs)
        results[name] = (wall, rss, runs[0][2])
        if name == "baseline":
            base_work = min(json.loads(r[2])["seconds"] for r in runs)
    base_wall, base_rss, base_out = results["baseline"]
    our_wall, our_rss, our_out = results["fmtcli"]
    base = json.loads(base_out)
    ours = json.loads(our_out)["tensors"][0]["schemes"][0]
    print(f"input: {path}  {size / 2**20:.0f} MiB float32, {args.elements:,} elements; "
          f"best of {args.repeat} runs; {os.cpu_count()} cores")
    print(f"{'':10s} {'wall s':>8s} {'GB/s':>7s} {'peak RSS MiB':>13s} {'RSS / file':>11s}")
    for name, (wall, rss, _) in results.items():
        print(f"{name:10s} {wall:8.3f} {size / wall / 1e9:7.3f} {rss / 2**20:13.0f} "
              f"{rss / size:11.2f}")
    print(f"throughput ratio fmtcli / baseline, whole processes: {base_wall / our_wall:.1f}x")
    our_work = our_wall - startup
    print(f"without interpreter start-up: baseline {base_work:.3f} s (its own timing), "
          f"fmtcli {our_work:.3f} s ({our_wall:.3f} - {startup:.3f} for "
          f"the same command on 128 values): {base_work / our_work:.1f}x")
    checks = [
        ("count", base["count"], ours["count"], 0.0),
        ("flushed_fraction", base["flushed_fraction"], ours["flushed_fraction"], 0.0),
        ("max_abs_error", base["max_abs_error"], ours["max_abs_error"], 0.0),
        ("rmse", base["rmse"], ours["rmse"], 1e-5),
        ("median_rel_error", base["median_rel_error"], ours["median_rel_error"],
         ours["rel_error_resolution"]),
    ]
    for key, theirs, mine, tolerance in checks:
        same = abs(theirs - mine) <= tolerance * abs(theirs)
        print(f"  {key:18s} baseline {theirs:<14.8g} fmtcli {mine:<14.8g} "
              f"{'agree' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
