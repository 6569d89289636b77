"""The cells of ``fmt quantize``'s tables, shared by its views (one tensor, a row per tensor,
the summary): each statistic of a ``SchemeStats`` as text, the rows and headers of each
view, the per-block facts, the total, and the names tensors are shown by.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.text import Text

from fmtcli.inputs.checkpoints import without_prefix
from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows
from fmtcli.render.widgets import exponents_text, prefix_note, shape_text, user_text

if TYPE_CHECKING:
    from fmtcli.engine.results import QuantizeResult, ScaleStats, SchemeStats, TensorResult
    from fmtcli.inputs.tensors import TensorInfo


def _count_pct(count: int, fraction: float | None) -> str:
    """'164 (16%)'; a zero count needs no percentage."""
    if fraction is None or count == 0:
        return f"{count:,}"
    return f"{count:,} ({percent_text(fraction)})"


def scales_text(scales: ScaleStats) -> str:
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


STAT_ROWS = [
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
    ("scales", lambda s: scales_text(s.scales)),
]


def tensor_title(tensor: TensorInfo) -> Text:
    name = user_text(tensor.source) + (f" : {user_text(tensor.key)}" if tensor.key else "")
    return Text(f"{name}  ({shape_text(tensor.shape)}, {tensor.dtype})")  # no markup in names


_ROW_STATS = [  # the per-tensor table's columns: header, cell
    ("flushed", lambda s: percent_text(s.flushed_fraction)),
    ("median rel", lambda s: percent_text(s.median_rel_error)),
    ("p99 rel", lambda s: percent_text(s.p99_rel_error)),
    ("SQNR", _sqnr_text),
    ("max abs err", lambda s: value_text(s.max_abs_error, 3)),
    ("saturated", lambda s: f"{s.saturated:,}"),
]


def _blocks_cell(s: SchemeStats, which: str) -> str:
    """'12 of 640 (1.88%)': blocks that flush / saturate at least one value; '-' where the
    scheme has no blocks (per-tensor, per-column) or they were not counted (CUDA)."""
    b = s.blocks
    if b is None:
        return "-"
    n, fraction = (b.flushing, b.flushing_fraction) if which == "flushing" else \
        (b.saturating, b.saturating_fraction)
    return f"{n:,} of {b.count:,}" + (f" ({percent_text(fraction)})" if n else "")


BLOCK_ROWS = [
    ("blocks that flush", lambda s: _blocks_cell(s, "flushing")),
    ("blocks that saturate", lambda s: _blocks_cell(s, "saturating")),
    ("log2(scale)", lambda s: exponents_text(s.scale_log2_histogram)),
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
            exponents_text(s.scale_log2_histogram, 16)]


def blocks_table(title: str, name_header: str, entries: list) -> HeadedRows | None:
    """The per-block facts of ``entries`` -- (name or None, label, SchemeStats) -- one line
    each, for those whose scheme has blocks (block, tile, row scaling); None if none has."""
    items = [(name, None, [(label, _block_cells(s))]) for name, label, s in entries
             if s.blocks is not None and s.blocks.count]
    if not items:
        return None
    return HeadedRows(title, "n" if name_header == "role" else "scheme", _BLOCK_HEADERS,
                      items, caption=BLOCKS_CAPTION, name_header=name_header)


class Names:
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


def stat_cells(s: SchemeStats) -> list[str]:
    return [cell(s) for _, cell in _ROW_STATS]


SHORT_HEADERS = ["flushed", "median", "p99", "SQNR", "max err", "saturated"]
# The summary's roles and worst tensors: the figures that tell tensors apart (the median is
# about the format's half-ulp everywhere; max abs error scales with each tensor's values).
SUMMARY_ROW = [_ROW_STATS[0], _ROW_STATS[2], _ROW_STATS[3], _ROW_STATS[5]]
SUMMARY_HEADERS = ["flushed", "p99", "SQNR", "satur."]
SHORT_CAPTION = "median, p99: relative error; max err: max abs error"


def total_items(result: QuantizeResult, named: bool) -> list:
    """The total's rows (HeadedRows items); ``named``: under 'total of N values'."""
    total = result.total or ()
    if not total:
        return []
    return [(f"total of {total[0].count:,} values" if named else None, None,
             [(s.scheme.label, stat_cells(s)) for s in total])]


def _mean_sqnr_text(s: SchemeStats) -> str:
    mean = s.per_tensor_sqnr.mean if s.per_tensor_sqnr else math.nan
    if math.isfinite(mean):
        return f"{mean:.1f} dB"
    return "-" if math.isnan(mean) else value_text(mean)


def total_caption(result: QuantizeResult) -> str:
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
