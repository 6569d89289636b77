"""``fmt attention``: attention in a format against float64, the IO model of FlashAttention,
and torch's attention kernels timed on a CUDA GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.attention.limits import IO_LIMITS as LIMITS
from fmtcli.base.choices import AttentionDevice, ScaleGranularity
from fmtcli.base.errors import UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, check_not_empty, resolve_one_format
from fmtcli.cli.output import StderrProgress, emit

SEED_MAX = 2**32 - 1
DEFAULT_SHAPE = {"batch": 1, "heads": 8, "seq": 1024, "dim": 64}


def _shape_option(name: str, text: str):
    return Annotated[Optional[int], typer.Option(
        f"--{name}", min=1, max=LIMITS[name], metavar="N", show_default=False,
        help=f"{text}  [default: {DEFAULT_SHAPE[name]}; with FILEs: theirs]")]


@app.command("attention", cls=UsageWithEllipsis,
             short_help="Attention in FP8, BF16, FP16: error, HBM traffic, GPU time.")
def attention_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Q, K, V: three files (.npy .npz .safetensors ...), or one "
        "holding three tensors (named q/k/v or query/key/value, else in order); shapes "
        "(seq, dim), (heads, seq, dim) or (batch, heads, seq, dim).  None: random "
        "N(0, 1) inputs.", show_default=False)] = None,
    batch: _shape_option("batch", "Batch size.") = None,
    heads: _shape_option("heads", "Heads.") = None,
    seq: _shape_option("seq", "Sequence length (queries = keys).") = None,
    dim: _shape_option("dim", "Head dimension d.") = None,
    causal: Annotated[bool, typer.Option(
        "--causal", help="Causal mask: query i sees keys 0..i.")] = False,
    block_q: Annotated[Optional[int], typer.Option(
        "--block-q", min=1, max=LIMITS["block_q"], metavar="BR", show_default=False,
        help="Query rows per block (B_r): the scale block of Q, the tile of P.  [default: "
        "Algorithm 1's min(ceil(M/4d), d), M = --sram in elements]")] = None,
    block_k: Annotated[Optional[int], typer.Option(
        "--block-k", min=1, max=LIMITS["block_k"], metavar="BC", show_default=False,
        help="Keys per block (B_c): the online softmax's step and the scale block of K, V.  "
        "[default: Algorithm 1's ceil(M/4d)]")] = None,
    format_name: Annotated[Optional[str], typer.Option(
        "--format", metavar="F", show_default=False,
        help="Precision of the attention: float32, float16, bfloat16 cast Q, K, V (and S, P "
        "where stored) to F; formats of 8 bits or fewer (FP8: e4m3, e5m2; FP6, FP4) are "
        "emulated as FP8 kernels do: x_q = cast(x * scale) / scale, P cast to F before "
        "P V, FP32 accumulators.  [default: float16]")] = None,
    granularity: Annotated[ScaleGranularity, typer.Option(
        "--scale-granularity", case_sensitive=False,
        help="FP8 scales: one per tensor, or one per block of rows (Q: --block-q, K and "
        "V: --block-k).")] = ScaleGranularity.BLOCK,
    hadamard: Annotated[bool, typer.Option(
        "--hadamard", help="Multiply Q and K by one random orthogonal Hadamard matrix "
        "before quantizing (FlashAttention-3's incoherent processing; Q K^T unchanged).  "
        "--dim must be a power of two.")] = False,
    outliers: Annotated[float, typer.Option(
        "--outliers", min=0.0, max=1.0, metavar="FRACTION",
        help="Random inputs: this fraction of entries gets an extra N(0, 100) term "
        "(FlashAttention-3 §4.3 uses 0.001).")] = 0.0,
    sram: Annotated[Optional[int], typer.Option(
        "--sram", min=1, max=LIMITS["sram_bytes"], metavar="BYTES", show_default=False,
        help="On-chip memory M of the IO model, bytes.  [default: 196608, the A100's 192 "
        "KiB per SM that Dao et al. 2022 assume]")] = None,
    device: Annotated[Optional[AttentionDevice], typer.Option(
        "--device", case_sensitive=False, show_default=False,
        help="cuda: also run torch's scaled_dot_product_attention backends (math, flash, "
        "efficient, cudnn) on the GPU: time, peak memory, error.  [default: cpu]")] = None,
    time: Annotated[bool, typer.Option(
        "--time", help="Time torch's SDPA backends on the CUDA GPU (implies --device "
        "cuda).")] = False,
    seed: Annotated[int, typer.Option(
        "--seed", min=0, max=SEED_MAX, help="Seed of the random inputs and of the "
        "Hadamard signs, 0..2**32-1.")] = 0,
    io: Annotated[bool, typer.Option(
        "--io", help="The IO model alone (no tensors made: any shape answers at once).")
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """Attention in a format: error against float64, HBM traffic, and GPU time.

    Standard attention and FlashAttention's blockwise online softmax, each in --format,
    against exact float64 attention: RMSE, max abs error, max relative error of an
    output vector.  The IO model of Dao et al. 2022 (Theorem 2): bytes moved and FLOPs of
    each.  With --device cuda / --time: torch's kernels measured.
    """
    from fmtcli.attention.report import analyse_attention, load_qkv

    check_not_empty(format=format_name)
    spec = resolve_one_format(format_name or "float16")
    if device is AttentionDevice.CPU and time:
        raise UsageError("--time measures torch's CUDA kernels; it does not go with "
                         "--device cpu")
    on_gpu = time or device is AttentionDevice.CUDA
    if io and on_gpu:
        raise UsageError("--io prints the IO model alone; it does not go with --time or "
                         "--device cuda")
    given = {"batch": batch, "heads": heads, "seq": seq, "dim": dim}
    if files and any(v is not None for v in given.values()):
        name = next(k for k, v in given.items() if v is not None)
        raise UsageError(f"--{name} sets the shape of random inputs; FILEs have their own")
    if files and (outliers or io):
        raise UsageError(f"{'--outliers' if outliers else '--io'} goes with random "
                         "inputs, not FILEs")
    shape = {k: DEFAULT_SHAPE[k] if v is None else v for k, v in given.items()}
    if hadamard and shape["dim"] & (shape["dim"] - 1):
        raise UsageError(f"--hadamard needs --dim a power of two, got {shape['dim']}")
    qkv, names = None, ()
    if files:
        *qkv, names = load_qkv(files)
        if hadamard and qkv[0].shape[3] & (qkv[0].shape[3] - 1):
            raise UsageError(f"--hadamard needs a power-of-two head dim; the FILEs have "
                             f"{qkv[0].shape[3]}")
    progress = StderrProgress("attention")
    b, h, n, _ = qkv[0].shape if qkv else (shape["batch"], shape["heads"], shape["seq"], 0)
    n_k = qkv[1].shape[2] if qkv else n
    unit = 4 * b * h * n * n_k  # the bar counts float32 score bytes: one N x N_k per step

    def steps(done: int, total: int) -> None:
        progress(done * unit, total * unit)

    try:
        result = analyse_attention(spec, **shape, qkv=qkv, inputs=names, causal=causal,
                                   block_q=block_q, block_k=block_k,
                                   granularity=granularity_of(granularity),
                                   hadamard=hadamard, outliers=outliers, seed=seed,
                                   sram_bytes=sram, io=io, time=on_gpu, progress=steps)
    finally:
        progress.close()
    emit(result, json_out)


def granularity_of(choice: ScaleGranularity):
    from fmtcli.base.choices import Granularity

    return Granularity(choice.value)
