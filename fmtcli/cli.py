"""The ``fmt`` command line: parse options, call the library, print a table or JSON.

Results go to stdout; notes and warnings to stderr.  A library FmtError becomes one line
``Error: ...`` on stderr with exit code 1 (data) or 2 (usage), never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from enum import Enum
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from . import __version__
from .backends import Backend, Device
from .conformance import check_backends
from .errors import FmtError, UsageError
from .formats import ARTICLE_FORMATS, REGISTRY, FormatSpec, resolve_format
from .jsonsafe import dumps
from .literals import parse_values
from .lossscale import example_gradients, sweep_loss_scales
from .output import check_not_an_input, check_target
from .quantize import CHUNK_ELEMENTS, quantize
from .rounding import OverflowPolicy, RoundingMode
from .scalesearch import HISTORY, Metric, search_scales
from .scaling import ScaleRule
from .schemes import RECIPES, Granularity, build_scheme, comparison_schemes
from .tensors import example_tensor, load_inputs
from .underflow import underflow_table


class OneLineErrors(TyperGroup):
    """Usage errors of the parser as one line ``Error: ...`` on stderr (exit 2), like ours."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        except typer.TyperException as error:  # the parser's usage errors
            command = error.ctx.command_path if getattr(error, "ctx", None) else "fmt"
            typer.echo(f"Error: {error.format_message()} (see '{command} --help')", err=True)
            sys.exit(getattr(error, "exit_code", 2))
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    rich_markup_mode=None,
    name="fmt",
    help="Explore the number formats of ML training and inference: FP32, FP16, BF16, FP8 "
         "(E4M3 fn/fnuz, E5M2), MX FP6/FP4/E8M0 and any custom eXmY.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
RoundingOption = Annotated[RoundingMode, typer.Option(
    "--rounding", "-r", case_sensitive=False, help="Rounding mode.")]
OverflowOption = Annotated[OverflowPolicy, typer.Option(
    "--overflow", case_sensitive=False,
    help="Beyond max: 'ieee' gives inf (or NaN where the format has no inf), "
         "'saturate' clips to +-max.")]
BackendOption = Annotated[Backend, typer.Option(
    "--backend", case_sensitive=False,
    help="Whose cast stores the values: fmtcli's numpy engine, ml_dtypes, or torch's dtypes "
         "(nearest-even, the backend's own overflow behaviour); auto: the engine, or torch "
         "with --device cuda.")]
DeviceOption = Annotated[Device, typer.Option(
    "--device", case_sensitive=False,
    help="Device of the torch backend. auto: the CPU, except that quantize with --backend "
         "auto runs tensors of 2**32 elements or more on a CUDA GPU when torch sees one.")]
# Options that quantize and scale-search share (their defaults differ: see each --help).
BlockOption = Annotated[Optional[int], typer.Option(
    "--block", metavar="N", help="One scale per N elements along --axis.",
    show_default=False)]
TileOption = Annotated[Optional[str], typer.Option(
    "--tile", metavar="RxC", help="One scale per RxC tile of the (rows x last axis) matrix, "
    "e.g. 128x128 or 1x128.")]
PerOption = Annotated[Optional[Granularity], typer.Option(
    "--per", case_sensitive=False, help="One scale per tensor, row or column.",
    show_default=False)]
AxisOption = Annotated[Optional[int], typer.Option(
    "--axis", help="Axis of --block: -1 (last, default) or 0 (first).")]
KeyOption = Annotated[Optional[list[str]], typer.Option(
    "--key", metavar="NAME", help="Only these tensors of a checkpoint (name or glob; "
    "repeatable).")]
WorkersOption = Annotated[Optional[int], typer.Option(
    "--workers", min=1, help="Worker processes.  [default: the cores available, at most 8]",
    show_default=False)]
SeedOption = Annotated[int, typer.Option("--seed", min=0, help="Seed of stochastic rounding.")]


def stdout_console():
    """Console for results; built per command so tests can pin the width (COLUMNS).  rich is
    imported here, not at start-up: --json runs never load it."""
    from rich.console import Console

    if os.environ.get("COLUMNS", "").isdigit():
        return Console(width=int(os.environ["COLUMNS"]))
    console = Console()
    if not console.is_terminal:  # a pipe or a file: don't squeeze tables into 80 columns
        console = Console(width=160)
    return console


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def note(message: str) -> None:
    """One line on stderr, for notes that are not results."""
    stderr_console().print(f"[dim]Note:[/dim] {message}", markup=True, soft_wrap=True)


def handle_errors(command):
    """Turn FmtError into 'Error: ...' on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except FmtError as error:
            typer.echo(f"Error: {error}", err=True)
            raise typer.Exit(error.exit_code) from None

    return wrapper


def resolve_formats(names: list[str] | None, default: tuple[str, ...]) -> list[FormatSpec]:
    """Specs for the names (each may be a comma list; duplicates dropped, order kept), notes
    for ambiguous names on stderr."""
    names = [part.strip() for name in (names or default) for part in name.split(",")
             if part.strip()]
    if not names:
        raise UsageError("no formats given", "e.g. --format fp16,bf16,e4m3fn")
    specs = []
    for name in names:
        spec, message = resolve_format(name)
        if message:
            note(message)
        if spec not in specs:
            specs.append(spec)
    return specs


def emit(json_out: bool, result, renderer: str, data=None) -> None:
    """Print ``result``'s JSON (``data`` if given, else ``result.to_dict()``), or the rich
    table that ``render.<renderer>(result)`` builds."""
    if json_out:
        typer.echo(dumps(data if data is not None else result.to_dict()))
    else:
        from . import render

        stdout_console().print(getattr(render, renderer)(result))


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"fmtcli {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[Optional[bool], typer.Option(
        "--version", callback=version_callback, is_eager=True, help="Show the version.")] = None,
) -> None:
    """fmt: what does this value become in each format, and what range does a format cover?"""


@app.command("range")
@handle_errors
def range_command(
    formats: Annotated[Optional[list[str]], typer.Argument(
        metavar="FORMAT", help="Formats to show (names, aliases or custom eXmY). "
             "Default: the article's six.", show_default=False)] = None,
    all_formats: Annotated[bool, typer.Option("--all", help="Every registered format.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Range and precision of formats: max, smallest normal/subnormal, eps, inf/NaN/-0."""
    if all_formats:
        specs = list(REGISTRY.values())
        specs += [s for s in resolve_formats(formats, ()) if s not in specs] if formats else []
    else:
        specs = resolve_formats(formats, ARTICLE_FORMATS)
    emit(json_out, specs, "render_range", data=[spec.to_dict() for spec in specs])


@app.command("underflow", context_settings={"ignore_unknown_options": True})
@handle_errors
def underflow_command(
    values: Annotated[list[str], typer.Argument(
        metavar="VALUE",
        help="Values: 1e-8, 2**-24, 2^-24, 3*2^-10, 0x1p-24, inf, nan, negatives; "
             "comma lists allowed.", show_default=False)],
    scale: Annotated[Optional[list[str]], typer.Option(
        "--scale", "-s", metavar="S", help="Scale (loss scale): x_q = cast(x * scale) / scale. "
                              "Repeatable or a comma list.")] = None,
    format_names: Annotated[Optional[list[str]], typer.Option(
        "--format", metavar="F",
        help="Format (repeatable or a comma list). Default: the article's six.")] = None,
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    overflow: OverflowOption = OverflowPolicy.IEEE,
    seed: SeedOption = 0,
    backend: BackendOption = Backend.NUMPY,
    device: DeviceOption = Device.CPU,
    json_out: JsonOption = False,
) -> None:
    """Will a value survive? What each format stores of it, with and without a scale.

    Fates: exact, rounded, subnormal (reduced precision), flushed (to zero), overflow
    (became inf/NaN), saturated (clipped to max), invalid (no code for it).
    """
    for text in values:
        if text.startswith("--"):
            raise typer.BadParameter(f"no such option: {text}")
    parsed = parse_values(values)
    scales = parse_values(scale or [])
    specs = resolve_formats(format_names, ARTICLE_FORMATS)
    result = underflow_table(parsed, specs, scales, rounding, overflow, seed, backend, device)
    emit(json_out, result, "render_underflow")


class Compare(str, Enum):
    TENSOR = "tensor"
    NONE = "none"
    ALL = "all"


class StderrProgress:
    """A rich progress bar on stderr, shown only on a terminal and once work passes ~1 s."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.start = time.monotonic()
        self.bar = None
        self.task = None
        self.enabled = sys.stderr.isatty()  # rich itself is imported only when needed

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not self.enabled or time.monotonic() - self.start < 1.0:
                return
            from rich.progress import BarColumn, Progress, TimeRemainingColumn

            self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                                "[progress.percentage]{task.percentage:>3.0f}%",
                                TimeRemainingColumn(), console=stderr_console(),
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command("quantize")
@handle_errors
def quantize_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Tensors: .npy .npz .safetensors .pt/.pth .txt/.csv/.json, a "
        "directory, or - for numbers on stdin. None: the article's built-in example "
        "(1024 values of size ~0.001 and one outlier of 100).", show_default=False)] = None,
    format_name: Annotated[Optional[str], typer.Option(
        "--format", metavar="F", help="Element format.  [default: float8_e4m3fn]",
        show_default=False)] = None,
    block: BlockOption = None,
    tile: TileOption = None,
    per: PerOption = None,
    axis: AxisOption = None,
    scale_rule: Annotated[Optional[ScaleRule], typer.Option(
        "--scale-rule", case_sensitive=False,
        help="How a block's amax sets its scale.  [default: amax]")] = None,
    margin: Annotated[Optional[int], typer.Option(
        "--margin", min=0, help="Divide scales by 2**margin (headroom).")] = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", metavar="NAME", help="Format + granularity + scale rule together: "
        + ", ".join(RECIPES) + ". Explicit options override parts of it.")] = None,
    rounding: RoundingOption = RoundingMode.NEAREST_EVEN,
    overflow: Annotated[OverflowPolicy, typer.Option(
        "--overflow", case_sensitive=False,
        help="Beyond max: 'saturate' clips to +-max (what FP8 recipes do), 'ieee' gives "
             "inf/NaN.")] = OverflowPolicy.SATURATE,
    compare: Annotated[Compare, typer.Option(
        "--compare", case_sensitive=False,
        help="'tensor': per-tensor scaling beside the chosen scheme; 'none': the scheme "
             "alone; 'all': every standard recipe.")] = Compare.TENSOR,
    keys: KeyOption = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", metavar="PATH", help="Write the scheme's result: .npy (dequantized values) "
        "or .npz/.safetensors (codes and scales).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
    seed: SeedOption = 0,
    backend: BackendOption = Backend.AUTO,
    device: DeviceOption = Device.AUTO,
    chunk: Annotated[int, typer.Option(
        "--chunk", min=1024, help="Elements per chunk (memory and speed; results do not "
        "depend on it).")] = CHUNK_ELEMENTS,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """How much does a tensor lose? Scaled quantization, per tensor vs per block or tile.

    x_q = cast(x * scale) / scale.  Prints flushed values, median/p99 relative error, max
    abs error, RMSE, SQNR, bias and saturation for each scheme.  Default scheme: blocks
    of 128 along the last axis, float8_e4m3fn, amax scales.
    """
    spec = resolve_formats([format_name], ())[0] if format_name else None
    main_scheme = build_scheme(format=spec, block=block, tile=tile, per=per, axis=axis,
                               scale_rule=scale_rule, margin=margin, recipe=recipe,
                               rounding=rounding, overflow=overflow)
    schemes = comparison_schemes(main_scheme, compare.value)
    if out is not None:
        if compare is Compare.ALL:
            raise UsageError("--out writes one scheme; it cannot go with --compare all")
        check_target(out, files or [], force)
    if not files and keys:
        raise UsageError("--key needs a FILE")
    sources = load_inputs(files, keys) if files else [example_tensor()]
    if out is not None:
        check_not_an_input(out, sources)
    progress = StderrProgress("quantizing")
    try:
        result = quantize(sources, schemes, seed=seed, chunk_elements=chunk, workers=workers,
                          progress=progress, out=out, backend=backend, device=device)
    finally:
        progress.close()
    for tensor in result.tensors:
        if tensor.skipped:
            note(f"skipped {tensor.tensor['key'] or tensor.tensor['source']}: {tensor.skipped}")
    emit(json_out, result, "render_quantize")


@app.command("scale-search")
@handle_errors
def scale_search_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Tensors, as for quantize. None: the article's example (or, "
        "with --loss-scale, synthetic gradients).", show_default=False)] = None,
    format_name: Annotated[Optional[str], typer.Option(
        "--format", metavar="F", help="Element format.  [default: float8_e4m3fn; with "
        "--loss-scale: float16]", show_default=False)] = None,
    block: BlockOption = None,
    tile: TileOption = None,
    per: PerOption = None,
    axis: AxisOption = None,
    metric: Annotated[Metric, typer.Option(
        "--metric", case_sensitive=False, help="What the best rule minimises (SQNR: "
        "maximises).")] = Metric.MSE,
    history: Annotated[int, typer.Option(
        "--history", min=1, help="Amax history length H of delayed scaling.")] = HISTORY,
    over_first_axis: Annotated[bool, typer.Option(
        "--over-first-axis", help="Treat the first axis of one tensor as a sequence of "
        "steps (for delayed scaling).")] = False,
    loss_scale: Annotated[bool, typer.Option(
        "--loss-scale", help="Sweep loss scales 2^0..2^32 over gradients instead.")] = False,
    histogram: Annotated[bool, typer.Option(
        "--histogram", help="With --loss-scale: a histogram of log2|g| with the format's "
        "regions.")] = False,
    keys: KeyOption = None,
    seed: SeedOption = 0,
    backend: BackendOption = Backend.AUTO,
    device: DeviceOption = Device.CPU,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """Which scale should I use? Candidate scale rules side by side, the best marked.

    x_q = cast(x * scale) / scale.  Rules: amax (and margins 1..3), powers of two, MX
    E8M0, percentile clipping, delayed scaling (for a sequence of tensors) and an MSE
    search.  Default granularity: one scale per tensor.  --loss-scale: which loss scale
    keeps FP16 gradients from flushing or overflowing.
    """
    if not files and keys:
        raise UsageError("--key needs a FILE")
    if histogram and not loss_scale:
        raise UsageError("--histogram goes with --loss-scale")
    if loss_scale:
        given = [name for name, value in (("--block", block), ("--tile", tile), ("--per", per),
                                          ("--axis", axis)) if value is not None]
        given += ["--over-first-axis"] if over_first_axis else []
        if given:
            raise UsageError(f"{', '.join(given)} do not apply to --loss-scale (it sweeps one "
                             "scale for all gradients)")
    if loss_scale:
        spec = resolve_formats([format_name or "float16"], ())[0]
        sources = load_inputs(files, keys) if files else [example_gradients()]
        result = sweep_loss_scales(sources, spec, workers=workers, backend=backend,
                                   device=device)
        if json_out:
            emit(True, result, "")
        else:
            from . import render

            stdout_console().print(render.render_loss_scale(result, histogram))
        return
    spec = resolve_formats([format_name], ())[0] if format_name else None
    if block is None and tile is None and per is None:
        per = Granularity.TENSOR
    base = build_scheme(format=spec, block=block, tile=tile, per=per, axis=axis)
    sources = load_inputs(files, keys) if files else [example_tensor()]
    result = search_scales(sources, base, metric, history=history,
                           first_axis=over_first_axis, seed=seed, workers=workers,
                           backend=backend, device=device)
    emit(json_out, result, "render_scale_search")


@app.command("check-backends")
@handle_errors
def check_backends_command(
    formats: Annotated[Optional[list[str]], typer.Argument(
        metavar="FORMAT", help="Formats to check.  Default: every registered format.",
        show_default=False)] = None,
    format_names: Annotated[Optional[list[str]], typer.Option(
        "--format", metavar="F", help="Formats to check (repeatable or a comma list).")] = None,
    seed: SeedOption = 0,
    json_out: JsonOption = False,
) -> None:
    """Can I trust this cast? ml_dtypes and torch (CPU, CUDA) against fmtcli's engine.

    Every float16 and bfloat16 bit pattern, the format's own code points, random float32
    over all binades, ties and their neighbours, subnormals, overflow, +-0, +-inf and NaN;
    mismatches by class, with NaN payload differences told apart from real ones.
    """
    names = (formats or []) + (format_names or [])
    specs = resolve_formats(names, ()) if names else list(REGISTRY.values())
    emit(json_out, check_backends(specs, seed), "render_conformance")


def main() -> None:
    """Console-script entry point."""
    app(prog_name=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fmt")
