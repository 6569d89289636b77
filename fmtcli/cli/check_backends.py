"""``fmt check-backends``: ml_dtypes and torch casts against fmtcli's engine."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import SEED_MAX, JsonOption, resolve_formats
from fmtcli.cli.output import emit


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
    mismatches by class, with NaN payload differences told apart from real ones.  First,
    what the installed ml_dtypes does where its releases differ (float64 rounded once or
    through float32; E8M0 subnormals and ties), torch's version, and whether fmt quantize's
    compiled kernel was built and is in use (FMTCLI_KERNEL=numpy turns it off).
    """
    from fmtcli.check_backends import check_backends
    from fmtcli.numerics import native
    from fmtcli.numerics.formats import REGISTRY

    names = (formats or []) + (format_names or [])
    specs = resolve_formats(names, ()) if names else list(REGISTRY.values())
    emit(check_backends(specs, seed, kernel=native.status()), json_out)
