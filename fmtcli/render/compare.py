"""The tables of ``fmt compare`` (``compare.CompareResult``), and its CSV rows.

One pair: every figure down one column.  A few pairs: a row per tensor, worst first.  More
than ``SUMMARY_ABOVE`` pairs: issue 8's summary -- a row per role (tensors that differ only
in their layer index, merged exactly), worst first, then the worst tensors, each list at
most ``top`` rows (left out where every role is one tensor: the same rows), then the total.
Names are the pairs' (``file:key`` where keys repeat in a folder), without the prefix all
share, which a line above the tables says.
Worst: the lowest SQNR (with ``--logits``: the largest mean KL divergence); NaN last.
Where a side is a quantized layout (``compare.verdict``): the columns are SQNR, fmt's own
SQNR of the same tensor (``fmt dB``), cosine, calc_diff, the relative Frobenius error, the
max abs error and the verdict; each tensor's layout is named beside it, and the flagged
tensors are listed with their reasons under the tables.
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
JUDGED_HEADERS = ["SQNR dB", "fmt dB", "cosine", "calc_diff", "rel Frob", "max abs",
                  "verdict"]
JUDGED_CAPTION = ("fmt dB: fmt's own quantization of REF in the layout's element format and "
                  "granularity; verdict flag: cosine < 0.99 (where fmt's own reaches it), or "
                  "SQNR more than 6 dB below fmt's own")


def _verdict_cell(flagged: int | None, tensors: int = 1) -> str:
    if flagged is None:
        return "-"
    if not flagged:
        return "ok"
    return "FLAG" if tensors == 1 else f"{flagged:,} FLAG"


def _cells(s: CompareStats, logits: bool, judged: tuple | None = None) -> list[str]:
    """A row's cells; ``judged``: (fmt's own SQNR or None, flagged, tensors) where a side
    is a quantized layout."""
    if judged is not None and not logits:
        own, flagged, tensors = judged
        return [_sqnr(s.sqnr_db), "-" if own is None else _sqnr(own), _cosine(s.cosine),
                value_text(s.calc_diff, 3), value_text(s.rel_frobenius, 3),
                value_text(s.max_abs_error, 3), _verdict_cell(flagged, tensors)]
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


def _tensor_judged(t: TensorComparison) -> tuple | None:
    j = t.judgement
    return None if j is None else (j.fmt_sqnr_db, int(j.verdict == "flag"), 1)


def render_compare(result: CompareResult, top: int = SUMMARY_TOP):
    logits = result.logits
    judged = result.judged and not logits
    headers = LOGIT_HEADERS if logits else JUDGED_HEADERS if judged else HEADERS
    caption = LOGIT_CAPTION if logits else CAPTION
    if judged:
        caption = JUDGED_CAPTION
    tensors = sorted(result.tensors, key=lambda t: worst_first(t.stats, logits))
    if len(tensors) == 1:
        return _one(tensors[0], caption)
    # what every name begins with is said once, above the tables
    prefix = shared_prefix([t.ref.key for t in tensors] + [r.pattern for r in result.roles])

    def name(text: str, key: str | None) -> str:
        return user_text(without_prefix(text, key, prefix))

    def row(t: TensorComparison) -> tuple:
        return (name(t.name, t.ref.key), t.layout,
                [(_shape(t), _cells(t.stats, logits, _tensor_judged(t)))])

    def role_judged(r) -> tuple | None:
        return (r.fmt_sqnr_db, r.flagged, r.count) if judged else None

    parts: list = [prefix_note(prefix)] if prefix else []
    if len(tensors) <= SUMMARY_ABOVE:
        parts.append(HeadedRows(
            f"{user_text(result.test)} against {user_text(result.ref)}: "
            f"{len(tensors):,} tensors, worst first", "shape", headers,
            [row(t) for t in tensors]))
    else:
        roles = sorted(result.roles, key=lambda r: worst_first(r.stats, logits))
        more = len(roles) - top
        if top and any(r.count > 1 for r in roles):  # else the same rows as the tensors'
            parts.append(HeadedRows(
                f"By role, worst first: {len(tensors):,} tensors in {len(roles):,} roles"
                + (f"; the {top:,} worst" if more > 0 else ""), "n", headers,
                [(name(r.pattern, r.pattern), None, [(f"x{r.count:,}",
                                                      _cells(r.stats, logits,
                                                             role_judged(r)))])
                 for r in roles[:top]], name_header="role",
                caption=f"{more:,} more role{'s' if more > 1 else ''}: --top N lists more, "
                        "--json all" if more > 0 else None))
        if top:
            parts.append(HeadedRows(
                f"Worst {min(top, len(tensors)):,} of {len(tensors):,} tensors", "shape",
                headers, [row(t) for t in tensors[:top]]))
    total = (result.fmt_sqnr_db, result.flagged, len(tensors)) if judged else None
    parts.append(HeadedRows(
        f"Total of {result.total.count:,} values", "", headers,
        [(None, None, [("", _cells(result.total, logits, total))])], caption=caption))
    if judged:
        parts.extend(_flagged(tensors, top, lambda t: name(t.name, t.ref.key)))
    return Group(*parts)


def _flagged(tensors: list, top: int, name) -> list:
    """Lines naming the flagged tensors (at most ``top``, worst first) and why."""
    flagged = [t for t in tensors if t.judgement and t.judgement.verdict == "flag"]
    if not flagged:
        return []
    shown = flagged[:max(top, 1)]
    lines = [Text(f"Flagged ({len(flagged):,} of {len(tensors):,} tensors):", style="bold")]
    lines += [Text(f"  {name(t)}: {'; '.join(t.judgement.reasons)}") for t in shown]
    if len(flagged) > len(shown):
        lines.append(Text(f"  {len(flagged) - len(shown):,} more: --top N lists more, "
                          "--json all", style="dim"))
    return lines


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
    j = t.judgement
    if j is not None:
        rows += [("layout", j.layout or "none (stored values)")]
        if j.fmt_scheme is not None:
            rows += [("fmt's own SQNR (dB)", _sqnr(j.fmt_sqnr_db)),
                     ("fmt's own scheme", j.fmt_scheme)]
        rows += [("verdict", "FLAG" if j.verdict == "flag" else j.verdict)]
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
    reasons = [Text(f"flagged: {reason}") for reason in (j.reasons if j else ())]
    return Group(title, table, *reasons, Text(caption, style="dim"))
