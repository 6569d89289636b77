"""``fmt audit PATH``: is an already-quantized checkpoint what its layout says it is?"""

from __future__ import annotations

from typing import Annotated

import typer

from fmtcli.base.choices import SUMMARY_TOP
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, KeyOption, WorkersOption, check_not_empty
from fmtcli.cli.output import StderrProgress, emit, note


@app.command("audit", cls=UsageWithEllipsis,
             short_help="Check a quantized checkpoint's layout, scales and codes.")
def audit_command(
    path: Annotated[str, typer.Argument(
        metavar="PATH", help="A quantized checkpoint: a .safetensors (or other tensor) "
        "file, a Hugging Face model folder (its config.json's quantization_config read "
        "too), or a sharded index.", show_default=False)],
    keys: KeyOption = None,
    show_all: Annotated[bool, typer.Option(
        "--all", help="List every quantized tensor (and its failed checks); without it, "
        "more than 8 tensors are summarised by role and the --top worst.")] = False,
    top: Annotated[int, typer.Option(
        "--top", min=0, metavar="N", help="How many rows each list of the summary shows: "
        "the worst roles, the worst tensors.")] = SUMMARY_TOP,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Exit 1 on a warning too (without it, only a failed check "
        "does).")] = False,
    workers: WorkersOption = None,
    json_out: JsonOption = False,
) -> None:
    """Check a quantized checkpoint: layout, scales, codes, bits per parameter.

    Every tensor a layout reader claims (DeepSeek-V3 FP8, compressed-tensors FP8, MX,
    NVFP4 and INT pack, ModelOpt NVFP4, gpt-oss MXFP4, KV scales, fmt's own --out) is
    described (layout, element, scale dtype, group, stored bits per parameter), its
    dequantized values measured chunk by chunk (amax, rms, zeros, NaN/inf), and checked:
    structure, scale count, dtype, finiteness, zeros and powers of two, clipping and
    lowest-code groups, all-zero groups, bits against the layout's nominal, the scheme
    config.json names, then the layout's own checks.  The rest is listed as plain data.  Exit 0 when
    no check fails (1 when one does; with --strict, a warning too).
    """
    from fmtcli.audit import audit_path
    from fmtcli.render.audit import every

    check_not_empty(key=keys)
    progress = StderrProgress("auditing")
    try:
        result = audit_path(path, keys, on_tensor=progress.tensor, workers=workers)
    finally:
        progress.close()
    if not result.tensors:
        note(f"no quantized layout found: {every(result.plain.count)} read as "
             "plain data")
    emit(result, json_out, top=top, show_all=show_all)
    failing = result.failed + (result.warned if strict else 0)
    if failing:
        what = "failed" if not strict else "failed or warned"
        note(f"{failing:,} check{'s' * (failing != 1)} {what} (exit 1)")
        raise typer.Exit(1)
