"""The ``fmt`` command line: parse options, call the library, print a table or JSON.

Results go to stdout; notes and warnings to stderr.  A library FmtError becomes one line
``Error: ...`` on stderr with exit code 1 (data) or 2 (usage), never a traceback.  Any other
exception is a bug: one line ``Error: internal error: ...`` and exit code 70, or the full
traceback with ``FMT_TRACEBACK=1`` in the environment.  A Python warning (e.g. a numpy
RuntimeWarning) becomes one line ``Note: ...`` on stderr.
"""

from __future__ import annotations

import os
import re
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

# Only what the parser needs is imported at start-up (fmt --version, fmt --help: no numpy);
# each command imports the library modules it uses when it runs.
from .choices import (
    ARTICLE_FORMATS,
    CHUNK_ELEMENTS,
    HISTORY,
    RECIPE_NAMES,
    Backend,
    Device,
    Granularity,
    Metric,
    OverflowPolicy,
    Product,
    RoundingMode,
    ScaleRule,
)
from .errors import DataError, FmtError, UsageError, one_line, shown

if TYPE_CHECKING:
    from .formats import FormatSpec

INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug in fmtcli


def show_tracebacks() -> bool:
    """FMT_TRACEBACK=1 (any value but '' and '0'): let internal errors raise."""
    return os.environ.get("FMT_TRACEBACK", "") not in ("", "0")


def error_line(message: object) -> None:
    typer.echo(f"Error: {one_line(message)}", err=True)


# The library names its parameters as Python keywords (``block=0``, ``use product='exact'``,
# ``pass force=True``); on the command line they are options.  Library parameter -> flag:
FLAGS = {"block": "--block", "tile": "--tile", "per": "--per", "axis": "--axis",
         "margin": "--margin", "percentile": "--percentile", "fixed_scale": "--fixed-scale",
         "scale_rule": "--scale-rule", "recipe": "--recipe", "compare": "--compare",
         "history": "--history", "first_axis": "--over-first-axis", "seed": "--seed",
         "out": "--out", "force": "--force", "key": "--key", "backend": "--backend",
         "device": "--device", "product": "--product", "rounding": "--rounding",
         "overflow": "--overflow", "format": "--format", "workers": "--workers",
         "chunk": "--chunk", "metric": "--metric"}
KEYWORD = re.compile(r"\b(?P<name>[a-z_]+)=(?P<value>'(?:[^'\\]|\\.)*'|True\b|[-+\w.]+)")
PLAIN_VALUE = re.compile(r"[-+\w./]+")


def as_options(error: FmtError) -> str:
    """A library error as the command line says it: each ``name=value`` naming a library
    parameter becomes the option and its value (``block=0`` -> ``--block 0``,
    ``product='exact'`` -> ``--product exact``, ``force=True`` -> ``--force``); quotes stay
    around values that need them (paths with spaces)."""
    def option(match: re.Match) -> str:
        flag = FLAGS.get(match["name"])
        if flag is None:
            return match[0]
        value = match["value"]
        if value == "True":
            return flag
        if value.startswith("'") and PLAIN_VALUE.fullmatch(value[1:-1]):
            value = value[1:-1]
        return f"{flag} {value}"

    return KEYWORD.sub(option, str(error))


def note(message: str) -> None:
    """One line ``Note: ...`` on stderr, for notes that are not results (user text in the
    message is shown as written: no rich markup is interpreted)."""
    from rich.text import Text

    stderr_console().print(Text.assemble(("Note:", "dim"), " ", one_line(message)),
                           soft_wrap=True)


def warning_as_note(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of the CLI: a warning (a numpy RuntimeWarning that escaped
    its source, say) becomes one ``Note:`` line instead of two lines naming our source."""
    note(f"{message} ({category.__name__})")


class OneLineErrors(TyperGroup):
    """Every way a command ends, as the user sees it.

    - a parser usage error or a FmtError: one line ``Error: ...`` on stderr, exit 2 or 1;
    - plain ``fmt``: the help on stdout, exit 0 (as git and gh);
    - Ctrl-C: ``Aborted.``, exit 130;
    - any other exception (a bug): one line ``Error: internal error: <type>: <message>``,
      exit 70; with FMT_TRACEBACK=1 it is raised (the test suite sets it).
    Python warnings are printed as ``Note:`` lines while a command runs.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        with warnings.catch_warnings():
            warnings.showwarning = warning_as_note
            code = self._run(args, prog_name, complete_var, **extra)
        if code == 130:  # typer turns KeyboardInterrupt into exit code 130
            typer.echo("Aborted.", err=True)
        sys.exit(code)

    def _run(self, args, prog_name, complete_var, **extra) -> int:
        if sys.stdout is None:  # started with stdout closed (fmt ... >&-): Python sets None
            # Refused before any work: results could not be printed, and the first file
            # opened would otherwise take descriptor 1.
            error_line("standard output is closed: nothing could be printed (redirect it "
                       "to a file or to /dev/null)")
            return 1
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            return code if isinstance(code, int) else 0
        except FmtError as error:
            error_line(as_options(error))
            return error.exit_code
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            return 1
        except BrokenPipeError:  # the reader of stdout went away (fmt ... | head): quietly
            _discard_stdout()
            return 1
        except typer.TyperException as error:  # the parser's usage errors
            ctx = getattr(error, "ctx", None)
            if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
                try:
                    with writing_results():
                        typer.echo(ctx.get_help())  # plain 'fmt': the help, on stdout
                except FmtError as failed:
                    error_line(failed)
                    return failed.exit_code
                return 0
            command = ctx.command_path if ctx is not None else "fmt"
            error_line(f"{error.format_message()} (see '{command} --help')")
            return getattr(error, "exit_code", 2)
        except MemoryError:
            if show_tracebacks():
                raise
            error_line("out of memory: the input or the options need more memory than this "
                       "process may have (try a smaller --chunk, fewer --workers or fewer "
                       "values)")
            return 1
        except OSError as error:  # the system refused a read or write (--help > /dev/full)
            if show_tracebacks():
                raise
            _discard_stdout()
            where = f" ({shown(error.filename)})" if error.filename else ""
            error_line(f"{error.strerror or error}{where}")
            return 1
        except Exception as error:
            if show_tracebacks():
                raise
            error_line(f"internal error: {type(error).__name__}: {error} (please report it; "
                       "FMT_TRACEBACK=1 shows the traceback)")
            return INTERNAL_ERROR


class UsageWithEllipsis(TyperCommand):
    """Usage lines that mark repeatable arguments: ``fmt underflow [OPTIONS] VALUE...``,
    ``fmt quantize [OPTIONS] [FILE]...`` (typer writes ``{VALUE}`` and ``[FILE]``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not isinstance(param, TyperArgument):
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            name = param.metavar or (param.name or "").upper()
            piece = name if param.required else f"[{name}]"
            pieces.append(piece + ("..." if param.nargs != 1 else ""))
        return pieces


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
ProductOption = Annotated[Product, typer.Option(
    "--product", case_sensitive=False,
    help="Width of x * scale before the cast: 'float32' takes the data and scale as float32 "
         "and rounds the product to float32 (as eager torch kernels do); 'exact' computes in "
         "float64 (exact for power-of-two scales and float32 data).")]
# Options that quantize and scale-search share (their defaults differ: see each --help).
BlockOption = Annotated[Optional[int], typer.Option(
    "--block", metavar="N", help="One scale per N elements along --axis.",
    show_default=False)]
TileOption = Annotated[Optional[str], typer.Option(
    "--tile", metavar="RxC", help="One scale per RxC tile of the (rows x last axis) matrix, "
    "e.g. 128x128 or 1x128.")]


class Per(str, Enum):
    """The choices of --per (blocks and tiles have their own options)."""

    TENSOR = "tensor"
    ROW = "row"
    COLUMN = "column"


PerOption = Annotated[Optional[Per], typer.Option(
    "--per", case_sensitive=False, help="One scale per tensor, row or column (of the "
    "rows x last-axis matrix; a 1-D tensor is one row).", show_default=False)]
AxisOption = Annotated[Optional[int], typer.Option(
    "--axis", help="Axis of --block: -1 (last, default) or 0 (first).")]
KeyOption = Annotated[Optional[list[str]], typer.Option(
    "--key", metavar="NAME", help="Only these tensors of a checkpoint (name or glob; "
    "repeatable).")]
MAX_WORKERS = 1024
WorkersOption = Annotated[Optional[int], typer.Option(
    "--workers", min=1, max=MAX_WORKERS, help="Worker processes, 1..1024.  [default: the "
    "cores available, at most 8]", show_default=False)]
SEED_MAX = 2**64 - 1
SeedOption = Annotated[int, typer.Option(
    "--seed", min=0, max=SEED_MAX, help="Seed of stochastic rounding, 0..2**64-1.")]


# Characters of the tables that an ASCII-only stream cannot take, and what stands for them.
ASCII_LOOKALIKES = str.maketrans({"≈": "~", "█": "#", "→": "->", "…": "...",
                                  "−": "-", "·": "."})


class SafeStream:
    """A text stream that cannot raise UnicodeEncodeError: characters its encoding lacks
    become ASCII look-alikes (``≈`` -> ``~``, bars ``█`` -> ``#``), then ``?``.

    rich reads ``encoding`` through it and draws ASCII boxes itself on a non-UTF stream;
    this catches the characters of our own cells (PYTHONIOENCODING=ascii, a Latin-1 pipe)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        try:
            text.encode(self.encoding)
        except UnicodeEncodeError:
            text = text.translate(ASCII_LOOKALIKES)
            text = text.encode(self.encoding, "replace").decode(self.encoding)
        except LookupError:  # an encoding Python does not know: plain ASCII
            text = text.translate(ASCII_LOOKALIKES).encode("ascii", "replace").decode()
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, fileno: the stream's own
        return getattr(self.stream, name)


def stdout_console():
    """Console for results; built per command so tests can pin the width (COLUMNS).  rich is
    imported here, not at start-up: --json runs never load it."""
    from rich.console import Console

    stream = SafeStream(sys.stdout)
    if os.environ.get("COLUMNS", "").isdigit():
        return Console(file=stream, width=max(20, int(os.environ["COLUMNS"])))
    console = Console(file=stream)
    if not console.is_terminal:  # a pipe or a file: don't squeeze tables into 80 columns
        console = Console(file=stream, width=160)
    return console


def stderr_console():
    from rich.console import Console

    return Console(file=SafeStream(sys.stderr), highlight=False)


def resolve_formats(names: list[str] | None, default: tuple[str, ...]) -> list[FormatSpec]:
    """Specs for the names (each may be a comma list; duplicates dropped, order kept), notes
    for ambiguous names on stderr.  An empty name ('', 'e4m3,') is a usage error, never a
    silent default."""
    from .formats import resolve_format

    specs: list[FormatSpec] = []
    for name in names or default:
        parts = [part.strip() for part in name.split(",")]
        if not all(parts):
            raise UsageError(f"empty format name in {shown(name)}",
                             "e.g. --format fp16,bf16,e4m3fn")
        for part in parts:
            spec, message = resolve_format(part)
            if message:
                note(message)
            if spec not in specs:
                specs.append(spec)
    if not specs:
        raise UsageError("no formats given", "e.g. --format fp16,bf16,e4m3fn")
    return specs


def resolve_one_format(name: str | None) -> FormatSpec | None:
    """The spec of a command's single --format (None: the command's default)."""
    if name is None:
        return None
    if "," in name:
        raise UsageError(f"--format takes one format here, got {shown(name)}")
    return resolve_formats([name], ())[0]


def check_not_empty(**options: str | list[str] | None) -> None:
    """An option given as '' (``--recipe ''``, ``--key ''``) is a usage error, not a default."""
    for option, value in options.items():
        values = [value] if isinstance(value, str) else value or []
        if any(not v.strip() for v in values):
            raise UsageError(f"--{option} must not be empty")


def note_skipped(sources) -> None:
    """One stderr note per tensor that is left out (an int64 position_ids, an empty tensor);
    the results list them under ``skipped`` in JSON."""
    skipped = [s for s in sources if s.skipped is not None]
    for s in skipped[:MAX_SKIP_NOTES]:
        note(f"skipped {shown(s.name)} ({s.dtype}, shape "
             f"{'x'.join(map(str, s.shape)) or 'scalar'}): {s.skipped}")
    if len(skipped) > MAX_SKIP_NOTES:
        note(f"skipped {len(skipped) - MAX_SKIP_NOTES:,} more tensors (--json lists them)")


MAX_SKIP_NOTES = 20


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that what is left in its buffer cannot fail again when
    Python flushes it at exit ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


@contextmanager
def writing_results():
    """Write results to stdout, flushed before leaving.  A reader that went away (``fmt
    range | head -1``) ends the command quietly (BrokenPipeError, exit 1, as the group
    handles it); any other failed write (a full disk: ``> /dev/full``) is a data error
    of one line, not an internal one."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        raise
    except OSError as error:
        _discard_stdout()
        raise DataError("cannot write the results to standard output "
                        f"({error.strerror or error})") from None


def emit(result, json_out: bool, **view) -> None:
    """The one way every command prints its result: ``result.to_dict()`` as one JSON
    document, or the table ``render.render(result, **view)`` builds for its type (``view``:
    display options that change no number, e.g. the loss-scale histogram)."""
    with writing_results():
        if json_out:
            from .jsonsafe import dumps

            typer.echo(dumps(result.to_dict()))
        else:
            from .render import render

            stdout_console().print(render(result, **view))


def version_callback(value: bool) -> None:
    if value:
        from . import package_version

        with writing_results():
            typer.echo(f"fmtcli {package_version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[Optional[bool], typer.Option(
        "--version", callback=version_callback, is_eager=True, help="Show the version.")] = None,
) -> None:
    """fmt: what does this value become in each format, and what range does a format cover?"""


@app.command("range", cls=UsageWithEllipsis,
             short_help="Range and precision of formats: max, eps, subnormals.")
def range_command(
    formats: Annotated[Optional[list[str]], typer.Argument(
        metavar="FORMAT", help="Formats to show (names, aliases or custom eXmY). "
             "Default: the article's six.", show_default=False)] = None,
    all_formats: Annotated[bool, typer.Option("--all", help="Every registered format.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Range and precision of formats: max, smallest normal/subnormal, eps, inf/NaN/-0."""
    from .formats import REGISTRY, FormatTable

    if all_formats:
        specs = list(REGISTRY.values())
        specs += [s for s in resolve_formats(formats, ()) if s not in specs] if formats else []
    else:
        specs = resolve_formats(formats, ARTICLE_FORMATS)
    emit(FormatTable(tuple(specs)), json_out)


@app.command("underflow", cls=UsageWithEllipsis,
             short_help="Will a value survive? What each format stores of it.",
             context_settings={"ignore_unknown_options": True})
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
    product: ProductOption = Product.EXACT,
    json_out: JsonOption = False,
) -> None:
    """Will a value survive? What each format stores of it, with and without a scale.

    Fates: exact, rounded, subnormal (reduced precision), flushed (to zero), overflow
    (became inf/NaN), saturated (clipped to max), invalid (no code for it).
    """
    for text in values:
        if text.startswith("--"):
            raise UsageError(f"no such option: {shown(text)}", "see 'fmt underflow --help'")
    from .literals import parse_values
    from .underflow import underflow_table

    check_not_empty(format=format_names, scale=scale)
    parsed = parse_values(values)
    scales = parse_values(scale or [])
    specs = resolve_formats(format_names, ARTICLE_FORMATS)
    result = underflow_table(parsed, specs, scales, rounding, overflow, seed, backend, device,
                             product=product)
    emit(result, json_out)


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


@app.command("quantize", cls=UsageWithEllipsis,
             short_help="How much does a tensor lose? Per tensor vs per block.")
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
        "--scale-rule", case_sensitive=False, metavar="RULE",
        help="How a block's amax sets its scale: " + ", ".join(r.value for r in ScaleRule)
        + " (see docs/quantize.md).  [default: amax]", show_default=False)] = None,
    margin: Annotated[Optional[int], typer.Option(
        "--margin", min=0, max=64, help="Divide scales by 2**margin (headroom), 0..64.")] = None,
    percentile: Annotated[Optional[float], typer.Option(
        "--percentile", metavar="Q", help="With --scale-rule percentile (implied): the "
        "percentile of |x| (in percent, 0 < Q <= 100, e.g. 99.9) that maps to the format's "
        "max; larger values saturate.", show_default=False)] = None,
    fixed_scale: Annotated[Optional[str], typer.Option(
        "--fixed-scale", metavar="S", help="With --scale-rule fixed (implied): one given "
        "scale for the whole tensor, x_q = cast(x * S) / S (e.g. 64, 2**-4).",
        show_default=False)] = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", metavar="NAME", help="Format + granularity + scale rule together: "
        + ", ".join(RECIPE_NAMES) + ". Explicit options override parts of it.")] = None,
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
    product: ProductOption = Product.FLOAT32,
    chunk: Annotated[int, typer.Option(
        "--chunk", min=1024, help="Elements per chunk (memory and speed; results do not "
        "depend on it).")] = CHUNK_ELEMENTS,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """How much does a tensor lose? Scaled quantization, per tensor vs per block or tile.

    x_q = cast(x * scale) / scale.  Prints flushed values, median/p99 relative error, max
    abs error, RMSE, SQNR, bias and saturation for each scheme.  Default scheme: blocks
    of 128 along the last axis, float8_e4m3fn, amax scales.  Tensors that are not floating
    point (e.g. int64 position_ids) are skipped with a note on stderr.
    """
    from .quantize import quantize
    from .quantize.writers import check_not_an_input, check_target
    from .schemes import build_scheme, comparison_schemes
    from .tensors import example_tensor, load_inputs

    check_not_empty(format=format_name, recipe=recipe, key=keys, tile=tile, out=out)
    scale_rule, fixed = rule_with_value(scale_rule, percentile, fixed_scale)
    if fixed is not None and block is None and tile is None and per is None:
        per = Per.TENSOR  # one given scale: the granularity does not matter
    main_scheme = build_scheme(format=resolve_one_format(format_name), block=block, tile=tile,
                               per=granularity(per), axis=axis, scale_rule=scale_rule,
                               margin=margin, recipe=recipe, rounding=rounding,
                               overflow=overflow, percentile=percentile, fixed_scale=fixed)
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
    note_skipped(sources)
    if main_scheme.granularity is Granularity.COLUMN:
        for s in sources:
            if s.skipped is None and len(s.shape) <= 1 and s.size > 1:
                note(f"--per column on the 1-D tensor {shown(s.name)}: each element is a "
                     "column, so every element gets its own scale")
    progress = StderrProgress("quantizing")
    try:
        result = quantize(sources, schemes, seed=seed, chunk_elements=chunk, workers=workers,
                          progress=progress, out=out, backend=backend, device=device,
                          product=product)
    finally:
        progress.close()
    emit(result, json_out)


def granularity(per: Per | None) -> Granularity | None:
    return None if per is None else Granularity(per.value)


def rule_with_value(rule: ScaleRule | None, percentile: float | None,
                    fixed_scale: str | None) -> tuple[ScaleRule | None, float | None]:
    """The scale rule implied or checked by --percentile / --fixed-scale, and the fixed
    scale parsed (as exactly as a literal of ``fmt underflow``)."""
    if percentile is not None and fixed_scale is not None:
        raise UsageError("--percentile and --fixed-scale are alternatives: give one")
    for option, value, wanted in (("--percentile", percentile, ScaleRule.PERCENTILE),
                                  ("--fixed-scale", fixed_scale, ScaleRule.FIXED)):
        if value is not None and rule not in (None, wanted):
            raise UsageError(f"{option} goes with --scale-rule {wanted.value}, not "
                             f"{rule.value}")
        if value is None and rule is wanted:
            example = "99.9" if wanted is ScaleRule.PERCENTILE else "64"
            raise UsageError(f"--scale-rule {wanted.value} needs {option} (e.g. {option} "
                             f"{example})")
        if value is not None:
            rule = wanted
    if fixed_scale is None:
        return rule, None
    from .literals import parse_value

    return rule, parse_value(fixed_scale)


@app.command("scale-search", cls=UsageWithEllipsis,
             short_help="Which scale should I use? Scale rules side by side.")
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
        "--loss-scale", help="Deprecated: use 'fmt loss-scale' (the same sweep of loss "
        "scales).")] = False,
    histogram: Annotated[bool, typer.Option(
        "--histogram", help="With --loss-scale: a histogram of log2|g| with the format's "
        "regions.")] = False,
    keys: KeyOption = None,
    backend: BackendOption = Backend.AUTO,
    device: DeviceOption = Device.CPU,
    product: ProductOption = Product.FLOAT32,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """Which scale should I use? Candidate scale rules side by side, the best marked.

    x_q = cast(x * scale) / scale.  Rules: amax (and margins 1..3), powers of two, MX
    E8M0, percentile clipping, delayed scaling (over steps: several files of one tensor
    each, of one shape, or --over-first-axis; not a checkpoint's tensors) and an MSE
    search.  Default granularity: one scale per tensor.  Every candidate rounds to
    nearest-even.  Tensors that are not floating point are skipped with a note on stderr.
    (Which loss scale: 'fmt loss-scale'.)
    """
    check_not_empty(format=format_name, key=keys, tile=tile)
    if not files and keys:
        raise UsageError("--key needs a FILE")
    if histogram and not loss_scale:
        raise UsageError("--histogram goes with 'fmt loss-scale' (the deprecated --loss-scale)")
    if loss_scale:
        given = [name for name, value in (("--block", block), ("--tile", tile), ("--per", per),
                                          ("--axis", axis)) if value is not None]
        given += ["--over-first-axis"] if over_first_axis else []
        if given:
            raise UsageError(f"{', '.join(given)} do not apply to --loss-scale (it sweeps one "
                             "scale for all gradients)")
        note("'fmt scale-search --loss-scale' is deprecated: use 'fmt loss-scale' (same "
             "options and output)")
        run_loss_scale(files, format_name, histogram, keys, backend, device, workers, json_out)
        return
    from .scalesearch import search_scales
    from .schemes import build_scheme
    from .tensors import example_tensor, load_inputs

    if block is None and tile is None and per is None:
        per = Per.TENSOR
    base = replace(build_scheme(format=resolve_one_format(format_name), block=block,
                                tile=tile, per=granularity(per), axis=axis), product=product)
    sources = load_inputs(files, keys) if files else [example_tensor()]
    note_skipped(sources)
    result = search_scales(sources, base, metric, history=history,
                           first_axis=over_first_axis, workers=workers, backend=backend,
                           device=device)
    emit(result, json_out)


@app.command("loss-scale", cls=UsageWithEllipsis,
             short_help="Which loss scale keeps my FP16 gradients? 2^0..2^32 swept.")
def loss_scale_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Gradients: tensors as for quantize. None: synthetic gradients "
        "(2**20 values, log2|g| normal with mean -27 and deviation 5).",
        show_default=False)] = None,
    format_name: Annotated[Optional[str], typer.Option(
        "--format", metavar="F", help="Format the gradients are cast to.  [default: "
        "float16]", show_default=False)] = None,
    histogram: Annotated[bool, typer.Option(
        "--histogram", help="Also a histogram of log2|g| with the format's regions "
        "(flush, subnormal, normal, overflow) at S = 1 and at the recommended scale.")] = False,
    keys: KeyOption = None,
    backend: BackendOption = Backend.AUTO,
    device: DeviceOption = Device.CPU,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """Which loss scale keeps gradients from flushing or overflowing? g_q = cast(g * S) / S.

    Sweeps S = 2^0 .. 2^32 over the gradients: flushed, subnormal, overflowed (or, where
    the cast clips, saturated) and kept, exactly, for each S.  Recommends the safe scale
    with one binade of headroom (nothing overflows at S or 2S) that flushes least, then
    leaves the fewest subnormal; shows where torch.amp.GradScaler's defaults settle.
    """
    run_loss_scale(files, format_name, histogram, keys, backend, device, workers, json_out)


def run_loss_scale(files, format_name, histogram, keys, backend, device, workers,
                   json_out) -> None:
    """``fmt loss-scale`` (and its deprecated spelling ``scale-search --loss-scale``)."""
    from .lossscale import example_gradients, sweep_loss_scales
    from .tensors import load_inputs

    check_not_empty(format=format_name, key=keys)
    if not files and keys:
        raise UsageError("--key needs a FILE")
    spec = resolve_one_format(format_name or "float16")
    sources = load_inputs(files, keys) if files else [example_gradients()]
    note_skipped(sources)
    result = sweep_loss_scales(sources, spec, workers=workers, backend=backend, device=device)
    emit(result, json_out, histogram=histogram)


@app.command("check-backends", cls=UsageWithEllipsis,
             short_help="Can I trust this cast? ml_dtypes and torch vs the engine.")
def check_backends_command(
    formats: Annotated[Optional[list[str]], typer.Argument(
        metavar="FORMAT", help="Formats to check.  Default: every registered format.",
        show_default=False)] = None,
    format_names: Annotated[Optional[list[str]], typer.Option(
        "--format", metavar="F", help="Formats to check (repeatable or a comma list).")] = None,
    seed: Annotated[int, typer.Option(
        "--seed", min=0, max=SEED_MAX, help="Seed of the random sample of float32 bit "
        "patterns (2**18 of them) among the inputs, 0..2**64-1.")] = 0,
    json_out: JsonOption = False,
) -> None:
    """Can I trust this cast? ml_dtypes and torch (CPU, CUDA) against fmtcli's engine.

    Every float16 and bfloat16 bit pattern, the format's own code points, random float32
    over all binades, ties and their neighbours, subnormals, overflow, +-0, +-inf and NaN;
    mismatches by class, with NaN payload differences told apart from real ones.
    """
    from .conformance import check_backends
    from .formats import REGISTRY

    names = (formats or []) + (format_names or [])
    specs = resolve_formats(names, ()) if names else list(REGISTRY.values())
    emit(check_backends(specs, seed), json_out)


def main() -> None:
    """Console-script entry point."""
    app(prog_name=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fmt")
