"""``fmt audit``'s layout-specific checks: ``CHECKS``, functions ``(q, scan) -> Check |
None`` (None: the check does not apply to ``q``), run per quantized tensor after the
generic checks.  Thresholds and their reasons: docs/audit_layout_checks.md.

- ``global-scale`` (NVFP4's two-level scales).  ModelOpt (``NVFP4QTensor``:
  ``weight_scale_2 = amax / (6 * 448)``, ``x = code * weight_scale * weight_scale_2``)
  multiplies; compressed-tensors (``quantization/utils/helpers.py`` ``generate_gparam``:
  ``global_scale = 448 * 6 / amax``; ``forward_helpers``: ``scale / global_scale``)
  divides.  Either way the stored global implies the tensor's amax, ``A = 2688 * m`` with
  ``m`` the multiplier it stands for; the reciprocal reading implies ``2688^2 / A``.  The
  two readings' amaxes multiply to 7.2e6, so at most one of them is a weight's amax
  (``PLAUSIBLE_AMAX``): ``fail`` when only the reciprocal is, ``warn`` when neither is.
  Both exporters map the tensor's amax block to the FP8 maximum (its block scale is 448);
  the largest block scale over 448 (``headroom``) is therefore ~1 for the tensor that set
  the global and below 1 only where a global is shared (fused q/k/v, gate/up).  When no
  tensor of the input reaches ``HALF_SIZE`` (or one of stacked experts with their own
  global scales stays under it): ``fail`` at about half (``HALF_BAND``: half-size block
  scales), ``warn`` below (a global not set from the amax; the values may be right).
- ``expert-scales``: stacked (E x ...) or numbered (``experts.<i>.``) experts whose
  per-expert global scales are all identical (``warn``: one amax for all, or uncalibrated
  experts; compressed-tensors falls back to 1.0 for those), input scales reported.
- ``missing-scales``: the input / KV-cache scales the config promises and the input lacks
  (compressed-tensors ``config_groups[*].input_activations`` with ``dynamic`` false
  (``input_scale``) or ``"local"`` (``input_global_scale``), ``kv_cache_scheme``;
  ModelOpt ``quant_algo`` NVFP4 / FP8 (``input_scale``), ``kv_cache_quant_algo``;
  DeepSeek ``activation_scheme: static``) -> ``warn`` naming what is missing.
- ``kv-scales`` (layout ``kv-scales``): vLLM's ``k_scale`` / ``v_scale`` (``q_scale``)
  dequantize (``x = code * k_scale``, vLLM ``attention/layer.py``, ``fmt kv --out``):
  positive, finite, one per tensor or per KV head; outside ``KV_RANGE`` is suspicious
  (an amax / 448 scale of 1e3 means activations of 4.5e5; 1e-6 means 4.5e-4), and a
  scale covering activations above ``KV_AMAX`` (scale x fp8_max > 1e4) warns: inverted?
"""

from __future__ import annotations

import re

import numpy as np

from fmtcli.audit.check import Check, Verdict
from fmtcli.audit.layout_values import mx_scale_rule, nibble_order
from fmtcli.inputs.layouts.base import values_of

FP4_FP8 = 6.0 * 448.0            # 2688: FP4's max times FP8 E4M3's
PLAUSIBLE_AMAX = (1e-6, 1e3)     # a quantized weight's amax, either reading
HALF_SIZE = 0.55                 # largest block scale / 448 below this everywhere: ...
HALF_BAND = (0.45, 0.55)         # ... fail inside this band (half-size), warn under it
KV_RANGE = (1e-6, 1e3)
#: the largest K/V activation a scale may cover (scale x fp8_max) before it is implausible:
#: fp16's max is 65504 and trained models' K/V amaxes stay in the hundreds; a scale
#: inverted into fmt's direction (fp8_max / amax) covers fp8_max^2 / amax, above this
#: for every amax under ~20 (448^2 / 1e4)
KV_AMAX = 1e4
EXPERT = re.compile(r"^(.*\bexperts\.)(\d+)(\..*)$")
_CACHE: dict = {}


def _cached(scan, what: str, compute):
    """``compute()`` once per scan (the last scan only: audits run one input at a time)."""
    if _CACHE.get("scan") is not scan:
        _CACHE.clear()
        _CACHE["scan"] = scan
    if what not in _CACHE:
        _CACHE[what] = compute()
    return _CACHE[what]


def _global(q) -> tuple[np.ndarray, bool] | None:
    """The per-matrix multipliers ``m`` of ``q``'s global scale as stored (float64) and
    whether the convention multiplies; None where ``q`` has none."""
    convention = q.facts.get("global_scale_convention")
    if "global_scale" not in q.parts or convention not in ("modelopt", "compressed-tensors"):
        return None
    stored = np.asarray(values_of(q.parts["global_scale"]), dtype=np.float64).ravel()
    return stored, convention == "modelopt"


def _headrooms(q, matrices: int = 1) -> np.ndarray:
    """The largest block scale (decoded, before the global) over FP8's max, 448, of each
    of ``matrices`` equal parts of the scales (stacked experts with their own globals)."""
    scales = np.asarray(q.scales_reader(), dtype=np.float64) if q.scales_reader else None
    if scales is None or not scales.size or scales.size % matrices:
        return np.array([float("nan")])
    scales = np.where(np.isfinite(scales), scales, -np.inf).reshape(matrices, -1)
    best = scales.max(axis=1) / 448.0
    return np.where(np.isfinite(best), best, np.nan)


def _headroom(q) -> float:
    per = _headrooms(q)
    return float("nan") if np.all(np.isnan(per)) else float(np.nanmax(per))


def _input_headroom(scan) -> float:
    best = 0.0
    for other in scan.quantized:
        if _global(other) is not None and not other.problems:
            best = max(best, _headroom(other))
            if best >= 0.9:
                break
    return best


def global_scale(q, scan) -> Check | None:
    """NVFP4's global scale: the stored direction against the reciprocal (docstring)."""
    found = _global(q)
    if found is None or q.problems:
        return None
    stored, multiplies = found
    if not np.all(np.isfinite(stored) & (stored > 0)):
        return Check("global-scale", Verdict.FAIL, "the global scale is not positive and "
                     f"finite ({stored[~(np.isfinite(stored) & (stored > 0))][0]:g})",
                     {"global_scale": stored.tolist()[:16]})
    multiplier = stored if multiplies else 1.0 / stored
    amax_stored, amax_other = FP4_FP8 * multiplier, FP4_FP8 / multiplier
    lo, hi = PLAUSIBLE_AMAX
    stored_ok = (amax_stored >= lo) & (amax_stored <= hi)
    other_ok = (amax_other >= lo) & (amax_other <= hi)
    per = _headrooms(q, stored.size) if len(q.shape) >= 3 and stored.size == q.shape[0] \
        else _headrooms(q)
    headroom = float(np.nanmax(per)) if not np.all(np.isnan(per)) else float("nan")
    figures = {"convention": q.facts.get("global_scale_convention"),
               "implied_amax": float(amax_stored.max()),
               "implied_amax_reciprocal": float(amax_other.max()),
               "plausible_amax": list(PLAUSIBLE_AMAX), "headroom": headroom,
               "half_size_threshold": HALF_SIZE}
    if per.size > 1:
        figures["expert_headroom_min"] = float(np.nanmin(per))
    if np.any(~stored_ok & other_ok):
        return Check("global-scale", Verdict.FAIL,
                     f"the global scale looks inverted: as stored it implies amax "
                     f"{amax_stored.max():.3g}, its reciprocal {amax_other.max():.3g}",
                     figures)
    if np.any(~stored_ok):
        return Check("global-scale", Verdict.WARN,
                     f"the global scale implies amax {amax_stored.max():.3g}, its "
                     f"reciprocal {amax_other.max():.3g}: neither looks like a weight's",
                     figures)
    return _headroom_check(q, scan, figures)


def _headroom_check(q, scan, figures: dict) -> Check:
    headroom = figures["headroom"]
    if headroom > 1.0 + 2.0 ** -10:
        return Check("global-scale", Verdict.FAIL, f"a block scale is {headroom:.3g}x "
                     "FP8's max 448: the block scales were not scaled by the global",
                     figures)
    if figures.get("expert_headroom_min", 1.0) < HALF_SIZE:
        return _underused(figures["expert_headroom_min"], "an expert's block scales reach "
                          "at most {:.3g} of 448 under its own global scale", figures)
    if headroom < HALF_SIZE:
        best = _cached(scan, "headroom", lambda: _input_headroom(scan))
        figures = {**figures, "input_headroom": best}
        if best < HALF_SIZE:
            return _underused(best, "block scales reach at most {:.3g} of 448 in every "
                              "tensor (the amax block should reach 448)", figures)
    return Check("global-scale", Verdict.OK,
                 f"{figures['convention']} direction: implied amax "
                 f"{figures['implied_amax']:.3g}, largest block scale "
                 f"{headroom * 448:.4g} of FP8's 448", figures)


def _underused(ratio: float, text: str, figures: dict) -> Check:
    """Block scales under HALF_SIZE of 448: half-size (fail) when about half, else a
    global scale that is not the tensor's amax / 2688 (warn: values may still be right)."""
    if HALF_BAND[0] <= ratio <= HALF_BAND[1]:
        return Check("global-scale", Verdict.FAIL, text.format(ratio) + ": half-size "
                     "block scales", figures)
    return Check("global-scale", Verdict.WARN, text.format(ratio) + ": the global scale "
                 "is not the weight's amax / 2688, or the block scales are off", figures)


def _per_expert(q, scan, role: str) -> np.ndarray | None:
    """One value per expert of ``q``'s ``role`` part: stacked (its leading axis) or over
    the numbered experts of the same name; None when there are not two experts."""
    part = q.parts.get(role)
    if part is not None and len(q.shape) >= 3 and part.size == q.shape[0] > 1:
        return np.asarray(values_of(part), dtype=np.float64).ravel()
    match = EXPERT.match(q.key)
    if match is None:
        return None
    pattern = (match.group(1), match.group(3))
    siblings = _cached(scan, ("experts", pattern, role), lambda: [
        np.asarray(values_of(o.parts[role]), dtype=np.float64).ravel()[0]
        for o in scan.quantized if role in o.parts and (m := EXPERT.match(o.key))
        and (m.group(1), m.group(3)) == pattern])
    return np.asarray(siblings) if len(siblings) > 1 else None


def _first_experts(scan) -> dict:
    """The lowest expert number of each numbered-expert name (``experts.*.``) in ``scan``."""
    first: dict = {}
    for other in scan.quantized:
        m = EXPERT.match(other.key)
        if m is not None:
            pattern = (m.group(1), m.group(3))
            first[pattern] = min(first.get(pattern, int(m.group(2))), int(m.group(2)))
    return first


def expert_scales(q, scan) -> Check | None:
    """Per-expert global / input scales that are all the same (module docstring)."""
    match = EXPERT.match(q.key)
    if match is not None and int(match.group(2)) != _cached(scan, "first-experts", lambda: (
            _first_experts(scan))).get((match.group(1), match.group(3))):
        return None  # said once, on the lowest-numbered expert
    found = {role: _per_expert(q, scan, role) for role in ("global_scale", "input_scale")}
    found = {role: v for role, v in found.items() if v is not None}
    if not found:
        return None
    figures = {f"{role}_experts": int(v.size) for role, v in found.items()}
    figures.update({f"{role}_distinct": int(np.unique(v).size) for role, v in found.items()})
    notes, verdict = [], Verdict.OK
    weights = found.get("global_scale")
    if weights is not None and np.unique(weights).size == 1:
        verdict = Verdict.WARN
        fallback = " (1.0: compressed-tensors' value for uncalibrated experts)" \
            if weights[0] == 1.0 else ""
        notes.append(f"all {weights.size} experts share one global scale {weights[0]:.6g}"
                     f"{fallback}: one amax for all?")
    elif weights is not None and np.count_nonzero(weights == 1.0) and q.facts.get(
            "global_scale_convention") == "compressed-tensors":
        verdict = Verdict.WARN
        notes.append(f"{np.count_nonzero(weights == 1.0)} of {weights.size} experts have "
                     "global scale 1.0 (compressed-tensors' value for uncalibrated experts)")
    inputs = found.get("input_scale")
    if inputs is not None:
        notes.append(f"input scales: {np.unique(inputs).size} distinct of {inputs.size}")
    return Check("expert-scales", verdict, "; ".join(notes) or "per-expert scales differ",
                 figures)


def promises(config: dict | None, q) -> tuple[str | None, bool]:
    """What the config promises: the input scale's name (None: dynamic or not said) and
    whether KV-cache scales are promised."""
    config = config or {}
    if isinstance(config.get("config_groups"), dict):
        wanted = set()
        for group in config["config_groups"].values():
            acts = group.get("input_activations") if isinstance(group, dict) else None
            dynamic = acts.get("dynamic") if isinstance(acts, dict) else True
            wanted.add({False: "input_scale", "local": "input_global_scale"}.get(dynamic))
        name = wanted.pop() if len(wanted) == 1 else None
        return name, isinstance(config.get("kv_cache_scheme"), dict)
    algo = config.get("quant_algo") or q.facts.get("config_scheme")
    if config.get("quant_method") == "modelopt" or q.layout.startswith("modelopt"):
        name = "input_scale" if algo in ("NVFP4", "FP8") else None
        return name, bool(config.get("kv_cache_quant_algo"))
    if config.get("activation_scheme") == "static":
        return "input_scale", False
    return None, False


def _keys(scan) -> set[str]:
    keys = {s.key for s in scan.plain if s.key}
    for other in scan.quantized:
        keys.add(other.key)
        keys.update(p.key for p in other.parts.values() if p.key)
    return keys


def missing_scales(q, scan) -> Check | None:
    """Input / KV scales the config promises and the input lacks (module docstring)."""
    if "codes" not in q.parts:
        return None  # KV scales themselves
    name, kv = promises(scan.config, q)
    wants_input = name is not None and q.key.endswith("weight")
    wants_kv = kv and "k_proj" in q.key
    if not (wants_input or wants_kv):
        return None
    keys = _cached(scan, "keys", lambda: _keys(scan))
    missing, figures = [], {"input_scale_promised": name, "kv_scales_promised": kv}
    if wants_input and name not in q.parts:
        wanted = q.key[: -len("weight")] + name
        if wanted not in keys:
            missing.append(wanted)
    if wants_kv:
        prefix = q.key[: q.key.index("k_proj")]
        for scale in ("k_scale", "v_scale"):
            if not any(k.startswith(prefix) and k.endswith(scale) for k in keys):
                missing.append(prefix + "*" + scale)
    figures["missing"] = missing
    if missing:
        return Check("missing-scales", Verdict.WARN, "the config promises "
                     f"{', '.join(missing)}, which the input lacks", figures)
    return Check("missing-scales", Verdict.OK, "the scales the config promises are there",
                 figures)


def kv_scales(q, scan) -> Check | None:
    """vLLM KV-cache scales: positive, finite, per tensor or per head, plausible."""
    if q.layout != "kv-scales" or q.problems:
        return None  # a shape that is not per tensor or per head is a problem already
    values = np.asarray(q.scales_reader() if q.scales_reader else
                        values_of(next(iter(q.parts.values()))), dtype=np.float64)
    flat = values.ravel()
    direction = str(q.facts.get("scale_direction") or "dequantization")
    heads = q.facts.get("heads")
    finite = flat[np.isfinite(flat)]
    figures = {"count": int(flat.size), "min": float(finite.min()) if finite.size else None,
               "max": float(finite.max()) if finite.size else None,
               "range": list(KV_RANGE), "direction": direction}
    bad = flat[~(np.isfinite(flat) & (flat > 0))]
    if bad.size:
        return Check("kv-scales", Verdict.FAIL, f"{bad.size} KV scale(s) not positive and "
                     f"finite (e.g. {bad[0]:g})", figures)
    if direction.startswith("quantization"):
        return Check("kv-scales", Verdict.FAIL, "KV scales in the quantization direction; "
                     "vLLM multiplies (x = code * k_scale)", figures)
    if values.ndim > 1 and flat.size > 1 or (heads and flat.size not in (1, heads)):
        return Check("kv-scales", Verdict.WARN, f"shape {list(values.shape)}: vLLM takes "
                     "one KV scale per tensor or per head", figures)
    if flat.min() < KV_RANGE[0] or flat.max() > KV_RANGE[1]:
        return Check("kv-scales", Verdict.WARN, f"KV scales {flat.min():.3g}..{flat.max():.3g}"
                     f" outside {KV_RANGE[0]:g}..{KV_RANGE[1]:g}: inverted or "
                     "uncalibrated?", figures)
    fp8_max = float(q.facts.get("fp8_max") or 448.0)
    covered = float(flat.max()) * fp8_max
    figures = {**figures, "implied_amax": covered, "implied_amax_limit": KV_AMAX}
    if covered > KV_AMAX:
        return Check("kv-scales", Verdict.WARN, f"KV scale {flat.max():.3g} covers "
                     f"activations up to {covered:.3g} (x {fp8_max:g}), above {KV_AMAX:g}:"
                     f" inverted (fmt's {fp8_max:g} / amax)?", figures)
    note = " (all 1.0: vLLM's uncalibrated default)" if np.all(flat == 1.0) else ""
    return Check("kv-scales", Verdict.OK, f"{flat.size} positive finite scale(s), "
                 f"{flat.min():.3g}..{flat.max():.3g}{note}", figures)


CHECKS = (global_scale, nibble_order, mx_scale_rule, expert_scales, missing_scales,
          kv_scales)
