"""The tables of ``fmt quantize`` (``engine.results.QuantizeResult``): one tensor, a row per
tensor and scheme, or (more than ``SUMMARY_ABOVE`` tensors) the summary of
``quantize_summary``; then the worst blocks where they were asked for.  Computes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table

from fmtcli.base.choices import SUMMARY_ABOVE, SUMMARY_TOP
from fmtcli.render.fit import Fit
from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows
from fmtcli.render.quantize_cells import (
    BLOCK_ROWS,
    SHORT_CAPTION,
    SHORT_HEADERS,
    STAT_ROWS,
    Names,
    blocks_table,
    stat_cells,
    tensor_title,
    total_caption,
    total_items,
)
from fmtcli.render.quantize_summary import summary
from fmtcli.render.widgets import shape_text, user_text

if TYPE_CHECKING:
    from fmtcli.engine.results import QuantizeResult, TensorResult


def render_quantize(result: QuantizeResult, per_tensor: bool = False,
                    top: int = SUMMARY_TOP, sort: str = "flushed"):
    """One tensor: statistics down, schemes across (one block per scheme where that does not
    fit).  A handful (or ``per_tensor``): a row per tensor and scheme.  More than
    ``SUMMARY_ABOVE`` tensors: the summary -- a row per role (the chosen scheme; the ``top``
    worst by ``sort`` where there are more), the ``top`` worst tensors (``engine.ranking``)
    and the total of every scheme; then the per-block facts of the roles whose blocks flush
    or saturate (at most ``top``).  Then the worst blocks where they were asked for.  Names
    as ``Names`` shows them: ``file:key`` where keys repeat, without a shared prefix."""
    quantized = result.quantized
    first = next((t.schemes[0] for t in quantized if t.schemes), None)
    caption = "x_q = cast(x * scale) / scale; relative errors over nonzero inputs"
    if first is not None:  # skipped tensors (int64 position_ids) may come first
        caption += f"; quantiles to within +{first.rel_error_resolution:.2%}"
    names = Names(result)
    if len(quantized) == 1 and result.total is None:
        parts = [_render_one_tensor(quantized[0], caption)]
    elif per_tensor or len(quantized) <= SUMMARY_ABOVE:
        parts = names.note() + [_per_tensor_rows(result, names,
                                                 caption + "; " + SHORT_CAPTION)]
        entries = [(names(t), s.scheme.label, s) for t in quantized for s in t.schemes]
        entries += [("total", s.scheme.label, s) for s in result.total or ()]
        parts.append(blocks_table("Blocks per tensor", "tensor", entries))
    else:
        parts = names.note() + summary(result, names, top, sort,
                                       caption + "; " + SHORT_CAPTION)
    if result.worst_blocks:
        parts.append(_worst_blocks(result, names))
    parts = [p for p in parts if p is not None]
    return Group(*parts) if len(parts) > 1 else parts[0]


def _per_tensor_rows(result: QuantizeResult, names: Names, caption: str) -> HeadedRows:
    items = [(names(t), f"({shape_text(t.tensor.shape)}"
              + ("" if t.in_total or not result.total else ", buffer") + ")",
              [(s.scheme.label, stat_cells(s)) for s in t.schemes]) for t in result.quantized]
    items += total_items(result, named=True)
    if result.total:
        caption += "; " + total_caption(result)
    return HeadedRows("Quantization error per tensor", "scheme", SHORT_HEADERS, items,
                      caption=caption)


def _worst_blocks(result: QuantizeResult, names: Names) -> Group:
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
    rows = STAT_ROWS + (BLOCK_ROWS if any(s.blocks for s in tensor.schemes) else [])
    across = Table(title=tensor_title(tensor.tensor), title_justify="left", caption=caption,
                   caption_justify="left", box=box.SIMPLE_HEAD)
    across.add_column("")
    for stats in tensor.schemes:
        across.add_column(stats.scheme.label, justify="right")
    for label, cell in rows:
        across.add_row(label, *[cell(s) for s in tensor.schemes])
    down = Table(title=tensor_title(tensor.tensor), title_justify="left", caption=caption,
                 caption_justify="left", box=box.SIMPLE_HEAD)  # one block per scheme
    down.add_column("scheme")
    for label, _ in rows:
        down.add_column(label)
    for stats in tensor.schemes:
        down.add_row(stats.scheme.label, *[cell(stats) for _, cell in rows])
    return Fit(across, fallback=down)
