"""``fmt compare REF TEST``: how far is a test tensor (or checkpoint) from its reference?"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fmtcli.base.choices import CHUNK_ELEMENTS, SUMMARY_TOP
from fmtcli.base.errors import shown
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, KeyOption, WorkersOption, check_not_empty
from fmtcli.cli.output import SafeStream, StderrProgress, emit, note, writing_results

LISTED = 8  # names listed in the note about tensors on one side only


@app.command("compare", cls=UsageWithEllipsis,
             short_help="How far is TEST from REF? SQNR, cosine, KL, per tensor.")
def compare_command(
    ref: Annotated[str, typer.Argument(
        metavar="REF", help="The reference: .npy .npz .safetensors .pt/.pth/.bin, a "
        "directory (a Hugging Face model folder), or - for numbers on stdin.",
        show_default=False)],
    test: Annotated[str, typer.Argument(
        metavar="TEST", help="What to compare with it (same kinds); tensors are matched "
        "by name (by file and name where a folder's files repeat one), or a single array "
        "with a single array.", show_default=False)],
    keys: KeyOption = None,
    logits: Annotated[bool, typer.Option(
        "--logits", help="The last axis holds logits (a row per token): also the KL "
        "divergence KL(ref || test) per row (mean, median, p99, max), top-1 agreement and "
        "top-5 overlap.")] = False,
    any_dtype: Annotated[bool, typer.Option(
        "--any-dtype", help="Compare tensors whose dtypes differ (both read as float64); "
        "without it a dtype mismatch is an error.")] = False,
    chunk: Annotated[int, typer.Option(
        "--chunk", min=1024, help="Elements per chunk (memory; results do not depend on it "
        "but for the last bits of sums).")] = CHUNK_ELEMENTS,
    workers: WorkersOption = None,
    top: Annotated[int, typer.Option(
        "--top", min=0, metavar="N", help="How many rows each list of the summary (more "
        "than 8 tensors) shows: the worst roles, the worst tensors (0: none).")
        ] = SUMMARY_TOP,
    csv_out: Annotated[bool, typer.Option(
        "--csv", help="Print CSV on stdout: a header (the JSON key names), then one row per "
        "tensor.  Not with --json.")] = False,
    json_out: JsonOption = False,
) -> None:
    """How far is TEST from REF?  Per tensor: SQNR, cosine, calc_diff, errors.

    SQNR = 10 log10(sum x^2 / sum (y - x)^2) (torchao), cosine similarity, calc_diff =
    1 - 2 sum(xy) / sum(x^2 + y^2) (DeepGEMM), relative Frobenius error, max abs and
    relative error, median/p99 relative error, elements that differ, NaN/inf on each side;
    x the reference, y the test.  Checkpoints are matched by tensor name, and by file and
    name (a.pt:w) where a folder's files repeat a name (tensors on one side only are
    listed on stderr); shapes (and dtypes, unless --any-dtype) must agree.  More than 8
    tensors: a summary by role, worst (lowest SQNR) first.  A side that is an
    already-quantized checkpoint (a layout fmt audit lists) is read dequantized, and each
    tensor gets a verdict beside fmt's own quantization of REF in the same element format
    and granularity: flagged at cosine < 0.99 or SQNR more than 6 dB below fmt's own.
    """
    from fmtcli.compare import compare_files

    if csv_out and json_out:
        from fmtcli.base.errors import UsageError

        raise UsageError("--csv and --json are alternatives: give one")
    check_not_empty(key=keys)
    progress = StderrProgress("comparing")
    try:
        result = compare_files(ref, test, keys, logits=logits, any_dtype=any_dtype,
                               chunk_elements=chunk, workers=workers, progress=progress,
                               on_tensor=progress.tensor)
    finally:
        progress.close()
    for side, names in (("REF", result.only_in_ref), ("TEST", result.only_in_test)):
        if names:
            listing = ", ".join(shown(n) for n in names[:LISTED])
            more = f" and {len(names) - LISTED:,} more" if len(names) > LISTED else ""
            note(f"{len(names):,} tensor{'s' if len(names) > 1 else ''} only in {side} "
                 f"(not compared): {listing}{more}")
    said = set()
    for info in result.skipped:  # once per name, however many sides skip it
        if (info.key, info.skipped) not in said:
            said.add((info.key, info.skipped))
            note(f"skipped {shown(info.key or info.name)}: {info.skipped}")
    if csv_out:
        from fmtcli.render.csvout import compare_csv

        with writing_results():
            SafeStream(sys.stdout).write(compare_csv(result))
    else:
        emit(result, json_out, top=top)
