"""``fmt softmax``: the online softmax of one query, block by block, in a chosen format."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.attention.limits import SOFTMAX_MAX_ELEMENTS, SOFTMAX_MAX_KEYS
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import UsageError, shown
from fmtcli.cli.app import app
from fmtcli.cli.options import JsonOption, RoundingOption, check_not_empty
from fmtcli.cli.output import emit, note


@app.command("softmax", short_help="The online softmax (FlashAttention's trick), block by "
             "block, in any format.")
def softmax_command(
    scores: Annotated[Optional[str], typer.Option(
        "--scores", metavar="LIST|FILE", show_default=False,
        help="One query's scores against the keys: a list (1,3,2,0; any number fmt "
             "underflow reads) or a file of one vector (.npy, .npz, .safetensors, .pt, text, "
             "JSON; - for stdin).")] = None,
    values: Annotated[Optional[str], typer.Option(
        "--values", metavar="LIST|FILE", show_default=False,
        help="The values, one per key: a list, or a file of a vector or of a matrix with "
             "one row per key (vectors: the table shows component 0).")] = None,
    block: Annotated[Optional[int], typer.Option(
        "--block", metavar="N", min=1, max=SOFTMAX_MAX_KEYS, show_default=False,
        help="Keys per block.  [default: 2 for the article's example, else 32]")] = None,
    random: Annotated[Optional[int], typer.Option(
        "--random", metavar="N", min=1, max=SOFTMAX_MAX_KEYS, show_default=False,
        help="Draw N scores and values from N(0, 1) (float32) instead.")] = None,
    dim: Annotated[Optional[int], typer.Option(
        "--dim", metavar="D", min=1, max=SOFTMAX_MAX_ELEMENTS, show_default=False,
        help="Components of each random value (with --random).  [default: 1]")] = None,
    seed: Annotated[int, typer.Option(
        "--seed", metavar="S", min=0, max=2**64 - 1,
        help="Seed of --random's draws and of stochastic rounding, 0..2**64-1.")] = 0,
    format_name: Annotated[str, typer.Option(
        "--format", metavar="F",
        help="Format of the running statistics: every exp, product and sum rounded to it "
             "(float64 too).")] = "float32",
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    all_blocks: Annotated[bool, typer.Option(
        "--all-blocks", help="Show every block (a long trace shows its first and last 8).")
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """The online softmax of one query, block by block: running max m, running sum l,
    the rescale exp(m_old - m_new), the weighted sum and the output so far, with every
    operation rounded to --format; then the output beside the exact softmax-weighted
    average.  With no input: the article's example (scores 1,3,2,0; values 10,20,30,40).
    """
    from fmtcli.attention.softmax import ARTICLE_BLOCK, DEFAULT_BLOCK, online_softmax
    from fmtcli.attention.softmax_inputs import article_example, random_inputs, read_numbers
    from fmtcli.numerics.format_names import arithmetic_spec

    check_not_empty(format=format_name)
    if "," in format_name:
        raise UsageError(f"--format takes one format here, got {shown(format_name)}")
    if random is not None and (scores is not None or values is not None):
        raise UsageError("--random draws the scores and values: give it or --scores and "
                         "--values, not both")
    if dim is not None and random is None:
        raise UsageError("--dim goes with --random (a file of values sets its own)")
    if (scores is None) != (values is None):
        raise UsageError("give --scores and --values together (or neither: the article's "
                         "example)")
    if scores == values == "-":
        raise UsageError("--scores and --values are both '-' (standard input): it can be read "
                         "once")
    spec, message = arithmetic_spec(format_name)
    if message:
        note(message)
    if random is not None:
        s, v = random_inputs(random, dim or 1, seed)
        source = f"random N(0, 1) draws (seed {seed})"
    elif scores is not None:
        (s, where), (v, _) = read_numbers(scores, "--scores"), \
            read_numbers(values, "--values", matrix=True)
        source = where or "the given scores"
    else:
        s, v, _ = article_example()
        source = "the article's example"
    default = ARTICLE_BLOCK if random is None and scores is None else DEFAULT_BLOCK
    result = online_softmax(s, v, default if block is None else block, spec, rounding,
                            seed, source)
    emit(result, json_out, all_blocks=all_blocks)
