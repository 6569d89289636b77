"""Rich tables for results.  Renderers format and lay out; they compute nothing new."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from .fates import Fate
from .formats import FormatSpec
from .underflow import Stored, UnderflowResult

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


def percent_text(rel: float | None) -> str:
    """A relative error as a percentage with three significant digits."""
    if rel is None or math.isnan(rel):
        return "-"
    if math.isinf(rel):
        return "inf"
    if rel == 0:
        return "0"
    return f"{rel * 100:.3g}%"


def fate_text(fate: Fate) -> Text:
    return Text(fate.value, style=FATE_STYLE[fate])


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


def render_range(specs: Sequence[FormatSpec]) -> Table:
    """One row per format: layout, range, precision and special values."""
    table = Table(title="Number formats", title_justify="left", box=box.SIMPLE_HEAD)
    for header, justify in [("format", "left"), ("bits", "right"), ("E", "right"),
                            ("M", "right"), ("bias", "right"), ("max", "right"),
                            ("smallest normal", "right"), ("smallest subnormal", "right"),
                            ("eps (spacing above 1)", "right"), ("digits", "right"),
                            ("binades", "right"), ("inf", "center"), ("NaN", "center"),
                            ("-0", "center")]:
        table.add_column(header, justify=justify)
    for spec in specs:
        name = spec.name if not spec.aliases else f"{spec.name}\n[dim]{spec.aliases[0]}[/dim]"
        table.add_row(
            name, str(spec.bits), str(spec.exponent_bits), str(spec.mantissa_bits),
            str(spec.bias), exact_text(spec.max), exact_text(spec.smallest_normal),
            exact_text(spec.smallest_subnormal), exact_text(spec.eps),
            f"{spec.decimal_digits:.1f}", f"{spec.dynamic_range_binades:.0f}",
            _yes(spec.has_inf), _yes(spec.has_nan), _yes(spec.has_negative_zero))
        table.add_section()
    return table


def _stored_cells(stored: Stored) -> list:
    return [value_text(stored.stored), percent_text(stored.rel_error), fate_text(stored.fate)]


def render_underflow(result: UnderflowResult) -> Table:
    """Rows per (value, format[, scale]); the scaled columns appear only with --scale."""
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
        cells = [value_text(row.value, 6) if first else "", row.format, *_stored_cells(row.plain)]
        if scaled:
            store = row.scaled_store
            cells += [value_text(row.scale, 6), value_text(row.scaled), value_text(store.stored),
                      fate_text(store.fate), value_text(row.recovered),
                      percent_text(row.recovered_rel_error),
                      Text("yes", "green") if row.survives else Text("no", "bold red")]
        table.add_row(*cells)
    return table


# -- fmt quantize --------------------------------------------------------------------------

def _count_pct(count: int, fraction: float | None) -> str:
    if fraction is None:
        return f"{count:,}"
    return f"{count:,} ({percent_text(fraction)})"


def _scales_text(scales: dict) -> str:
    if not scales["count"]:
        return "-"
    low, high = scales["min"], scales["max"]
    span = value_text(low, 4) if low == high else f"{value_text(low, 4)} .. {value_text(high, 4)}"
    distinct = scales["distinct"]
    distinct = f">{scales['distinct_more_than']:,}" if distinct is None else f"{distinct:,}"
    nan = f", {scales['nan']:,} NaN" if scales["nan"] else ""
    return f"{span}\n{scales['count']:,} scales, {distinct} distinct{nan}"


_STAT_ROWS = [
    ("format", lambda s: s.scheme["format"]),
    ("scale rule", lambda s: s.scheme["scale_rule"] + (f" (margin {s.scheme['margin']})"
                                                       if s.scheme["margin"] else "")
     + f", {s.scheme['scale_format']}"),
    ("flushed to zero", lambda s: _count_pct(s.flushed, s.flushed_fraction)),
    ("median rel error", lambda s: percent_text(s.median_rel_error)),
    ("p99 rel error", lambda s: percent_text(s.p99_rel_error)),
    ("max abs error", lambda s: value_text(s.max_abs_error, 4)),
    ("RMSE", lambda s: value_text(s.rmse, 4)),
    ("SQNR", lambda s: f"{s.sqnr_db:.1f} dB" if math.isfinite(s.sqnr_db)
     else ("-" if math.isnan(s.sqnr_db) else value_text(s.sqnr_db))),
    ("bias (mean error)", lambda s: value_text(s.bias, 3)),
    ("saturated", lambda s: f"{s.saturated:,}"),
    ("overflowed (inf/NaN)", lambda s: f"{s.overflowed:,}"),
    ("NaN produced", lambda s: f"{s.nan_produced:,}"),
    ("scales", lambda s: _scales_text(s.scales)),
]


def _tensor_title(tensor: dict) -> str:
    name = tensor["source"] + (f" : {tensor['key']}" if tensor.get("key") else "")
    shape = "x".join(str(d) for d in tensor["shape"]) or "scalar"
    return f"{name}  ({shape}, {tensor['dtype']})"


def render_quantize(result) -> Table:
    """One tensor: statistics down, schemes across.  Several: a row per tensor and scheme."""
    resolution = f"quantiles to within +{result.tensors[0].schemes[0].rel_error_resolution:.2%}" \
        if result.quantized and result.quantized[0].schemes else ""
    caption = f"x_q = cast(x * scale) / scale; relative errors over nonzero inputs; {resolution}"
    if len(result.quantized) == 1 and result.total is None:
        tensor = result.quantized[0]
        table = Table(title=_tensor_title(tensor.tensor), title_justify="left",
                      caption=caption, caption_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("")
        for stats in tensor.schemes:
            table.add_column(stats.scheme["label"], justify="right")
        for label, cell in _STAT_ROWS:
            table.add_row(label, *[cell(s) for s in tensor.schemes])
        _add_skipped_caption(table, result)
        return table
    table = Table(title="Quantization error per tensor", title_justify="left", caption=caption,
                  caption_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("tensor", overflow="fold", min_width=14)
    table.add_column("shape", no_wrap=True)
    table.add_column("scheme", min_width=12)
    for header in ("flushed", "median rel", "p99 rel", "SQNR", "max abs err", "saturated"):
        table.add_column(header, justify="right", no_wrap=True)

    def add(name: str, shape: str, stats) -> None:
        for i, s in enumerate(stats):
            table.add_row(name if i == 0 else "", shape if i == 0 else "", s.scheme["label"],
                          percent_text(s.flushed_fraction), percent_text(s.median_rel_error),
                          percent_text(s.p99_rel_error), _STAT_ROWS[7][1](s),
                          value_text(s.max_abs_error, 3), f"{s.saturated:,}")
        table.add_section()

    for tensor in result.tensors:
        t = tensor.tensor
        name = t["key"] or t["source"]
        shape = "x".join(str(d) for d in t["shape"])
        if not tensor.skipped:
            add(name, shape, tensor.schemes)
    if result.total:
        add("[bold]total[/bold]", f"{result.total[0].count:,} values", result.total)
    _add_skipped_caption(table, result)
    return table


def _add_skipped_caption(table: Table, result) -> None:
    skipped = [t for t in result.tensors if t.skipped]
    if skipped:
        names = ", ".join(f"{t.tensor['key'] or t.tensor['source']} ({t.skipped})" for t in skipped)
        table.caption = f"{table.caption}\nskipped: {names}"
