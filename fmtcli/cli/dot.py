"""``fmt dot``: an FP8 GEMM with a limited-precision accumulator against float64, and the
real one on a CUDA GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import AccumulationRounding, DotDevice
from fmtcli.base.errors import UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, check_not_empty, resolve_one_format
from fmtcli.cli.output import emit

SEED_MAX = 2**32 - 1
DEFAULT_SHAPE = {"m": 256, "n": 256, "k": 4096}


def _shape_option(name: str, text: str):
    return Annotated[Optional[int], typer.Option(
        f"--{name}", min=1, metavar=name.upper(), show_default=False,
        help=f"{text}  [default: {DEFAULT_SHAPE[name]}; with FILEs: theirs]")]


@app.command("dot", cls=UsageWithEllipsis,
             short_help="FP8 GEMM: what a 14-bit accumulator loses, FP32 promotion.")
def dot_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="A (M x K) and B (K x N): two files (.npy .npz .safetensors "
        "...), or one holding two tensors (named a and b, else in order).  None: random "
        "N(0, 1) inputs.", show_default=False)] = None,
    m: _shape_option("m", "Rows of A and C.") = None,
    n: _shape_option("n", "Columns of B and C.") = None,
    k: _shape_option("k", "The inner dimension: products summed per output.") = None,
    format_name: Annotated[Optional[str], typer.Option(
        "--format", metavar="F", show_default=False,
        help="Format of A and B: x_q = cast(x * scale) / scale, amax scales, saturating "
        "cast (formats over 8 bits: cast, no scale).  [default: float8_e4m3fn]")] = None,
    granularity: Annotated[str, typer.Option(
        "--scale-granularity", metavar="tensor|row|block:BS",
        help="One scale per tensor; per row of A and column of B; or block:BS, A per 1 x BS "
        "tile and B per BS x BS block (DeepSeek-V3: block:128).")] = "tensor",
    accumulator_bits: Annotated[Optional[int], typer.Option(
        "--accumulator-bits", min=1, max=40, metavar="B", show_default=False,
        help="Fraction bits of the tensor-core accumulator: each step of 32 products is "
        "aligned to the largest exponent and cut to B bits.  [default: 13, DeepSeek-V3's "
        "'around 14 bits' of H800 FP8 GEMMs]")] = None,
    accumulator: Annotated[Optional[str], typer.Option(
        "--accumulator", metavar="F", show_default=False,
        help="An ordinary accumulator in format F instead (e.g. bf16, fp16, fp32): "
        "acc + 32 exact products rounded to F.")] = None,
    rounding: Annotated[AccumulationRounding, typer.Option(
        "--accumulation-rounding", case_sensitive=False,
        help="How the accumulator drops bits: toward-zero (as tensor cores truncate) or "
        "nearest-even.")] = AccumulationRounding.TOWARD_ZERO,
    promote_every: Annotated[Optional[int], typer.Option(
        "--promote-every", min=1, metavar="NC", show_default=False,
        help="Promote partial sums to an FP32 accumulator every NC elements of K "
        "(DeepSeek-V3: 128).  [default: never]")] = None,
    seed: Annotated[int, typer.Option(
        "--seed", min=0, max=SEED_MAX, help="Seed of the random inputs, 0..2**32-1.")] = 0,
    device: Annotated[DotDevice, typer.Option(
        "--device", case_sensitive=False,
        help="cuda: also run the real FP8 GEMM, torch._scaled_mm with and without "
        "use_fast_accum, against the same references.")] = DotDevice.CPU,
    json_out: JsonOption = False,
) -> None:
    """FP8 GEMM C = A @ B with an accumulator of limited precision, against float64.

    A and B quantized to --format, products exact, sums in an accumulator of
    --accumulator-bits (or --accumulator F), promoted to FP32 every --promote-every
    elements.  Errors against float64 of the quantized inputs (the accumulation alone) and of
    the unquantized ones: max_rel_error = max|C - R| / max|R|, rel_fro_error = ||C - R||_F /
    ||R||_F, calc_diff = 1 - 2 sum(C R) / sum(C^2 + R^2) (DeepGEMM).
    """
    from fmtcli.arithmetic.dot import analyse_dot, load_operands

    check_not_empty(**{"format": format_name, "accumulator": accumulator,
                       "scale-granularity": granularity})
    spec = resolve_one_format(format_name or "float8_e4m3fn")
    if accumulator is not None and accumulator_bits is not None:
        raise UsageError("--accumulator-bits and --accumulator are alternatives: give one")
    acc_spec = resolve_one_format(accumulator)
    given = {"m": m, "n": n, "k": k}
    if files and any(v is not None for v in given.values()):
        name = next(key for key, v in given.items() if v is not None)
        raise UsageError(f"--{name} sets the shape of random inputs; FILEs have their own")
    operands, names = None, ()
    if files:
        *operands, names = load_operands(files)
    shape = {key: DEFAULT_SHAPE[key] if v is None else v for key, v in given.items()}
    result = analyse_dot(spec, **shape, operands=operands, inputs=names,
                         granularity=granularity, accumulator_bits=accumulator_bits,
                         accumulator=acc_spec, rounding=rounding,
                         promote_every=promote_every, seed=seed, device=device.value)
    emit(result, json_out)
