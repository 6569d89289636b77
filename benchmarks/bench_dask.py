"""``fmt quantize`` on one machine vs ``--dask``, on one sharded checkpoint, in one run.

    python benchmarks/bench_dask.py [--gib G] [--shards S] [--workers 1,2] [--dir DIR]
                                    [--local-workers N] [--json OUT]

Makes (or reuses) a Hugging Face style checkpoint in DIR: S safetensors shards and a
``model.safetensors.index.json``, G GiB of bfloat16 in all (each shard: a few 4096-wide
matrices of N(0, 0.02) with rare x100 outliers, one 1-D norm; written by one process per
shard), then times, each as its own process (``python -m fmtcli``, the default schemes:
block 128 beside per-tensor, float8_e4m3fn, ``--json``):

- ``local``: the engine on this machine (``--workers`` = ``--local-workers``, default: its
  own default, one per core up to 8);
- ``dask local:N`` for the last N of ``--workers``: the whole command, which starts and
  stops a LocalCluster (what a user on one machine pays);
- ``dask N``: for every N of ``--workers``, a LocalCluster of N single-thread worker
  processes is started here first (its start-up timed apart; then the workers import
  fmtcli), and the command runs against it with ``--dask tcp://...``: the scan itself.
  Throughput is the checkpoint's bytes over that wall time; scaling efficiency is
  throughput(N) / (N * throughput(first N)).

Every Dask run's JSON must equal the local one (less its ``dask`` key): the script says so
and fails otherwise.  The data is read from the page cache after the first run (it is
written just before), so this measures the work and its distribution, not a disk.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = 4096


def write_shard(path: str, rows: int, seed: int, layer: int) -> int:
    """One safetensors shard of bfloat16 matrices (rows x 4096 in all, in up to 4 tensors)
    and a norm vector, written without the safetensors package; returns its bytes."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    parts = [rows // 4] * 3 + [rows - 3 * (rows // 4)]
    names = ["q_proj", "k_proj", "up_proj", "down_proj"]
    header, offset, tensors = {}, 0, []
    for name, r in zip(names, parts):
        key = f"model.layers.{layer}.mlp.{name}.weight"
        header[key] = {"dtype": "BF16", "shape": [r, COLS],
                       "data_offsets": [offset, offset + r * COLS * 2]}
        offset += r * COLS * 2
        tensors.append((key, r))
    norm = f"model.layers.{layer}.input_layernorm.weight"
    header[norm] = {"dtype": "BF16", "shape": [COLS], "data_offsets": [offset, offset + COLS * 2]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for _key, r in tensors:
            for start in range(0, r, 1024):
                n = min(1024, r - start)
                block = rng.standard_normal((n, COLS), dtype=np.float32) * np.float32(0.02)
                hits = rng.random(block.shape) < 1.5e-5
                block[hits] *= 100
                out.write(block.astype(ml_dtypes.bfloat16).tobytes())
        out.write(np.ones(COLS, np.float32).astype(ml_dtypes.bfloat16).tobytes())
    return os.path.getsize(path)


def make_checkpoint(folder: str, gib: float, shards: int) -> int:
    """The checkpoint (reused when its index is there); its tensor bytes."""
    index = os.path.join(folder, "model.safetensors.index.json")
    os.makedirs(folder, exist_ok=True)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    if not os.path.exists(index):
        rows = int(gib * (1 << 30) / shards / (COLS * 2))
        with ProcessPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:
            list(pool.map(write_shard, [os.path.join(folder, n) for n in names],
                          [rows] * shards, range(shards), range(shards)))
        weight_map = {}
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                weight_map.update(dict.fromkeys(json.loads(f.read(length)), name))
        with open(index, "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return sum(os.path.getsize(os.path.join(folder, n)) for n in names)


def fmt(*args: str) -> tuple[float, dict]:
    """Wall seconds and the parsed --json document of ``python -m fmtcli ARGS --json``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fmtcli", *args, "--json"], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"fmt {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=0.5)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--local-workers", type=int, default=None)
    parser.add_argument("--dir", default="/tmp/fmtcli-bench-dask")
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    folder = os.path.join(args.dir, f"{args.gib:g}gib-{args.shards}")
    start = time.perf_counter()
    nbytes = make_checkpoint(folder, args.gib, args.shards)
    print(f"checkpoint: {folder}: {args.shards} shards, {nbytes / 2**30:.2f} GiB bfloat16 "
          f"(made or found in {time.perf_counter() - start:.1f} s); {os.cpu_count()} cores")
    fmt("quantize", folder)  # warm: the page cache, Python's bytecode cache
    local_args = [] if args.local_workers is None else ["--workers", str(args.local_workers)]
    wall, reference = fmt("quantize", folder, *local_args)
    rows = [{"run": f"local (--workers {args.local_workers or 'default'})", "wall_s": wall,
             "gb_s": nbytes / wall / 1e9}]

    def same(doc: dict) -> bool:
        return {k: v for k, v in doc.items() if k != "dask"} == reference

    wall, doc = fmt("quantize", folder, "--dask", f"local:{counts[-1]}")
    rows.append({"run": f"--dask local:{counts[-1]} (whole command)", "wall_s": wall,
                 "gb_s": nbytes / wall / 1e9, "identical": same(doc)})
    import distributed

    base = None
    for n in counts:
        begin = time.perf_counter()
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=":0")
        started = time.perf_counter() - begin
        try:
            with distributed.Client(cluster) as client:  # the workers' imports, done first
                client.run(__import__, "fmtcli.quantize.distributed")
            wall, doc = fmt("quantize", folder, "--dask", cluster.scheduler_address)
        finally:
            cluster.close()
        gb_s = nbytes / wall / 1e9
        base = base or gb_s / n
        rows.append({"run": f"--dask tcp:// ({n} workers)", "workers": n, "wall_s": wall,
                     "gb_s": gb_s, "efficiency": gb_s / (n * base), "cluster_start_s": started,
                     "tasks": doc["dask"].get("tasks"), "identical": same(doc)})
    print(f"{'run':38} {'wall s':>8} {'GB/s':>7} {'eff.':>6} {'start s':>8}  identical")
    for row in rows:
        eff = f"{row['efficiency']:.2f}" if "efficiency" in row else ""
        st = f"{row['cluster_start_s']:.1f}" if "cluster_start_s" in row else ""
        print(f"{row['run']:38} {row['wall_s']:8.2f} {row['gb_s']:7.3f} {eff:>6} {st:>8}  "
              f"{row.get('identical', '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": nbytes, "shards": args.shards, "cores": os.cpu_count(),
                       "rows": rows}, f, indent=1)
    if not all(row.get("identical", True) for row in rows):
        sys.exit("a Dask run's statistics differ from the local run's")


if __name__ == "__main__":
    main()
