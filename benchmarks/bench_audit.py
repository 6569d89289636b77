"""fmt audit on quantized checkpoints vs fmt quantize on a plain one of the same stored bytes.

    python benchmarks/bench_audit.py [--size-mb M] [--layouts L,L] [--repeat R]
                                     [--workers W] [--big-mb B] [--dir DIR] [--env K=V]

Issue 24's target: a quantized checkpoint audits at >= 50% of ``fmt quantize``'s
throughput on the same number of stored bytes, in bounded memory.

In a temporary folder (``--dir`` to keep and reuse one) the script writes:

- ``plain/model.safetensors``: bfloat16 linear weights (``model.layers.I.mlp.up_proj.weight``
  ..., rows of 4096, N(0, 0.02) with rare x100 outliers, seeded) of M MiB;
- for each layout, a checkpoint folder of about M MiB of stored bytes, from bfloat16
  weights of the same kind (as many parameters as the layout's nominal bits fit in M MiB):
  ``deepseek-fp8`` (``fmt quantize SRC --recipe deepseek --out DIR --layout deepseek-fp8``:
  float8_e4m3fn + float32 ``weight_scale_inv`` per 128x128 tile), ``ct-nvfp4``
  (``--recipe nvfp4 --layout compressed-tensors``), ``modelopt-nvfp4`` (``--recipe nvfp4
  --layout modelopt-nvfp4``), ``ct-fp8-block`` (``--block 128 --layout compressed-tensors``)
  and ``gptoss-mxfp4``, written here from gpt-oss's definition (``gpt_oss/torch/weights.py``:
  ``<name>.blocks`` uint8 [O, I/32, 16], two E2M1 codes a byte, low nibble first;
  ``<name>.scales`` uint8 E8M0, bias 127) with OCP MX v1.0's scale rule
  (``floor(log2 amax) - 2``), as ``tests/layout_fixtures.mxfp4_gptoss`` does, streamed.

Then, each as its own process, R times, best wall time kept:

- ``fmt quantize plain/model.safetensors --json --workers W`` (the default schemes: blocks
  of 128 E4M3 amax, and per tensor beside it);
- ``fmt audit LAYOUT_DIR --json --workers W`` for each layout.

Prints, for each, the stored bytes, wall seconds, MB/s of stored bytes (whole process,
start-up included), the same with the start-up left out (the command on a checkpoint of
one 128 x 128 weight in the same layout: the same imports, no work), and audit / quantize.

``--big-mb B`` (0 to skip) writes a deepseek-fp8 checkpoint of B MiB (the M MiB one's
tensors repeated under further layer numbers) and prints audit's
peak resident memory (``wait4``'s ``ru_maxrss`` of the child, its forked workers
counted separately by the kernel: the largest of them) against the file size: a
checkpoint "larger than memory" shown as a bounded RSS; then the same audit again under
``ulimit -v`` (address space) of the file's size + 768 MiB: the address space counts the
file's memory map, so a limit below the file fails at the map whatever the RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
from benchfiles import child_env

COLS = 4096
ROWS_PER_TENSOR = 4096  # 16M parameters a weight, 32 MiB of bfloat16
NAMES = ("mlp.up_proj", "mlp.down_proj", "self_attn.q_proj", "self_attn.o_proj")
#: the layouts' nominal bits per parameter (the scales' share of 4096-column rows included)
BITS = {"deepseek-fp8": 8 + 32 / 128**2, "ct-fp8-block": 8 + 32 / 128,
        "ct-nvfp4": 4.5, "modelopt-nvfp4": 4.5, "gptoss-mxfp4": 4.25}
#: the fmt quantize options that write each layout (gptoss-mxfp4: written here)
WRITERS = {"deepseek-fp8": ["--recipe", "deepseek", "--layout", "deepseek-fp8"],
           "ct-nvfp4": ["--recipe", "nvfp4", "--layout", "compressed-tensors"],
           "modelopt-nvfp4": ["--recipe", "nvfp4", "--layout", "modelopt-nvfp4"],
           "ct-fp8-block": ["--block", "128", "--layout", "compressed-tensors"]}
DEFAULT_LAYOUTS = "deepseek-fp8,ct-nvfp4,gptoss-mxfp4"
FMT = [sys.executable, "-m", "fmtcli"]
ALLOWANCE_MIB = 768  # --big-mb's ulimit -v beyond the file's own mapping
EXTRA_ENV: dict[str, str] = {}  # --env KEY=VALUE: added to every timed child's environment
CHUNK_ROWS = 512


def weight_names(params: int) -> list[tuple[str, int]]:
    """(name, rows) of the weights holding ``params`` parameters in rows of 4096."""
    rows, out, i = max(1, params // COLS), [], 0
    while rows > 0:
        take = min(rows, ROWS_PER_TENSOR)
        out.append((f"model.layers.{i // len(NAMES)}.{NAMES[i % len(NAMES)]}.weight", take))
        rows, i = rows - take, i + 1
    return out


def gaussian_rows(rng, rows: int) -> np.ndarray:
    block = rng.standard_normal((rows, COLS), dtype=np.float32) * np.float32(0.02)
    hits = rng.random(block.shape) < 1.5e-5
    block[hits] *= 100
    return block


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 ``x``, nearest-even (no NaN in ``x``)."""
    u = x.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def write_safetensors(path: str, entries: list[tuple[str, str, tuple, int]], chunks) -> None:
    """A .safetensors file of ``entries`` (name, dtype code, shape, bytes) whose data
    ``chunks`` yields in order, one piece at a time (bounded memory)."""
    header, offset = {}, 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for piece in chunks:
            handle.write(piece.tobytes())


def write_plain(folder: str, params: int, seed: int) -> str:
    """``folder/model.safetensors`` of bfloat16 weights (``params`` parameters)."""
    os.makedirs(folder, exist_ok=True)
    names = weight_names(params)
    rng = np.random.default_rng(seed)

    def chunks():
        for _, rows in names:
            for r0 in range(0, rows, CHUNK_ROWS):
                yield bf16_bits(gaussian_rows(rng, min(CHUNK_ROWS, rows - r0)))

    path = os.path.join(folder, "model.safetensors")
    write_safetensors(path, [(n, "BF16", (r, COLS), r * COLS * 2) for n, r in names],
                      chunks())
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"model_type": "llama", "torch_dtype": "bfloat16"}, handle)
    return path


# OCP MX v1.0 FP4 E2M1: the midpoints between magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6)
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)


def mxfp4_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss MXFP4 of float32 rows ``x`` [R, I]: (blocks uint8 [R, I/32, 16], scales
    uint8 [R, I/32]); scale 2^(floor(log2 amax) - 2) per 32, codes nearest (ties up)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2
    exponent = np.where(amax > 0, np.clip(exponent, -127, 127), -127).astype(np.int32)
    scaled = blocks / np.ldexp(np.float32(1), exponent)[..., None]
    code = np.searchsorted(E2M1_BOUNDS, np.abs(scaled)).astype(np.uint8)
    code |= (scaled < 0).astype(np.uint8) << 3
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed, (exponent + 127).astype(np.uint8)


def write_gptoss(folder: str, params: int, seed: int) -> None:
    """A gpt-oss MXFP4 folder of ``params`` parameters (config: quant_method mxfp4)."""
    os.makedirs(folder, exist_ok=True)
    names = weight_names(params)
    entries = []
    for name, rows in names:
        stem = name[:-len(".weight")]
        entries.append((stem + ".blocks", "U8", (rows, COLS // 32, 16), rows * COLS // 2))
        entries.append((stem + ".scales", "U8", (rows, COLS // 32), rows * COLS // 32))
    rng = np.random.default_rng(seed)

    def chunks():  # a tensor's blocks, then its scales (kept: 1/16 of the blocks)
        for _, rows in names:
            scales = []
            for r0 in range(0, rows, CHUNK_ROWS):
                packed, scale = mxfp4_rows(gaussian_rows(rng, min(CHUNK_ROWS, rows - r0)))
                scales.append(scale)
                yield packed
            yield np.concatenate(scales)

    write_safetensors(os.path.join(folder, "model.safetensors"), entries, chunks())
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"model_type": "gpt_oss",
                   "quantization_config": {"quant_method": "mxfp4"}}, handle)


def write_layout(layout: str, folder: str, params: int, work: str, seed: int) -> None:
    """``folder``: a ``layout`` checkpoint of ``params`` parameters."""
    if layout == "gptoss-mxfp4":
        write_gptoss(folder, params, seed)
        return
    source = write_plain(os.path.join(work, "source"), params, seed)
    run([*FMT, "quantize", source, *WRITERS[layout], "--out", folder, "--force",
         "--compare", "none", "--json"], ok=(0,))
    shutil.rmtree(os.path.join(work, "source"))


def stored_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors"))


def run(command: list[str], ok=(0, 1), prefix: str | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes (``wait4``) and stdout of one process; exit codes
    in ``ok`` accepted (audit exits 1 when a check fails).  ``prefix``: a shell line the
    command runs after (e.g. a ``ulimit``)."""
    if prefix:
        command = ["bash", "-c", prefix + ' && exec "$@"', "bash", *command]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a file: a full stderr pipe would block
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors,
                                env=child_env(**EXTRA_ENV))
        stdout = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            errors.seek(0)
            sys.exit(f"failed ({code}): {' '.join(command)}\n{errors.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024, stdout.decode()


def best(command: list[str], repeat: int) -> tuple[float, int, str]:
    runs = [run(command) for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs), runs[0][2]


def audit_summary(out: str) -> str:
    """``fmt audit --json``'s checks counted by verdict (ok, warn, fail...)."""
    doc = json.loads(out)
    counts: dict[str, int] = {}

    def walk(node):
        if isinstance(node, dict):
            verdict = node.get("verdict")
            if isinstance(verdict, str) and "evidence" in node:  # a check
                counts[verdict] = counts.get(verdict, 0) + 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def prepare(args, work: str) -> dict[str, str]:
    """The plain file, each layout's folder and their 128x128 start-up twins."""
    size = args.size_mb << 20
    paths = {"plain": os.path.join(work, "plain", "model.safetensors")}
    if not os.path.exists(paths["plain"]):
        print(f"writing {paths['plain']} ...", file=sys.stderr)
        write_plain(os.path.dirname(paths["plain"]), size // 2, args.seed)
    for layout in args.layouts:
        paths[layout] = os.path.join(work, layout)
        if not os.path.exists(paths[layout]):
            print(f"writing {paths[layout]} ...", file=sys.stderr)
            write_layout(layout, paths[layout], int(size * 8 / BITS[layout]), work, args.seed)
    return paths


def startup(layout: str, work: str, workers: int) -> float:
    """Wall seconds of the command on one 128 x 128 weight in ``layout`` (imports, set-up)."""
    folder = os.path.join(work, "tiny-" + layout)
    if not os.path.exists(folder):
        if layout == "plain":
            write_plain(folder, 128 * COLS, 1)
        else:
            write_layout(layout, folder, 128 * COLS, os.path.join(work, "tiny-src"), 1)
    if layout == "plain":
        command = [*FMT, "quantize", os.path.join(folder, "model.safetensors"), "--json"]
    else:
        command = [*FMT, "audit", folder, "--json"]
    command += ["--workers", str(workers)]
    run(command)  # warm-up (bytecode cache)
    return min(run(command)[0] for _ in range(3))


def throughput(args, work: str, paths: dict[str, str]) -> None:
    workers = ["--workers", str(args.workers)]
    rows = []
    plan = [("quantize", "plain", [*FMT, "quantize", paths["plain"], "--json", *workers])]
    plan += [(f"audit {layout}", layout, [*FMT, "audit", paths[layout], "--json", *workers])
             for layout in args.layouts]
    for label, key, command in plan:
        start = startup(key, work, args.workers)
        wall, rss, out = best(command, args.repeat)
        note = audit_summary(out) if label != "quantize" else ""
        rows.append((label, stored_bytes(paths[key]), wall, start, rss, note))
    q_bytes, q_wall, q_start = rows[0][1], rows[0][2], rows[0][3]
    q_rate, q_work = q_bytes / q_wall / 1e6, q_bytes / (q_wall - q_start) / 1e6
    print(f"{args.workers} workers, best of {args.repeat}; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f} at the end"
          + "".join(f"; {k}={v}" for k, v in EXTRA_ENV.items()))
    print(f"{'command':22s} {'MiB':>6s} {'wall s':>7s} {'MB/s':>6s} {'ratio':>6s} "
          f"{'start s':>7s} {'work MB/s':>9s} {'ratio':>6s} {'RSS MiB':>7s}")
    for label, nbytes, wall, start, rss, _ in rows:
        rate, work_rate = nbytes / wall / 1e6, nbytes / max(wall - start, 1e-9) / 1e6
        print(f"{label:22s} {nbytes / 2**20:6.0f} {wall:7.3f} {rate:6.0f} "
              f"{rate / q_rate:5.2f}x {start:7.3f} {work_rate:9.0f} "
              f"{work_rate / q_work:5.2f}x {rss / 2**20:7.0f}")
    for label, *_, note in rows[1:]:
        print(f"  {label}: checks {note}")


def replicate(folder: str, out: str, mib: int) -> None:
    """``out``: ``folder``'s checkpoint repeated (its tensors again under further layer
    numbers, bytes copied) up to about ``mib`` MiB: a big checkpoint of the same exported
    values without quantizing gigabytes again."""
    source = os.path.join(folder, "model.safetensors")
    with open(source, "rb") as handle:
        n = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(n))
    header.pop("__metadata__", None)
    layers = 1 + max(int(k.split(".")[2]) for k in header)
    data = os.path.getsize(source) - 8 - n
    times = max(1, -(-(mib << 20) // data))
    entries = []
    for t in range(times):
        for key, info in header.items():
            parts = key.split(".")
            parts[2] = str(int(parts[2]) + t * layers)
            begin, end = info["data_offsets"]
            entries.append((".".join(parts), info["dtype"], tuple(info["shape"]), end - begin,
                            begin))

    def chunks():
        with open(source, "rb") as handle:
            for *_, nbytes, begin in entries:
                handle.seek(8 + n + begin)
                yield np.frombuffer(handle.read(nbytes), dtype=np.uint8)

    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), [e[:4] for e in entries],
                      chunks())
    shutil.copy(os.path.join(folder, "config.json"), out)


def bounded(args, work: str) -> None:
    """Peak RSS of audit on a big deepseek-fp8 checkpoint, and the run under ulimit -v."""
    folder = os.path.join(work, f"big-deepseek-fp8-{args.big_mb}")
    if not os.path.exists(folder):
        print(f"writing {folder} ...", file=sys.stderr)
        small = os.path.join(work, "deepseek-fp8")
        if not os.path.exists(small):
            write_layout("deepseek-fp8", small,
                         int((args.size_mb << 20) * 8 / BITS["deepseek-fp8"]), work, args.seed)
        replicate(small, folder, args.big_mb)
    size = stored_bytes(folder)
    command = [*FMT, "audit", folder, "--json", "--workers", str(args.workers)]
    wall, rss, out = run(command)
    print(f"big deepseek-fp8: {size / 2**20:.0f} MiB stored, audit {wall:.2f} s "
          f"({size / wall / 1e6:.0f} MB/s), peak RSS {rss / 2**20:.0f} MiB = "
          f"{rss / size:.3f} of the file; checks {audit_summary(out)}")
    # address space counts the file's memory map (the readers map it; pages are read on
    # demand and never count as the process's own), so the limit is the file plus a fixed
    # allowance for everything else: interpreter, numpy, chunk buffers
    limit_kib = (size + (ALLOWANCE_MIB << 20)) // 1024
    try:
        wall, rss, limited = run(command, prefix=f"ulimit -v {limit_kib}")
    except SystemExit as error:
        print(f"under ulimit -v {limit_kib} KiB: failed: {str(error).splitlines()[-1]}")
        return
    same = json.loads(limited) == json.loads(out)
    print(f"under ulimit -v {limit_kib} KiB (address space: the file + {ALLOWANCE_MIB} MiB): "
          f"{wall:.2f} s, peak RSS {rss / 2**20:.0f} MiB, same document: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512,
                        help="stored MiB of each checkpoint (default 512)")
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                        help=f"comma-separated, of {', '.join(BITS)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--big-mb", type=int, default=0,
                        help="a deepseek-fp8 checkpoint of this many MiB for peak RSS")
    parser.add_argument("--dir", default=None, help="work folder (kept; reused)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in the children's environment (e.g. OPENBLAS_NUM_THREADS=1)")
    args = parser.parse_args()
    EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    args.layouts = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in args.layouts if name not in BITS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(BITS)}")
    work = args.dir or tempfile.mkdtemp(prefix="fmtcli-bench-audit-")
    try:
        paths = prepare(args, work)
        throughput(args, work, paths)
        if args.big_mb:
            bounded(args, work)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
