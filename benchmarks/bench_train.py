"""fmt train: the time of one training step per recipe against the BF16 baseline's.

    python benchmarks/bench_train.py [--recipes A,B] [--steps N] [--warmup W] [--threads T]
                                     [--width W --layers L --seq S --batch B] [--json FILE]

For each recipe (default: every recipe of ``fmtcli.train.recipes.RECIPE_NAMES``) one
training session (``fmtcli.train.session.Session``: the model, AdamW, the loss scaler and
the emulated casts of every block Linear's three GEMMs) is built at the same sizes and
seed, ``--warmup`` steps are taken untimed, then ``--steps`` steps are timed one by one;
the median is reported with its ratio to the median of ``bf16`` (the baseline: bfloat16
GEMM inputs through torch's own conversion) and of ``fp32`` (no cast at all: the cost of
the model and the optimizer alone).  The recipes run interleaved round by round (each
round times a block of steps of every recipe) so that a change of the machine's load
weighs on all of them alike.  The issue's target: the FP8 recipes within 3x of the BF16
step on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FP8 = ("tensorwise", "delayed", "rowwise", "deepseek", "mxfp8", "fp8-unscaled")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", default=None, help="comma list (default: all)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per recipe")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="blocks the steps are split into")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--json", default=None, help="also write the figures here")
    return p.parse_args()


def main() -> None:
    args = parse()
    import torch

    from fmtcli.train.data import load_corpus
    from fmtcli.train.recipes import RECIPE_NAMES, get_recipe
    from fmtcli.train.results import TrainSettings
    from fmtcli.train.session import Session

    torch.set_num_threads(args.threads)
    names = args.recipes.split(",") if args.recipes else list(RECIPE_NAMES)
    names = ["bf16", "fp32"] + [n for n in names if n not in ("bf16", "fp32")]
    settings = TrainSettings(steps=args.warmup + args.steps + 1, layers=args.layers,
                             width=args.width, seq=args.seq, batch=args.batch,
                             threads=args.threads)
    corpus = load_corpus(None, settings.seq)
    sessions = {n: Session(get_recipe(n), settings, 0, corpus) for n in names}
    step = dict.fromkeys(names, 0)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name, session in sessions.items():
        for _ in range(args.warmup):
            step[name] += 1
            session.step(step[name])
    per_round = -(-args.steps // args.rounds)
    for _ in range(args.rounds):
        for name, session in sessions.items():
            for _ in range(min(per_round, args.steps - len(times[name]))):
                step[name] += 1
                start = time.perf_counter()
                session.step(step[name])
                times[name].append(time.perf_counter() - start)
    report(args, names, times)


def report(args, names: list[str], times: dict[str, list[float]]) -> None:
    median = {n: statistics.median(times[n]) for n in names}
    print(f"{args.layers} layers of width {args.width}, {args.batch} x {args.seq} tokens a "
          f"step, {args.threads} thread(s), median of {args.steps} steps after "
          f"{args.warmup} warm-up; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'recipe':14} {'ms/step':>9} {'vs bf16':>8} {'vs fp32':>8}  target")
    rows = []
    for n in names:
        ratio = median[n] / median["bf16"]
        target = ("<= 3x: met" if ratio <= 3 else "<= 3x: NOT met") if n in FP8 else ""
        print(f"{n:14} {1e3 * median[n]:9.1f} {ratio:7.2f}x "
              f"{median[n] / median['fp32']:7.2f}x  {target}")
        rows.append({"recipe": n, "median_seconds": median[n], "vs_bf16": ratio,
                     "vs_fp32": median[n] / median["fp32"]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
