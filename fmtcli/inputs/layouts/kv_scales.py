"""KV-cache scales: ``k_scale`` / ``v_scale`` (/ ``q_scale``) beside a checkpoint's
attention layers, in vLLM's dequantization direction.

Definition (vLLM, ``vllm/model_executor/layers/quantization/kv_cache.py``
``BaseKVCacheMethod``, as ``fmtcli/kv/__init__.py`` documents it; llm-compressor and
compressed-tensors write the same names; ``fmt kv --out`` writes them too): per layer
``model.layers.N.self_attn.k_scale`` and ``.v_scale`` (``q_scale`` for an FP8 attention
query), float32, a scalar (one per tensor) or ``[num_kv_heads]`` (one per KV head), in the
*dequantization* direction: ``q = cast(x / k_scale)``, ``x ~ q * k_scale``, ``k_scale =
amax / fp8_max`` (1.0 when uncalibrated; vLLM doubles them on fnuz GPUs, so ``fmt kv``
writes half for float8_e4m3fnuz).  fmt's own scale is ``1 / k_scale``.

**They hold no codes**: the K and V they scale exist only at run time.  The rule: each is
claimed as a ``Quantized`` whose only part is ``{"scales": ...}`` -- its ``shape`` the
scale's, ``rows_reader`` / ``scales_reader`` the scale values themselves (float32, as
stored, no direction applied) and ``elements_reader`` None.  ``layouts.dequantized`` keeps
only groups with a ``codes`` part, so the scales leave the data every analysis reads
(``fmt quantize`` no longer quantizes a scale as if it were a weight; an input of scales
alone gives them as skipped sources saying what they are, ``layouts.scales_only``), while
``layouts.scan`` still shows them to ``fmt audit``, which checks them: positive, finite, one per tensor or
per head, the direction.  ``group`` is what one value covers of the tensor exposed here
(the scale vector: ``tensor`` for a scalar, ``block 1`` for one per head, so that counting
scales against ``shape`` holds); ``facts["granularity"]`` is what it covers in the KV cache
(``tensor`` or ``head``).  ``facts`` carry what the checks need: ``stream`` (k, v or q),
``layer``, ``heads`` (None for one per tensor), ``format`` and ``fp8_max`` (the KV format:
``fmt kv``'s file metadata, else the config's ``kv_cache_scheme``, else vLLM's ``fp8`` =
float8_e4m3fn), ``covered_amax`` (scale x fp8_max: the amax each scale covers when applied
in vLLM's direction; an inverted, fmt-direction scale shows as an amax of thousands).

Detection is strict: the key's last part is ``k_scale``, ``v_scale`` or ``q_scale``, the
dtype a real float, at most ``MAX_HEADS`` values in at most two axes.  What is claimed but
not one per tensor or per head (a shape like [8, 2]), or K and V of one layer with different
head counts, is a problem (``Quantized.problems``).
"""

from __future__ import annotations

import os
import re

import numpy as np

from fmtcli.base.errors import FmtError
from fmtcli.inputs.layouts.base import Checkpoint, Quantized, values_of
from fmtcli.numerics.granularity import ScaleGroup

NAME = "kv-scales"
DESCRIPTION = ("k_scale / v_scale (/ q_scale): float32 per tensor or per KV head, "
               "dequantization (x = q * k_scale)")
REFERENCE = ("vLLM vllm/model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod; "
             "fmtcli/kv (fmt kv --out)")

STREAMS = {"k_scale": "k", "v_scale": "v", "q_scale": "q"}
FLOATS = ("float32", "float64", "float16", "bfloat16")
MAX_HEADS = 4096
DEFAULT_FORMAT = "float8_e4m3fn"  # vLLM's kv_cache_dtype "fp8"
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def _stream(key: str) -> str | None:
    return STREAMS.get(key.rsplit(".", 1)[-1])


def _is_scale(key: str, source) -> bool:
    return (_stream(key) is not None and source.dtype in FLOATS and source.opener is not None
            and len(source.shape) <= 2 and 1 <= source.size <= MAX_HEADS)


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    formats: dict[str, tuple[str, str]] = {}  # a file's KV format, its header read once
    found = []
    for key, source in checkpoint.tensors.items():
        if _is_scale(key, source):
            if source.source not in formats:
                formats[source.source] = _format(source, checkpoint.config)
            found.append(_quantized(key, source, checkpoint.config, formats[source.source]))
    heads = {}
    for q in found:
        heads.setdefault(q.key.rsplit(".", 1)[0], {})[q.facts["stream"]] = q.facts["heads"]
    for q in found:
        mine, siblings = q.facts["heads"], heads[q.key.rsplit(".", 1)[0]]
        other = siblings.get("v" if q.facts["stream"] == "k" else "k")
        if q.facts["stream"] in "kv" and mine and other and mine != other:
            q.problems.append(f"{q.key} has {mine} heads and its "
                              f"{'v' if q.facts['stream'] == 'k' else 'k'}_scale {other}")
    return found


def _format(source, config: dict | None) -> tuple[str, str]:
    """The KV format's name and where it was read: ``fmt kv --out``'s file metadata, the
    config's ``kv_cache_scheme`` (compressed-tensors: type float, 8 bits), or vLLM's fp8."""
    if source.source.lower().endswith(".safetensors"):
        try:
            from fmtcli.inputs.safetensorsfile import read_metadata

            metadata = read_metadata(source.source)
        except (FmtError, OSError, ValueError, RecursionError):  # a hint only
            metadata = {}
        # fmt kv --out's (format + checkpoint_factor); transformers writes {"format": "pt"}
        name = metadata.get("format")
        if ("checkpoint_factor" in metadata and isinstance(name, str) and len(name) < 40
                and _fp8_max(name) is not None):
            return name, f"{os.path.basename(source.source)} metadata (fmt kv --out)"
    scheme = (config or {}).get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("type") == "float" and scheme.get(
            "num_bits") == 8:
        return DEFAULT_FORMAT, "config.json kv_cache_scheme"
    return DEFAULT_FORMAT, "vLLM's fp8 default"


def _fp8_max(name: str) -> float | None:
    try:
        from fmtcli.numerics.formats import get_format

        return float(get_format(name).max)
    except FmtError:  # an unknown name in a file's metadata: no amax figure
        return None


def _quantized(key: str, source, config: dict | None, found: tuple[str, str]) -> Quantized:
    shape = tuple(source.shape)
    per_head = [n for n in shape if n != 1]
    problems = []
    if len(per_head) > 1:
        problems.append(f"{key} has shape {list(shape)}: a KV scale is one per tensor or "
                        "one per KV head")
    heads = per_head[0] if len(per_head) == 1 else None
    match = _LAYER.search(key)
    name, where = found
    fp8_max = _fp8_max(name)
    cache: dict = {}

    def scales() -> np.ndarray:
        if not cache:
            cache["v"] = values_of(source).astype(np.float32).reshape(shape)
        return cache["v"]

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        return scales().reshape(1, -1)[r0:r1]

    facts = {"scale_direction": "dequantization (x = code * scale)",
             "stream": STREAMS[key.rsplit(".", 1)[-1]],
             "layer": int(match.group(1)) if match else None, "heads": heads,
             "format": name, "format_from": where, "fp8_max": fp8_max,
             "config_scheme": _config_scheme(config), "nominal_bits": None,
             "scale_rule": "amax / fp8_max (vLLM; fmt kv --out's recommendation)"}
    if fp8_max is not None and not problems:
        with np.errstate(over="ignore", invalid="ignore"):
            facts["covered_amax"] = [float(v) * fp8_max for v in scales().reshape(-1)]
    # the group as seen on the tensor exposed here, the scale vector itself: each value
    # its own (block 1); what a scale covers in the KV cache is facts["granularity"]
    facts["granularity"] = "head" if heads else "tensor"
    group = ScaleGroup("block", block=1) if heads else ScaleGroup("tensor")
    return Quantized(NAME, key, source.source, shape, name, source.dtype, group,
                     {"scales": source}, rows_reader, facts, None, scales, problems)


def _config_scheme(config: dict | None):
    scheme = (config or {}).get("kv_cache_scheme")
    if not isinstance(scheme, dict):
        return None
    return {k: scheme.get(k) for k in ("type", "num_bits", "strategy", "symmetric")
            if k in scheme}
