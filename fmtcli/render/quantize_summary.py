"""The summary of ``fmt quantize`` over many tensors (more than ``SUMMARY_ABOVE``): a row per
role, the worst tensors, the total of every scheme, and the roles whose blocks flush or
saturate, each list at most ``top`` rows (``engine.ranking`` orders them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from fmtcli.render.plaintable import HeadedRows
from fmtcli.render.quantize_cells import (
    BLOCKS_CAPTION,
    SHORT_HEADERS,
    SUMMARY_HEADERS,
    SUMMARY_ROW,
    Names,
    blocks_table,
    total_caption,
    total_items,
)
from fmtcli.render.widgets import shape_text

if TYPE_CHECKING:
    from fmtcli.engine.results import QuantizeResult, SchemeStats


def summary(result: QuantizeResult, names: Names, top: int, sort: str, caption: str
            ) -> list:
    """The summary's parts: the roles (all, or the ``top`` worst by ``sort``; left out
    where every role is one tensor), the ``top`` worst tensors, the total, and the roles
    whose blocks flush or saturate (or the line that says none does)."""
    from fmtcli.engine.ranking import blocks_worst_first, worst_tensors

    quantized = result.quantized
    main = result.schemes[-1].label  # the chosen scheme (a comparison puts it last)
    n = len(quantized)
    def cells(s: SchemeStats) -> list[str]:
        return [cell(s) for _, cell in SUMMARY_ROW]

    groups = list(result.groups)  # whole in the checkpoint's order, or the worst ``top``
    shown = groups if len(groups) <= top else worst_tensors(groups, sort=sort, top=top)
    title = f"By role: {n:,} tensors in {len(groups):,} roles, under {main}"
    parts: list = []
    if shown and (shown is groups or any(g.count > 1 for g in groups)):
        # (ranked roles of one tensor each would repeat the worst tensors below)
        parts.append(HeadedRows(
            title + ("" if shown is groups else f"; the {len(shown):,} worst by {sort}"),
            "n", SUMMARY_HEADERS, [(names.role(g.pattern), None,
                                     [(f"x{g.count:,}", cells(g.schemes[-1]))])
                                    for g in shown], name_header="role",
            caption=None if shown is groups else _more(len(groups) - len(shown), "role")))
    # the tensors the total counts: buffers (running_var, ...) are not ranked unless counted
    ranked = [t for t in quantized if t.in_total] or quantized
    worst = worst_tensors(ranked, sort=sort, top=top)
    if worst:
        left_out = "" if len(ranked) == n else " (buffers left out)"
        parts.append(HeadedRows(
            f"Worst {len(worst):,} of {len(ranked):,} tensors by {sort}{left_out}, under "
            f"{main}", "shape",
            SUMMARY_HEADERS, [(names(t), None, [(shape_text(t.tensor.shape),
                                                 cells(t.schemes[-1]))])
                              for t in worst]))
    total = result.total or ()
    counted = sum(t.in_total for t in quantized)
    parts.append(HeadedRows(
        f"Total of {total[0].count:,} values in {counted:,} tensors" if total else "Total",
        "scheme", SHORT_HEADERS, total_items(result, named=False),
        caption=caption + "; " + (total_caption(result) + "; " if total else "")
        + "--per-tensor shows every tensor"))
    hurt = [g for g in groups if g.schemes[-1].blocks is not None
            and (g.schemes[-1].blocks.flushing or g.schemes[-1].blocks.saturating)]
    with_blocks = sum(g.schemes[-1].blocks is not None for g in groups)
    listed = hurt if len(hurt) <= top else blocks_worst_first(hurt, top)
    table = blocks_table(
        f"Roles whose blocks flush or saturate, under {main}"
        + ("" if listed is hurt else f": {len(listed):,} of {len(hurt):,}, most flushing "
           "first"), "role",
        [(names.role(g.pattern), f"x{g.count:,}", g.schemes[-1]) for g in listed]
        + [(None, f"total, {s.scheme.label}", s) for s in total])
    if table is not None:
        rest = with_blocks - len(hurt)
        table.caption = (_more(len(hurt) - len(listed), "role") + "; " if listed is not hurt
                         else "") + (f"{rest:,} other role{'' if rest == 1 else 's'} with "
                                     "blocks: none flushes or saturates; " if rest else "") \
            + BLOCKS_CAPTION
    elif with_blocks:
        table = Text(f"Blocks under {main}: none flushes or saturates in the "
                     f"{with_blocks:,} roles with blocks")
    parts.append(table)
    return parts


def _more(count: int, what: str) -> str:
    """The caption of a summary's list cut at ``--top``."""
    return (f"{count:,} more {what}{'' if count == 1 else 's'}: --top N lists more, "
            "--per-tensor every tensor, --json all")
