"""``fmt scale-search``: candidate scale rules side by side, the best marked."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional

import typer

from fmtcli.base.choices import HISTORY, Backend, Device, Metric, Product
from fmtcli.base.errors import UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import (
    AxisOption,
    BackendOption,
    BlockOption,
    DeviceOption,
    JsonOption,
    KeyOption,
    Per,
    PerOption,
    ProductOption,
    TileOption,
    WorkersOption,
    check_not_empty,
    granularity,
    note_skipped,
    resolve_one_format,
)
from fmtcli.cli.output import emit, note


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
    include_buffers: Annotated[bool, typer.Option(
        "--include-buffers", help="Rank the rules over non-weight buffers too (BatchNorm's "
        "running_mean, running_var; moving_mean, moving_variance; inv_freq): by default "
        "they are left out, as quantize leaves them out of its total.")] = False,
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
        from fmtcli.cli.loss_scale import run_loss_scale

        note("'fmt scale-search --loss-scale' is deprecated: use 'fmt loss-scale' (same "
             "options and output)")
        run_loss_scale(files, format_name, histogram, keys, backend, device, workers, json_out)
        return
    from fmtcli.inputs.tensors import example_tensor, load_inputs
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.scale_search import search_scales

    if block is None and tile is None and per is None:
        per = Per.TENSOR
    base = replace(build_scheme(format=resolve_one_format(format_name), block=block,
                                tile=tile, per=granularity(per), axis=axis), product=product)
    sources = load_inputs(files, keys) if files else [example_tensor()]
    note_skipped(sources)
    result = search_scales(sources, base, metric, history=history,
                           first_axis=over_first_axis, workers=workers, backend=backend,
                           device=device, include_buffers=include_buffers)
    emit(result, json_out)
