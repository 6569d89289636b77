"""The tables of ``fmt kv`` (``kv.KvResult``): the recommended scale of each layer's K and V
beside what unit scales give, every rule over all layers, and one line on what unit scales
cost.  Computes nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows

if TYPE_CHECKING:
    from fmtcli.kv import KvResult, KvStats

CAPTION = ("scale: vLLM's k_scale/v_scale, a dequantization scale: q = cast(x / scale), "
           "x ~ q * scale (fmt's own scale is 1 / scale); token-head scales are computed "
           "per token at run time, never stored")


def _db(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else value_text(value)


def _scales(s: KvStats) -> str:
    if s.scale_min == s.scale_max:
        return value_text(s.scale_min, 3)
    return f"{value_text(s.scale_min, 2)}..{value_text(s.scale_max, 2)}"


def _cells(s: KvStats) -> list[str]:
    return [_db(s.sqnr_db), percent_text(s.clipped_fraction),
            percent_text(s.flushed_fraction), percent_text(s.p99_rel_error),
            percent_text(s.max_rel_error)]


def render_kv(result: KvResult):
    rows = {}
    for s in result.streams:
        unit = next((t for t in s.stats if t.candidate == "unit"), None)
        rec = s.recommended
        rows.setdefault(s.layer, []).append((s.stream.upper(), [
            f"{rec.granularity} {rec.candidate}", _scales(rec), _db(rec.sqnr_db),
            _db(unit.sqnr_db) if unit else "-", percent_text(rec.clipped_fraction),
            percent_text(rec.flushed_fraction)]))
    parts = [HeadedRows(
        f"Recommended {result.format} KV-cache scales", "", ["rule", "scale", "SQNR",
                                                              "unit", "clipped", "flushed"],
        [(f"layer {layer}", None, r) for layer, r in rows.items()], name_header="",
        caption="SQNR in dB; unit: the SQNR of scale 1.0 (vLLM's default)" + (
            "; scale: as applied on fnuz GPUs (MI300), where vLLM doubles a checkpoint's "
            "scales: --out writes half" if result.checkpoint_factor != 1 else ""))]
    parts.append(HeadedRows(
        "Every rule, all layers together", "rule", ["SQNR", "clipped", "flushed", "p99 rel",
                                                    "max rel"],
        [(stream.upper(), None, [(f"{s.granularity} {s.candidate}", _cells(s))
                                 for s in stats]) for stream, stats in result.totals.items()],
        name_header="stream", caption=CAPTION))
    lines = []
    for stream, stats in result.totals.items():
        unit = next((s for s in stats if s.candidate == "unit"), None)
        rec = result.recommended_total[stream]
        if unit is not None:
            lines.append(f"{stream.upper()}: scale 1.0 gives {_db(unit.sqnr_db)} dB "
                         f"({percent_text(unit.clipped_fraction)} clipped, "
                         f"{percent_text(unit.flushed_fraction)} flushed); the "
                         f"recommended scales {_db(rec.sqnr_db)} dB.")
    if lines:
        parts.append(Text("What unit scales cost: " + " ".join(lines)))
    return Group(*parts)
