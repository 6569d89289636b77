"""The table of ``fmt softmax``: the online softmax's trace, one row per block, and the final
output beside the exact one.  Lays out what ``attention.softmax.SoftmaxTrace`` holds; computes
nothing.

Cells of the trace show 4 significant digits (as the article writes 18.81 and 22.14); the
final output shows every digit its format holds, the exact reference two more.  A long trace
shows its first and last blocks (``all_blocks``: every block); vectors show one component.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit, plain_rows
from fmtcli.render.numbers import value_text

if TYPE_CHECKING:
    from fmtcli.attention.softmax import SoftmaxBlock, SoftmaxTrace

#: Blocks shown at each end of a long trace (without --all-blocks).
HEAD_BLOCKS = 8
#: Scores listed in a block's row; larger blocks show only their max.
LISTED_SCORES = 4
TRACE_DIGITS = 4


def _digits(precision_bits: int) -> int:
    """Significant digits that tell every value of a p-bit significand apart."""
    return min(17, math.ceil(precision_bits * math.log10(2)) + 1)


def _cell(value: float | None) -> str:
    return "-" if value is None else value_text(value, TRACE_DIGITS)


def _component(value, worst: int = 0):
    return value[worst] if isinstance(value, tuple) else value


def _headers(result: SoftmaxTrace, scores: bool, one_line: bool = False) -> list[str]:
    if one_line:  # the plain layout of thousands of rows: one line each
        acc, out = ("acc", "acc / l") if result.dim is None else ("acc[0]", "output[0]")
        return ["block", "block max", "max m", "rescale", "sum l", acc, out]
    acc, out = ("weighted\nsum acc", "output\nacc / l") if result.dim is None else \
        ("weighted\nsum acc[0]", "output[0]\nacc / l")
    return (["block"] + (["scores"] if scores else [])
            + ["block\nmax", "running\nmax m", "rescale", "running\nsum l", acc, out])


def _row(b: SoftmaxBlock, scores: bool) -> list[str]:
    listed = [", ".join(_cell(s) for s in b.scores)] if scores else []
    return [str(b.block), *listed, _cell(b.block_max), _cell(b.running_max), _cell(b.rescale),
            _cell(b.running_sum), _cell(_component(b.weighted_sum)),
            _cell(_component(b.output))]


def _caption(result: SoftmaxTrace, hidden: int, scores: bool) -> str:
    lines = ["m: the largest score so far; rescale: exp(m_old-m_new), what l and acc were "
             "multiplied by (1: the max did not change; -: nothing yet); l: sum of exp(s-m); "
             "acc: sum of exp(s-m)*v"
             + ("" if result.dim is None else f" (component 0 of {result.dim}; --json has all)"),
             f"arithmetic: {result.arithmetic}"]
    if not scores:
        lines.append("each block's scores: in --json")
    if hidden:
        lines.append(f"{hidden:,} blocks not shown: --all-blocks shows every block, --json "
                     "lists them")
    return "\n".join(lines)


def _trace_table(result: SoftmaxTrace, scores: bool, all_blocks: bool,
                 plain: bool = False) -> Table:
    """The trace; ``plain``: for thousands of rows, one-line headers and neither title nor
    caption (the caller prints them above and below), so ``Fit`` draws it line by
    line (``plaintable``)."""
    blocks, hidden = _shown_blocks(result, all_blocks)
    table = Table(title=None if plain else _title(result), title_justify="left",
                  box=box.SIMPLE_HEAD, caption=None if plain else _caption(result, hidden, scores),
                  caption_justify="left")
    for header in _headers(result, scores, one_line=plain):
        table.add_column(header, justify="left" if header == "scores" else "right",
                         no_wrap=header != "scores")
    for b in blocks:
        if b is None:
            table.add_row("...", *[""] * (len(table.columns) - 1))
        else:
            table.add_row(*_row(b, scores))
    return table


def _title(result: SoftmaxTrace) -> str:
    keys = f"{result.keys:,} key{'' if result.keys == 1 else 's'}"
    shape = "" if result.dim is None else f", values of {result.dim:,} components"
    return (f"Online softmax of {result.source}: {keys}{shape}, blocks of {result.block:,}, "
            f"in {result.format}")


def _shown_blocks(result: SoftmaxTrace, all_blocks: bool) -> tuple[list, int]:
    """The blocks in the table (None: the row of dots between the ends) and how many are
    not shown."""
    blocks = list(result.blocks)
    if all_blocks or len(blocks) <= 2 * HEAD_BLOCKS:
        return blocks, 0
    return [*blocks[:HEAD_BLOCKS], None, *blocks[-HEAD_BLOCKS:]], len(blocks) - 2 * HEAD_BLOCKS


def _summary(result: SoftmaxTrace) -> Table:
    """The final output beside the exact one, their difference, and the running sum's."""
    digits = _digits(result.precision_bits)
    exact_digits = min(17, digits + 2)
    worst = result.worst
    index = "" if result.dim is None else f"[{worst}]"
    text = value_text
    rows = [(f"output{index}", text(_component(result.output, worst), digits),
             f"{result.format} (eps {text(result.eps, 2)}), after the last block"),
            (f"exact{index}", text(_component(result.reference, worst), exact_digits),
             "in extended precision"
             + ("" if result.dim is None else
                f"; of {result.dim:,} components, the largest error")),
            ("abs error", text(result.max_abs_error, 2),
             f"relative {text(result.rel_error, 2)} (to the average of |v|)"),
            ("running sum l", text(result.running_sum, digits),
             f"exact {text(result.sum_reference, exact_digits)}, relative error "
             f"{text(result.sum_rel_error, 2)}")]
    if result.inputs_rounded:
        rows.append(("inputs", f"{result.inputs_rounded:,} rounded",
                     f"to {result.format}: the exact answer moved "
                     f"{text(result.input_rounding_error, 2)}"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(overflow="fold")  # folded, never cut, on a very narrow terminal
    grid.add_column(justify="right", overflow="fold")
    grid.add_column(overflow="fold")  # the notes wrap at spaces
    for row in rows:
        grid.add_row(*row)
    return grid


def render_softmax(result: SoftmaxTrace, all_blocks: bool = False) -> Group:
    """The trace (with each block's scores where blocks are small, else without), then the
    final output, the exact reference and their difference."""
    rows, hidden = _shown_blocks(result, all_blocks)
    if len(rows) > plain_rows():  # --all-blocks of thousands: drawn line by line
        table = _trace_table(result, False, all_blocks, plain=True)
        return Group(Text(_title(result)), Fit(table),
                     Text(_caption(result, hidden, False)), Text(""), _summary(result))
    small = all(len(b.scores) <= LISTED_SCORES for b in result.blocks)
    layouts = [_trace_table(result, True, all_blocks)] if small else []
    layouts.append(_trace_table(result, False, all_blocks))
    return Group(Fit(*layouts), Text(""), _summary(result))
