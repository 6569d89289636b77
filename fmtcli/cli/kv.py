"""``fmt kv``: FP8 KV-cache scales (vLLM's k_scale/v_scale) chosen from real K and V."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fmtcli.base.errors import UsageError
from fmtcli.cli.app import UsageWithEllipsis, app
from fmtcli.cli.options import JsonOption, check_not_empty, resolve_one_format
from fmtcli.cli.output import StderrProgress, emit, note

FORMATS = ("e4m3fn", "e4m3fnuz", "e5m2")


@app.command("kv", cls=UsageWithEllipsis,
             short_help="FP8 KV-cache scales: which k_scale/v_scale, what unit costs.")
def kv_command(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="K/V dumps: .npy .npz .safetensors .pt (tensors named like "
        "layers.3.k / layers.3.v, key/value, k_cache/v_cache; a .npy by its file name).  "
        "None: a built-in synthetic example (outlier channels in K, heavy-tailed V).",
        show_default=False)] = None,
    k_file: Annotated[Optional[str], typer.Option(
        "--k", metavar="PATH", help="A file whose every tensor is K (its layer from its "
        "name, e.g. layers.3, or from a layers axis).", show_default=False)] = None,
    v_file: Annotated[Optional[str], typer.Option(
        "--v", metavar="PATH", help="A file whose every tensor is V.", show_default=False)
    ] = None,
    format_name: Annotated[str, typer.Option(
        "--format", metavar="F", help="KV-cache format: " + ", ".join(FORMATS) + " (fp8: "
        "e4m3fn).  e4m3fnuz: the scales vLLM applies on fnuz GPUs (MI300), which double "
        "what a checkpoint holds: --out writes half of them.")] = "e4m3fn",
    layout: Annotated[str, typer.Option(
        "--layout", metavar="AXES", help="The axes of each tensor, from layers, batch, "
        "tokens, heads, dim (batch and tokens are merged), e.g. layers,tokens,heads,dim.")
    ] = "tokens,heads,dim",
    granularity: Annotated[str, typer.Option(
        "--granularity", metavar="G[,G]", help="Scales per tensor (a layer's K or V), per "
        "KV head, per token and head (dynamic: reported, never written).")
    ] = "tensor,head,token-head",
    candidates: Annotated[str, typer.Option(
        "--candidates", metavar="RULES", help="Scale rules: unit (1.0, vLLM's default), "
        "amax, amax-x2, p99.99, mse.")] = "unit,amax,amax-x2,p99.99,mse",
    out: Annotated[Optional[str], typer.Option(
        "--out", metavar="PATH", help="Write the recommended scales under vLLM's names "
        "(model.layers.N.self_attn.k_scale / v_scale, vLLM's direction: dequantization "
        "scales): .safetensors or .json.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")
                     ] = False,
    json_out: JsonOption = False,
) -> None:
    """Which FP8 KV-cache scales?  Every rule and granularity on real K and V.

    vLLM's k_scale/v_scale are dequantization scales: q = cast(x / k_scale), x ~ q *
    k_scale, k_scale = amax / fp8_max (fmt's scale is 1 / k_scale).  For each layer and
    stream: clipped and flushed fractions, SQNR, p99 and max relative error of each
    rule; the recommendation (highest SQNR among stored granularities); what unit scales
    cost.
    """
    import os

    from fmtcli.kv import (
        KV_FORMATS,
        analyse_kv,
        example_kv,
        kv_streams,
        parse_layout,
        write_scales,
    )

    check_not_empty(format=format_name, layout=layout, granularity=granularity,
                    candidates=candidates, out=out, k=k_file, v=v_file)
    inputs = [*(files or []), *(f for f in (k_file, v_file) if f is not None)]
    spec = resolve_one_format(format_name)  # every command's parser: fp8, e4m3 -> e4m3fn
    if spec.name not in KV_FORMATS:
        raise UsageError(f"--format {format_name}: a KV-cache format is one of "
                         f"{', '.join(FORMATS)}")
    parse_layout(layout)
    if out is not None:
        if not out.endswith((".safetensors", ".json")):
            raise UsageError(f"--out {out}: a .safetensors or .json file")
        if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
            raise UsageError(f"--out {out}: no such directory")
        if os.path.exists(out) and not force:
            raise UsageError(f"--out {out} exists: give --force to replace it")
        if any(os.path.abspath(out) == os.path.abspath(f) for f in inputs):
            raise UsageError(f"--out {out} is an input")
    if inputs:
        from fmtcli.inputs.tensors import load_path

        names: dict = {}
        streams = kv_streams([s for f in files for s in load_path(f)], layout,
                             names=names) if files else None
        for kind, path in (("k", k_file), ("v", v_file)):
            if path is not None:
                streams = kv_streams(load_path(path), layout, kind, streams, names)
    else:
        if layout != "tokens,heads,dim":
            raise UsageError("--layout describes FILEs; the built-in example has none")
        streams, names = example_kv(), None
    progress = StderrProgress("kv scales")
    try:
        result = analyse_kv(streams, spec,
                            list(dict.fromkeys(g.strip() for g in granularity.split(","))),
                            list(dict.fromkeys(c.strip() for c in candidates.split(","))),
                            inputs=tuple(inputs or ["<built-in example>"]), progress=progress,
                            names=names)
    finally:
        progress.close()
    if out is not None:
        write_scales(result, out)
        halved = "; halved: vLLM doubles them on fnuz GPUs" \
            if result.checkpoint_factor != 1 else ""
        note(f"wrote {len(result.streams)} scales to {out} (vLLM's direction: "
             f"x ~ q * k_scale{halved})")
    emit(result, json_out)
