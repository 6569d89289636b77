"""Snapshot every command's output (JSON, table, stderr, exit code) to show a refactor left
it byte-identical.

    python scripts/json_snapshot.py save DIR [--package-root ROOT]
    python scripts/json_snapshot.py compare DIR [--package-root ROOT] [--diff N] [--keep NEW]

``save`` runs every case and writes one file per command (``DIR/quantize.txt``, ...: each
invocation's command line, exit code, stdout and stderr), the list of invocations
(``DIR/commands.txt``) and the SHA-256 of the example files they ran on
(``DIR/inputs.sha256``).  ``compare`` reads ``commands.txt`` back, runs them again and
reports every command whose file differs (the first ``--diff`` lines of a unified diff of
each, default 40; ``--keep NEW`` saves this run too, for ``diff -r DIR NEW``) and whether
the example files are still the same bytes; exit 1 on any difference.

The cases are a fixed list (``CASES``: every command of ``fmt --help`` in several option
combinations, files, stdin and error cases) plus every ``$ fmt`` console example of
README.md and docs/*.md at ``save`` time (directives dropped; ``not run`` ones left out).
A case without ``--json`` or ``--csv`` runs twice: as written (the table) and with
``--json``.  Each runs in-process (typer's CliRunner, ``COLUMNS=80``, stderr apart) in a
temporary directory holding the files of ``examples/make_example_files.py`` (loaded by
path); a file a command writes there (``--out``) is recorded by name, size and SHA-256,
then removed.  The temporary directory's path is written ``<TMP>`` and the ml_dtypes and
torch versions check-backends prints ``<VERSION>``, so that two runs (and two installs)
compare equal; nothing timed is run (no ``attention --time``, no ``--device cuda``).
Invocations of no command (``fmt --version``, an unknown command) go to ``DIR/fmt.txt``.
A full run takes about 80 s on two cores.

``--package-root ROOT`` is the tree whose ``fmtcli`` (put first on sys.path, and checked to
be the one imported), docs and examples are used; by default the tree of the fmtcli that
python would import (``PYTHONPATH`` before the editable install).  The baseline before a
refactor, from a git worktree of it (its C kernel built there, or check-backends says it
is missing and quantize runs without it):

    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python scripts/json_snapshot.py save /tmp/snap --package-root /tmp/base
    python scripts/json_snapshot.py compare /tmp/snap      # the current tree against it

Only ``fmtcli.cli.app`` of the package is imported, so that the script runs on any layout.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = "80"
#: variables that would change what rich or fmt prints: unset for every run
UNSET = ("FMT_TRACEBACK", "FMTCLI_KERNEL", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE",
         "TTY_INTERACTIVE", "LINES", "COLUMNS")

#: one case a line: ``fmt ...`` (shell words), optionally `` <<< TEXT`` for stdin
CASES = """\
fmt range
fmt range --all
fmt range fp16 bf16 e4m3fnuz e3m4 e5m2_b10fn
fmt range e4m3 e5m2 fp6 fp4 e8m0
fmt range e4m3 e5m2 e2m3fn e3m2fn fp4 e8m0
fmt range float8_e4m3fn bfloat16 e9m9
fmt range nosuchformat
fmt range e4m3fn --format e5m2
fmt underflow 1e-8 65504 70000 0x3c00 2^-24 --scale 1,4096 --format fp16,bf16,e4m3fn,e8m0
fmt underflow 0.3 --rounding stochastic --seed 7 --format e4m3fn,fp4
fmt underflow 1e6 --overflow ieee --format e4m3fn,e5m2
fmt underflow -0.0 nan inf -inf 1e-45 --format fp16,e4m3fnuz,e5m2
fmt underflow 0.1 --rounding toward-zero --product exact --format e4m3,e3m2fn
fmt underflow 1e-8 --format nosuchformat
fmt underflow abc --format fp16
fmt underflow
fmt quantize
fmt quantize --compare all
fmt quantize --compare none
fmt quantize --recipe nvfp4
fmt quantize --format e5m2 --block 64
fmt quantize model.safetensors
fmt quantize model.safetensors --recipe nvfp4 --compare none
fmt quantize model.safetensors --recipe mxfp4 --key layer.0.*
fmt quantize model.safetensors --recipe mxfp6 --compare all
fmt quantize model.safetensors --format e2m3fn --block 32
fmt quantize model.safetensors --per row --scale-rule pow2-ceil
fmt quantize model.safetensors --per column --margin 1
fmt quantize model.safetensors --per tensor --format fp4
fmt quantize model.safetensors --tile 16x16 --format e5m2
fmt quantize model.safetensors --scale-rule percentile --percentile 99.9
fmt quantize model.safetensors --fixed-scale 64
fmt quantize model.safetensors --rounding stochastic --seed 3 --product exact
fmt quantize model.safetensors --block 32 --axis 0 --overflow ieee
fmt quantize model.safetensors --backend numpy --chunk 4096 --workers 1
fmt quantize model.safetensors --backend ml_dtypes --workers 2
fmt quantize model.safetensors --backend torch
fmt quantize model.safetensors --include-buffers
fmt quantize model.safetensors --per-tensor
fmt quantize model.safetensors --csv --recipe mxfp8
fmt quantize model.safetensors --key layer.0.attention.query.weight --out q.npy
fmt quantize model.safetensors --recipe mxfp8 --out q.safetensors
fmt quantize model-fp8.safetensors
fmt quantize bert.safetensors --sort flushed --top 3
fmt quantize bert.safetensors --recipe nvfp4 --sort sqnr --per-tensor
fmt quantize logits.npy --block 128
fmt quantize missing.safetensors
fmt quantize model.safetensors --key nosuchkey
fmt quantize model.safetensors --block 32 --tile 16x16
fmt quantize model.safetensors --recipe nosuchrecipe
fmt quantize model.safetensors --csv --json
fmt scale-search
fmt scale-search --metric sqnr
fmt scale-search model.safetensors
fmt scale-search model.safetensors --block 128 --format e5m2
fmt scale-search model.safetensors --per row --metric p99-rel
fmt scale-search model.safetensors --metric flushed --history 4
fmt scale-search model.safetensors --include-buffers --format fp4 --block 32
fmt scale-search bert.safetensors --metric median-rel
fmt scale-search --loss-scale
fmt scale-search --loss-scale --histogram
fmt scale-search model.safetensors --loss-scale
fmt scale-search model.safetensors --metric nosuchmetric
fmt loss-scale
fmt loss-scale model.safetensors
fmt loss-scale bert.safetensors --key *dense.weight --format e5m2
fmt loss-scale --format nosuchformat
fmt check-backends
fmt check-backends e4m3fn e8m0 fp16
fmt check-backends --format e5m2,e2m3fn --seed 5
fmt check-backends e9m9
fmt check-backends nosuchformat
fmt softmax
fmt softmax --random 500 --dim 3 --block 16 --format fp16 --rounding stochastic --seed 2
fmt softmax --scores 1,3,2,0 --values 10,20,30,40 --block 3 --format e4m3fn
fmt softmax --random 4096 --format bf16 --all-blocks --block 512
fmt softmax --scores 1,2,3 --values 1,2
fmt softmax --block 0
fmt attention --seq 128 --heads 2
fmt attention --seq 256 --heads 2 --format e4m3fn --scale-granularity tensor
fmt attention --seq 256 --heads 2 --format e4m3fn --outliers 0.001 --hadamard --seed 3
fmt attention --seq 128 --heads 2 --format bf16 --causal --block-q 32 --block-k 64
fmt attention --seq 128 --heads 1 --dim 32 --format e5m2 --scale-granularity block
fmt attention --io --seq 4096 --sram 100000 --causal
fmt attention --seq 128 --dim 48 --hadamard
fmt attention --format nosuchformat
fmt calc "(1 + 2^-23) * (1 - 2^-23) - 1" --format fp32
fmt calc "fma(1 + 2^-23, 1 - 2^-23, -1)" --format fp32,fp64
fmt calc "sqrt(2) / 3 - 1e-8" --format e4m3fn,e5m2,fp16
fmt calc "1 + 2^-9" --format bf16 --rounding up
fmt calc "1 + 2^-9" --format bf16 --rounding stochastic --seed 9
fmt calc "1 / 0" --format fp16
fmt calc "1 +"
fmt calc "1 + 2" --format nosuchformat
fmt sum
fmt sum --order kahan --accumulator bf16,fp16
fmt sum --order blocked:64 --random 10000 --dist lognormal --seed 4
fmt sum --random 5000 --dist uniform --format bf16 --accumulator fp32
fmt sum --accumulator bf16 --rounding stochastic --seed 1
fmt sum --constant 0.001 --count 3000
fmt sum --update 1e-3*1e-3 --weight 2 --count 2000
fmt sum logits.npy --accumulator bf16,fp32
fmt sum - <<< 0.1 0.2 0.3 1e8 -1e8
fmt sum --order nosuchorder
fmt sum missing.npy
fmt dot --m 16 --n 16 --k 256 --promote-every 128
fmt dot --m 32 --n 32 --k 1024 --scale-granularity row --format e5m2 --seed 3
fmt dot --m 32 --n 32 --k 1024 --scale-granularity block:128 --accumulator-bits 22
fmt dot --m 32 --n 32 --k 1024 --scale-granularity block:128 --promote-every 128
fmt dot --m 32 --n 32 --k 512 --accumulator bf16 --accumulation-rounding nearest-even
fmt dot --m 32 --n 32 --k 512 --format fp4 --scale-granularity block:32 --promote-every 32
fmt dot --scale-granularity block:0
fmt compare model.safetensors model-fp8.safetensors --chunk 1024 --workers 1
fmt compare bert.safetensors bert-fp8.safetensors --top 2
fmt compare logits.npy logits-fp8.npy --logits
fmt compare logits.npy logits.npy
fmt compare model.safetensors bert.safetensors
fmt compare model.safetensors missing.safetensors
fmt compare - - <<< 1 2 3
fmt kv
fmt kv --granularity tensor --candidates unit,amax
fmt kv --granularity tensor --candidates amax
fmt kv --format e4m3fnuz --candidates unit,amax,p99.99,mse
fmt kv --format e5m2 --granularity token-head
fmt kv --format e5m2 --granularity tensor,token-head
fmt kv --out scales.json
fmt kv --out scales.safetensors --granularity tensor
fmt kv --granularity nosuch
fmt kv --format fp16
fmt audit model-deepseek-fp8
fmt audit model-deepseek-fp8 --key 'layer.*' --strict
fmt audit model.safetensors
fmt audit missing.safetensors
fmt train --steps 4 --layers 1 --width 32 --heads 2 --seq 16 --batch 4 --recipe fp16
fmt train --recipe tensorwyse
fmt --version
fmt nosuchcommand
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--package-root", type=Path, default=None,
                        help="the tree whose fmtcli, docs and examples are used "
                             "(default: that of the fmtcli python imports)")
    parser.add_argument("--diff", type=int, default=40, metavar="N",
                        help="compare: lines of unified diff shown per command")
    parser.add_argument("--keep", type=Path, default=None, metavar="NEW",
                        help="compare: also save this run in NEW (then diff -r DIR NEW)")
    return parser.parse_args(argv)


def default_root() -> Path:
    """The tree of the fmtcli this interpreter would import (PYTHONPATH first, then an
    installed or editable one), else this script's checkout."""
    spec = importlib.util.find_spec("fmtcli")
    if spec is None or not spec.origin:
        return ROOT
    return Path(spec.origin).resolve().parent.parent


def use_package(root: Path):
    """``fmtcli.cli.app`` imported from ``root`` (first on sys.path; an error if another
    fmtcli, e.g. an editable install's, was imported)."""
    root = root.resolve()
    sys.path.insert(0, str(root))
    import fmtcli
    from fmtcli.cli import app
    where = Path(fmtcli.__file__).resolve()
    if root not in where.parents:
        sys.exit(f"fmtcli imported from {where}, not from --package-root {root}")
    return app


def commands_from_docs(root: Path) -> list[str]:
    """Every ``$ fmt`` console example of README.md and docs/*.md under ``root``, without
    its directive comment; ``not run`` ones left out."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    block = re.compile(r"^```console\n\$ (fmt [^\n]*)\n", re.M)
    out = []
    for page in pages:
        if page.exists():
            for match in block.finditer(page.read_text()):
                if "not run:" not in match.group(1):
                    out.append(match.group(1).split("  #")[0].strip())
    return out


def invocations(cases: list[str]) -> list[str]:
    """Each case as written and, unless it says --json or --csv, with --json too."""
    out = []
    for case in cases:
        words = shlex.split(case.split(" <<< ")[0])
        out.append(case)
        if "--json" not in words and "--csv" not in words:
            command, _, stdin = case.partition(" <<< ")
            out.append(f"{command} --json" + (f" <<< {stdin}" if stdin else ""))
    return list(dict.fromkeys(out))


def command_name(invocation: str, commands: set[str]) -> str:
    """The file an invocation is saved in: its command (``quantize``) if it is one of
    ``commands``, else ``fmt``."""
    words = shlex.split(invocation.split(" <<< ")[0])[1:]
    return words[0] if words and words[0] in commands else "fmt"


def write_inputs(root: Path, directory: Path) -> str:
    """The example files of ``root``'s examples/make_example_files.py, written into
    ``directory``; their names and SHA-256, a line each."""
    script = root / "examples" / "make_example_files.py"
    spec = importlib.util.spec_from_file_location("make_example_files", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_example_files(directory)
    return "".join(f"{sha256(p)}  {p.relative_to(directory).as_posix()}\n"
                   for p in sorted(directory.rglob("*")) if p.is_file())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mask(text: str, tmp: str) -> str:
    """``text`` without what differs between two runs or two installs: the temporary
    directory's path, and the versions of ml_dtypes and torch that check-backends names
    (its table's ``ml_dtypes 0.7.0 ...`` and ``torch: 2.13.0+cpu`` lines, JSON's
    ``"version"`` keys) written ``<VERSION>``."""
    text = text.replace(os.path.realpath(tmp), "<TMP>").replace(tmp, "<TMP>")
    version = r"\d+\.\d+(?:\.\d+)?(?:[+.\-]?[0-9A-Za-z]+)*"
    text = re.sub(rf"(?m)^(\s*(?:ml_dtypes|torch|numpy):? ){version}", r"\1<VERSION>", text)
    return re.sub(rf'("version": "){version}"', r'\1<VERSION>"', text)


def run_one(app, invocation: str, tmp: Path) -> str:
    """One invocation's record: command line, exit code, stdout, stderr, files written."""
    from typer.testing import CliRunner

    command, _, stdin = invocation.partition(" <<< ")
    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    env = {"COLUMNS": WIDTH, **{k: None for k in UNSET if k != "COLUMNS"}}
    before = set(tmp.iterdir())
    result = runner.invoke(app, shlex.split(command)[1:], env=env,
                           input=stdin + "\n" if stdin else None)
    written = sorted(set(tmp.iterdir()) - before)
    # a folder written (--out DIR --layout ...): each of its files, by its path inside
    listed = [(q, q.relative_to(tmp).as_posix()) for p in written
              for q in ([p] if p.is_file() else sorted(p.rglob("*"))) if q.is_file()]
    files = "".join(f"{name} {q.stat().st_size} {sha256(q)}\n" for q, name in listed)
    for p in written:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    out = (f"$ {invocation}\nexit {result.exit_code}\n--- stdout\n{result.stdout}"
           f"--- stderr\n{result.stderr}" + (f"--- files\n{files}" if files else ""))
    return mask(out, str(tmp)) + "=== end\n"


def run_all(app, root: Path, commands: list[str]) -> tuple[dict[str, str], str]:
    """Every invocation's record, joined per command file; and the inputs' checksums."""
    import typer

    names = set(typer.main.get_command(app).commands)
    by_name: dict[str, str] = {}
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        inputs = write_inputs(root, tmp_path)
        os.chdir(tmp)
        try:
            for invocation in commands:
                name = command_name(invocation, names)
                by_name[name] = by_name.get(name, "") + run_one(app, invocation, tmp_path)
        finally:
            os.chdir(old)
    return by_name, inputs


def write_snapshot(directory: Path, commands: list[str], by_name: dict[str, str],
                   inputs: str) -> None:
    """``commands.txt``, ``inputs.sha256`` and one file per command in ``directory`` (an
    earlier snapshot there replaced; any other non-empty directory refused)."""
    if directory.exists() and any(directory.iterdir()):
        if not (directory / "commands.txt").exists():
            sys.exit(f"{directory} is neither empty nor a snapshot: not written")
        for old in [*directory.glob("*.txt"), directory / "inputs.sha256"]:
            old.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "commands.txt").write_text("\n".join(commands) + "\n")
    (directory / "inputs.sha256").write_text(inputs)
    for name, text in by_name.items():
        (directory / f"{name}.txt").write_text(text)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for key in UNSET:
        os.environ.pop(key, None)
    args.package_root = (args.package_root or default_root()).resolve()
    app = use_package(args.package_root)
    print(f"fmtcli of {args.package_root}", file=sys.stderr)
    directory = args.directory
    if args.action == "save":
        commands = invocations(commands_from_docs(args.package_root) + CASES.splitlines())
        by_name, inputs = run_all(app, args.package_root, commands)
        write_snapshot(directory, commands, by_name, inputs)
        print(f"{len(commands)} invocations of {len(by_name)} commands saved in {directory}")
        return 0
    commands = (directory / "commands.txt").read_text().splitlines()
    by_name, inputs = run_all(app, args.package_root, commands)
    if args.keep:
        write_snapshot(args.keep, commands, by_name, inputs)
    differ = 0
    if inputs != (directory / "inputs.sha256").read_text():
        print("DIFFERS: the example files (examples/make_example_files.py) are other bytes")
    for name, text in by_name.items():
        path = directory / f"{name}.txt"
        saved = path.read_text() if path.exists() else ""
        if saved != text:
            differ += 1
            runs = sum(a != b for a, b in zip(saved.split("=== end\n"),
                                               text.split("=== end\n")))
            print(f"DIFFERS: {name} ({runs} invocations)")
            diff = difflib.unified_diff(saved.splitlines(), text.splitlines(),
                                        f"saved/{name}.txt", f"now/{name}.txt", lineterm="")
            for line in list(diff)[:args.diff]:
                print("    " + line)
    print(f"{len(by_name) - differ} of {len(by_name)} command files byte-identical "
          f"({len(commands)} invocations)")
    differ += inputs != (directory / "inputs.sha256").read_text()
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
