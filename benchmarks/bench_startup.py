"""Start-up of ``fmt`` against the import of numpy, side by side in one run.

    python benchmarks/bench_startup.py [--repeat 20]

Times whole processes (fork, exec, interpreter, imports, output), alternating the
commands so that machine noise falls on all of them alike, and prints the median of each
and the ratios to ``python -c "import numpy"``.  Issue 10's target: ``fmt --version``
within 1.5x of that import.  ``fmt range fp16 --json`` and ``fmt range`` show what a small
command costs once it needs numpy (and rich, for the table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c 'import numpy'": [sys.executable, "-c", "import numpy"],
    "fmt --version": [sys.executable, "-m", "fmtcli", "--version"],
    "fmt --help": [sys.executable, "-m", "fmtcli", "--help"],
    "fmt range fp16 --json": [sys.executable, "-m", "fmtcli", "range", "fp16", "--json"],
    "fmt range": [sys.executable, "-m", "fmtcli", "range"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    repeat = parser.parse_args().repeat
    env = dict(os.environ, COLUMNS="120")
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeat):
        for name, argv in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)
            times[name].append(time.perf_counter() - start)
    numpy = statistics.median(times["python -c 'import numpy'"])
    print(f"median of {repeat} whole processes each (alternating):")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:28s} {median * 1e3:7.1f} ms  {median / numpy:5.2f}x import numpy")
    ratio = statistics.median(times["fmt --version"]) / numpy
    print(f"fmt --version / import numpy = {ratio:.2f} (target <= 1.5): "
          f"{'met' if ratio <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
