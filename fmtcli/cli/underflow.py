"""``fmt underflow``: what each format stores of a value, with and without a scale."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import (
    ARTICLE_FORMATS,
    Backend,
    Device,
    OverflowPolicy,
    Product,
    RoundingMode,
)
from fmtcli.base.errors import UsageError, shown
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import (
    BackendOption,
    DeviceOption,
    JsonOption,
    OverflowOption,
    ProductOption,
    RoundingOption,
    SeedOption,
    check_not_empty,
    resolve_formats,
)
from fmtcli.cli.output import emit


@app.command("underflow", cls=UsageWithEllipsis,
             short_help="Will a value survive? What each format stores of it.",
             context_settings={"ignore_unknown_options": True})
def underflow_command(
    values: Annotated[list[str], typer.Argument(
        metavar="VALUE",
        help="Values: 1e-8, 2**-24, 2^-24, 3*2^-10, 0x1p-24, inf, nan, negatives; "
             "comma lists allowed.", show_default=False)],
    scale: Annotated[Optional[list[str]], typer.Option(
        "--scale", "-s", metavar="S", help="Scale (loss scale): x_q = cast(x * scale) / scale. "
                              "Repeatable or a comma list.")] = None,
    format_names: Annotated[Optional[list[str]], typer.Option(
        "--format", metavar="F",
        help="Format (repeatable or a comma list). Default: the article's six.")] = None,
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    overflow: OverflowOption = OverflowPolicy.IEEE,
    seed: SeedOption = 0,
    backend: BackendOption = Backend.NUMPY,
    device: DeviceOption = Device.CPU,
    product: ProductOption = Product.EXACT,
    json_out: JsonOption = False,
) -> None:
    """Will a value survive? What each format stores of it, with and without a scale.

    Fates: exact, rounded, subnormal (reduced precision), flushed (to zero), overflow
    (became inf/NaN), saturated (clipped to max), invalid (no code for it).
    """
    for text in values:
        if text.startswith("--"):
            raise UsageError(f"no such option: {shown(text)}", "see 'fmt underflow --help'")
    from fmtcli.numerics.literals import parse_values
    from fmtcli.underflow import underflow_table

    check_not_empty(format=format_names, scale=scale)
    parsed = parse_values(values)
    scales = parse_values(scale or [])
    specs = resolve_formats(format_names, ARTICLE_FORMATS)
    result = underflow_table(parsed, specs, scales, rounding, overflow, seed, backend, device,
                             product=product)
    emit(result, json_out)
