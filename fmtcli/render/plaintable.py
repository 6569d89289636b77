"""Tables of one-line cells drawn as rich draws them, without rich's layout engine.

rich lays a table out at about 0.1 ms a row; ``fmt underflow`` of 100,000 values in six
formats is 600,000 rows (minutes).  For the one shape of table fmtcli prints in bulk
(box SIMPLE_HEAD, default padding and edges, one-line cells, no caption) these functions
produce the same lines, styles included, in a few microseconds a row; ``fit.Fit`` uses
them above ``fmtcli.render.PLAIN_ROWS`` rows (tests/cli/test_table_layout.py compares both at
widths 20-200, colour on and off).
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.segment import Segment
from rich.table import Table
from rich.text import Text


def cell_text(cell) -> str | None:
    """A cell's text if it is one plain line (str or Text without markup), else None."""
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str) and "[" not in cell:
        text = cell
    else:
        return None
    return None if "\n" in text or "\r" in text else text


def is_plain(table) -> bool:
    """A table that ``plain_table_lines`` draws exactly as rich would: box SIMPLE_HEAD,
    default padding and edges, fixed-width-free columns of one-line cells."""
    if not isinstance(table, Table) or table.box is not box.SIMPLE_HEAD or table.expand:
        return False
    if (table.padding != (0, 1, 0, 1) or not table.pad_edge or not table.show_edge
            or table.show_lines or table.collapse_padding or table.caption or table.row_styles
            or not table.show_header or (table.title is not None and not isinstance(
                table.title, str))):
        return False
    return all(column.width is None and column.max_width is None and column.min_width is None
               and column.ratio is None and not column.style and column.justify in (
                   "left", "right") and cell_text(column.header) is not None
               and all(cell_text(cell) is not None for cell in column.cells)
               for column in table.columns)


def pad(text: str, width: int, right: bool = False) -> str:
    space = " " * (width - cell_len(text))
    return space + text if right else text + space


def segments(lines: list, console):
    """Lines (str, or lists of styled segments) as rich prints them."""
    for line in lines:
        if isinstance(line, str):
            yield Segment(line)
        else:
            yield from line
        yield Segment.line()


def plain_table_lines(table: Table, console) -> tuple[int, list]:
    """The width and lines of a SIMPLE_HEAD table of one-line cells, as rich draws them
    (title padded to the table's width, a blank top edge, header, rule, rows with a blank
    line between sections, a blank bottom edge).  Where the console shows styles, each
    line is a list of styled segments; else (a pipe, a file) a plain string, built with
    one format per row when every cell is ASCII (a million rows in a few seconds)."""
    texts = [[cell_text(cell) for cell in (column.header, *column.cells)]
             for column in table.columns]
    widths = [max(map(cell_len, column)) for column in texts]
    right = [column.justify == "right" for column in table.columns]
    width = 2 + sum(w + 2 for w in widths) + len(widths) - 1
    if table.title and cell_len(table.title) > width:
        return 1 << 30, []  # rich would wrap the title: never fits, not drawn here
    styled = console.color_system is not None
    header_style = console.get_style("table.header", default="")
    cells = [[column.header, *column.cells] for column in table.columns]

    def row(i: int) -> list[Segment]:
        line = [Segment(" ")]
        style = header_style if i == 0 else None
        for column, cell_texts, w, flush_right in zip(cells, texts, widths, right):
            cell = column[i]
            own = console.get_style(cell.style, default="") if isinstance(cell, Text) \
                and cell.style else style
            line += [Segment(" ", style), Segment(pad(cell_texts[i], w, flush_right), own),
                     Segment(" ", style), Segment(" ")]  # padding, cell, padding, divider
        return line

    if not styled and all(text.isascii() for column in texts for text in column):
        layout = " " + " ".join(f" {{:{'>' if r else '<'}{w}}} " for w, r in zip(widths, right))
        layout += " "

        def row(i: int) -> str:  # the same line, without styles
            return layout.format(*[column[i] for column in texts])

    elif not styled:
        plain_row = row

        def row(i: int) -> str:
            return "".join(segment.text for segment in plain_row(i))

    blank = " " * width
    lines: list = []
    if table.title:
        title = pad(table.title, width)
        lines.append([Segment(title, console.get_style("table.title", default=""))]
                     if styled else title)
    lines += [blank, row(0), " " + "\u2500" * (width - 2) + " "]
    for i, table_row in enumerate(table.rows, start=1):
        lines.append(row(i))
        if table_row.end_section and i < table.row_count:
            lines.append(blank)
    lines.append(blank)
    return width, lines


def plain_records_lines(table: Table, width: int, console) -> list | None:
    """``records(table)``'s lines (str, or styled segments where the console shows styles)
    for a table of one-line cells whose records fit ``width`` unfolded; None for others
    (rich lays those out)."""
    headers = [" ".join(cell_text(column.header).split()) or " " for column in table.columns]
    columns = [list(column.cells) for column in table.columns]
    dim = console.get_style("dim")
    styled = console.color_system is not None
    lines: list = []
    for i in range(table.row_count):
        pairs = [(h, c[i]) for h, c in zip(headers, columns) if c[i] not in ("", None)]
        left = max((cell_len(h) for h, _ in pairs), default=0)
        right = max((cell_len(cell_text(v)) for _, v in pairs), default=0)
        if left + 2 + right > width:
            return None
        lines.append("")
        for header, value in pairs:
            if not styled:
                lines.append(f"{pad(header, left)}  {pad(cell_text(value), right)}")
                continue
            own = console.get_style(value.style, default="") if isinstance(value, Text) \
                and value.style else None
            lines.append([Segment(pad(header, left), dim), Segment("  ", dim),
                          Segment(pad(cell_text(value), right), own)])
    return lines


class HeadedRows:
    """A table whose rows come in items under a name (a tensor, a role), drawn to fit the
    console whole: no cell is cut, no line passes the width.

    Each item is ``(name, note, rows)``: ``name`` (None for rows under no name), a dim
    ``note`` beside it (a shape), and ``rows`` of ``(label, cells)``.  Three shapes, the
    first that fits: names in a column of their own, whole, beside their first row; else
    each name on a line of its own above its rows (broken only after a ``.``, continuation
    indented); else one block per row, ``header  value`` per line."""

    def __init__(self, title: str | None, label_header: str, headers: list[str], items: list,
                 caption: str | None = None, name_header: str = "tensor") -> None:
        self.title, self.caption = title, caption
        self.label_header, self.name_header = label_header, name_header
        self.headers = headers
        self.items = items

    def _widths(self) -> tuple[int, list[int]]:
        rows = [row for _, _, rows in self.items for row in rows]
        label = max([cell_len(self.label_header), *(cell_len(lb) for lb, _ in rows)])
        cells = [max([cell_len(h), *(cell_len(r[1][j]) for r in rows)])
                 for j, h in enumerate(self.headers)]
        return label, cells

    def __rich_console__(self, console, options):
        from rich.text import Text

        width = options.max_width
        label, cells = self._widths()
        stats = sum(w + 2 for w in cells)
        names = [(cell_len(n) + (cell_len(note) + 2 if note else 0)) if n else 0
                 for n, note, _ in self.items]
        name_col = max([cell_len(self.name_header), *names]) if any(names) else -2
        if self.title:
            yield Text(self.title, style="bold")
        single = all(name and len(rows) == 1 for name, _, rows in self.items)
        if 1 + name_col + 2 + label + stats <= width:
            lines = self._beside(name_col, label, cells)
        elif single and 1 + 24 + 2 + label + stats <= width:
            lines = self._split(width - 3 - label - stats, label, cells)
        elif 3 + label + stats <= width:
            lines = self._above(width, label, cells)
        elif 3 + stats <= width and not any(name for name, _, _ in self.items):
            # long labels (a recipe's scheme) as the names: each on a line above its figures
            rows = HeadedRows(None, "", self.headers,
                              [(lb, None, [("", c)]) for _, _, r in self.items for lb, c in r],
                              name_header=self.label_header)
            lines = rows._above(width, 0, cells)
        else:
            lines = self._records(width)
        dim = console.get_style("dim")
        header = console.get_style("table.header", default="")
        for text, style in lines:
            yield Segment(text.rstrip(), {"dim": dim, "header": header}.get(style))
            yield Segment.line()
        if self.caption:  # then a blank line, as below a table without one
            yield Text(self.caption, style="dim")
            yield Segment.line()

    def _stat_cells(self, cells: list[str], widths: list[int]) -> str:
        return "".join("  " + pad(c, w, right=True) for c, w in zip(cells, widths))

    def _beside(self, name_col: int, label: int, widths: list[int]) -> list:
        head = pad(self.name_header, name_col) + "  " if name_col >= 0 else ""
        out = [("", None), (" " + head + pad(self.label_header, label)
                            + "".join("  " + pad(h, w, right=True)
                                      for h, w in zip(self.headers, widths)), "header")]
        out.append((" " + "\u2500" * (name_col + 2 + label + sum(w + 2 for w in widths)), None))
        for name, note, rows in self.items:
            for i, (lb, cells) in enumerate(rows):
                shown = (name + (f"  {note}" if note else "")) if i == 0 and name else ""
                out.append((" " + (pad(shown, name_col) + "  " if name_col >= 0 else "")
                            + pad(lb, label) + self._stat_cells(cells, widths), None))
        return out + [("", None)]

    def _split(self, room: int, label: int, widths: list[int]) -> list:
        """One row per item, its name in a column ``room`` wide: whole where every name fits;
        else what comes before each name's first layer index (``encoder.layer.``) on a line
        of its own, shared by the next items that begin the same, and the rest indented
        below; names without an index whole where they fit, else their lines (broken after
        dots) above the row."""
        out = [("", None), (" " + pad(self.name_header, room) + "  "
                            + pad(self.label_header, label)
                            + "".join("  " + pad(h, w, right=True)
                                      for h, w in zip(self.headers, widths)), "header")]
        out.append((" " + "\u2500" * (room + 2 + label + sum(w + 2 for w in widths)), None))
        prefix = None
        split = any(cell_len(name) > room for name, _, _ in self.items)  # then all alike
        for name, _, ((lb, cells),) in self.items:
            row = "  " + pad(lb, label) + self._stat_cells(cells, widths)
            head, rest = split_at_index(name)
            if cell_len(name) <= room and not (split and head and cell_len(rest) + 2 <= room):
                prefix = None
                out.append((" " + pad(name, room) + row, None))
            elif head and cell_len(rest) + 2 <= room:
                if head != prefix:
                    out.append((" " + head, None))
                prefix = head
                out.append((" " + pad("  " + rest, room) + row, None))
            else:
                prefix = None
                out += [(" " + line, None) for line in dotted_lines(name, room + 2 + label)]
                out.append((" " + " " * room + row, None))
        return out + [("", None)]

    def _above(self, width: int, label: int, widths: list[int]) -> list:
        named = any(name for name, _, _ in self.items)
        head = self.label_header if not named else (
            f"{self.name_header} / {self.label_header}" if self.label_header
            else self.name_header)
        first = label + (2 if named else 0)
        columns = "".join("  " + pad(h, w, right=True) for h, w in zip(self.headers, widths))
        if cell_len(head) <= first or 1 + cell_len(head) + cell_len(columns) <= width:
            first = max(first, cell_len(head))
            out = [("", None), (" " + pad(head, first) + columns, "header")]
        else:  # the header is wider than the labels' column: a line of its own above
            out = [("", None), (" " + head, "header"), (" " + " " * first + columns, "header")]
        out.append((" " + "\u2500" * (first + sum(w + 2 for w in widths)), None))
        for name, note, rows in self.items:
            if name:
                out += [(" " + line, None) for line in dotted_lines(name, width - 1)]
                if note and cell_len(out[-1][0]) + 2 + cell_len(note) <= width:
                    out[-1] = (out[-1][0] + "  " + note, None)
                elif note:
                    out.append(("     " + note, None))
            for lb, cells in rows:
                out.append((" " + pad(("  " if name else "") + lb, first)
                            + self._stat_cells(cells, widths), None))
        return out + [("", None)]

    def _records(self, width: int) -> list:
        out: list = []
        left = max(cell_len(h) for h in self.headers)
        for name, note, rows in self.items:
            if name:
                out.append(("", None))
                out += [(line, None) for line in dotted_lines(name, width)]
                if note:
                    out.append((note, "dim"))
            for lb, cells in rows:
                if not name:
                    out.append(("", None))
                out.append((("  " if name else "") + lb, None))
                out += [(("  " if name else "") + "  " + pad(h, left) + "  " + c, None)
                        for h, c in zip(self.headers, cells)]
        return out + [("", None)]


def split_at_index(name: str) -> tuple[str, str]:
    """``name`` cut before its first dotted part that is a layer index (digits, or ``*``
    in a role): ``('encoder.layer.', '3.attention.self.query.weight')``; ``('', name)``
    where it has none."""
    parts = name.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part == "*" or part.isdigit():
            return ".".join(parts[:i]) + ".", ".".join(parts[i:])
    return "", name


def dotted_lines(name: str, width: int, indent: int = 4) -> list[str]:
    """``name`` in lines of at most ``width`` cells, broken only after a ``.`` (or a space),
    continuation lines indented by ``indent``; a part with nothing to break at that is
    wider than a line is folded (the one case that breaks a word)."""
    width = max(width, indent + 8)
    parts = [p for p in name.replace(".", ".\n").replace(" ", " \n").split("\n") if p]
    lines: list[str] = []
    for part in parts:
        room = width - (indent if lines else 0)
        if lines and cell_len(lines[-1]) + cell_len(part) <= (width if len(lines) == 1
                                                               else width - indent):
            lines[-1] += part
            continue
        while cell_len(part) > room:
            lines.append(part[:room])
            part = part[room:]
            room = width - indent
        lines.append(part)
    return [line if i == 0 else " " * indent + line for i, line in enumerate(lines)]
