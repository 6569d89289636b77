"""``fmt calc``: a small expression with every operation rounded once, in each format."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import UsageError, shown
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, RoundingOption, SeedOption, check_not_empty
from fmtcli.cli.output import emit, note


@app.command("calc", cls=UsageWithEllipsis,
             short_help="Each operation rounded once to a format: 1 + 2^-9 in BF16.",
             context_settings={"ignore_unknown_options": True})
def calc_command(
    expression: Annotated[str, typer.Argument(
        metavar="EXPR", show_default=False,
        help="The expression: numbers as fmt underflow reads them (1e-8, 0x1p-24, inf), "
             "2^-9, + - * /, parentheses, fma(a, b, c), sqrt(x).  Quote it.")],
    format_names: Annotated[Optional[list[str]], typer.Option(
        "--format", metavar="F",
        help="Format of the arithmetic (repeatable or a comma list; float64 too).  "
             "[default: bfloat16,float16,float32,float64]", show_default=False)] = None,
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    seed: SeedOption = 0,
    json_out: JsonOption = False,
) -> None:
    """Evaluate EXPR in each format, every number stored in it and every operation (+, -,
    *, /, fma, sqrt) computed exactly and rounded once: each step's exact value, the
    rounded result and the error, and where a term was absorbed (the article's
    1 + 2^-9 = 1 in BF16; 1.001953125 in FP16 and FP32).
    """
    if expression.startswith("--") and expression[2:3].isalpha():
        raise UsageError(f"no such option: {shown(expression)}", "see 'fmt calc --help'")
    from fmtcli.arithmetic.calc import DEFAULT_FORMATS, calculate
    from fmtcli.arithmetic.ops import arithmetic_specs

    check_not_empty(format=format_names)
    specs, notes = arithmetic_specs(format_names, DEFAULT_FORMATS)
    for message in notes:
        note(message)
    emit(calculate(expression, specs, rounding, seed), json_out)
