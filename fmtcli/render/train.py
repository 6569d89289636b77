"""The tables of ``fmt train`` (``train.results.TrainResult``): the loss curves side by
side, each recipe's final loss and gap to the BF16 baseline beside the baseline's own
seed-to-seed spread, and what each recipe's casts did to every layer's tensors.

The loss table has one column per recipe; where the console is too narrow for all of them
it is split into several tables of the same rows (each with the step column), and a run
of many logged steps shows every k-th row (the last always; ``--json`` holds them all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows

if TYPE_CHECKING:
    from fmtcli.train.results import RecipeRun, TensorRecord, TrainResult

#: The most rows of the loss table: above it every k-th logged step is shown.
LOSS_ROWS = 24
#: DeepSeek-V3 (2024, section 3.3.1 / appendix B.1): the relative loss error of its FP8
#: training against BF16 stays below 0.25%.
DEEPSEEK_GAP = 0.0025
#: The widths of a loss table's cells beside their headers: a loss as 4.5802.
LOSS_CELL = 6
PADDING = 2


def render_train(result: TrainResult):
    """The loss table(s), the summary of gaps and the per-layer tensor statistics."""
    parts: list = [LossTables(result), Text(""), _summary(result), _summary_lines(result)]
    for run in result.recipes:
        parts += [Text(""), _tensors(run, result.settings.steps)]
    if result.captured:
        parts += [Text(""), Text("captured: " + ", ".join(result.captured))]
    if result.notes:
        parts += [Text(""), Text("\n".join(f"Note: {n}" for n in result.notes))]
    return Group(*parts)


def loss_text(value: float | None) -> str:
    return "NaN/inf" if value is None else f"{value:.4f}"


def shown_steps(steps: list[int], most: int = LOSS_ROWS) -> list[int]:
    """Every k-th of the logged steps, k the smallest that keeps at most ``most`` rows, and
    the last step always."""
    if len(steps) <= most:
        return steps
    k = -(-len(steps) // (most - 1))
    kept = steps[k - 1::k]
    return kept if kept[-1] == steps[-1] else kept + [steps[-1]]


class LossTables:
    """The loss curves: one row per shown step, one column per recipe, as many recipes per
    table as the console's width holds."""

    def __init__(self, result: TrainResult) -> None:
        self.result = result
        logged = sorted({s for run in result.recipes for s, _ in run.losses})
        self.steps = shown_steps(logged)
        self.thinned = len(self.steps) < len(logged)

    def _chunks(self, width: int) -> list[list[RecipeRun]]:
        """The recipes in as few tables as fit ``width``, as evenly shared as fits."""
        step = max(cell_len("step"), len(str(self.steps[-1] if self.steps else 0)))
        runs = list(self.result.recipes)
        cells = [max(LOSS_CELL, len("NaN/inf"), cell_len(run.name)) + PADDING for run in runs]
        chunks: list[list[int]] = [[]]
        used = step + PADDING
        for i, cell in enumerate(cells):
            if chunks[-1] and used + cell > width:
                chunks.append([])
                used = step + PADDING
            chunks[-1].append(i)
            used += cell
        per = -(-len(runs) // len(chunks))
        even = [list(range(i, min(i + per, len(runs)))) for i in range(0, len(runs), per)]
        if len(even) == len(chunks) and all(
                step + PADDING + sum(cells[i] for i in chunk) <= width for chunk in even):
            chunks = even
        return [[runs[i] for i in chunk] for chunk in chunks]

    def _table(self, runs: list[RecipeRun], title: str | None) -> Table:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                      padding=(0, 1), collapse_padding=True)
        table.add_column("step", justify="right", no_wrap=True)
        for run in runs:
            table.add_column(run.name, justify="right", no_wrap=True)
        by_run = [dict(run.losses) for run in runs]
        for step in self.steps:
            cells = []
            for run, losses in zip(runs, by_run):
                if step in losses:
                    cells.append(Text(loss_text(losses[step]),
                                      style="red" if step == run.diverged_at else ""))
                else:
                    cells.append("")
            table.add_row(str(step), *cells)
        return table

    def __rich_console__(self, console, options):
        s = self.result.settings
        title = (f"Training loss (mean of each {s.log_every} steps), {s.layers} layers of "
                 f"width {s.width}, {s.batch} x {s.seq} bytes a step, seed {s.seed}")
        if self.thinned:
            title += "; every k-th logged step shown (--json has all)"
        yield Text(title, style="bold")
        for runs in self._chunks(options.max_width):
            yield Fit(self._table(runs, None))

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement(min(20, options.max_width), options.max_width)


def _gap_text(run: RecipeRun) -> str:
    if run.gap_to_baseline is None:
        return "-"
    text = percent_text(abs(run.gap_to_baseline))
    return ("-" if run.gap_to_baseline < 0 else "+") + text


def _summary(result: TrainResult) -> Fit:
    base = result.baseline.name
    table = Table(title=f"Final loss and the gap to {base}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for header in ("recipe", "final loss", f"gap to {base}", "val loss", "diverged at",
                   "s/step"):
        table.add_column(header, justify="left" if header == "recipe" else "right",
                         no_wrap=header != "recipe")
    for run in result.recipes:
        diverged = "-" if run.diverged_at is None else f"step {run.diverged_at}"
        gap = "baseline" if run is result.baseline else _gap_text(run)
        over = run.gap_to_baseline is not None and result.baseline_spread is not None \
            and abs(run.gap_to_baseline) > result.baseline_spread
        table.add_row(run.name, loss_text(run.final_loss) if run.final_loss is not None
                      or run.diverged_at is None else "-",
                      Text(gap, style="yellow" if over else ""),
                      value_text(run.val_loss, 4), Text(diverged, style="red"
                                                        if run.diverged_at else ""),
                      f"{run.step_seconds:.3f}")
    return Fit(table)


def _summary_lines(result: TrainResult) -> Text:
    seeds = [v for v in result.baseline_seeds]
    base = result.baseline.name
    if result.baseline_spread is not None:
        lines = [f"{base} seed-to-seed spread: {percent_text(result.baseline_spread)} "
                 f"((max - min) / mean of {len(seeds)} seeds' final losses); a gap smaller "
                 "than this is within the noise"]
    else:
        lines = [f"{base} seed-to-seed spread: not measured (one seed; --seeds 3 "
                 "measures it)"]
    lines.append(f"DeepSeek-V3 reports a relative loss gap below "
                 f"{percent_text(DEEPSEEK_GAP)} for its FP8 training against BF16")
    for run in result.recipes:
        if run.diverged_at is not None:
            lines.append(f"{run.name} diverged at step {run.diverged_at}: "
                         f"{run.divergence_reason}")
    return Text("\n".join(lines))


def short_text(value: float) -> str:
    """Three significant digits, the exponent without its zeros and plus: 2.2e-5, 5.12e4."""
    text = value_text(value, 3)
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text


def _range_text(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "-"
    if low == high:
        return short_text(low)
    return f"{short_text(low)}..{short_text(high)}"


def _share(value: float | None) -> str:
    return percent_text(value) if value is not None else "-"


def _tensors(run: RecipeRun, steps: int):
    """Per layer (a name above its rows) and role: what the casts did over the steps; for
    gradients cast to float16, a table of their underflow beside it."""
    done = f"{run.steps_done} steps" if run.steps_done != steps else f"{steps} steps"
    title = f"{run.name}: {run.description}; the GEMM inputs over {done}"
    if all(t.format == "float32" for t in run.tensors):
        return Text(f"{run.name}: no casts (float32 GEMM inputs)")
    headers = ["format", "flushed", "saturated", "amax", "scale"]
    order: list[str] = []
    rows: dict[str, list] = {}
    for record in run.tensors:
        if record.layer not in rows:
            order.append(record.layer)
            rows[record.layer] = []
        rows[record.layer].append((record.role, _cells(record)))
    items = [(layer, None, rows[layer]) for layer in order]
    table = HeadedRows(title, "role", headers, items, name_header="layer")
    fp16 = [t for t in run.tensors if t.fp16_underflow_scaled is not None]
    if not fp16:
        return table
    return Group(table, Text(""), _underflow(run, fp16))


def _underflow(run: RecipeRun, records: list[TensorRecord]) -> HeadedRows:
    title = (f"{run.name}: the nonzero output gradients FP16 flushes (|g| <= 2^-25), as "
             f"the GEMM saw them (with the loss scale: {_scale_text(run.loss_scale)}) and "
             "without it")
    rows = [(t.layer, [_share(t.fp16_underflow_scaled), _share(t.fp16_underflow_unscaled)])
            for t in records]
    return HeadedRows(title, "layer", ["with the scale", "without"], [(None, None, rows)],
                      name_header="layer")


def _scale_text(scale: dict | None) -> str:
    if not scale or scale.get("mode", "none") == "none":
        return "none"
    low, high = scale.get("min_scale"), scale.get("max_scale")
    text = f"{scale['mode']} {_power_text(low)}"
    if high != low:
        text += f"..{_power_text(high)}"
    skipped = scale.get("skipped_steps") or 0
    return text + (f", {skipped} steps skipped" if skipped else "")


def _power_text(value: float | None) -> str:
    import math

    if value is None or not math.isfinite(value) or value <= 0:
        return value_text(value)
    exponent = math.log2(value)
    return f"2^{int(exponent)}" if exponent == int(exponent) else value_text(value, 4)


def _cells(record: TensorRecord) -> list[str]:
    return [_format_name(record.format), _share(record.flushed_share),
            _share(record.saturated_share), _range_text(record.amax_min, record.amax_max),
            _range_text(record.scale_min, record.scale_max)]


SHORT_FORMATS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "float8_e4m3fn": "E4M3", "float8_e5m2": "E5M2", "float4_e2m1fn": "E2M1"}


def _format_name(name: str) -> str:
    return SHORT_FORMATS.get(name, name)
