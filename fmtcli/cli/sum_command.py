"""``fmt sum``: accumulation drift -- values added in a format, against the exact sum."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import UsageError, shown
from fmtcli.cli.app import app
from fmtcli.cli.options import JsonOption, RoundingOption, check_not_empty
from fmtcli.cli.output import emit, note


@app.command("sum", short_help="Accumulation drift: where a BF16 sum stalls; lost updates.")
def sum_command(
    file: Annotated[Optional[str], typer.Argument(
        metavar="[FILE]", show_default=False,
        help="Values to add: a file of one tensor (.npy, .npz, .safetensors, .pt, text, "
             "JSON; - for stdin), flattened.")] = None,
    random: Annotated[Optional[int], typer.Option(
        "--random", metavar="N", min=1, show_default=False,
        help="Add N random draws from --dist instead.")] = None,
    dist: Annotated[str, typer.Option(
        "--dist", metavar="D",
        help="Distribution of --random: normal (N(0, 1)), uniform ([0, 1)) or lognormal "
             "(exp N(0, 1)).")] = "normal",
    seed: Annotated[int, typer.Option(
        "--seed", metavar="S", min=0, max=2**64 - 1,
        help="Seed of --random's draws and of stochastic rounding, 0..2**64-1.")] = 0,
    constant: Annotated[Optional[str], typer.Option(
        "--constant", metavar="V", show_default=False,
        help="Add V again and again (--count times).  With no input: 0.01, 10,000 times "
             "(the BF16 stall).")] = None,
    count: Annotated[Optional[int], typer.Option(
        "--count", metavar="N", min=1, show_default=False,
        help="How many times --constant is added (or --update applied).  [default: "
             "10,000]")] = None,
    format_name: Annotated[str, typer.Option(
        "--format", metavar="F",
        help="Format the values are stored in before they are added (nearest-even).")
    ] = "float32",
    accumulators: Annotated[Optional[list[str]], typer.Option(
        "--accumulator", "-a", metavar="A",
        help="Format of the running sum (repeatable or a comma list).  [default: "
             "bfloat16,float16,float32,float64; with --update bfloat16,float32]",
        show_default=False)] = None,
    order: Annotated[str, typer.Option(
        "--order", metavar="ORDER",
        help="sequential, pairwise (a balanced tree), kahan (compensated, every operation "
             "in the format) or blocked:B (blocks of B, then the block sums).")
    ] = "sequential",
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    update: Annotated[Optional[str], typer.Option(
        "--update", metavar="LR*GRAD", show_default=False,
        help="The weight-update view: w -= LR*GRAD (e.g. 1e-3*1e-3), --count times, to a "
             "weight held in each accumulator format (bf16 vs an fp32 master copy): how "
             "many updates are lost.")] = None,
    weight: Annotated[str, typer.Option(
        "--weight", metavar="W", help="The initial weight of --update.")] = "1",
    json_out: JsonOption = False,
) -> None:
    """Add values with the running sum held in each accumulator format, every addition
    rounded once, in the chosen order, against the exact sum (exact at any size): the final
    relative error and where the sum stalled (the count after which adding more changed
    nothing).  With --update: a weight updated again and again, with and without an FP32
    master copy (Micikevicius et al. 2018, §3.1).
    """
    if file is not None and file.startswith("--"):
        raise UsageError(f"no such option: {shown(file)}", "see 'fmt sum --help'")
    from fmtcli.arithmetic.ops import arithmetic_specs
    from fmtcli.arithmetic.sum_inputs import sum_inputs
    from fmtcli.arithmetic.summation import DEFAULT_ACCUMULATORS, sum_values, weight_update
    from fmtcli.numerics.literals import parse_value

    check_not_empty(format=format_name, accumulator=accumulators, order=order, dist=dist)
    if "," in format_name:
        raise UsageError(f"--format takes one format here, got {shown(format_name)}")
    store, notes = arithmetic_specs([format_name])
    if update is not None:
        if file is not None or random is not None or constant is not None:
            raise UsageError("--update adds its own values: give it without FILE, --random "
                             "or --constant")
        if order.strip().lower() != "sequential":
            raise UsageError("--update applies the updates in order: --order sequential")
        specs, more = arithmetic_specs(accumulators, ("bfloat16", "float32"))
        for message in notes + more:
            note(message)
        result = weight_update(parse_value(update), 10_000 if count is None else count,
                               parse_value(weight), specs, store[0], rounding, seed)
        emit(result, json_out)
        return
    if weight != "1":
        raise UsageError("--weight goes with --update")
    specs, more = arithmetic_specs(accumulators, DEFAULT_ACCUMULATORS)
    for message in notes + more:
        note(message)
    values, source = sum_inputs(file, random, dist.strip().lower(), seed,
                                None if constant is None else parse_value(constant), count)
    emit(sum_values(values, specs, store[0], order, rounding, seed, source), json_out)
