"""The tables of ``fmt dot``: what the GEMM multiplied and how it accumulated, then its
errors against float64 of the quantized inputs (the accumulation alone) and of the
unquantized inputs (everything), the emulation beside the GPU's kernels where they ran.
Lays out what ``arithmetic.dot.DotResult`` holds; computes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import percent_text, value_text

if TYPE_CHECKING:
    from fmtcli.arithmetic.dot import DotResult, DotSettings, Errors


def _sci(value: float | None) -> str:
    return value_text(value, 3)


def _scales_text(s: DotSettings) -> str:
    if not s.scaled:
        return "cast, no scale"
    if s.scale_granularity == "tensor":
        return "one scale per tensor"
    if s.scale_granularity == "row":
        return "scales per row of A and column of B"
    size = s.scale_granularity.split(":")[1]
    return f"scales per 1x{size} tile of A and {size}x{size} block of B"


def _accumulator_text(s: DotSettings) -> str:
    if s.accumulator_format is not None:
        how = (f"accumulator: {s.accumulator_format} ({s.accumulation_rounding}), "
               f"{s.group} exact products per step")
    else:
        how = (f"accumulator: {s.accumulator_bits} fraction bits ({s.accumulation_rounding}), "
               f"{s.group} products per aligned step")
    if s.promote_every is None:
        return f"{how}\nno FP32 promotion: the whole K in the accumulator"
    return f"{how}\npartial sums promoted to FP32 every {s.promote_every} of K"


def _header(s: DotSettings) -> Text:
    inputs = ", ".join(s.inputs) if s.inputs else f"random N(0, 1), seed {s.seed}"
    return Text(f"C = A ({s.m}x{s.k}) @ B ({s.k}x{s.n}), {s.format}, {_scales_text(s)}\n"
                f"inputs: {inputs}\n{_accumulator_text(s)}")


def _errors_table(title: str, rows: list[tuple[str, Errors | None]], caption: str | None
                  ) -> Fit:
    def layout(short: bool) -> Table:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                      caption=caption, caption_justify="left")
        headers = ("max rel", "rel Fro", "calc_diff") if short else (
            "max rel error", "rel Fro error", "calc_diff")
        table.add_column("")
        for header in headers:
            table.add_column(header, justify="right")
        for name, e in rows:
            if e is None:
                table.add_row(Text(name, style="dim"), "-", "-", "-")
            else:
                table.add_row(name, _sci(e.max_rel_error), _sci(e.rel_fro_error),
                              _sci(e.calc_diff))
        return table

    return Fit(layout(False), layout(True))


def render_dot(result: DotResult):
    """The header lines, then the two error tables (and the GPU's notes)."""
    runs = result.gpu_runs or ()
    names = {False: "_scaled_mm", True: "_scaled_mm fast accum"}
    gpu_q = [(names[r.fast_accum], r.vs_quantized) for r in runs]
    gpu_u = [(names[r.fast_accum], r.vs_unquantized) for r in runs]
    gpu_e = [(names[r.fast_accum], r.vs_emulated) for r in runs]
    parts: list = [_header(result.settings), Text("")]
    parts.append(_errors_table(
        "Accumulation error (vs float64, quantized inputs)",
        [("emulated", result.vs_quantized), *gpu_q], None))
    parts.append(_errors_table(
        "Total error (vs float64, unquantized inputs)",
        [("exact sums", result.quantization), ("emulated", result.vs_unquantized), *gpu_u],
        None))
    parts.append(Text("max rel = max|C - R| / max|R|; rel Fro = ||C - R||_F / ||R||_F;\n"
                      "calc_diff = 1 - 2 sum(C R) / sum(C^2 + R^2)", style="dim"))
    if runs:
        parts.append(Text(""))
        parts.append(_errors_table(
            f"{result.gpu}, torch {result.torch_version}: vs the emulation",
            gpu_e, None))
        lines = []
        for r in runs:
            if not r.available:
                lines.append(f"{names[r.fast_accum]}: not run: {r.reason}")
            else:
                lines.append(f"{names[r.fast_accum]}: output {r.out_dtype}; "
                             f"{percent_text(r.identical_to_emulated)} of outputs "
                             "equal the emulation's to the bit")
        parts.append(Text("\n".join(lines)))
    return Group(*parts)
