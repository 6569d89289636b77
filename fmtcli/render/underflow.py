"""The table of ``fmt underflow``: what each format stores of each value
(``underflow.UnderflowResult``), and with ``--scale`` what the scaled round trip recovers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import input_text, percent_text, value_text
from fmtcli.render.widgets import fate_text

if TYPE_CHECKING:
    from fmtcli.underflow import Stored, UnderflowResult


def _stored_cells(stored: Stored) -> list:
    return [value_text(stored.stored), percent_text(stored.rel_error), fate_text(stored.fate)]


def render_underflow(result: UnderflowResult) -> Fit:
    """Rows per (value, format[, scale]); the scaled columns appear only with --scale (one
    block per row where the rows do not fit)."""
    scaled = result.scaled
    title = "What each format stores"
    if scaled:
        title += " (x_q = cast(x * scale) / scale)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("value", justify="right")
    table.add_column("format")
    table.add_column("stored", justify="right")
    table.add_column("rel err", justify="right")
    table.add_column("fate")
    if scaled:
        for header in ("scale", "x * scale", "stored", "fate", "recovered", "rel err",
                       "survives"):
            table.add_column(header, justify="left" if header == "fate" else "right")
    previous = None
    for row in result.rows:
        first = row.item != previous
        if first and previous is not None:
            table.add_section()
        previous = row.item
        cells = [input_text(row.value) if first else "", row.format, *_stored_cells(row.plain)]
        if scaled:
            store = row.scaled_store
            cells += [input_text(row.scale), value_text(row.scaled), value_text(store.stored),
                      fate_text(store.fate), value_text(row.recovered),
                      percent_text(row.recovered_rel_error),
                      Text("yes", "green") if row.survives else Text("no", "bold red")]
        table.add_row(*cells)
    return Fit(table)
