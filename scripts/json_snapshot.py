"""Snapshot the JSON output of fmt's commands, to show a refactor left it byte-identical.

    python scripts/json_snapshot.py save DIR      # run every command, write DIR/NNN.json
    python scripts/json_snapshot.py compare DIR   # run them again, report any difference

The commands are the JSON examples of README.md and docs/ at the time of ``save`` (their
``--json`` form, directives dropped) plus a fixed list covering every command and scheme;
``save`` writes the list to DIR/commands.txt and ``compare`` reads it back, so the check
survives the examples moving between pages.  Each runs in-process (CliRunner, COLUMNS=80)
in a directory holding the README's small checkpoint (``model_files`` of
tests/test_console_examples.py).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

EXTRA = """\
fmt range --all --json
fmt range fp16 bf16 e4m3fnuz e3m4 e5m2_b10fn --json
fmt underflow 1e-8 65504 70000 0x3c00 2^-24 --scale 1,4096 --format fp16,bf16,e4m3fn,e8m0 --json
fmt underflow 0.3 --rounding stochastic --seed 7 --format e4m3fn,fp4 --json
fmt underflow 1e6 --overflow ieee --format e4m3fn,e5m2 --json
fmt quantize --json
fmt quantize --compare all --json
fmt quantize model.safetensors --json
fmt quantize model.safetensors --recipe deepseek --json
fmt quantize model.safetensors --recipe nvfp4 --compare none --json
fmt quantize model.safetensors --recipe mxfp4 --key layer.0.* --json
fmt quantize model.safetensors --per row --scale-rule pow2-ceil --json
fmt quantize model.safetensors --tile 16x16 --format e5m2 --json
fmt quantize model.safetensors --scale-rule percentile --percentile 99.9 --json
fmt quantize model.safetensors --fixed-scale 64 --json
fmt quantize model.safetensors --rounding stochastic --seed 3 --product exact --json
fmt quantize model.safetensors --block 32 --axis 0 --overflow ieee --json
fmt scale-search --json
fmt scale-search model.safetensors --json
fmt scale-search model.safetensors --block 128 --format e5m2 --json
fmt scale-search --loss-scale --json
fmt scale-search --loss-scale --histogram --json
fmt scale-search model.safetensors --loss-scale --json
fmt check-backends --json
fmt check-backends e4m3fn e8m0 fp16 --json
fmt softmax --random 500 --dim 3 --block 16 --format fp16 --rounding stochastic --seed 2 --json
fmt softmax --scores 1,3,2,0 --values 10,20,30,40 --block 3 --format e4m3fn --json
"""


def commands_from_docs() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    block = re.compile(r"^```console\n\$ (fmt [^\n]*)\n", re.M)
    out = []
    for page in pages:
        if not page.exists():
            continue
        for match in block.finditer(page.read_text()):
            command = match.group(1).split("  #")[0].strip()
            if "--json" in command and "not run" not in match.group(1):
                out.append(command)
    return out


def run(commands: list[str]) -> list[tuple[int, str]]:
    try:
        from test_console_examples import model_files
    except ImportError:  # before the console-example test took over README's
        from test_readme import model_files
    from typer.testing import CliRunner

    from fmtcli.cli import app

    results = []
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        model_files(Path(tmp))
        os.chdir(tmp)
        try:
            for command in commands:
                result = CliRunner().invoke(app, shlex.split(command)[1:],
                                            env={"COLUMNS": "80"})
                results.append((result.exit_code, result.stdout))
        finally:
            os.chdir(old)
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "compare"):
        sys.exit(__doc__)
    directory = Path(argv[1])
    if argv[0] == "save":
        directory.mkdir(parents=True, exist_ok=True)
        commands = list(dict.fromkeys(commands_from_docs() + EXTRA.splitlines()))
        (directory / "commands.txt").write_text("\n".join(commands) + "\n")
        for i, (code, out) in enumerate(run(commands)):
            (directory / f"{i:03d}.json").write_text(f"{code}\n{out}")
        print(f"{len(commands)} commands saved in {directory}")
        return 0
    commands = (directory / "commands.txt").read_text().splitlines()
    differ = 0
    for i, (command, (code, out)) in enumerate(zip(commands, run(commands))):
        if (directory / f"{i:03d}.json").read_text() != f"{code}\n{out}":
            differ += 1
            print(f"DIFFERS: {command}")
    print(f"{len(commands) - differ} of {len(commands)} commands byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
