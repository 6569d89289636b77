"""The tables of ``fmt compare`` (``compare.CompareResult``), and its CSV rows.

One pair: every figure down one column.  A few pairs: a row per tensor, worst first.  More
than ``SUMMARY_ABOVE`` pairs: issue 8's summary -- a row per role (tensors that differ only
in their layer index, merged exactly), worst first, then the worst tensors, each list at
most ``top`` rows (left out where every role is one tensor: the same rows), then the total.
Names are the pairs' (``file:key`` where keys repeat in a folder), without the prefix all
share, which a line above the tables says.
Worst: the lowest SQNR (with ``--logits``: the largest mean KL divergence); NaN last.
Computes nothing but the order of the rows.  (Its CSV: ``csvout.compare_csv``.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.base.choices import SUMMARY_ABOVE, SUMMARY_TOP
from fmtcli.inputs.checkpoints import shared_prefix, without_prefix
from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows
from fmtcli.render.widgets import DottedName, prefix_note, user_text

if TYPE_CHECKING:
    from fmtcli.compare import CompareResult, CompareStats, TensorComparison

CAPTION = ("rel: |test - ref| / |ref| over nonzero ref values (p99 to within +0.78%); "
           "calc_diff: 1 - 2 sum(xy) / sum(x^2 + y^2); differ: elements not equal")
LOGIT_CAPTION = ("KL(ref || test) per row of the last axis, nats; top-1: rows whose argmax "
                 "agrees; top-5: mean overlap of the top-5 sets")


def _cosine(value: float) -> str:
    """Enough digits to tell 0.99999 from 0.999999 (a cosine near 1 is the point)."""
    if not math.isfinite(value) or abs(value) >= 1 or abs(value) < 0.99:
        return value_text(value, 4)
    digits = max(4, min(9, 2 - math.floor(math.log10(1 - abs(value)))))
    shown = math.floor(abs(value) * 10 ** digits) / 10 ** digits  # cut: never "1.0000"
    return f"{'-' if value < 0 else ''}{shown:.{digits}f}"


def _sqnr(value: float) -> str:
    return value_text(value) if not math.isfinite(value) else f"{value:.2f}"


def _fraction(part: int, whole: int) -> str:
    return percent_text(part / whole) if whole else "-"


HEADERS = ["SQNR dB", "cosine", "calc_diff", "p99 rel", "max rel", "differ"]
LOGIT_HEADERS = ["KL mean", "KL p99", "KL max", "top-1", "top-5", "SQNR dB"]


def _cells(s: CompareStats, logits: bool) -> list[str]:
    if logits:
        lg = s.logits
        return [value_text(lg.kl_mean, 3), value_text(lg.kl_p99, 3),
                value_text(lg.kl_max, 3), percent_text(lg.top1_agreement),
                percent_text(lg.top5_overlap), _sqnr(s.sqnr_db)]
    return [_sqnr(s.sqnr_db), _cosine(s.cosine), value_text(s.calc_diff, 3),
            percent_text(s.p99_rel_error), percent_text(s.max_rel_error),
            _fraction(s.differ, s.count)]


def worst_first(stats: CompareStats, logits: bool) -> float:
    """Sort key: the lowest SQNR first (logits: the largest mean KL); NaN last."""
    value = -stats.logits.kl_mean if logits else stats.sqnr_db
    return math.inf if math.isnan(value) else value


def _shape(t: TensorComparison) -> str:
    return "x".join(map(str, t.ref.shape)) or "scalar"


def render_compare(result: CompareResult, top: int = SUMMARY_TOP):
    logits = result.logits
    headers = LOGIT_HEADERS if logits else HEADERS
    caption = LOGIT_CAPTION if logits else CAPTION
    tensors = sorted(result.tensors, key=lambda t: worst_first(t.stats, logits))
    if len(tensors) == 1:
        return _one(tensors[0], caption)
    # what every name begins with is said once, above the tables
    prefix = shared_prefix([t.ref.key for t in tensors] + [r.pattern for r in result.roles])

    def name(text: str, key: str | None) -> str:
        return user_text(without_prefix(text, key, prefix))

    parts: list = [prefix_note(prefix)] if prefix else []
    if len(tensors) <= SUMMARY_ABOVE:
        parts.append(HeadedRows(
            f"{user_text(result.test)} against {user_text(result.ref)}: "
            f"{len(tensors):,} tensors, worst first", "shape", headers,
            [(name(t.name, t.ref.key), None, [(_shape(t), _cells(t.stats, logits))])
             for t in tensors]))
    else:
        roles = sorted(result.roles, key=lambda r: worst_first(r.stats, logits))
        more = len(roles) - top
        if top and any(r.count > 1 for r in roles):  # else the same rows as the tensors'
            parts.append(HeadedRows(
                f"By role, worst first: {len(tensors):,} tensors in {len(roles):,} roles"
                + (f"; the {top:,} worst" if more > 0 else ""), "n", headers,
                [(name(r.pattern, r.pattern), None, [(f"x{r.count:,}",
                                                      _cells(r.stats, logits))])
                 for r in roles[:top]], name_header="role",
                caption=f"{more:,} more role{'s' if more > 1 else ''}: --top N lists more, "
                        "--json all" if more > 0 else None))
        if top:
            parts.append(HeadedRows(
                f"Worst {min(top, len(tensors)):,} of {len(tensors):,} tensors", "shape",
                headers, [(name(t.name, t.ref.key), None, [(_shape(t), _cells(t.stats,
                                                                            logits))])
                          for t in tensors[:top]]))
    parts.append(HeadedRows(
        f"Total of {result.total.count:,} values", "", headers,
        [(None, None, [("", _cells(result.total, logits))])], caption=caption))
    return Group(*parts)


def _one(t: TensorComparison, caption: str) -> Group:
    s = t.stats
    title = DottedName(f"{user_text(t.name)} ({_shape(t).replace('x', ' x ')}, "
                              f"{t.ref.dtype} vs {t.test.dtype})", style="bold")
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("SQNR (dB)", _sqnr(s.sqnr_db)), ("cosine similarity", _cosine(s.cosine)),
            ("calc_diff", value_text(s.calc_diff, 4)),
            ("relative Frobenius error", value_text(s.rel_frobenius, 4)),
            ("max abs error", value_text(s.max_abs_error, 4)),
            ("median rel error", percent_text(s.median_rel_error)),
            ("p99 rel error", percent_text(s.p99_rel_error)),
            ("max rel error", percent_text(s.max_rel_error)),
            ("elements that differ", f"{s.differ:,} of {s.count:,}"),
            ("NaN / inf in ref", f"{s.ref_nan:,} / {s.ref_inf:,}"),
            ("NaN / inf in test", f"{s.test_nan:,} / {s.test_inf:,}")]
    if s.logits is not None:
        lg = s.logits
        rows += [("rows (logit vectors)", f"{lg.rows:,}" + (
                     f" (+{lg.bad_rows:,} with NaN/inf)" if lg.bad_rows else "")),
                 ("KL mean", value_text(lg.kl_mean, 4)),
                 ("KL median", value_text(lg.kl_median, 4)),
                 ("KL p99", value_text(lg.kl_p99, 4)),
                 ("KL max", value_text(lg.kl_max, 4)),
                 ("top-1 agreement", percent_text(lg.top1_agreement)),
                 ("top-5 overlap", percent_text(lg.top5_overlap))]
    for row in rows:
        table.add_row(*row)
    return Group(title, table, Text(caption, style="dim"))
