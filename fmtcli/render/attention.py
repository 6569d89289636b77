"""The tables of ``fmt attention``: accuracy of each method against float64, the IO model
(forward, and forward + backward beside the paper's Fig. 2 where the shape is the paper's),
and torch's SDPA backends timed.  Lays out what ``attention.report.AttentionResult`` holds;
computes nothing but ratios of figures it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import value_text

if TYPE_CHECKING:
    from fmtcli.attention.io_model import IoModel
    from fmtcli.attention.report import AttentionResult, AttentionSettings


def _sci(value: float | None) -> str:
    """An error figure to 3 significant digits (inf, NaN and None as such)."""
    return value_text(value, 3)


def _si(value: float, unit: str) -> str:
    """1.64e9 B -> '1.64 GB' (powers of 1000, as the paper's table writes GB and GFLOPs;
    from 1e21 on, a power of ten: '2.03e+31 B', as narrow as the headers)."""
    if abs(value) >= 1e21:
        return f"{value:.3g} {unit}"
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                           (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _ratio(a: float, b: float) -> str:
    """a / b as '1.13x', or as '1/9.16' below 1 (nine times less reads better so)."""
    r = a / b
    return f"{r:.2f}x" if r >= 0.995 else f"1/{1 / r:.2f}"


def _shape_line(s: AttentionSettings, io_only: bool) -> str:
    keys = f", {s.seq_k} keys" if s.seq_k != s.seq else ""
    inputs = ", ".join(s.inputs) if s.inputs else (
        f"random N(0, 1), seed {s.seed}"
        + (f", outliers {s.outliers:g} of entries (+N(0, 100))" if s.outliers else ""))
    shape = f"batch {s.batch} x heads {s.heads} x seq {s.seq} x dim {s.dim}{keys}"
    if io_only:
        return f"{shape}: the IO model alone (no tensors made)"
    return f"{shape}{', causal' if s.causal else ''}; inputs: {inputs}"


def _accuracy(result: AttentionResult) -> Table:
    s = result.settings
    io = result.io
    narrow = io.element_bits <= 8  # scaled, as FP8 kernels do (attention.accuracy)
    how = (f"{'one scale per tensor' if s.scale_granularity == 'tensor' else 'scales per block'}"
           f" (Q: {io.block_q} rows, K/V: {io.block_k} rows)" if narrow else "cast, no scale")
    title = (f"Attention in {s.format} against float64: {how}"
             f"{', Hadamard on Q, K' if s.hadamard else ''}")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("method", "RMSE", "max abs error", "max rel error"):
        table.add_column(header, justify="left" if header == "method" else "right")
    for row in result.accuracy:
        name = "standard" if row.method == "standard" else "flash (online softmax)"
        table.add_row(name, _sci(row.rmse), _sci(row.max_abs_error), _sci(row.max_rel_error))
    return table


def _io(io: IoModel) -> Table:
    bits = io.element_bits
    title = (f"IO model (Dao et al. 2022, Theorem 2), {bits}-bit elements: SRAM M = "
             f"{io.sram_bytes:,} B ({io.sram_source}), blocks B_r {io.block_q}, "
             f"B_c {io.block_k}")
    caption = ("HBM traffic = reads + writes of the paper's algorithms; FLOPs: a "
               "multiply-add is 2. Forward + backward: FlashAttention recomputes S and P.")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, caption=caption,
                  caption_justify="left")
    for header in ("", "HBM forward", "FLOPs forward", "HBM fwd+bwd", "FLOPs fwd+bwd"):
        table.add_column(header, justify="left" if header == "" else "right")
    table.add_row("standard", _si(io.standard_bytes, "B"), _si(io.standard_flops, "FLOP"),
                  _si(io.standard_bytes_fwd_bwd, "B"), _si(io.standard_flops_fwd_bwd, "FLOP"))
    table.add_row("flash", _si(io.flash_bytes, "B"), _si(io.flash_flops, "FLOP"),
                  _si(io.flash_bytes_fwd_bwd, "B"), _si(io.flash_flops_fwd_bwd, "FLOP"))
    table.add_row(Text("flash / standard", style="dim"),
                  _ratio(io.flash_bytes, io.standard_bytes),
                  _ratio(io.flash_flops, io.standard_flops),
                  _ratio(io.flash_bytes_fwd_bwd, io.standard_bytes_fwd_bwd),
                  _ratio(io.flash_flops_fwd_bwd, io.standard_flops_fwd_bwd))
    if io.is_paper_shape:
        from fmtcli.attention.io_model import PAPER_FIGURES as p

        table.add_section()
        table.add_row("paper, standard", "", "", _si(p["standard_bytes"], "B"),
                      _si(p["standard_flops"], "FLOP"))
        table.add_row("paper, flash", "", "", _si(p["flash_bytes"], "B"),
                      _si(p["flash_flops"], "FLOP"))
        table.add_row(Text("flash / standard", style="dim"), "", "",
                      _ratio(p["flash_bytes"], p["standard_bytes"]),
                      _ratio(p["flash_flops"], p["standard_flops"]))
    return table


def _timing(result: AttentionResult) -> list:
    s = result.settings
    rows = result.timing or ()
    title = f"torch scaled_dot_product_attention on {s.gpu}, {s.format}, one forward call"

    def layout(wide: bool) -> Table:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        headers = ["backend", "ms", "TFLOP/s", "peak memory", "RMSE"]
        if wide:
            headers += ["max abs error", "max rel error"]
        for header in headers:
            table.add_column(header, justify="left" if header == "backend" else "right")
        for row in rows:
            if not row.available:  # why: in the notes below the table
                table.add_row(*(Text(c, style="dim") for c in [row.backend]
                                + ["-"] * (len(headers) - 1)))
                continue
            cells = [row.backend, f"{row.ms:.3f}", f"{row.tflops:.1f}",
                     _si(row.peak_bytes, "B"), _sci(row.rmse)]
            if wide:
                cells += [_sci(row.max_abs_error), _sci(row.max_rel_error)]
            table.add_row(*cells)
        return table

    notes = [f"{row.backend}: not available: {row.reason}" for row in rows
             if not row.available]
    parts = [Text(""), Fit(layout(True), layout(False))]
    if notes:
        parts.append(Text("\n".join(notes), style="dim"))
    return parts


def render_attention(result: AttentionResult):
    """The whole report: shape line, accuracy (unless the IO model alone), IO model, timing."""
    parts: list = [Text(_shape_line(result.settings, result.io_only))]
    parts.append(Text(""))
    if not result.io_only:  # the table ends in a blank line of its own
        parts.append(Fit(_accuracy(result)))
    parts.append(Fit(_io(result.io)))
    if result.timing is not None:
        parts += _timing(result)
    return Group(*parts)
