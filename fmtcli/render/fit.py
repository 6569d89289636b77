"""The width rules: a table fits the console or changes shape, never cut.

A renderer offers its layouts, widest first, through ``Fit``, which prints the first that
renders without cutting anything (no ``…``, no line wider than the console) and otherwise
the last one as records (one ``header  value`` block per row).  Above
``fmtcli.render.PLAIN_ROWS`` rows a table of one-line cells is laid out by ``plaintable``
(the same bytes as rich's, ~2 us a row instead of ~0.1 ms).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from fmtcli import render as package  # its PLAIN_ROWS, read when a table is drawn
from fmtcli.render.plaintable import (
    is_plain,
    plain_records_lines,
    plain_table_lines,
    segments,
)

ELLIPSIS = "\u2026"  # what rich puts where it cuts a cell


def plain_rows() -> int:
    """Rows above which a table of one-line cells is drawn line by line, not by rich
    (``fmtcli.render.PLAIN_ROWS``, looked up at each call so that a test can turn it)."""
    return package.PLAIN_ROWS


class Fit:
    """The first of ``layouts`` that fits the console width uncut; else ``fallback`` (by
    default the last layout) as records."""

    def __init__(self, *layouts, fallback: Table | None = None) -> None:
        self.layouts = layouts
        self.fallback = fallback if fallback is not None else layouts[-1]

    def __rich_console__(self, console, options):
        plain = plain_rows()
        for table in self.layouts:
            if _longest_words(table) > options.max_width:
                continue  # cheap: tens of thousands of rows (underflow of many values)
            if is_plain(table) and table.row_count > plain:
                width, lines = plain_table_lines(table, console)
                if width <= options.max_width:
                    yield from segments(lines, console)
                    return
                continue
            unclamped = options.update_width(1 << 16)
            if Measurement.get(console, unclamped, table).minimum > options.max_width:
                continue  # rich would squeeze a column below its longest word
            lines = console.render_lines(table, options, pad=False)
            text = "".join(segment.text for line in lines for segment in line)
            if ELLIPSIS not in text and all(
                    sum(cell_len(s.text) for s in line) <= options.max_width for line in lines):
                for line in lines:  # the lines just rendered: no second rendering
                    yield from line
                    yield Segment.line()
                return
        if is_plain(self.fallback) and self.fallback.row_count > plain:
            lines = plain_records_lines(self.fallback, options.max_width, console)
            if lines is not None:
                if self.fallback.title:  # as records() shows it (wrapped where narrow)
                    yield Text(str(self.fallback.title), style="bold")
                yield from segments(lines, console)
                return
        yield records(self.fallback)

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(min(20, options.max_width), options.max_width)


def _longest_words(table) -> int:
    """A lower bound of a table's width: the sum over its columns of the longest word in
    each (rich never breaks a word; padding and rules come on top); 0 for other layouts."""
    if not isinstance(table, Table):
        return 0
    total = 0
    for column in table.columns:
        longest = 0
        for cell in (column.header, *column.cells):
            text = cell.plain if isinstance(cell, Text) else str(cell)
            if len(text) > longest:
                longest = max(longest, *(cell_len(word) for word in text.split() or [""]))
        total += longest
    return total


def records(table: Table) -> Group:
    """A table as one block per row: each nonempty cell under its column's header."""
    headers = [" ".join(str(column.header).split()) for column in table.columns]
    cells = [list(column.cells) for column in table.columns]
    parts: list = [Text(str(table.title), style="bold")] if table.title else []
    for i in range(table.row_count):
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", overflow="fold")
        grid.add_column(overflow="fold")
        for header, column in zip(headers, cells):
            if column[i] not in ("", None):
                grid.add_row(header or " ", column[i])
        parts += [Text(""), grid]
    if table.caption:
        parts += [Text(""), Text(str(table.caption), style="dim")]
    return Group(*parts)
