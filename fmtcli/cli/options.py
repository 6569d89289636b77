"""Options and arguments shared by several commands, and their checks.

The option types (``Annotated`` Typer options) that more than one command takes, the
choices the command line adds (``--per``, ``--compare``), and the small steps every command
repeats: format names to specs (with notes for ambiguous names), empty values refused,
skipped tensors noted; and ``OPTIONS``, the option that sets each library parameter, by
which a library error's parameters are said as options (``as_options``).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from fmtcli.base.choices import (
    Backend,
    Device,
    Granularity,
    OverflowPolicy,
    Product,
    RoundingMode,
    ScaleRule,
    cores_available,
)
from fmtcli.base.errors import FmtError, Param, UsageError, shown

if TYPE_CHECKING:
    from fmtcli.numerics.formats import FormatSpec

from fmtcli.cli.output import note

#: Library parameter -> the option that sets it on the command line: a library error names
#: the parameters it is about (``errors.Param``), and the command line says each as its
#: option (``as_options``).  A parameter not here keeps the library's ``name=value``.
OPTIONS = {"block": "--block", "tile": "--tile", "per": "--per", "axis": "--axis",
           "margin": "--margin", "percentile": "--percentile", "fixed_scale": "--fixed-scale",
           "scale_rule": "--scale-rule", "recipe": "--recipe", "compare": "--compare",
           "history": "--history", "first_axis": "--over-first-axis", "seed": "--seed",
           "out": "--out", "force": "--force", "key": "--key", "backend": "--backend",
           "device": "--device", "product": "--product", "rounding": "--rounding",
           "overflow": "--overflow", "format": "--format", "workers": "--workers",
           "chunk": "--chunk", "metric": "--metric", "top": "--top", "sort": "--sort",
           "worst_blocks": "--worst-blocks", "sram": "--sram", "io": "--io",
           "hadamard": "--hadamard", "dim": "--dim", "block_q": "--block-q",
           "block_k": "--block-k", "outliers": "--outliers",
           "promote_every": "--promote-every", "accumulator_bits": "--accumulator-bits",
           "accumulator": "--accumulator", "scale_granularity": "--scale-granularity",
           "dask": "--dask", "layout": "--layout", "count": "--count", "constant": "--constant",
           "random": "--random", "order": "--order", "dist": "--dist",
           "steps": "--steps", "layers": "--layers", "width": "--width", "heads": "--heads",
           "seq": "--seq", "batch": "--batch", "lr": "--lr", "seeds": "--seeds",
           "log_every": "--log-every", "data": "--data", "capture_dir": "--capture",
           "capture_steps": "--capture-steps", "amax_history": "--amax-history",
           "amax_mode": "--amax-mode", "mx_rule": "--mx-rule", "threads": "--threads"}
#: a quoted value that the shell takes as it is, unquoted on the command line
PLAIN_VALUE = re.compile(r"[-+\w./]+")


def as_options(error: FmtError) -> str:
    """A library error as the command line says it: each parameter it names becomes the
    option and its value (``block=0`` -> ``--block 0``, ``product='exact'`` -> ``--product
    exact``, ``force=True`` -> ``--force``), read from the error's parameters, not its text;
    quotes stay around values that need them (paths with spaces)."""
    return error.say(option_of)


def option_of(param: Param) -> str:
    """One parameter as its option and value (``--block 0``); a flag alone for True; the
    library's ``name=value`` for a parameter no option sets."""
    flag = OPTIONS.get(param.name)
    if flag is None:
        return str(param)
    if param.value is True:
        return flag
    text = param.text
    if text[:1] == "'" and text[-1:] == "'" and PLAIN_VALUE.fullmatch(text[1:-1]):
        text = text[1:-1]
    return f"{flag} {text}"

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
CsvOption = Annotated[bool, typer.Option(
    "--csv", help="Print CSV on stdout: a header, then one row per tensor and scheme (the "
    "JSON key names; nan/inf as such).  Not with --json.")]
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
    "--tile", metavar="RxC", help="One scale per RxC tile of the tensor's matrix view, "
    "e.g. 128x128 or 1x128.")]


class Per(str, Enum):
    """The choices of --per (blocks and tiles have their own options)."""

    TENSOR = "tensor"
    ROW = "row"
    COLUMN = "column"


PerOption = Annotated[Optional[Per], typer.Option(
    "--per", case_sensitive=False, help="One scale per tensor, row or column of its "
    "matrix view (rows x last axis; a 1-D tensor is one row; conv weights O x I*kh*kw).",
    show_default=False)]
AxisOption = Annotated[Optional[int], typer.Option(
    "--axis", help="Axis of --block: -1 (last, default) or 0 (first).")]
KeyOption = Annotated[Optional[list[str]], typer.Option(
    "--key", metavar="NAME", help="Only these tensors of a checkpoint (name or glob; "
    "repeatable).")]


def check_workers(workers: int | None) -> int | None:
    """--workers N: 1 to the cores this process may use (more processes than cores only
    compete for them: a typo such as 1024 would fork a thousand)."""
    if workers is not None:
        most = cores_available()
        if not 1 <= workers <= most:
            raise UsageError(f"--workers {workers}: give 1 to {most} (the cores available "
                             "here)")
    return workers


WorkersOption = Annotated[Optional[int], typer.Option(
    "--workers", metavar="N", callback=check_workers, help="Worker processes, 1 to the cores "
    "available.  [default: the cores available, at most 8]", show_default=False)]
SEED_MAX = 2**64 - 1
SeedOption = Annotated[int, typer.Option(
    "--seed", min=0, max=SEED_MAX, help="Seed of stochastic rounding, 0..2**64-1.")]


def resolve_formats(names: list[str] | None, default: tuple[str, ...]) -> list[FormatSpec]:
    """Specs for the names (each may be a comma list; duplicates dropped, order kept), notes
    for ambiguous names on stderr as they are found (``format_names.parse_formats``).  An
    empty name ('', 'e4m3,') is a usage error, never a silent default."""
    from fmtcli.numerics.format_names import parse_formats

    return parse_formats(names, default, example="e.g. --format fp16,bf16,e4m3fn",
                         on_note=note)[0]


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
    """Notes on stderr of the tensors left out (an int64 position_ids, an empty tensor): one
    per tensor, or one per reason where several share it (a CNN's six int64
    ``num_batches_tracked``), naming at most ``MAX_SKIP_NAMES`` of them; the results list
    every one under ``skipped`` in JSON."""
    by_reason: dict[tuple[str, str], list] = {}
    for s in sources:
        if s.skipped is not None:
            by_reason.setdefault((str(s.dtype), s.skipped), []).append(s)
    for (dtype, reason), group in list(by_reason.items())[:MAX_SKIP_NOTES]:
        if len(group) == 1:
            s = group[0]
            note(f"skipped {shown(s.name)} ({dtype}, shape "
                 f"{'x'.join(map(str, s.shape)) or 'scalar'}): {reason}")
            continue
        names = ", ".join(shown(s.name) for s in group[:MAX_SKIP_NAMES])
        more = len(group) - MAX_SKIP_NAMES
        note(f"skipped {len(group):,} tensors ({dtype}): {reason}: {names}"
             + (f" and {more:,} more (--json lists them)" if more > 0 else ""))
    if len(by_reason) > MAX_SKIP_NOTES:
        rest = sum(len(g) for g in list(by_reason.values())[MAX_SKIP_NOTES:])
        note(f"skipped {rest:,} more tensors (--json lists them)")


MAX_SKIP_NAMES = 3
MAX_SKIP_NOTES = 20


class SortBy(str, Enum):
    """The choices of quantize's --sort: what makes a tensor one of the worst."""

    FLUSHED = "flushed"
    P99 = "p99"
    SQNR = "sqnr"
    MEDIAN = "median"
    SATURATED = "saturated"


class Compare(str, Enum):
    TENSOR = "tensor"
    NONE = "none"
    ALL = "all"


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
    from fmtcli.numerics.literals import parse_value

    return rule, parse_value(fixed_scale)
