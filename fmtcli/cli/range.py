"""``fmt range``: range and precision of formats."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import ARTICLE_FORMATS
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, resolve_formats
from fmtcli.cli.output import emit


@app.command("range", cls=UsageWithEllipsis,
             short_help="Range and precision of formats: max, eps, subnormals.")
def range_command(
    formats: Annotated[Optional[list[str]], typer.Argument(
        metavar="FORMAT", help="Formats to show (names, aliases or custom eXmY). "
             "Default: the article's six.", show_default=False)] = None,
    all_formats: Annotated[bool, typer.Option("--all", help="Every registered format.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Range and precision of formats: max, smallest normal/subnormal, eps, inf/NaN/-0."""
    from fmtcli.numerics.formats import REGISTRY, FormatTable

    if all_formats:
        specs = list(REGISTRY.values())
        specs += [s for s in resolve_formats(formats, ()) if s not in specs] if formats else []
    else:
        specs = resolve_formats(formats, ARTICLE_FORMATS)
    emit(FormatTable(tuple(specs)), json_out)
