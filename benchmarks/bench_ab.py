"""Two checkouts of fmtcli, one command, alternating: what a change costs or saves.

    git worktree add /tmp/before <rev>
    python benchmarks/bench_ab.py --before /tmp/before [--repeat 15] [-- EXTRA fmt ARGS]

Runs ``python -m fmtcli quantize FILE --block 128 --compare none --json`` (plus EXTRA)
with PYTHONPATH pointing at each checkout in turn, whole processes, alternating so that
machine noise falls on both alike; prints min and median wall time of each and their ratio.
FILE is the 64M-element float32 tensor of bench_quantize.py (made by it if missing).  The
start-up of both is included; the same command on a 128-value file gives it, to take out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchfiles import BENCH_FILE, ROOT, child_env, ensure_bench_file, tiny_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other checkout's root")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--file", default=BENCH_FILE)
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    ensure_bench_file(args.file)
    tiny = tiny_file(args.file)
    trees = {"before": os.path.abspath(args.before), "after": ROOT}
    times: dict[str, dict[str, list[float]]] = {k: {"work": [], "start": []} for k in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            env = child_env(PYTHONPATH=tree)
            for kind, path in (("work", args.file), ("start", tiny)):
                command = [sys.executable, "-m", "fmtcli", "quantize", path, "--block", "128",
                           "--compare", "none", "--json", *args.extra]
                start = time.perf_counter()
                subprocess.run(command, stdout=subprocess.DEVNULL, check=True, env=env,
                               cwd="/tmp")
                times[name][kind].append(time.perf_counter() - start)
    os.unlink(tiny)
    print(f"{args.file}: {args.repeat} alternating runs each; "
          f"extra args: {' '.join(args.extra) or '(none)'}")
    summary = {}
    for name in trees:
        work, start = times[name]["work"], times[name]["start"]
        summary[name] = (min(work), statistics.median(work), min(start))
        print(f"  {name:6s} whole min {min(work):.3f} s, median {statistics.median(work):.3f} "
              f"s; start-up (128 values) min {min(start):.3f} s")
    (bw, bm, bs), (aw, am, as_) = summary["before"], summary["after"]
    print(f"after / before, whole process: min {aw / bw:.3f}, median {am / bm:.3f}; "
          f"start-up taken out (min): {(aw - as_) / (bw - bs):.3f}")


if __name__ == "__main__":
    main()
