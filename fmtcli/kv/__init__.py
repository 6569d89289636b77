"""FP8 KV-cache scales chosen from real K and V: what each scale rule and granularity costs.

Serving engines store the KV cache in FP8 with one scale per tensor (per layer) or per KV
head.  **Direction**: vLLM's ``k_scale`` / ``v_scale`` are *dequantization* scales,

    q = cast(x / k_scale),   x ~ q * k_scale,   k_scale = amax(|K|) / fp8_max,

stored per layer as ``model.layers.N.self_attn.k_scale`` (a scalar, or ``[num_kv_heads]``)
and 1.0 when not calibrated.  ``fmt``'s own scales go the other way (``x_q = cast(x *
scale) / scale``): ``scale = 1 / k_scale``.  Everything in this module -- the statistics,
the scales reported and written -- is in vLLM's direction and computed as vLLM applies it
(float32 division by the scale, a saturating cast, multiplication by the scale), so that the
scales ``--out`` writes, applied that way, give exactly the figures reported.

For each layer and stream (K, V), granularity and candidate rule:

- granularities: ``tensor`` (one scale per layer and stream), ``head`` (one per KV head),
  ``token-head`` (one per token and head, as dynamic per-token quantization computes it at
  run time: reported, never written);
- candidates: ``unit`` (1.0, the serving default), ``amax`` (amax / fp8_max), ``amax-x2``
  (twice that: a binade of headroom for values beyond those calibrated), ``p99.99`` (the
  99.99th percentile of |x| / fp8_max: the top 0.01% clip), ``mse`` (the scale of least
  squared error on the grid of ``fmt scale-search``'s MSE search: amax scales times 2**-m,
  m in ``numerics.scaling.COARSE``, then steps of ``FINE_STEP`` around the best);
- figures: clipped (|x / s| beyond fp8_max, saturated) and flushed (nonzero x that become
  0) fractions, SQNR, p99 and max relative error over the nonzero values
  (``quantize.metrics.ErrorAccumulator``'s exact histogram: p99 to within +0.78%).

The recommendation of a layer and stream: the stored granularity (tensor or head) and rule
of the highest SQNR (fewest flushed values on a tie).

**What a checkpoint holds.**  vLLM keeps scales in float32 and loads a checkpoint's
``k_scale``/``v_scale`` in the OCP convention (E4M3's amax / 448); on GPUs whose FP8 is
fnuz (AMD MI300/MI325, gfx94x: ``current_platform.is_fp8_fnuz()``), where the cache is
float8_e4m3fnuz (max 240), it multiplies every loaded scale by 2 before use
(``BaseKVCacheMethod.process_weights_after_loading`` in vLLM's
``vllm/model_executor/layers/quantization/kv_cache.py``).  So the figures of
``--format e4m3fnuz`` are those of the scales vLLM *applies* there, and ``--out`` writes
half of them (``checkpoint_factor``), which vLLM doubles back exactly.  A scale must be a
normal float32 as written: a group whose amax / fp8_max falls below float32's smallest
normal (2^-126) cannot be given one and is refused, naming the tensor; the p99.99 and MSE
rules never go below that floor.
"""


from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.kv.inputs import (
    AXES,
    DEFAULT_LAYOUT,
    K_NAMES,
    V_NAMES,
    example_kv,
    kv_streams,
    parse_layout,
    stream_of,
)
from fmtcli.kv.scales import (
    CANDIDATES,
    FLOAT32_TINY,
    KV_KINDS,
    TinyScale,
    candidate_scale,
    checkpoint_factor,
    round_trip,
    smallest_scale,
)
from fmtcli.numerics.formats import FormatSpec
from fmtcli.streaming.metrics import ErrorAccumulator

__all__ = ["AXES", "CANDIDATES", "DEFAULT_LAYOUT", "FLOAT32_TINY", "GRANULARITIES",
           "K_NAMES", "KV_FORMATS", "KV_KINDS", "KvResult", "KvStats", "STORED", "StreamResult",
           "TinyScale", "V_NAMES", "analyse_kv", "candidate_scale", "checkpoint_factor",
           "example_kv", "kv_streams", "measure", "parse_layout", "round_trip",
           "smallest_scale", "stream_of", "vllm_name", "write_scales"]

GRANULARITIES = tuple(kind.value for kind in KV_KINDS)  # numerics.granularity's spellings
STORED = GRANULARITIES[:2]  # what a checkpoint holds (tensor, head); token-head's are dynamic
KV_FORMATS = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2")


def vllm_name(layer: int, stream: str) -> str:
    """The checkpoint name vLLM and llm-compressor load a layer's scale from."""
    return f"model.layers.{layer}.self_attn.{stream}_scale"


@dataclass(frozen=True)
class KvStats:
    """One granularity and rule on one stream: its scales (vLLM's direction) and errors."""

    granularity: str
    candidate: str
    count: int
    nonzero: int
    clipped: int
    flushed: int
    sqnr_db: float
    p99_rel_error: float
    max_rel_error: float
    scale_min: float
    scale_max: float

    @property
    def clipped_fraction(self) -> float:
        return self.clipped / self.count

    @property
    def flushed_fraction(self) -> float:
        return self.flushed / self.nonzero if self.nonzero else math.nan

    def to_dict(self) -> dict:
        return {**self.__dict__, "clipped_fraction": self.clipped_fraction,
                "flushed_fraction": self.flushed_fraction}


def measure(x: np.ndarray, k_scale: np.ndarray, spec: FormatSpec, granularity: str,
            candidate: str) -> tuple[KvStats, ErrorAccumulator]:
    """The figures of one set of scales on x (tokens, heads, dim), and its accumulator
    (mergeable over layers)."""
    x_hat, clipped = round_trip(x, k_scale, spec)
    acc = ErrorAccumulator()
    acc.add_chunk(x.reshape(-1), x_hat.reshape(-1), saturated=clipped)
    return _stats(acc, granularity, candidate, k_scale, _max_rel(x, x_hat)), acc


def _max_rel(x: np.ndarray, x_hat: np.ndarray) -> float:
    nz = x != 0
    if not nz.any():
        return math.nan
    return float((np.abs(x_hat[nz].astype(np.float64) - x[nz]) / np.abs(x[nz])).max())


def _stats(acc: ErrorAccumulator, granularity: str, candidate: str, k_scale,
           max_rel: float) -> KvStats:
    from fmtcli.streaming.metrics import scaled_sum

    x2, xp = scaled_sum(acc.sum_x2, acc.sum_x2_big, acc.sum_x2_tiny)
    e2, ep = scaled_sum(acc.sum_err2, acc.sum_err2_big, acc.sum_err2_tiny)
    if e2 == 0:
        sqnr = math.inf if x2 > 0 else math.nan
    elif x2 == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * (math.log10(x2 / e2) + (xp - ep) * math.log10(2))
    scales = np.asarray(k_scale, dtype=np.float64)
    return KvStats(granularity, candidate, acc.count, acc.nonzero, acc.saturated, acc.flushed,
                   sqnr, acc.quantile(0.99), max_rel, float(scales.min()), float(scales.max()))


@dataclass(frozen=True)
class StreamResult:
    """One layer's K or V: every (granularity, rule), the recommendation and its scales."""

    layer: int
    stream: str
    shape: tuple[int, int, int]
    stats: tuple[KvStats, ...]
    recommended: KvStats
    scales: tuple[float, ...]  # the recommended k_scale/v_scale: 1 value, or one per head

    @property
    def name(self) -> str:
        return vllm_name(self.layer, self.stream)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "stream": self.stream, "name": self.name,
                "tokens": self.shape[0], "heads": self.shape[1], "dim": self.shape[2],
                "recommended": {"granularity": self.recommended.granularity,
                                "candidate": self.recommended.candidate,
                                "scales": list(self.scales)},
                "candidates": [s.to_dict() for s in self.stats]}


@dataclass(frozen=True)
class KvResult:
    """All of ``fmt kv``: per layer and stream, the totals over layers, the cost of unit
    scales."""

    format: str
    fp8_max: float
    inputs: tuple[str, ...]
    streams: tuple[StreamResult, ...]
    totals: dict  # stream -> tuple of KvStats over every layer, in ``streams[0].stats`` order
    recommended_total: dict  # stream -> KvStats of the recommended scales over every layer
    checkpoint_factor: float = 1.0  # written scale = applied scale x this (``checkpoint_factor``)

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        """What ``--out`` writes: vLLM name -> float32 scalar (per tensor) or [num_kv_heads]
        (per head), the applied scales times ``checkpoint_factor`` (exact: a power of two)."""
        return {s.name: np.asarray(s.scales[0] if s.recommended.granularity == "tensor"
                                   else s.scales, np.float32)
                * np.float32(self.checkpoint_factor) for s in self.streams}

    def scales_document(self) -> dict:
        """The scales ``--out`` writes: vLLM name -> value (a float, or a list per head)."""
        return {name: a.tolist() for name, a in self.checkpoint_arrays().items()}

    def to_dict(self) -> dict:
        return {"format": self.format, "fp8_max": self.fp8_max, "inputs": list(self.inputs),
                "direction": "vllm: x ~ q * k_scale, q = cast(x / k_scale); fmt's scale = "
                             "1 / k_scale",
                "streams": [s.to_dict() for s in self.streams],
                "totals": {k: [s.to_dict() for s in v] for k, v in self.totals.items()},
                "recommended_total": {k: v.to_dict()
                                      for k, v in self.recommended_total.items()},
                "checkpoint_factor": self.checkpoint_factor,
                "scales": self.scales_document()}


def _better(a: KvStats, b: KvStats) -> bool:
    def key(s: KvStats) -> tuple[float, int]:
        return (-s.sqnr_db if not math.isnan(s.sqnr_db) else math.inf, s.flushed)

    return key(a) < key(b)


def analyse_kv(streams: dict[tuple[int, str], np.ndarray], spec: FormatSpec,
               granularities=GRANULARITIES, candidates=CANDIDATES,
               inputs: tuple[str, ...] = (), progress=None, names: dict | None = None
               ) -> KvResult:
    """Every (granularity, candidate) on every stream; recommendations from the stored
    granularities among those asked for.  ``progress(done, total)``: bytes of float32 K and
    V done, after each stream; ``names``: (layer, stream) -> the tensor's name, for errors.
    A format other than ``KV_FORMATS`` is a UsageError."""
    if spec.name not in KV_FORMATS:
        raise UsageError(Param("format", spec.name) + ": a KV-cache format is one of "
                         "e4m3fn, e4m3fnuz, e5m2")
    for g in granularities:
        if g not in GRANULARITIES:
            raise UsageError(Param("granularity", g) + f": one of {', '.join(GRANULARITIES)}")
    for c in candidates:
        if c not in CANDIDATES:
            raise UsageError(Param("candidate", c) + f": one of {', '.join(CANDIDATES)}")
    if not any(g in STORED for g in granularities):
        raise UsageError("granularity: give tensor or head too (token-head scales are "
                         "computed at run time and cannot be recommended for a checkpoint)")
    results, totals, rec_totals = [], {}, {}
    total_bytes, done = sum(x.nbytes for x in streams.values()), 0
    for (layer, kind), x in streams.items():
        rows, best, best_scale = [], None, None
        for g in granularities:
            for c in candidates:
                if c == "unit" and g != granularities[0]:
                    continue  # 1.0 everywhere: the same at every granularity
                try:
                    scale = candidate_scale(x, g, c, spec)
                except TinyScale as error:
                    name = (names or {}).get((layer, kind), f"layer {layer}'s {kind.upper()}")
                    raise DataError(f"{shown(name)}: " + error.parts, error.suggestion_parts
                                    ) from None
                stats, acc = measure(x, scale, spec, g, c)
                rows.append(stats)
                key = (kind, g, c)
                totals.setdefault(key, [ErrorAccumulator(), 0.0, [], 0])
                total = totals[key]
                total[0].merge(acc)
                total[1] = max(total[1], stats.max_rel_error) if not math.isnan(
                    stats.max_rel_error) else total[1]
                total[2].append(scale)
                if g in STORED and (best is None or _better(stats, best)):
                    best, best_scale, best_acc = stats, scale, acc
        rec = rec_totals.setdefault(kind, [ErrorAccumulator(), 0.0, []])
        rec[0].merge(best_acc)
        rec[1] = max(rec[1], best.max_rel_error) if not math.isnan(best.max_rel_error) \
            else rec[1]
        rec[2].append(best_scale)
        results.append(StreamResult(layer, kind, tuple(x.shape), tuple(rows), best,
                                    tuple(float(s) for s in np.asarray(best_scale).ravel())))
        done += x.nbytes
        if progress is not None:
            progress(done, total_bytes)
    total_stats = {}
    for (kind, g, c), (acc, max_rel, scales, _) in totals.items():
        flat = np.concatenate([np.asarray(s, np.float64).ravel() for s in scales])
        total_stats.setdefault(kind, []).append(_stats(acc, g, c, flat, max_rel))
    rec_stats = {}
    for kind, (acc, max_rel, scales) in rec_totals.items():
        flat = np.concatenate([np.asarray(s, np.float64).ravel() for s in scales])
        rec_stats[kind] = _stats(acc, "recommended", "recommended", flat, max_rel)
    return KvResult(spec.name, spec.max, tuple(inputs), tuple(results),
                    {k: tuple(v) for k, v in total_stats.items()}, rec_stats,
                    checkpoint_factor(spec))


def write_scales(result: KvResult, path: str) -> None:
    """``--out``: the recommended scales as vLLM loads them (``KvResult.checkpoint_arrays``:
    vLLM's names and direction, halved for e4m3fnuz), as .safetensors (float32 scalars, or
    [num_kv_heads]) or .json (the same content); written by the project's own writer,
    atomically, with a new file's usual mode (``quantize.writers.write_atomically``)."""
    import json

    from fmtcli.engine.writers import write_bytes, write_safetensors

    if path.endswith(".json"):
        write_bytes(path, json.dumps(
            {"direction": "vllm: x ~ q * k_scale (dequantization scales)",
             "format": result.format, "checkpoint_factor": result.checkpoint_factor,
             "scales": result.scales_document()}, indent=2).encode())
    elif path.endswith(".safetensors"):
        write_safetensors(path, result.checkpoint_arrays(),
                          {"format": result.format,
                           "checkpoint_factor": repr(result.checkpoint_factor)})
    else:
        raise UsageError(Param("out", path) + ": .safetensors or .json")
