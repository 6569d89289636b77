"""The table of ``fmt scale-search`` (``scale_search.ScaleSearchResult``): one row per
candidate scale rule, the best by the chosen metric marked.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from fmtcli.base.choices import Granularity
from fmtcli.render.fit import Fit
from fmtcli.render.numbers import percent_text, value_text

if TYPE_CHECKING:
    from fmtcli.numerics.schemes import Scheme
    from fmtcli.scale_search import Candidate, ScaleSearchResult


def _scale_cell(candidate: Candidate, stacked: bool = False) -> str:
    """The candidate's scale, or the range of its scales (``stacked``: on two lines)."""
    scales = candidate.stats.scales
    if scales.single is not None:
        return value_text(scales.single, 5)
    if scales.min is None:
        return "NaN"
    return f"{value_text(scales.min, 3)} ..{chr(10) if stacked else ' '}" \
        f"{value_text(scales.max, 3)}"


def render_scale_search(result: ScaleSearchResult) -> Fit | Text:
    """One row per candidate rule; the best by the chosen metric marked.  Three layouts (the
    first that fits the console): roomy with a "<- best" column, compact with the best
    rule starred, compact with a range of scales on two lines; else one record per rule.
    With nothing to quantize (no candidates), the title and the notes that say why."""
    title = (f"Scale rules for {result.scheme.format.name}, one scale per "
             f"{_granularity_text(result.scheme)}")
    if not result.candidates:
        return Text("\n".join([title, "", *result.notes]))
    delayed = any(c.overflow_steps is not None for c in result.candidates)
    n, skipped = len(result.tensors), len(result.skipped)
    caption = (f"x_q = cast(x * scale) / scale; best by {result.metric.value}; "
               f"{n:,} tensor{'' if n == 1 else 's'}"
               + (f" ({skipped:,} more skipped)" if skipped else ""))
    for note in result.notes:
        caption += f"\n{note}"
    for c in result.candidates:
        if c.note:
            caption += f"\n{c.name}: {c.note}"

    def layout(compact: bool, stacked: bool = False) -> Table:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                      caption=Text(caption + ("\n* best" if compact and result.best else "")),
                      caption_justify="left", show_edge=not compact,
                      padding=(0, 1 if not compact else 0), pad_edge=not compact)
        table.add_column("rule", no_wrap=True)
        headers = ("scale", "flushed", "saturated", "median rel", "p99 rel", "SQNR", "MSE")
        if compact:
            headers = ("scale", "flushed", "satur.", "median", "p99", "SQNR", "MSE")
        for header in headers:
            table.add_column(header, justify="right", no_wrap=True)
        if delayed:
            table.add_column("ovf steps" if compact else "overflow steps", justify="right")
        if not compact:
            table.add_column("", no_wrap=True)
        for c in result.candidates:
            best = c.name == result.best
            s = c.stats
            name = c.name + (" *" if compact and best else "")
            cells = [Text(name, style="bold" if best else ""), _scale_cell(c, stacked),
                     percent_text(s.flushed_fraction), percent_text(s.saturated_fraction),
                     percent_text(s.median_rel_error), percent_text(s.p99_rel_error),
                     f"{s.sqnr_db:.1f} dB" if math.isfinite(s.sqnr_db) else value_text(s.sqnr_db),
                     value_text(s.mse, 3)]
            if delayed:
                cells.append(f"{c.overflow_steps}/{c.steps}" if c.overflow_steps is not None
                             else "")
            if not compact:
                cells.append(Text("<- best", style="bold green") if best else "")
            table.add_row(*cells)
        return table

    return Fit(layout(False), layout(True), layout(True, stacked=True))


def _granularity_text(scheme: Scheme) -> str:
    g = scheme.granularity
    if g is Granularity.BLOCK:
        return f"block of {scheme.block}" + (" (axis 0)" if scheme.axis == 0 else "")
    if g is Granularity.TILE:
        return f"{scheme.tile[0]}x{scheme.tile[1]} tile"
    return g.value
