"""fmt quantize vs the hand-written numpy + ml_dtypes baseline, in one run, on one file.

    python benchmarks/bench_quantize.py [--elements N] [--repeat R] [--file PATH] [--no-dtypes]

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

fmtcli runs twice: with its compiled chunk kernel (``fmtcli/numerics/_native.c``, where it
is built) and with ``FMTCLI_KERNEL=numpy`` (the numpy formulation alone: the engine before
the kernel), so the kernel's gain is measured in the same run.  Then the same values stored
as float32, bfloat16 and float16, runs alternating (``--no-dtypes`` to skip): elements per
second of work against float32's, as whole processes minus each type's own start-up and as
timed inside a fresh process (``compare_dtypes``).  ``import ml_dtypes`` is timed on its
own too (1.4-2.6 s from ml_dtypes 0.7.0, against ~10-50 ms before): a bfloat16 file
imported it until issue 22 item 2b (it is now read as its bit patterns); where the probe
still imports it, the bfloat16 work without it is shown beside.
Children run with Python's bytecode
cache on (``PYTHONDONTWRITEBYTECODE`` removed from their environment, one warm-up run
first), as an installed package runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from benchfiles import ROOT, child_env, tiny_file

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


def run(command: list[str], **env: str) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes and stdout of one process (``env``: added)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env(**env))
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(command)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss * 1024, stdout.decode()


# The work of one fmt quantize run inside a fresh process (load, quantize(), its first and
# only call, so first-call costs count): no interpreter start-up to subtract.
WORK_PROBE = """
import sys, time
from fmtcli.numerics.formats import get_format
from fmtcli.quantize import quantize
from fmtcli.numerics.schemes import build_scheme
from fmtcli.inputs.tensors import load_path
scheme = build_scheme(format=get_format("float8_e4m3fn"), block=128)
t0 = time.perf_counter()
quantize(load_path(sys.argv[1]), [scheme])
print(time.perf_counter() - t0, "ml_dtypes" in sys.modules)
"""


# ``import ml_dtypes`` alone in a fresh process (numpy loaded first, as fmtcli has it)
IMPORT_PROBE = """
import time
import numpy
t0 = time.perf_counter()
import ml_dtypes
print(time.perf_counter() - t0)
"""


def ml_dtypes_version() -> str:
    import ml_dtypes

    return ml_dtypes.__version__


def compare_dtypes(path: str, args, ours_cmd: list[str]) -> None:
    """The same values stored as float32, bfloat16 and float16, runs alternating (machine
    noise falls on all three alike): elements per second of work, two ways -- whole
    processes minus their start-up (a 128-value file of the same type), and the work timed
    inside a fresh process (``WORK_PROBE``)."""
    files, tinies = {"float32": path}, {}
    for dtype in ("bfloat16", "float16"):
        files[dtype] = f"{path[:-4]}.{dtype}.npy"
        if not os.path.exists(files[dtype]):
            subprocess.run([sys.executable, __file__, "--make-dtype", dtype, "--file", path],
                           check=True)
    for dtype in files:
        tinies[dtype] = tiny_file(path, dtype)
        run([*ours_cmd[:4], tinies[dtype], *ours_cmd[5:]])  # warm-up
    walls, starts, inside = ({dtype: [] for dtype in files} for _ in range(3))
    loads = {}  # whether the work imported ml_dtypes (bfloat16 did before issue 22, 2b)
    probe = [sys.executable, "-c", WORK_PROBE]
    for _ in range(args.repeat):
        for dtype in files:
            walls[dtype].append(run([*ours_cmd[:4], files[dtype], *ours_cmd[5:]])[0])
            starts[dtype].append(run([*ours_cmd[:4], tinies[dtype], *ours_cmd[5:]])[0])
            seconds, imported = run([*probe, files[dtype]])[2].split()
            inside[dtype].append(float(seconds))
            loads[dtype] = imported == "True"
    for tiny_path in tinies.values():
        os.unlink(tiny_path)
    whole = {dtype: min(walls[dtype]) - min(starts[dtype]) for dtype in files}
    timed = {dtype: min(inside[dtype]) for dtype in files}
    imports = [float(run([sys.executable, "-c", IMPORT_PROBE])[2]) for _ in range(args.repeat)]
    print(f"float32, bfloat16, float16 alternating, best of {args.repeat} each (target: "
          "16-bit >= float32's elements/s)")
    print(f"{'input':9s} {'whole - start-up':>17s} {'ratio':>6s} {'timed inside':>13s} "
          f"{'M elements/s':>13s} {'ratio':>6s}")
    for dtype in files:
        print(f"{dtype:9s} {whole[dtype]:15.3f} s {whole['float32'] / whole[dtype]:5.2f}x "
              f"{timed[dtype]:11.3f} s {args.elements / timed[dtype] / 1e6:13.0f} "
              f"{timed['float32'] / timed[dtype]:5.2f}x")
    import_s = min(imports)
    loaded = [dtype for dtype in files if loads[dtype]]
    if not loads["bfloat16"]:
        print(f"import ml_dtypes {ml_dtypes_version()}: {import_s:.3f} s, in no time above "
              f"(imported by: {', '.join(loaded) or 'none'})")
        return
    bf16 = timed["bfloat16"] - import_s
    print(f"import ml_dtypes {ml_dtypes_version()}: {import_s:.3f} s (in the bfloat16 time "
          f"inside); bfloat16 without it {bf16:.3f} s, {args.elements / bf16 / 1e6:.0f} M "
          f"elements/s, {timed['float32'] / bf16:.2f}x float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--file", default=None, help="tensor path (made if missing)")
    parser.add_argument("--naive", default=NAIVE)
    parser.add_argument("--no-dtypes", action="store_true",
                        help="skip the bfloat16 and float16 runs")
    parser.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--make-dtype", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = args.file or os.path.join("/tmp", f"fmtcli-bench-{args.elements}.npy")
    if args.make:
        make_tensor(path, args.elements)
        return
    if args.make_dtype:
        import ml_dtypes

        dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[args.make_dtype]
        source = np.load(path, mmap_mode="r")
        out = np.lib.format.open_memmap(f"{path[:-4]}.{args.make_dtype}.npy", mode="w+",
                                        dtype=dtype, shape=source.shape)
        for start in range(0, source.shape[0], 1024):
            out[start:start + 1024] = source[start:start + 1024].astype(dtype)
        out.flush()
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
    tiny = tiny_file(path)
    tiny_cmd = [*ours_cmd[:4], tiny, *ours_cmd[5:]]
    run(tiny_cmd)  # warm-up: writes the bytecode cache
    startup = min(run(tiny_cmd)[0] for _ in range(args.repeat))
    startup_numpy = min(run(tiny_cmd, FMTCLI_KERNEL="numpy")[0] for _ in range(args.repeat))
    os.unlink(tiny)
    results = {}
    plan = (("baseline", baseline_cmd, {}), ("fmtcli", ours_cmd, {}),
            ("numpy path", ours_cmd, {"FMTCLI_KERNEL": "numpy"}))
    for name, command, env in plan:
        runs = [run(command, **env) for _ in range(args.repeat)]
        wall = min(r[0] for r in runs)
        rss = max(r[1] for r in runs)
        results[name] = (wall, rss, runs[0][2])
        if name == "baseline":
            base_work = min(json.loads(r[2])["seconds"] for r in runs)
    base_wall, base_rss, base_out = results["baseline"]
    our_wall, our_rss, our_out = results["fmtcli"]
    numpy_wall = results["numpy path"][0]
    if json.loads(results["numpy path"][2]) != json.loads(our_out):
        print("WARNING: the numpy path's JSON differs from the compiled kernel's")
    base = json.loads(base_out)
    ours = json.loads(our_out)["tensors"][0]["schemes"][0]
    print(f"input: {path}  {size / 2**20:.0f} MiB float32, {args.elements:,} elements; "
          f"best of {args.repeat} runs; {os.cpu_count()} cores")
    print(f"{'':10s} {'wall s':>8s} {'GB/s':>7s} {'peak RSS MiB':>13s} {'RSS / file':>11s}")
    for name, (wall, rss, _) in results.items():
        print(f"{name:10s} {wall:8.3f} {size / wall / 1e9:7.3f} {rss / 2**20:13.0f} "
              f"{rss / size:11.2f}")
    print(f"whole processes, fmtcli / baseline: {base_wall / our_wall:.1f}x (target >= 10x; "
          f"numpy path {base_wall / numpy_wall:.1f}x)")
    our_work = our_wall - startup
    numpy_work = numpy_wall - startup_numpy
    print(f"start-up (the same command on 128 values): fmtcli {startup:.3f} s, numpy path "
          f"{startup_numpy:.3f} s")
    print(f"work: baseline {base_work:.3f} s (its own timing), fmtcli {our_work:.3f} s = "
          f"{size / our_work / 1e9:.2f} GB/s, numpy path {numpy_work:.3f} s = "
          f"{size / numpy_work / 1e9:.2f} GB/s")
    print(f"work throughput: fmtcli / numpy path {numpy_work / our_work:.2f}x (target >= 2x, "
          f">= 1.3 GB/s); fmtcli / baseline {base_work / our_work:.1f}x")
    if not args.no_dtypes:
        compare_dtypes(path, args, ours_cmd)
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
