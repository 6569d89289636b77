"""The tables of ``fmt calc`` and ``fmt sum``.  Lay out what ``arithmetic.calc.CalcResult``
and ``arithmetic.summation.SumResult`` hold; compute nothing.

Values of a format are written exactly where that is short (a BF16 value has at most ~8
significant digits, FP32 ~25), so the rounding can be checked by eye; errors with three
significant digits.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import input_text, percent_text, value_text

if TYPE_CHECKING:
    from fmtcli.arithmetic.calc import CalcFormat, CalcResult
    from fmtcli.arithmetic.summation import SumResult


def _exact_value(value: float) -> str:
    """A float (a value of some format) written exactly where short, else to 17 digits."""
    from fmtcli.arithmetic.calc import exact_text

    if value is None:
        return "-"
    if not math.isfinite(value) or value == 0:
        return value_text(value)
    return exact_text(Fraction(value))


def _error(value: float | None) -> str:
    return value_text(value, 3)


# -- fmt calc --------------------------------------------------------------------------

def _digits(precision_bits: int) -> int:
    """Significant digits that tell every value of a p-bit significand apart."""
    return min(17, math.ceil(precision_bits * math.log10(2)) + 1)


def _short(text: str, value: float, digits: int) -> str:
    """``text`` (exact) where it has at most 12 significant digits, else ≈ ``value`` to
    ``digits`` (no space after ≈: a cell never wraps inside a number)."""
    mantissa = text.lstrip("-≈ ").split("e")[0].replace(".", "").lstrip("0")
    if "≈" not in text and "/" not in text and len(mantissa) <= 12:
        return text
    if "/" in text and len(text) <= 12:
        return text
    if not math.isfinite(value) or value == 0:  # beyond float64: ≈ d.ddd...e-15491
        sign, _, approximate = text.partition("≈ ")
        mantissa, e, exponent = approximate.partition("e")
        if not e:
            return text.replace("≈ ", "≈")
        rounded = f"{float(mantissa):.{digits - 1}e}"  # 9.9999 may round to 1.0000e+01
        shift = int(rounded.partition("e")[2])
        return f"{sign}≈{rounded.partition('e')[0]}e{int(exponent) + shift:+d}"
    return f"≈{value:.{digits}g}"


def _calc_rows(result: CalcFormat, exact_text: str) -> list[tuple[str, ...]]:
    """(step, exact, rounded, error, rel error, note) rows of one format, the result last
    where the expression took more than one step (or was stored exactly)."""
    digits = _digits(result.precision_bits)
    wider = min(17, digits + 3)
    rows = [(s.expression, _short(s.exact_text, s.exact, wider),
             _short(_exact_value(s.value), s.value, digits), _error(s.error),
             _error(s.rel_error), s.note) for s in result.steps]
    whole = len(result.steps) == 1 and result.steps[0].kind == "operation"
    if not whole:
        rows.append(("= result", _short(exact_text, result.exact, wider),
                     _short(_exact_value(result.value), result.value, digits),
                     _error(result.error), _error(result.rel_error),
                     f"{result.absorbed} absorbed" if result.absorbed else ""))
    return rows


def _calc_table(result: CalcResult, columns: tuple[str, ...]) -> Table:
    """The steps of every format; with a "format" column each format's first row names it,
    without one a row of its own does; without a "note" column the note goes under the
    step (narrow terminals)."""
    table = Table(title=f"{result.expression}  (every operation rounded once, "
                        f"{result.rounding})", title_justify="left", box=box.SIMPLE_HEAD,
                  caption=_calc_caption(result), caption_justify="left",
                  padding=(0, 1) if "format" not in columns else (0, 1, 0, 1),
                  pad_edge="format" in columns)
    headers = {"format": "format", "step": "step", "exact": "exact", "rounded": "rounded",
               "error": "error", "rel": "rel error", "note": "note"}
    for key in columns:
        number = key in ("exact", "rounded", "error", "rel")
        # numbers and names whole; step and note wrap at spaces (a cut word shows an
        # ellipsis, and Fit takes the next layout)
        table.add_column(headers[key], justify="right" if number else "left",
                         no_wrap=number or key == "format")
    index = {"step": 0, "exact": 1, "rounded": 2, "error": 3, "rel": 4, "note": 5}
    for r in result.results:
        rows = _calc_rows(r, result.exact_text)
        if "format" not in columns:
            table.add_row(f"[bold]{r.format}[/bold]", *[""] * (len(columns) - 1))
        for i, row in enumerate(rows):
            cells = [(r.format if i == 0 else "") if key == "format" else row[index[key]]
                     for key in columns]
            if "note" not in columns and row[5]:  # the note under the step, dimmed
                at = columns.index("step")
                cells[at] = Text.assemble(cells[at], "\n", (row[5], "dim"))
            table.add_row(*cells, end_section=i == len(rows) - 1)
    return table


def _calc_caption(result: CalcResult) -> str:
    return ("exact: the step's operation on the rounded operands, computed exactly; "
            "rounded: to the format; error = rounded - exact; = result: against the "
            f"expression's exact value {result.exact_text}")


def render_calc(result: CalcResult) -> Fit:
    """One section per format: the steps, then the result against the exact value."""
    wide = ("format", "step", "exact", "rounded", "error", "rel", "note")
    narrow = _calc_table(result, ("format", "step", "exact", "rounded", "rel", "note"))
    return Fit(_calc_table(result, wide), narrow,
                      _calc_table(result, ("step", "exact", "rounded", "rel", "note")),
                      _calc_table(result, ("step", "exact", "rounded", "rel")),
                      fallback=narrow)


# -- fmt sum ---------------------------------------------------------------------------

def _sum_text(value: float) -> str:
    """A sum: exactly where that takes at most 12 characters, else to 10 digits."""
    text = _exact_value(value)
    return text if len(text) <= 12 else value_text(value, 10)


def _sum_table(result: SumResult, short: bool) -> Table:
    update = result.update is not None
    if update:
        u = result.update
        title = (f"Weight w = {input_text(u.weight)} updated by w -= "
                 f"{input_text(u.update)} (lr*grad, {result.format}), "
                 f"{u.steps:,} times")
    else:
        order = result.order if result.order != "sequential" else "one after another"
        title = (f"Sum of {result.source}, stored in {result.format}, added "
                 f"{order} ({result.rounding})")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                  caption=_sum_caption(result), caption_justify="left")
    headers = (["weight in", "final weight", "rel error", "updates lost", "stalled after"]
               if update else ["accumulator", "sum", "rel error", "absorbed",
                               "stalled after"])
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=i > 0)
    for a in result.accumulators:
        lost = "-" if a.absorbed is None else f"{a.absorbed:,}"
        if a.absorbed and not short:
            lost += f" ({percent_text(a.absorbed / result.count)})"
        table.add_row(a.format, _sum_text(a.sum), percent_text(a.rel_error), lost,
                      "-" if a.stalled_at is None else f"{a.stalled_at:,}")
    return table


def _sum_caption(result: SumResult) -> str:
    exact = value_text(result.exact, 17)
    if result.update is not None:
        return (f"exact: w - {result.update.steps:,} x update = "
                f"{value_text(result.update.exact, 17)}; updates lost: w - update "
                "rounded back to w; stalled after: the weight never moved again after that "
                "many updates.  Without an FP32 master copy small updates are lost "
                "(Micikevicius et al. 2018, §3.1)")
    if not math.isfinite(result.exact) and result.exact_text:
        exact = f"{result.exact_text} (the stored values' exact sum: beyond float64)"
    else:
        exact += " (the stored values' exact sum, to float64)"
    lines = [f"exact sum {exact}; absorbed: nonzero values "
             "that changed nothing when added; stalled after: the running sum never changed "
             "again after that many values"]
    stalled = [a for a in result.accumulators if a.stalled_at is not None]
    for a in stalled[:4]:
        lines.append(f"{a.format}: {_exact_value(a.stalled_value)} + "
                     f"{input_text(a.next_value)} = {_exact_value(a.stalled_value)} "
                     f"from value {a.stalled_at + 1:,} on")
    if result.inputs_rounded:
        lines.append(f"{result.inputs_rounded:,} of the {result.count:,} values changed when "
                     f"stored in {result.format}")
    return "\n".join(lines)


def render_sum(result: SumResult) -> Group:
    """One row per accumulator: the sum, its relative error, the values absorbed, where the
    running sum stalled."""
    return Group(Fit(_sum_table(result, False), _sum_table(result, True)))
