"""What the benchmark scripts share: the 64M-element test tensor, the 128-value file whose
run is a command's start-up, and the environment the timed children run in."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_FILE = os.path.join("/tmp", f"fmtcli-bench-{1 << 26}.npy")


def ensure_bench_file(path: str = BENCH_FILE) -> str:
    """``path``, written by ``bench_quantize.py --make`` (in a child process, so that this
    one stays small) if it is missing."""
    if not os.path.exists(path):
        print(f"writing {path} ...", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_quantize.py"),
                        "--make", "--file", path], check=True)
    return path


def tiny_file(beside: str, dtype: str = "float32") -> str:
    """A 128-value ``.npy`` of ``dtype`` next to ``beside``: the same command on it times the
    command's start-up (the same imports and set-up, no work; a bfloat16 run, read as its
    bit patterns, no longer imports ml_dtypes: issue 22, 2b).  The caller deletes it."""
    path = f"{beside}.tiny.{dtype}.npy"
    values = np.linspace(-1, 1, 128, dtype=np.float32)
    if dtype == "bfloat16":
        import ml_dtypes

        values = values.astype(ml_dtypes.bfloat16)
    np.save(path, values.astype(dtype) if dtype != "bfloat16" else values)
    return path


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a timed child: as an installed package runs, with its modules'
    bytecode cached (a development shell may set PYTHONDONTWRITEBYTECODE, which makes every
    run compile fmtcli's sources again: ~50 ms), and the compiled kernel on unless
    ``extra`` says otherwise (``FMTCLI_KERNEL="numpy"``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE", "FMTCLI_KERNEL")}
    env.update(extra)
    return env
