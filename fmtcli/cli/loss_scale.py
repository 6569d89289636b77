"""``fmt loss-scale``: which loss scale keeps gradients from flushing or overflowing."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import Backend, Device
from fmtcli.base.errors import UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import (
    BackendOption,
    DeviceOption,
    JsonOption,
    KeyOption,
    WorkersOption,
    check_not_empty,
    note_skipped,
    resolve_one_format,
)
from fmtcli.cli.output import emit


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
    from fmtcli.inputs.tensors import load_inputs
    from fmtcli.loss_scale import example_gradients, sweep_loss_scales

    check_not_empty(format=format_name, key=keys)
    if not files and keys:
        raise UsageError("--key needs a FILE")
    spec = resolve_one_format(format_name or "float16")
    sources = load_inputs(files, keys) if files else [example_gradients()]
    note_skipped(sources)
    result = sweep_loss_scales(sources, spec, workers=workers, backend=backend, device=device)
    emit(result, json_out, histogram=histogram)
