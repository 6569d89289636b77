"""Rich tables for results.  Renderers format and lay out; they compute nothing new.

Tables fit the console: a renderer offers its layouts, widest first, through ``Fit``, which
prints the first that renders without cutting anything (no ``…``, no line wider than the
console) and otherwise the last one as records (one ``header  value`` block per row).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.cells import cell_len
from rich.console import Group
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from fmtcli.base.choices import SUMMARY_ABOVE, SUMMARY_TOP, Granularity
from fmtcli.base.errors import one_line
from fmtcli.inputs.checkpoints import without_prefix
from fmtcli.numerics.fates import Fate
from fmtcli.render.arithmetic import render_calc, render_sum
from fmtcli.render.attention import render_attention
from fmtcli.render.compare import render_compare
from fmtcli.render.dot import render_dot
from fmtcli.render.kv import render_kv
from fmtcli.render.plaintable import (
    HeadedRows,
    is_plain,
    plain_records_lines,
    plain_table_lines,
    segments,
)
from fmtcli.render.softmax import render_softmax

if TYPE_CHECKING:  # the result types: loaded by the command that made the result
    from fmtcli.check_backends import ConformanceResult
    from fmtcli.engine.results import QuantizeResult, ScaleStats, SchemeStats, TensorResult
    from fmtcli.inputs.tensors import TensorInfo
    from fmtcli.loss_scale import LossScaleResult
    from fmtcli.numerics.formats import FormatSpec, FormatTable
    from fmtcli.numerics.schemes import Scheme
    from fmtcli.scale_search import Candidate, ScaleSearchResult
    from fmtcli.underflow import Stored, UnderflowResult

ELLIPSIS = "\u2026"  # what rich puts where it cuts a cell


class Fit:
    """The first of ``layouts`` that fits the console width uncut; else ``fallback`` (by
    default the last layout) as records."""

    def __init__(self, *layouts, fallback: Table | None = None) -> None:
        self.layouts = layouts
        self.fallback = fallback if fallback is not None else layouts[-1]

    def __rich_console__(self, console, options):
        for table in self.layouts:
            if _longest_words(table) > options.max_width:
                continue  # cheap: tens of thousands of rows (underflow of many values)
            if is_plain(table) and table.row_count > PLAIN_ROWS:
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
        if is_plain(self.fallback) and self.fallback.row_count > PLAIN_ROWS:
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


# Above this many rows a table of one-line cells is laid out here, not by rich: rich takes
# ~0.1 ms a row (100,000 values of ``fmt underflow`` in six formats: minutes), this ~2 us.
PLAIN_ROWS = 2000


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


class DottedName:
    """A long name (a checkpoint key) that wraps only after its dots (or spaces): parts
    longer than the width are folded."""

    def __init__(self, name: str, style: str = "") -> None:
        self.name = name
        self.style = style
        parts = name.replace(".", ".\n").replace(" ", " \n").split("\n")
        self.parts = [p for p in parts if p]

    def lines(self, width: int) -> list[str]:
        out: list[str] = []
        for part in self.parts:
            while cell_len(part) > width:  # fold a part with no dot to break at
                out.append(part[:width])
                part = part[width:]
            if out and cell_len(out[-1]) + cell_len(part) <= width and out[-1][-1] in ". ":
                out[-1] += part
            else:
                out.append(part)
        return out

    def __rich_measure__(self, console, options) -> Measurement:
        longest = max((cell_len(p) for p in self.parts), default=0)
        return Measurement(min(longest, 16), cell_len(self.name))

    def __rich_console__(self, console, options):
        lines = [line.rstrip() for line in self.lines(max(1, options.max_width))]
        yield Text("\n".join(lines), style=self.style)

FATE_STYLE = {
    Fate.EXACT: "green", Fate.ROUNDED: "default", Fate.SUBNORMAL: "yellow",
    Fate.FLUSHED: "bold red", Fate.OVERFLOW: "bold red", Fate.SATURATED: "magenta",
    Fate.INVALID: "bold red",
}


def exact_text(value: float) -> str:
    """A format figure written exactly and readably: 448; 65,504; 2^-9 over 0.001953125.

    Powers of two take two lines: the power, then its exact decimal (or an approximation
    when the decimal would be long)."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    mantissa, exponent = math.frexp(value)
    if value == int(value) and abs(value) < 1e7:
        return f"{int(value):,}"
    if abs(mantissa) == 0.5:  # a power of two
        power = exponent - 1
        if -16 <= power < 0:
            return f"2^{power}\n{value:.{-power}f}".rstrip("0")
        if 0 <= power < 24:
            return f"2^{power}\n{int(value):,}"
        return f"2^{power}\n≈ {value:.4g}"
    short = repr(value)
    return short if len(short) <= 12 else f"≈ {value:.6g}"


def value_text(value: float | None, digits: int = 5) -> str:
    """A stored or computed value to ``digits`` significant digits."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    return f"{value:.{digits}g}"


def input_text(value: float | None, float32: bool = False) -> str:
    """A value the user gave (or an input), with every digit its float needs: the shortest
    text that reads back as the same float64 (float32 with ``float32``), so 68.00000357
    shows as 68.00000357, not as 68, and its rounding can be checked by eye."""
    if value is None or not math.isfinite(value) or value == 0:
        return value_text(value)
    if float32:  # the inputs of check-backends are float32
        import numpy as np

        with np.errstate(over="ignore"):
            single = np.float32(value)
        text = np.format_float_positional(single, unique=True, trim="-") \
            if 1e-4 <= abs(value) < 1e16 else \
            np.format_float_scientific(single, unique=True, trim="-")
    else:
        text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if e:  # 1e-08 -> 1e-8
        text = f"{mantissa}e{int(exponent)}"
    return text.removesuffix(".0")


def percent_text(rel: float | None) -> str:
    """A relative error as a percentage with three significant digits."""
    if rel is None or math.isnan(rel):
        return "-"
    if math.isinf(rel):
        return "inf"
    if rel == 0:
        return "0"
    if 0.999 < rel < 1:  # enough digits not to round to 100%
        decimals = math.ceil(-math.log10(1 - rel)) - 2
        return f"{rel * 100:.{decimals}f}%"
    return f"{rel * 100:.3g}%"


def fate_text(fate: Fate) -> Text:
    return Text(fate.value, style=FATE_STYLE[fate])


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


_RANGE_COLUMNS = [("format", "left"), ("bits", "right"), ("E", "right"), ("M", "right"),
                  ("bias", "right"), ("max", "right"), ("smallest normal", "right"),
                  ("smallest subnormal", "right"), ("eps (spacing above 1)", "right"),
                  ("digits", "right"), ("binades", "right"), ("inf", "center"),
                  ("NaN", "center"), ("-0", "center")]


def _range_cells(spec: FormatSpec) -> list[str]:
    name = spec.name if not spec.aliases else f"{spec.name}\n[dim]{spec.aliases[0]}[/dim]"
    return [name, str(spec.bits), str(spec.exponent_bits), str(spec.mantissa_bits),
            str(spec.bias), exact_text(spec.max), exact_text(spec.smallest_normal),
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


# -- fmt quantize --------------------------------------------------------------------------

def _count_pct(count: int, fraction: float | None) -> str:
    """'164 (16%)'; a zero count needs no percentage."""
    if fraction is None or count == 0:
        return f"{count:,}"
    return f"{count:,} ({percent_text(fraction)})"


def _scales_text(scales: ScaleStats) -> str:
    if not scales.count:
        return "-"
    low, high = scales.min, scales.max
    span = value_text(low, 4) if low == high else f"{value_text(low, 4)} .. {value_text(high, 4)}"
    distinct, more = scales.distinct, scales.distinct_more_than
    distinct = (f", {distinct:,} distinct" if distinct is not None else
                f", >{more:,} distinct" if more is not None else "")  # None, None: not counted
    nan = f", {scales.nan:,} NaN" if scales.nan else ""
    count = scales.count
    return f"{span}\n{count:,} scale{'' if count == 1 else 's'}{distinct}{nan}"


def _sqnr_text(s: SchemeStats) -> str:
    """'41.2 dB'; '-' where undefined (no signal); inf / -inf as such."""
    if math.isfinite(s.sqnr_db):
        return f"{s.sqnr_db:.1f} dB"
    return "-" if math.isnan(s.sqnr_db) else value_text(s.sqnr_db)


_STAT_ROWS = [
    ("format", lambda s: s.scheme.format.name),
    ("scale rule", lambda s: s.scheme.scale_rule.value + (f" (margin {s.scheme.margin})"
                                                          if s.scheme.margin else "")
     + f", {s.scheme.scale_format.value}"),
    ("flushed to zero", lambda s: _count_pct(s.flushed, s.flushed_fraction)),
    ("median rel error", lambda s: percent_text(s.median_rel_error)),
    ("median outside amax block", lambda s: "-" if s.median_rel_error_outside_amax_block is None
     else percent_text(s.median_rel_error_outside_amax_block)),
    ("p99 rel error", lambda s: percent_text(s.p99_rel_error)),
    ("max abs error", lambda s: value_text(s.max_abs_error, 4)),
    ("RMSE", lambda s: value_text(s.rmse, 4)),
    ("SQNR", _sqnr_text),
    ("bias (mean error)", lambda s: value_text(s.bias, 3)),
    ("|x*scale| > max", lambda s: f"{s.above_max:,}"),
    ("saturated", lambda s: f"{s.saturated:,}"),
    ("overflowed (inf/NaN)", lambda s: f"{s.overflowed:,}"),
    ("NaN produced", lambda s: f"{s.nan_produced:,}"),
    ("scales", lambda s: _scales_text(s.scales)),
]


def user_text(text: object) -> str:
    """A name the user's data chose (a file path, a checkpoint key) as a table shows it:
    control characters, newlines and bidi overrides escaped (no terminal escape, no broken
    line), and more than 240 characters cut in the middle with a count.  Pass it to rich
    inside a ``Text`` so that brackets are not read as markup."""
    return one_line(text, 240)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _tensor_title(tensor: TensorInfo) -> Text:
    name = user_text(tensor.source) + (f" : {user_text(tensor.key)}" if tensor.key else "")
    return Text(f"{name}  ({_shape_text(tensor.shape)}, {tensor.dtype})")  # no markup in names


_ROW_STATS = [  # the per-tensor table's columns: header, cell
    ("flushed", lambda s: percent_text(s.flushed_fraction)),
    ("median rel", lambda s: percent_text(s.median_rel_error)),
    ("p99 rel", lambda s: percent_text(s.p99_rel_error)),
    ("SQNR", _sqnr_text),
    ("max abs err", lambda s: value_text(s.max_abs_error, 3)),
    ("saturated", lambda s: f"{s.saturated:,}"),
]


SPARK = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # eight heights, lowest first


def sparkline(histogram: dict[int, int], width: int = 32) -> str:
    """A histogram over consecutive integers (scale exponents) as one line of bars, one
    character per exponent from the lowest to the highest (several per character past
    ``width``); ``.`` where none fall."""
    if not histogram:
        return ""
    low, high = min(histogram), max(histogram)
    per = -(-(high - low + 1) // width)
    counts = [sum(histogram.get(e, 0) for e in range(start, start + per))
              for start in range(low, high + 1, per)]
    peak = max(counts)
    return "".join(SPARK[max(0, math.ceil(len(SPARK) * n / peak) - 1)] if n else "."
                   for n in counts)


def _exponents_text(histogram: dict[int, int] | None, width: int = 32) -> str:
    """'11..16 ▃█▅▁' (floor(log2) of the scales, their sparkline), '7' for one exponent,
    '-' where unknown."""
    if not histogram:
        return "-"
    low, high = min(histogram), max(histogram)
    if low == high:
        return f"{low}"
    return f"{low}..{high} {sparkline(histogram, width)}"


def _blocks_cell(s: SchemeStats, which: str) -> str:
    """'12 of 640 (1.88%)': blocks that flush / saturate at least one value; '-' where the
    scheme has no blocks (per-tensor, per-column) or they were not counted (CUDA)."""
    b = s.blocks
    if b is None:
        return "-"
    n, fraction = (b.flushing, b.flushing_fraction) if which == "flushing" else \
        (b.saturating, b.saturating_fraction)
    return f"{n:,} of {b.count:,}" + (f" ({percent_text(fraction)})" if n else "")


_BLOCK_ROWS = [
    ("blocks that flush", lambda s: _blocks_cell(s, "flushing")),
    ("blocks that saturate", lambda s: _blocks_cell(s, "saturating")),
    ("log2(scale)", lambda s: _exponents_text(s.scale_log2_histogram)),
]


_BLOCK_HEADERS = ["blocks", "flush", "satur.", "worst", "log2(scale)"]
BLOCKS_CAPTION = ("flush / satur.: blocks with at least one value flushed to zero / "
                  "clipped to max; worst: the largest fraction of a block flushed; "
                  "log2(scale): the scales' exponents, fewest to most blocks (\u2581 .. "
                  "\u2588); --json has their histogram and quantiles")


def _block_cells(s: SchemeStats) -> list[str]:
    b = s.blocks
    worst = dict(b.flushed_fraction_quantiles)["max"]
    return [f"{b.count:,}", percent_text(b.flushing_fraction),
            percent_text(b.saturating_fraction), percent_text(worst),
            _exponents_text(s.scale_log2_histogram, 16)]


def blocks_table(title: str, name_header: str, entries: list) -> HeadedRows | None:
    """The per-block facts of ``entries`` -- (name or None, label, SchemeStats) -- one line
    each, for those whose scheme has blocks (block, tile, row scaling); None if none has."""
    items = [(name, None, [(label, _block_cells(s))]) for name, label, s in entries
             if s.blocks is not None and s.blocks.count]
    if not items:
        return None
    return HeadedRows(title, "n" if name_header == "role" else "scheme", _BLOCK_HEADERS,
                      items, caption=BLOCKS_CAPTION, name_header=name_header)


def prefix_note(prefix: str) -> Text:
    """The line above a table whose names are shown without their shared ``prefix``."""
    return Text(f"Names below are under {user_text(prefix)}\n")


class _Names:
    """The names a report's tables show (``checkpoints.tensor_names``): a tensor's key, or
    ``file:key`` where keys repeat across files; without the prefix every key and role
    begins with (``checkpoints.shared_prefix``), said once by ``note``."""

    def __init__(self, result: QuantizeResult) -> None:
        from fmtcli.inputs.checkpoints import shared_prefix, tensor_names

        infos = [t.tensor for t in result.quantized]
        self.prefix = shared_prefix([t.key for t in infos]
                                    + [g.pattern for g in result.groups]) \
            if len(infos) > 1 else ""
        self.by_name = {t.name: without_prefix(shown, t.key, self.prefix)
                        for t, shown in zip(infos, tensor_names(infos))}

    def __call__(self, t: TensorResult) -> str:
        return user_text(self.by_name[t.tensor.name])

    def role(self, pattern: str) -> str:
        return user_text(without_prefix(pattern, pattern, self.prefix))

    def note(self) -> list:
        return [prefix_note(self.prefix)] if self.prefix else []


def _stat_cells(s: SchemeStats) -> list[str]:
    return [cell(s) for _, cell in _ROW_STATS]


_SHORT_HEADERS = ["flushed", "median", "p99", "SQNR", "max err", "saturated"]
# The summary's roles and worst tensors: the figures that tell tensors apart (the median is
# about the format's half-ulp everywhere; max abs error scales with each tensor's values).
_SUMMARY_ROW = [_ROW_STATS[0], _ROW_STATS[2], _ROW_STATS[3], _ROW_STATS[5]]
_SUMMARY_HEADERS = ["flushed", "p99", "SQNR", "satur."]
_SHORT_CAPTION = "median, p99: relative error; max err: max abs error"


def render_quantize(result: QuantizeResult, per_tensor: bool = False,
                    top: int = SUMMARY_TOP, sort: str = "flushed"):
    """One tensor: statistics down, schemes across (one block per scheme where that does not
    fit).  A handful (or ``per_tensor``): a row per tensor and scheme.  More than
    ``SUMMARY_ABOVE`` tensors: the summary -- a row per role (the chosen scheme; the ``top``
    worst by ``sort`` where there are more), the ``top`` worst tensors (``quantize.ranking``)
    and the total of every scheme; then the per-block facts of the roles whose blocks flush
    or saturate (at most ``top``).  Then the worst blocks where they were asked for.  Names
    as ``_Names`` shows them: ``file:key`` where keys repeat, without a shared prefix."""
    quantized = result.quantized
    first = next((t.schemes[0] for t in quantized if t.schemes), None)
    caption = "x_q = cast(x * scale) / scale; relative errors over nonzero inputs"
    if first is not None:  # skipped tensors (int64 position_ids) may come first
        caption += f"; quantiles to within +{first.rel_error_resolution:.2%}"
    names = _Names(result)
    if len(quantized) == 1 and result.total is None:
        parts = [_render_one_tensor(quantized[0], caption)]
    elif per_tensor or len(quantized) <= SUMMARY_ABOVE:
        parts = names.note() + [_per_tensor_rows(result, names,
                                                 caption + "; " + _SHORT_CAPTION)]
        entries = [(names(t), s.scheme.label, s) for t in quantized for s in t.schemes]
        entries += [("total", s.scheme.label, s) for s in result.total or ()]
        parts.append(blocks_table("Blocks per tensor", "tensor", entries))
    else:
        parts = names.note() + _summary(result, names, top, sort,
                                        caption + "; " + _SHORT_CAPTION)
    if result.worst_blocks:
        parts.append(_worst_blocks(result, names))
    parts = [p for p in parts if p is not None]
    return Group(*parts) if len(parts) > 1 else parts[0]


def _total_items(result: QuantizeResult, named: bool) -> list:
    """The total's rows (HeadedRows items); ``named``: under 'total of N values'."""
    total = result.total or ()
    if not total:
        return []
    return [(f"total of {total[0].count:,} values" if named else None, None,
             [(s.scheme.label, _stat_cells(s)) for s in total])]


def _mean_sqnr_text(s: SchemeStats) -> str:
    mean = s.per_tensor_sqnr.mean if s.per_tensor_sqnr else math.nan
    if math.isfinite(mean):
        return f"{mean:.1f} dB"
    return "-" if math.isnan(mean) else value_text(mean)


def _total_caption(result: QuantizeResult) -> str:
    """What a total's SQNR is, and which tensors it leaves out."""
    left = [t for t in result.quantized if not t.in_total]
    counted = len(result.quantized) - len(left)
    means = ", ".join(f"{_mean_sqnr_text(s)} ({s.scheme.label})" for s in result.total or ())
    text = (f"mean of the {counted:,} tensors' SQNR: {means}; the total's SQNR is over all "
            "its values (energy-weighted: the tensors of the largest values set it)")
    if left:
        kinds = ", ".join(dict.fromkeys((t.tensor.key or t.tensor.source).rsplit(".", 1)[-1]
                                        for t in left))
        text += (f"; {len(left):,} non-weight buffer{'' if len(left) == 1 else 's'} "
                 f"({user_text(kinds)}) not in the total: --include-buffers counts them")
    return text


def _per_tensor_rows(result: QuantizeResult, names: _Names, caption: str) -> HeadedRows:
    items = [(names(t), f"({_shape_text(t.tensor.shape)}"
              + ("" if t.in_total or not result.total else ", buffer") + ")",
              [(s.scheme.label, _stat_cells(s)) for s in t.schemes]) for t in result.quantized]
    items += _total_items(result, named=True)
    if result.total:
        caption += "; " + _total_caption(result)
    return HeadedRows("Quantization error per tensor", "scheme", _SHORT_HEADERS, items,
                      caption=caption)


def _summary(result: QuantizeResult, names: _Names, top: int, sort: str, caption: str
             ) -> list:
    from fmtcli.engine.ranking import blocks_worst_first, worst_tensors

    quantized = result.quantized
    main = result.schemes[-1].label  # the chosen scheme (a comparison puts it last)
    n = len(quantized)
    def cells(s: SchemeStats) -> list[str]:
        return [cell(s) for _, cell in _SUMMARY_ROW]

    groups = list(result.groups)  # whole in the checkpoint's order, or the worst ``top``
    shown = groups if len(groups) <= top else worst_tensors(groups, sort=sort, top=top)
    title = f"By role: {n:,} tensors in {len(groups):,} roles, under {main}"
    parts: list = []
    if shown and (shown is groups or any(g.count > 1 for g in groups)):
        # (ranked roles of one tensor each would repeat the worst tensors below)
        parts.append(HeadedRows(
            title + ("" if shown is groups else f"; the {len(shown):,} worst by {sort}"),
            "n", _SUMMARY_HEADERS, [(names.role(g.pattern), None,
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
            _SUMMARY_HEADERS, [(names(t), None, [(_shape_text(t.tensor.shape),
                                                  cells(t.schemes[-1]))])
                               for t in worst]))
    total = result.total or ()
    counted = sum(t.in_total for t in quantized)
    parts.append(HeadedRows(
        f"Total of {total[0].count:,} values in {counted:,} tensors" if total else "Total",
        "scheme", _SHORT_HEADERS, _total_items(result, named=False),
        caption=caption + "; " + (_total_caption(result) + "; " if total else "")
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


def _worst_blocks(result: QuantizeResult, names: _Names) -> Group:
    """The worst blocks of each scheme: the tensor, the block (row, column of the block
    grid), its amax and scale, values flushed of the block's, and the largest relative
    error in it."""
    by_scheme: dict[str, list] = {}
    for b in result.worst_blocks:
        by_scheme.setdefault(b.scheme, []).append(b)
    parts = []
    for label, blocks in by_scheme.items():
        items: list = []
        for b in blocks:
            row = (f"({b.row:,}, {b.column:,})",
                   [value_text(b.amax, 4), value_text(b.scale, 4), f"{b.flushed:,}/{b.size:,}",
                    percent_text(b.max_rel_error)])
            name = user_text(names.by_name.get(b.tensor, b.tensor))
            if items and items[-1][0] == name:
                items[-1][2].append(row)
            else:
                items.append((name, None, [row]))
        parts.append(HeadedRows(f"Worst {len(blocks):,} blocks under {label}", "block",
                                ["amax", "scale", "flushed", "max rel err"], items,
                                caption="block: (row, column) in the grid of blocks of the "
                                        "tensor's matrix view"))
    return Group(*parts)


def _render_one_tensor(tensor: TensorResult, caption: str) -> Fit:
    rows = _STAT_ROWS + (_BLOCK_ROWS if any(s.blocks for s in tensor.schemes) else [])
    across = Table(title=_tensor_title(tensor.tensor), title_justify="left", caption=caption,
                   caption_justify="left", box=box.SIMPLE_HEAD)
    across.add_column("")
    for stats in tensor.schemes:
        across.add_column(stats.scheme.label, justify="right")
    for label, cell in rows:
        across.add_row(label, *[cell(s) for s in tensor.schemes])
    down = Table(title=_tensor_title(tensor.tensor), title_justify="left", caption=caption,
                 caption_justify="left", box=box.SIMPLE_HEAD)  # one block per scheme
    down.add_column("scheme")
    for label, _ in rows:
        down.add_column(label)
    for stats in tensor.schemes:
        down.add_row(stats.scheme.label, *[cell(stats) for _, cell in rows])
    return Fit(across, fallback=down)


# -- fmt scale-search ----------------------------------------------------------------------

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


# -- fmt loss-scale ------------------------------------------------------------------------

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


# -- fmt check-backends --------------------------------------------------------------------

def _case_value_text(value: float) -> str:
    """A value of ``ML_DTYPES_CASES`` as read by eye: ``2^-127``, ``1.25*2^-127``, ``72``."""
    mantissa, exponent = math.frexp(value) if math.isfinite(value) else (0.0, 0)
    if value > 0 and abs(exponent) > 20 and (2 * mantissa * 64).is_integer():
        head = "" if mantissa == 0.5 else f"{2 * mantissa:g}*"
        return f"{head}2^{exponent - 1}"
    return input_text(value)


def render_environment(env) -> Group:
    """What ``check-backends`` ran against: the installed ml_dtypes' answers on the inputs
    where its releases differ, torch's version, and the compiled kernel of ``quantize``."""
    cases = Table(title=f"ml_dtypes {env.ml_dtypes_version} where its releases differ",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("format", "input", "engine", "ml_dtypes", "ml_dtypes does"):
        cases.add_column(header, no_wrap=True, justify="left" if header in (
            "format", "ml_dtypes does") else "right")
    for case in env.ml_dtypes_cases:
        cases.add_row(case.format, f"{_case_value_text(case.input)} ({case.input_dtype})",
                      _case_value_text(case.engine), _case_value_text(case.backend),
                      Text(case.behaviour, style="green" if case.agrees else "bold red"))
    torch = "not installed" if env.torch_version is None else env.torch_version
    lines = [Text(f"torch: {torch}")]
    if env.kernel is not None:
        lines.append(Text(f"compiled kernel of fmt quantize: {env.kernel.text}",
                          style="" if env.kernel.on else "yellow"))
    return Group(Fit(cases), *lines, Text(""))


def render_conformance(result: ConformanceResult) -> Group | Fit:
    """The environment, then one row per (format, backend): agreement, then each mismatch
    class with an example."""
    table = Table(title="Backends against fmtcli's engine (nearest-even, IEEE overflow)",
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption="kinds: value = a real difference; nan_payload = both NaN, other "
                          "bits; sign_of_zero = +0 against -0", caption_justify="left")
    for header in ("format", "backend", "inputs", "verdict", "class", "kind", "count",
                   "example: input -> engine | backend"):
        table.add_column(header, justify="right" if header in ("inputs", "count") else "left")
    for report in result.reports:
        if report.error:
            verdict = Text(report.error, style="dim" if report.backend == "-" else "bold red")
            table.add_row(report.format, report.backend, f"{report.inputs:,}", verdict)
            table.add_section()
            continue
        verdict = Text("agrees", style="green") if report.agrees else Text(
            f"{report.value_mismatches:,} differ", style="bold red")
        head = [report.format, f"{report.backend} ({report.device})", f"{report.inputs:,}",
                verdict]
        if not report.mismatches:
            table.add_row(*head, "-", "", "", "")
        for i, m in enumerate(report.mismatches):
            given, reference, backend = m.examples[0]
            example = (f"{input_text(given, float32=True)} -> "
                       f"{input_text(reference, float32=True)} | "
                       f"{input_text(backend, float32=True)}")
            cells = head if i == 0 else ["", "", "", ""]
            style = "red" if m.kind == "value" else "dim"
            table.add_row(*cells, m.input_class, Text(m.kind, style=style), f"{m.count:,}",
                          example)
        table.add_section()
    if result.environment is None:
        return Fit(table)
    return Group(render_environment(result.environment), Fit(table))


# -- one entry for every command -----------------------------------------------------------

#: Each result type, by the module and name that define it, and its renderer.  Keyed by name
#: rather than by the class object so that drawing one command's table never imports the
#: other commands' engines (the result's own module is loaded already: it made the result).
RENDERERS = {
    ("fmtcli.numerics.formats", "FormatTable"): render_range,
    ("fmtcli.underflow", "UnderflowResult"): render_underflow,
    ("fmtcli.engine.results", "QuantizeResult"): render_quantize,
    ("fmtcli.scale_search", "ScaleSearchResult"): render_scale_search,
    ("fmtcli.loss_scale", "LossScaleResult"): render_loss_scale,
    ("fmtcli.check_backends", "ConformanceResult"): render_conformance,
    ("fmtcli.attention.report", "AttentionResult"): render_attention,
    ("fmtcli.attention.softmax", "SoftmaxTrace"): render_softmax,
    ("fmtcli.arithmetic.calc", "CalcResult"): render_calc,
    ("fmtcli.arithmetic.summation", "SumResult"): render_sum,
    ("fmtcli.arithmetic.dot", "DotResult"): render_dot,
    ("fmtcli.compare", "CompareResult"): render_compare,
    ("fmtcli.kv", "KvResult"): render_kv,
}


def render(result, **view):
    """The rich renderable of a command's result (``view``: display options that change no
    number, such as the loss-scale histogram)."""
    cls = type(result)
    renderer = RENDERERS.get((cls.__module__, cls.__qualname__))
    if renderer is None:
        raise TypeError(f"no renderer for {cls.__module__}.{cls.__qualname__}")
    return renderer(result, **view)
