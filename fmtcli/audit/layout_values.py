"""``fmt audit``'s layout checks that read a tensor's values: the nibble order of packed FP4
and the exporter's power-of-two scale rule (docs/audit_layout_checks.md gives every
threshold and why).

**Nibble order** (``nibble-order``).  compressed-tensors (``compressors/nvfp4/helpers.py``
``pack_fp4_to_uint8``: ``packed = low | high << 4``, the even element in the low nibble),
ModelOpt (``NVFP4QTensor``: ``(q[..., 1::2] << 4) | q[..., 0::2]``) and gpt-oss
(``weights.py``: ``lut[blk & 0x0F]`` first) all put the first element in the low nibble.
Reading the other order swaps every pair of neighbouring elements along the rows, inside
one scale block: a consistent column permutation.  Anything that ignores positions (the
values' histogram, per-column magnitudes, outlier columns, the block scales) is the same
under both readings, so the check measures the one thing a swap changes, the step between
neighbours across a pair boundary: ``R = mean((x[2k+1] - x[2k+2])^2) / (2 var)`` for the
stored reading and the same for the swapped one (there the step is ``x[2k] - x[2k+3]``).
With neighbour structure (a smooth row) the right reading has the smaller R; white noise
gives R = 1 in both.  ``fail`` when the swapped reading's R is below half the stored one's
and below 0.8; ``ok`` (high confidence) when the stored reading is the smooth one;
otherwise the rows have no neighbour structure to judge by (trained linear weights
usually have none along the input axis).  Then an *anchor* can decide: a plain (unpacked)
1-D tensor of the same layer with one value per input channel and "norm" in its name (the
layer norm the weight reads, e.g. ``input_layernorm.weight`` for q/k/v).  Trained weights'
columns co-vary with it (outlier channels); a swap moves each column's magnitude to its
neighbour.  The rank correlation of the columns' mean |x| with the anchor, stored vs
swapped: ``fail`` when the swapped one is larger by 5 standard errors (5 / sqrt(columns))
and at least 0.1, ``ok`` (high confidence) the other way round.  With no anchor, or none
that separates the readings: ``ok`` with ``confidence: low`` -- the order then rests on
the layout's definition (``facts["nibble_order"]``) and on fmt audit's comparison with the
original.

**Scale rule** (``mx-scale-rule``): power-of-two (E8M0 / UE8M0) block scales against the
exporter's own rule, from the stored codes alone.  With a block scale ``2^e`` the rule
puts the block's amax in a known range of ``amax / 2^e``, so the block's top code is at
least a rule-given minimum:

- compressed-tensors 0.20.1 (``quantization/utils/mxfp_utils.py`` ``generate_mx_scales``,
  ``round_to_power_2``): ``e = floor(log2 amax') - offset``, ``amax'`` rounded up a binade
  when amax's significand is >= 1.75, offset ``floor(log2 elem_max)`` (FP4: 2, FP8 E4M3: 8;
  FP8 uses FP4's 1-bit threshold): ``amax / 2^e`` in ``[3.5, 7)`` (FP4), ``[224, 448)``
  (FP8): top code >= 4, >= 224;
- OCP MX v1.0 (section 6.3): ``e = floor(log2 amax) - emax_elem``: ``[4, 8)``,
  ``[256, 512)``: top code >= 4, >= 256 (and the top binade clips);
- round-up rules, ``e = ceil(log2(amax / elem_max))``: triton_kernels'
  ``downcast_to_mxfp`` (``DequantScaleRoundingMode.ROUND_UP``, what gpt-oss' kernels
  quantize with) and DeepGEMM's ``ceil_to_ue8m0`` (DeepSeek-V3.1 ``scale_fmt: ue8m0``):
  ``(3, 6]``, ``(224, 448]``: top code >= 3, >= 224;
- gpt-oss publishes no rule with its checkpoint: the union of the three (top code >= 3,
  the largest share at the max);
- fmt's own ``--out`` files (``numerics/scaling.py``): ``mx-floor`` is OCP's, ``mx-rceil``
  the round-up rule, ``mx-even`` compressed-tensors' for FP4 (``[248, 496)``: >= 256 for
  FP8), ``mx-ceil`` ``(2, 4]``, ``(128, 256]``: top code >= 2, >= 128, never the max.

The share of blocks whose top code is below the rule's minimum is the share of scales at
least twice what the rule gives (``fail`` above 1%, ``warn`` above 0).  The opposite error
-- scales smaller than the codes were quantized with (codes clipped at the top code), or a
scale rounded up to a power of two *after* the codes were quantized with the unrounded one
(transformers PR #46763: every block's top code is the format's max, the dequantized
values up to 2x too large) -- fills the top code in every block.  How many healthy blocks
reach it depends on where their amaxes fall in a binade (the rule's share assumes them
spread evenly in log2; blocks of one amax can all land there), so: ``warn`` above halfway
between that share and 1, ``fail`` from 98% of at least 16 blocks.  A strict OCP floor
check on a healthy compressed-tensors file would call the ~14-19% of blocks whose amax
significand is >= 1.75 wrong; reading the codes against the exporter's own rule does not.
Scales promised as powers of two that are not (DeepSeek-V3 #961) fail too.  Half-size
scales whose codes were quantized with the full-size ones leave every block consistent:
only the comparison with the original shows them.
"""

from __future__ import annotations

import re

import numpy as np

from fmtcli.audit.check import Check, Verdict
from fmtcli.audit.layout_blocks import (
    ELEMENT_MAX,
    PILE_CODES,
    block_figures,
    log2_octave,
    power_of_two_share,
    sample_rows,
    share,
)
from fmtcli.inputs.layouts.base import values_of

NIBBLE_RATIO = 0.5   # swapped R below this fraction of the stored R: swapped
#: values the nibble-order check reads at most (whole rows spread over the tensor): R's
#: standard error at 512K Gaussian values is ~0.3% of R (256K pairs), far inside the thresholds
NIBBLE_SAMPLE = 1 << 19
STRUCTURE = 0.8      # R below this: the rows have neighbour structure
ANCHOR_SE = 5.0      # the anchor correlations must differ by 5 standard errors (1/sqrt n)
ANCHOR_MIN = 0.1     # ... and the better one reach 0.1
LAYER = re.compile(r"^(.*?\blayers\.\d+\.)")
BELOW_FAIL = 0.01    # share of blocks under the rule's minimum top code that fails
AT_MAX_FAIL = 0.98   # share of blocks at the format's max that fails (from 16 blocks)

#: rule -> element -> (minimum top code, share of blocks at the max for log-uniform amax)
RULES = {
    "compressed-tensors": {"float4_e2m1fn": (4.0, log2_octave(5, 7)),
                           "float8_e4m3fn": (224.0, log2_octave(432, 448))},
    "ocp": {"float4_e2m1fn": (4.0, log2_octave(5, 8)),
            "float8_e4m3fn": (256.0, log2_octave(432, 512))},
    "round-up": {"float4_e2m1fn": (3.0, log2_octave(5, 6)),
                 "float8_e4m3fn": (224.0, log2_octave(432, 448))},
}
#: fmt's own rules (numerics/scaling.py): mx-even rounds amax's significand to the
#: element's mantissa width half-up, then floors; mx-ceil never reaches the top binade
RULES["mx-even"] = {"float4_e2m1fn": RULES["compressed-tensors"]["float4_e2m1fn"],
                    "float8_e4m3fn": (256.0, log2_octave(432, 496))}
RULES["mx-ceil"] = {"float4_e2m1fn": (2.0, 0.0), "float8_e4m3fn": (128.0, 0.0)}
#: gpt-oss publishes no rule: the union of the three (the least minimum, the most at max)
RULES["unpublished"] = {
    element: (min(RULES[r][element][0] for r in ("compressed-tensors", "ocp", "round-up")),
              max(RULES[r][element][1] for r in ("compressed-tensors", "ocp", "round-up")))
    for element in ("float4_e2m1fn", "float8_e4m3fn")}
RULE_SOURCES = {
    "compressed-tensors": "compressed-tensors generate_mx_scales",
    "ocp": "OCP MX v1.0 floor(log2 amax) - emax",
    "round-up": "ceil(log2(amax / max)) (triton_kernels downcast_to_mxfp, DeepGEMM "
                "ceil_to_ue8m0)",
    "unpublished": "none published (gpt-oss): any of compressed-tensors, OCP, round-up",
    "mx-even": "fmt mx-even (numerics/scaling.py)",
    "mx-ceil": "fmt mx-ceil: ceil(log2 amax) - emax (numerics/scaling.py)",
}
#: rule -> element -> the top of the rule's ``amax / 2^e`` range (the bound of the pile-up
#: figure: with a non-increasing density the codes at the max, the block's own amax left
#: out, are at most ``(top - edge) / width`` times those at the next code, PILE_CODES)
RULE_TOP = {"compressed-tensors": {"float4_e2m1fn": 7.0, "float8_e4m3fn": 448.0},
            "ocp": {"float4_e2m1fn": 8.0, "float8_e4m3fn": 512.0},
            "round-up": {"float4_e2m1fn": 6.0, "float8_e4m3fn": 448.0},
            "mx-even": {"float4_e2m1fn": 7.0, "float8_e4m3fn": 496.0},
            "mx-ceil": {"float4_e2m1fn": 4.0, "float8_e4m3fn": 256.0},
            "unpublished": {"float4_e2m1fn": 8.0, "float8_e4m3fn": 512.0}}
PILE_FAIL = 1.15     # pile-up figure over its healthy bound by this factor (and 4 sigma)
PILE_SIGMA = 4.0
FLAT = 0.85          # next code's density / the half-max code's: a flat (uniform) top
FMT_RULES = {"mx-floor": "ocp", "mx-even": "mx-even", "mx-ceil": "mx-ceil",
             "mx-rceil": "round-up"}


def _cross_pair_roughness(rows: np.ndarray) -> tuple[float, float]:
    """R of the stored and of the swapped reading (see the module docstring)."""
    rows = rows[:, : rows.shape[1] // 4 * 4]
    rows = rows[np.isfinite(rows).all(axis=1)]  # a row holding NaN/inf says nothing
    if rows.shape[1] < 4 or not rows.size:  # (no mean of an empty slice)
        return 1.0, 1.0
    centred = rows - rows.mean(axis=1, keepdims=True)
    var = float(np.mean(centred ** 2))
    if not (var > 0.0 and np.isfinite(var)):  # constant rows, or squares that overflow
        return 1.0, 1.0
    stored = np.mean((rows[:, 1:-2:2] - rows[:, 2:-1:2]) ** 2) / (2 * var)
    swapped = np.mean((rows[:, 0:-3:2] - rows[:, 3::2]) ** 2) / (2 * var)
    return float(stored), float(swapped)


def nibble_order(q, scan) -> Check | None:
    """Packed FP4: is the swapped nibble order markedly smoother than the stored one?"""
    order = q.facts.get("nibble_order")
    if q.element != "float4_e2m1fn" or order not in ("low-first", "high-first") or q.problems:
        return None
    rows = sample_rows(q, NIBBLE_SAMPLE)
    stored, swapped = _cross_pair_roughness(rows)
    figures = {"nibble_order": order, "roughness_stored": stored,
               "roughness_swapped": swapped, "ratio_threshold": NIBBLE_RATIO,
               "structure_threshold": STRUCTURE}
    other = "high-first" if order == "low-first" else "low-first"
    if swapped < NIBBLE_RATIO * stored and swapped < STRUCTURE:
        return Check("nibble-order", Verdict.FAIL,
                     f"the {other} reading is smoother: neighbour roughness {swapped:.3g} "
                     f"vs {stored:.3g} stored ({order}); the nibbles look swapped",
                     {**figures, "confidence": "high"})
    if stored < NIBBLE_RATIO * swapped and stored < STRUCTURE:
        return Check("nibble-order", Verdict.OK,
                     f"{order} confirmed: neighbour roughness {stored:.3g} vs {swapped:.3g} "
                     "swapped", {**figures, "confidence": "high"})
    return _by_anchor(q, scan, rows, figures, order, other)


def _ranks(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.size)
    out[np.argsort(values, kind="stable")] = np.arange(values.size)
    return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    a, b = _ranks(a) - (a.size - 1) / 2, _ranks(b) - (b.size - 1) / 2
    denominator = float(np.sqrt(np.sum(a * a) * np.sum(b * b)))
    return float(np.sum(a * b)) / denominator if denominator else 0.0


def _anchors(q, scan) -> list:
    """Plain 1-D tensors of the same layer with one value per column and "norm" in their
    name: the layer norm whose output the weight reads, stored unpacked."""
    match = LAYER.match(q.key)
    cols = q.matrix[1]
    if match is None:
        return []
    return [s for s in scan.plain if s.key and s.key.startswith(match.group(1))
            and "norm" in s.key and tuple(s.shape) == (cols,) and s.opener is not None]


def _by_anchor(q, scan, rows, figures: dict, order: str, other: str) -> Check:
    """No neighbour structure: correlate the columns' mean |x| with an unpacked anchor."""
    profile = np.abs(rows).mean(axis=0)
    swapped = profile.reshape(-1, 2)[:, ::-1].ravel() if profile.size % 2 == 0 else profile
    margin = ANCHOR_SE * max(1, profile.size) ** -0.5
    for anchor in _anchors(q, scan):
        gamma = np.asarray(values_of(anchor), dtype=np.float64).ravel()
        c_stored, c_swapped = abs(_spearman(profile, gamma)), abs(_spearman(swapped, gamma))
        found = {**figures, "anchor": anchor.key, "anchor_corr_stored": c_stored,
                 "anchor_corr_swapped": c_swapped, "anchor_margin": margin}
        if c_swapped > max(c_stored + margin, ANCHOR_MIN):
            return Check("nibble-order", Verdict.FAIL,
                         f"the {other} reading matches {anchor.key}'s channels better "
                         f"(|rank corr| {c_swapped:.3g} vs {c_stored:.3g} stored, "
                         f"{order}): the nibbles look swapped", {**found, "confidence": "high"})
        if c_stored > max(c_swapped + margin, ANCHOR_MIN):
            return Check("nibble-order", Verdict.OK,
                         f"{order} confirmed by {anchor.key}'s channels (|rank corr| "
                         f"{c_stored:.3g} vs {c_swapped:.3g} swapped)",
                         {**found, "confidence": "high"})
        figures = found  # the last anchor's figures, undecided
    return Check("nibble-order", Verdict.OK,
                 f"inconclusive: no neighbour structure (roughness "
                 f"{figures['roughness_stored']:.3g} stored, "
                 f"{figures['roughness_swapped']:.3g} swapped); {order} as the layout "
                 "defines it", {**figures, "confidence": "low"})


def rule_of(q) -> str | None:
    """Which exporter rule ``q``'s power-of-two scales follow (None: not power-of-two)."""
    if q.layout == "fmt-out":  # fmt's own --out: the scheme it records, margin 0 only
        scheme = q.facts.get("scheme") or {}
        margin = scheme.get("margin") or 0
        return FMT_RULES.get(scheme.get("scale_rule")) if margin == 0 else None
    ue8m0 = q.facts.get("scale_fmt") == "ue8m0"
    if q.scale_dtype != "e8m0" and not ue8m0:
        return None
    if q.layout.startswith("compressed-tensors"):
        return "compressed-tensors"
    if q.layout.startswith("gptoss"):
        return "unpublished"
    if ue8m0 or q.layout.startswith("deepseek"):
        return "round-up"
    return "ocp"


def mx_scale_rule(q, scan) -> Check | None:
    """Power-of-two block scales against the exporter's own rule (module docstring)."""
    rule = rule_of(q)
    if rule is None or q.problems or q.element not in RULES[rule]:
        return None
    blocks = block_figures(q)
    if blocks is None:
        return None
    minimum, expected = RULES[rule][q.element]
    emax = ELEMENT_MAX[q.element]
    live = blocks.top > 0
    n = int(np.count_nonzero(live))
    below = share(np.count_nonzero(live & (blocks.top < minimum)), n)
    at_max = share(np.count_nonzero(live & (blocks.top >= emax)), n)
    at_max_limit = expected + (1.0 - expected) / 2
    not_pow2 = power_of_two_share(blocks.scale)
    saturated = float(blocks.at_max[live].mean()) if n else 0.0
    figures = {**_pile_figures(blocks, q.element, RULE_TOP[rule][q.element], emax),
               "rule": rule, "rule_source": RULE_SOURCES[rule], "blocks": n,
               "sampled": blocks.sampled, "minimum_top_code": minimum,
               "share_below_rule": below, "share_at_max": at_max,
               "expected_at_max": expected, "at_max_threshold": at_max_limit,
               "at_max_fail": AT_MAX_FAIL, "elements_at_max_per_block": saturated,
               "share_not_power_of_two": not_pow2, "below_threshold": BELOW_FAIL}
    verdict, evidence = _rule_verdict(figures, emax)
    return Check("mx-scale-rule", verdict, evidence, figures)


def _pile_figures(blocks, element: str, top: float, emax: float) -> dict:
    """The pile-up figure (codes at the max beyond each block's own amax, per code at the
    next one down) against its healthy bound, and the flatness of the top codes."""
    if element not in PILE_CODES:
        return {"pile_up": None, "pile_bound": None, "pile_significant": False,
                "flatness": None}
    _, edge, width, _, low_width = PILE_CODES[element]
    extra = float(blocks.at_max.sum() - np.count_nonzero(blocks.top >= emax))
    nexts = float(blocks.at_next)
    bound = max(0.0, top - edge) / width
    ratio = extra / nexts if nexts else (float("inf") if extra else 0.0)
    spread = PILE_SIGMA * np.sqrt(extra + bound * bound * nexts)
    significant = bool(extra > PILE_FAIL * bound * nexts + spread)
    flat = (nexts / width) / (blocks.at_low / low_width) if blocks.at_low else None
    return {"pile_up": ratio, "pile_bound": bound, "pile_significant": significant,
            "flatness": flat}


def _rule_verdict(f: dict, emax: float) -> tuple[Verdict, str]:
    if f["share_not_power_of_two"] > 0:
        return Verdict.FAIL, (f"{f['share_not_power_of_two']:.1%} of the scales are not "
                              "powers of two where the layout promises E8M0/UE8M0")
    if f["pile_significant"]:
        return Verdict.FAIL, (f"codes pile up at {emax:g}: {f['pile_up']:.2f} per code at "
                              f"the next one down, over the {f['pile_bound']:.2f} the "
                              f"{f['rule']} rule allows: scales smaller than the codes were "
                              "quantized with")
    flat = f["flatness"] is not None and f["flatness"] >= FLAT
    if f["share_at_max"] > f["at_max_threshold"] and flat and f["pile_up"] > f["pile_bound"]:
        return Verdict.WARN, (f"{f['share_at_max']:.0%} of blocks reach {emax:g}, codes "
                              f"pile up there ({f['pile_up']:.2f} > {f['pile_bound']:.2f}) "
                              f"but not beyond chance in {f['blocks']:,} blocks: scales "
                              "too small?")
    if f["share_at_max"] > f["at_max_threshold"] and flat:
        return Verdict.OK, (f"{f['share_at_max']:.0%} of blocks reach {emax:g}: blocks of "
                            f"nearly one amax (a flat top, flatness {f['flatness']:.2f}), "
                            f"no pile-up ({f['pile_up']:.2f} <= {f['pile_bound']:.2f})")
    if f["share_at_max"] > f["at_max_threshold"]:
        text = (f"{f['share_at_max']:.1%} of blocks reach the top code {emax:g} (rule "
                f"{f['rule']}: ~{f['expected_at_max']:.0%} for spread amaxes)")
        if f["share_at_max"] >= AT_MAX_FAIL and f["blocks"] >= 16:
            return Verdict.FAIL, (text + ": scales smaller than the codes were quantized "
                                  "with, or rounded after quantizing (transformers #46763)")
        if (f["pile_up"] is not None and f["pile_up"] <= f["pile_bound"]
                and f["share_at_max"] < AT_MAX_FAIL):
            return Verdict.OK, text + f": no pile-up ({f['pile_up']:.2f} <= " \
                f"{f['pile_bound']:.2f}), blocks of nearly one amax"
        return Verdict.WARN, text + ": blocks of nearly one amax, or scales too small"
    below = f["share_below_rule"]
    text = (f"{below:.2%} of {f['blocks']:,} blocks have a top code under "
            f"{f['minimum_top_code']:g}, the {f['rule']} rule's least")
    if below > f["below_threshold"]:
        return Verdict.FAIL, text + ": scales 2x or more larger than the rule gives"
    if below > 0:
        return Verdict.WARN, text
    return Verdict.OK, (f"every block follows the {f['rule']} rule (top code >= "
                        f"{f['minimum_top_code']:g}; {f['share_at_max']:.0%} at {emax:g})")
