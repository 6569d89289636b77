"""The table of ``fmt range``: one row per format (``numerics.formats.FormatTable``), its
layout, range, precision and special values; formats across where the rows do not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import exact_text

if TYPE_CHECKING:
    from fmtcli.numerics.formats import FormatSpec, FormatTable


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


_RANGE_COLUMNS = [("format", "left"), ("bits", "right"), ("E", "right"), ("M", "right"),
                  ("bias", "right"), ("max", "right"), ("smallest normal", "right"),
                  ("smallest subnormal", "right"), ("eps (spacing above 1)", "right"),
                  ("digits", "right"), ("binades", "right"), ("inf", "center"),
                  ("NaN", "center"), ("-0", "center")]


def _layout_cells(spec: FormatSpec) -> list[str]:
    """E, M and bias; a tapered format's fields by their narrowest and widest (no bias)."""
    if spec.taper is None:
        return [str(spec.exponent_bits), str(spec.mantissa_bits), str(spec.bias)]
    low, high = spec.taper.exponent_widths
    return [f"{low}-{high}", f"{min(spec.taper.mantissa)}-{max(spec.taper.mantissa)}", "-"]


def _range_cells(spec: FormatSpec) -> list[str]:
    name = spec.name if not spec.aliases else f"{spec.name}\n[dim]{spec.aliases[0]}[/dim]"
    return [name, str(spec.bits), *_layout_cells(spec), exact_text(spec.max),
            exact_text(spec.smallest_normal),
            exact_text(spec.smallest_subnormal), exact_text(spec.eps),
            f"{spec.decimal_digits:.1f}", f"{spec.dynamic_range_binades:.0f}",
            _yes(spec.has_inf), _yes(spec.has_nan), _yes(spec.has_negative_zero)]


def render_range(result: FormatTable) -> Fit:
    """One row per format: layout, range, precision and special values.  Where the rows do
    not fit: formats across, a few per table; then one block per format."""
    specs = result.specs
    table = Table(title="Number formats", title_justify="left", box=box.SIMPLE_HEAD)
    for header, justify in _RANGE_COLUMNS:
        table.add_column(header, justify=justify)
    for spec in specs:
        table.add_row(*_range_cells(spec))
        table.add_section()

    def across(group: Sequence[FormatSpec], title: str | None) -> Table:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_header=False)
        t.add_column(style="dim")
        for _ in group:
            t.add_column(justify="right")
        columns = [_range_cells(spec) for spec in group]
        for i, (header, _) in enumerate(_RANGE_COLUMNS):
            t.add_row(header, *[cells[i] for cells in columns], end_section=i == 0)
        return t

    layouts = [Group(*[across(specs[i:i + k], "Number formats" if i == 0 else None)
                       for i in range(0, len(specs), k)])
               for k in range(min(len(specs), 6), 1, -1)]
    return Fit(table, *layouts, fallback=table)
