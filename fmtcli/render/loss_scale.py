"""The tables of ``fmt loss-scale`` (``loss_scale.LossScaleResult``): the sweep of loss
scales, what it recommends, and (``--histogram``) the bars of log2|g| per binade.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import percent_text

if TYPE_CHECKING:
    from fmtcli.loss_scale import LossScaleResult


def render_loss_scale(result: LossScaleResult, histogram: bool = False):
    """The sweep: one row per loss scale, safe ones and the recommendations marked; with
    nothing to sweep, the note that says so.  ``histogram``: bars of log2|g| below."""
    title = (f"Loss scales for {result.format}: g_q = cast(g * S) / S, "
             f"{result.nonzero:,} nonzero gradient{'' if result.nonzero == 1 else 's'}")
    if not result.nonzero:
        return Text("\n".join([title, "", *result.notes]))
    clips = result.clips  # no inf/NaN: beyond max clips
    lost = "saturated" if clips else "overflow"
    best_safe = result.best_safe.exponent if result.best_safe else None
    most_kept = result.most_kept
    most = most_kept.exponent
    g = result.grad_scaler
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("S", "flushed", "subnormal", lost, "kept", ""):
        table.add_column(header, justify="left" if header == "" else "right", no_wrap=True)
    for row in result.rows:
        e = row.exponent
        marks = []
        if e == best_safe:
            marks.append(f"best without {'saturation' if clips else 'overflow'}")
        if e == most and e != best_safe:
            marks.append("keeps the most")
        if e == g.settles_at_log2:
            marks.append("GradScaler settles")
        style = "" if getattr(row, lost) == 0 else "red"
        table.add_row(Text(f"2^{e}", style=style), percent_text(row.fraction(row.flushed)),
                      percent_text(row.fraction(row.subnormal)),
                      Text(percent_text(row.fraction(getattr(row, lost))), style=style),
                      percent_text(row.fraction(row.kept)),
                      Text("\n".join(marks), style="bold green" if marks else ""))
    safe = result.safe
    lines = [f"safe scales (no {'saturation' if clips else 'overflow'}): "
             + (f"2^{safe[0].exponent} .. 2^{safe[-1].exponent}" if safe
                else "none in 2^0 .. 2^32")]
    if result.best_safe:
        lines.append(f"best without {'saturation' if clips else 'overflow'}: 2^{best_safe} "
                     f"(rule: {result.best_safe_rule})")
    lines.append(f"keeps the most: 2^{most} ({percent_text(most_kept.fraction(most_kept.kept))}"
                 f" kept)")
    if clips:
        lines.append(f"{result.format} gives no inf/NaN here: values beyond max are clipped "
                     f"(saturated), which GradScaler does not see")
    if g.settles_at_log2 is not None:
        steps = g.steps_to_settle
        lines.append(f"torch.amp.GradScaler (start 2^16, x2 after 2000 clean steps, x0.5 on "
                     f"overflow) settles at 2^{g.settles_at_log2} after about "
                     f"{steps:,} step{'' if steps == 1 else 's'}"
                     + (" (the top of the sweep)" if g.capped_at_sweep else ""))
    parts = [Fit(table), Text("\n".join(lines))]  # a mark per line: fits 80 columns
    if histogram:
        parts.append(render_log2_histogram(result, best_safe))
    return Group(*parts)


def render_log2_histogram(result: LossScaleResult, scale_log2: int | None) -> Fit:
    """Bars of log2|g| per binade, each binade's region in the format at S = 1 and at the
    recommended scale: flush, subnormal, normal, overflow (or saturate, where the cast
    clips instead)."""
    t = result.thresholds
    edge = min(t.overflow, t.saturate)  # one of them is inf
    beyond = "overflow" if math.isfinite(t.overflow) else "saturate"
    bins = sorted(result.log2_histogram.items())
    total = sum(n for _, n in bins) or 1
    peak = max((n for _, n in bins), default=1)
    shift = scale_log2 or 0

    def region(k: int, s: int) -> str:
        low = 2.0 ** (k + s)  # the binade [2^k, 2^(k+1)) scaled by 2^s
        high = 2.0 ** (k + s + 1)
        if high <= t.kept:
            return "flush"
        if low >= edge:
            return beyond
        if high <= t.normal:
            return "subnormal"
        if low >= t.normal and high <= edge:
            return "normal"
        return "mixed"

    styles = {"flush": "red", "subnormal": "yellow", "normal": "green", "overflow": "magenta",
              "saturate": "magenta", "mixed": "default"}

    def layout(bar_width: int) -> Table:
        table = Table(title="log2|g| per binade", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("log2|g|", justify="right")
        table.add_column("share", justify="right")
        table.add_column("", no_wrap=True)
        table.add_column("at S = 1")
        table.add_column(f"at S = 2^{shift}")
        for k, n in bins:
            bar = "█" * max(1, round(bar_width * n / peak))
            here, there = region(k, 0), region(k, shift)
            table.add_row(str(k), percent_text(n / total), bar, Text(here, style=styles[here]),
                          Text(there, style=styles[there]))
        return table

    # bars of 30 characters where they fit, shorter on a narrow terminal (never cut)
    return Fit(*(layout(width) for width in (30, 20, 12, 6)))
