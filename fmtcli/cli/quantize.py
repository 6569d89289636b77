"""``fmt quantize``: how much a tensor loses under a scaling scheme."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.choices import (
    CHUNK_ELEMENTS,
    RECIPE_NAMES,
    SUMMARY_ABOVE,
    SUMMARY_TOP,
    Backend,
    Device,
    Granularity,
    OutLayout,
    OverflowPolicy,
    Product,
    RoundingMode,
    ScaleRule,
)
from fmtcli.base.errors import UsageError, shown
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import (
    AxisOption,
    BackendOption,
    BlockOption,
    Compare,
    CsvOption,
    DeviceOption,
    JsonOption,
    KeyOption,
    Per,
    PerOption,
    ProductOption,
    RoundingOption,
    SeedOption,
    SortBy,
    TileOption,
    WorkersOption,
    check_not_empty,
    granularity,
    note_skipped,
    resolve_one_format,
    rule_with_value,
)
from fmtcli.cli.output import StderrProgress, emit, emit_csv, note

MAX_WORST_BLOCKS = 100_000  # a list longer than this is no report (and costs memory)


@app.command("quantize", cls=UsageWithEllipsis,
             short_help="How much does a tensor lose? Per tensor vs per block.")
def quantize_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Tensors: .npy .npz .safetensors .pt/.pth/.bin "
        ".txt/.csv/.json, a directory (a Hugging Face model folder, sharded or not, reads as "
        "one checkpoint), or - for numbers on stdin. None: the article's built-in example "
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
    layout: Annotated[Optional[OutLayout], typer.Option(
        "--layout", case_sensitive=False, metavar="L", help="With --out DIR: write the "
        "scheme's result as a checkpoint folder (model.safetensors + config.json) in a "
        "layout its loaders read: " + ", ".join(x.value for x in OutLayout)
        + " (docs/quantize.md).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
    seed: SeedOption = 0,
    backend: BackendOption = Backend.AUTO,
    device: DeviceOption = Device.AUTO,
    product: ProductOption = Product.FLOAT32,
    chunk: Annotated[int, typer.Option(
        "--chunk", min=1024, help="Elements per chunk (memory and speed; results do not "
        "depend on it).")] = CHUNK_ELEMENTS,
    workers: WorkersOption = None,
    dask: Annotated[Optional[str], typer.Option(
        "--dask", metavar="ADDRESS", help="Run on a Dask cluster: a scheduler "
        "(tcp://HOST:8786) or local:N (N worker processes here); the workers read the "
        "files themselves, the statistics are those of one machine.  Needs pip install "
        "'fmtcli[dask]' (docs/scale-out.md).", show_default=False)] = None,
    per_tensor: Annotated[bool, typer.Option(
        "--per-tensor", help="A row per tensor and scheme, however many tensors (the default "
        f"above {SUMMARY_ABOVE} tensors is a summary: by role, the worst tensors, the "
        "total).")] = False,
    top: Annotated[int, typer.Option(
        "--top", min=0, metavar="N", help="How many rows each list of the summary shows: "
        "the worst tensors, the roles (all in the checkpoint's order when there are at "
        "most N, else the N worst), the roles whose blocks flush most (0: none).")
        ] = SUMMARY_TOP,
    sort: Annotated[SortBy, typer.Option(
        "--sort", case_sensitive=False, help="What makes a tensor one of the worst (under "
        "the chosen scheme).  flushed (the default): the fraction of values flushed to "
        "zero, each lost whole, which SQNR (dominated by the largest values) hides and the "
        "p99 misses below 1% of a tensor; ties go to the larger p99, then the lower SQNR.  "
        "p99, median: relative error, largest first; sqnr: lowest first; saturated: "
        "largest fraction first.")] = SortBy.FLUSHED,
    worst_blocks: Annotated[int, typer.Option(
        "--worst-blocks", min=0, max=MAX_WORST_BLOCKS, metavar="K",
        help="List each block scheme's K worst blocks (most values flushed, then largest "
        "relative error): tensor, block, amax, scale.  0..100000.")
    ] = 0,
    include_buffers: Annotated[bool, typer.Option(
        "--include-buffers", help="Count non-weight buffers in the total (BatchNorm's "
        "running_mean, running_var, num_batches_tracked; moving_mean, moving_variance; "
        "inv_freq): by default they are reported per tensor but left out of it.")] = False,
    csv_out: CsvOption = False,
    json_out: JsonOption = False,
) -> None:
    """How much does a tensor lose? Scaled quantization, per tensor vs per block or tile.

    x_q = cast(x * scale) / scale.  Prints flushed values, median/p99 relative error, max
    abs error, RMSE, SQNR, bias and saturation for each scheme.  Default scheme: blocks
    of 128 along the rows of the tensor's matrix view (a matrix's last axis; conv weights
    O x I*kh*kw), float8_e4m3fn, amax scales.  Tensors that are not floating
    point (e.g. int64 position_ids) are skipped with a note on stderr.
    """
    from fmtcli.engine.writers import check_not_an_input, check_target
    from fmtcli.inputs.tensors import example_tensor, load_inputs
    from fmtcli.numerics.schemes import build_scheme, comparison_schemes
    from fmtcli.quantize import quantize

    if csv_out and json_out:
        raise UsageError("--csv and --json are alternatives: give one")
    check_not_empty(format=format_name, recipe=recipe, key=keys, tile=tile, out=out)
    scale_rule, fixed = rule_with_value(scale_rule, percentile, fixed_scale)
    if fixed is not None and block is None and tile is None and per is None:
        per = Per.TENSOR  # one given scale: the granularity does not matter
    main_scheme = build_scheme(format=resolve_one_format(format_name), block=block, tile=tile,
                               per=granularity(per), axis=axis, scale_rule=scale_rule,
                               margin=margin, recipe=recipe, rounding=rounding,
                               overflow=overflow, percentile=percentile, fixed_scale=fixed)
    schemes = comparison_schemes(main_scheme, compare.value)
    if dask is not None:
        from fmtcli.quantize.distributed import check_options, require_distributed

        check_options(dask, backend, device, out)
        if workers is not None:
            raise UsageError("--workers sets the processes of this machine; with --dask the "
                             "cluster's workers do the work (local:N sets how many)")
        if not files:
            raise UsageError("--dask needs FILE: the workers read tensors from files")
        require_distributed(dask)
    if out is not None:
        if compare is Compare.ALL:
            raise UsageError("--out writes one scheme; it cannot go with --compare all")
        if layout is None:
            check_target(out, files or [], force)
    if layout is not None:
        check_layout_options(layout, out, dask, files, force, main_scheme)
    if not files and keys:
        raise UsageError("--key needs a FILE")
    sources = load_inputs(files, keys) if files else [example_tensor()]
    if out is not None and layout is None:
        check_not_an_input(out, sources)
    plan = None
    if layout is not None:
        from fmtcli.engine.run import with_product
        from fmtcli.quantize.layout_out import plan_layout

        every = load_inputs(files) if keys else sources  # --key: which ones to quantize
        plan = plan_layout(out, layout, with_product([main_scheme], product)[0], every,
                           files, chosen=sources)
    note_skipped(sources)
    if main_scheme.granularity is Granularity.COLUMN:
        for s in sources:
            if s.skipped is None and len(s.shape) <= 1 and s.size > 1:
                note(f"--per column on the 1-D tensor {shown(s.name)}: each element is a "
                     "column, so every element gets its own scale")
    progress = StderrProgress("quantizing")
    try:
        if dask is not None:
            result = quantize_on_dask(sources, schemes, dask, seed=seed, chunk_elements=chunk,
                                      progress=progress, on_tensor=progress.tensor,
                                      backend=backend, device=device, product=product,
                                      worst_blocks=worst_blocks, connected=note_dask,
                                      include_buffers=include_buffers)
        else:
            result = quantize(sources, schemes, seed=seed, chunk_elements=chunk,
                              workers=workers, progress=progress, on_tensor=progress.tensor,
                              out=None if plan else out, backend=backend, device=device,
                              product=product,
                              worst_blocks=worst_blocks, include_buffers=include_buffers)
    finally:
        progress.close()
    if plan is not None:
        result = write_layout(plan, result, seed=seed, chunk_elements=chunk,
                              workers=workers, backend=backend, device=device)
    if csv_out:
        emit_csv(result)
    else:
        emit(result, json_out, per_tensor=per_tensor, top=top, sort=sort.value)


def quantize_on_dask(sources, schemes, address, **options):
    """``quantize.distributed.quantize_on_dask``, its result saying where it ran (the
    ``dask`` key of the JSON)."""
    from dataclasses import replace

    from fmtcli.quantize.distributed import quantize_on_dask as run

    result, where = run(sources, schemes, address, **options)
    return replace(result, ran_on=where)


def note_dask(where: dict) -> None:
    """Where a --dask run goes, as a note on stderr (before the work starts)."""
    note(f"running on Dask: scheduler {where['scheduler']}, {where['workers']} workers, "
         f"{where['threads']} threads ({where['dask']})")


def check_layout_options(layout, out, dask, files, force, scheme) -> None:
    """--layout's companions, checked before any work: a --out DIR, no --dask, FILE given,
    a scheme the layout holds, a directory that may be written."""
    from fmtcli.quantize.layout_out import check_directory
    from fmtcli.quantize.layout_tensors import check_scheme

    if out is None:
        raise UsageError("--layout writes a checkpoint folder: give it --out DIR")
    if dask is not None:
        raise UsageError("--layout writes on this machine; it cannot go with --dask")
    if not files or "-" in files:
        raise UsageError("--layout needs FILE: a checkpoint whose linear weights it writes "
                         "(not standard input)")
    check_scheme(layout, scheme)
    check_directory(out, files, force)


def write_layout(plan, result, **options):
    """``layout_out.write_layout`` with a progress bar; the result saying what it wrote."""
    from dataclasses import replace

    from fmtcli.quantize.layout_out import write_layout as write

    progress = StderrProgress("writing")
    try:
        written = write(plan, on_tensor=progress.tensor, **options)
    finally:
        progress.close()
    return replace(result, output=written)
