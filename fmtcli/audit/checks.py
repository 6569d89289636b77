"""``fmt audit``'s generic checks: what every quantized layout must hold, whoever wrote it.

Each check is a function ``(q, scan, measured) -> Check | None`` (None: does not apply):
``q`` a ``layouts.base.Quantized``, ``scan`` the input's ``layouts.Scan``, ``measured`` the
tensor's streamed ``Measured`` figures (``audit.stats``; None where the tensor could not be
read).  Thresholds are documented in ``docs/audit.md``, each with a test that makes it fire
(``tests/commands/test_audit.py``):

- ``structure``: the reader's ``problems`` (a scale grid of the wrong shape, a packed
  tensor too short, a config that names another scheme): fail.
- ``scale-count``: the scales stored against the groups the weight's shape and ``q.group``
  need (one per tile, edges padded, stacked matrices blocked one by one or the matrix view
  as a whole): fail when they differ.
- ``scale-dtype``: the scales' storage type against the layout's definition (NVFP4:
  float8_e4m3fn per 16, OCP MX: E8M0, DeepSeek-V3: float32 or UE8M0, fmt's own
  ``--out``: float32 or float64; a reader may say ``facts["scale_dtypes"]``): warn.
- ``scale-finite``: a NaN or infinite scale (E8M0 byte 255): fail.
- ``scale-zero``: zero scales (the block's values are all lost): warn.
- ``scale-power-of-two``: where the layout promises powers of two (E8M0/UE8M0 scales, OCP
  MX, DeepSeek-V3.1's ``scale_fmt: ue8m0``; DeepSeek-V3 issue #961), any scale that is
  not one: fail.
- ``values-finite``: NaN or inf among the dequantized values: fail.
- ``clipping``: the share of nonzero groups that clip (``stats``: top codes piled up):
  warn above 15%, fail above 30% -- the scales are too small (half-size scales).  Not for
  MX layouts: OCP's floor rule clips by design (71% of the blocks of uniform weights in
  MXFP4), so how many blocks may reach the top is the exporter's rule's to say
  (``layout_checks``' ``mx-scale-rule``).  With two groups or more, one flagged group,
  or a share within chance (binomial tail >= 1e-4 under ``chance_share``: INT8 rows of
  512 uniform values clip by chance 18.9% of the time), passes.
- ``lowest-codes``: the share of nonzero groups whose codes stay in the lowest half of the
  format's range: warn above 10%, fail above 50% -- the scales are too large (double).
- ``zero-groups``: the share of groups whose codes are all zero: warn above 5%.
- ``bits-per-param``: the stored bits per parameter (scales included) against the layout's
  nominal (``facts["nominal_bits"]``): warn when more than 2% above it.
- ``config-scheme``: the element family ``config.json`` (or the reader's own config file,
  ``facts["config_scheme"]``) names (fp4, fp8, int) against the tensor's: fail when they
  differ (an FP8 file labelled NVFP4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.audit.check import Check, Verdict
from fmtcli.audit.stats import PILE_UP, CodeStats, ValueStats, clip_count, element_top
from fmtcli.base.errors import FmtError

CLIP_WARN, CLIP_FAIL = 0.15, 0.30
#: the clipping share must also be beyond chance: its binomial tail under the healthy
#: per-group clip probability (chance_share) below this
CLIP_ALPHA = 1e-4
#: with two groups or more, fewer flagged groups than this are chance (a 64-value bias)
MIN_FLAGGED = 2
LOWEST_WARN, LOWEST_FAIL = 0.10, 0.50
ZERO_GROUPS_WARN = 0.05
BITS_MARGIN = 0.02


@dataclass(frozen=True)
class Measured:
    """A tensor's streamed figures (``stats.measure``) and its decoded scales (None where
    the layout has none or they could not be read: ``scales_error`` says why)."""

    values: ValueStats | None
    codes: CodeStats | None
    scales: np.ndarray | None
    scales_error: str | None = None


def _pct(part: float) -> str:
    return f"{100 * part:.3g}%"


def structure(q, scan, m) -> Check:
    if q.problems:
        more = f" (+{len(q.problems) - 1} more)" if len(q.problems) > 1 else ""
        return Check("structure", Verdict.FAIL, q.problems[0] + more,
                     {"problems": list(q.problems)})
    return Check("structure", Verdict.OK, f"{q.layout}: every part present and readable")


def expected_groups(q) -> set[int]:
    """How many scales ``q.group`` needs over ``q.shape``: blocked matrix by matrix (the
    readers of stacked experts) or over the matrix view as a whole (fmt's own tiles)."""
    rows, cols = q.matrix
    if rows <= 0 or cols <= 0:
        return {0}
    out = set()
    heights = {rows}
    if len(q.shape) >= 3 and rows == math.prod(q.shape[:-1]) and q.shape[-2] > 0:
        heights.add(int(q.shape[-2]))
    for height in heights:
        tr, tc = q.group.tile_shape(height, cols, len(q.shape))
        out.add((rows // height) * -(-height // tr) * -(-cols // tc))
    return out


def scale_count(q, scan, m) -> Check | None:
    scales = q.parts.get("scales")
    if scales is None or "codes" not in q.parts:
        return None
    want = expected_groups(q)
    figures = {"scales": int(scales.size), "groups": sorted(want)}
    if scales.size in want:
        return Check("scale-count", Verdict.OK, f"{scales.size:,} scales, one per "
                     f"{q.group.label} group", figures)
    return Check("scale-count", Verdict.FAIL,
                 f"{scales.key} holds {scales.size:,} scales; {q.group.label} groups of "
                 f"{'x'.join(map(str, q.shape))} need {min(want):,}", figures)


def _expected_dtypes(q) -> tuple[str, ...] | None:
    """The scale storage a layout's definition gives; None where it does not say."""
    promised = q.facts.get("scale_dtypes")
    if promised:
        return tuple(promised)
    layout, element = q.layout, q.element
    if layout == "fmt-out":  # fmt's own scales, whatever the recipe emulates
        return ("float32", "float64")
    if layout == "deepseek-fp8":  # float32, or UE8M0 powers of two as float32 or bytes
        return ("float32", "e8m0")
    if "nvfp4" in layout or (element == "float4_e2m1fn" and q.group.block == 16):
        return ("float8_e4m3fn",)
    if "mx" in layout or _promises_power_of_two_layout(q):
        return ("e8m0",)
    return None


def scale_dtype(q, scan, m) -> Check | None:
    want = _expected_dtypes(q)
    if want is None or "scales" not in q.parts:
        return None
    figures = {"scale_dtype": q.scale_dtype, "expected": list(want)}
    if q.scale_dtype in want:
        return Check("scale-dtype", Verdict.OK, f"{q.scale_dtype} scales, as {q.layout} "
                     "defines them", figures)
    return Check("scale-dtype", Verdict.WARN, f"{q.scale_dtype} scales; {q.layout} stores "
                 f"{' or '.join(want)}", figures)


def scale_finite(q, scan, m) -> Check | None:
    if m is None or m.scales is None:
        return _unreadable("scale-finite", m)
    bad = int(m.scales.size - np.count_nonzero(np.isfinite(m.scales)))
    figures = {"nonfinite": bad, "scales": int(m.scales.size)}
    if bad:
        return Check("scale-finite", Verdict.FAIL, f"{bad:,} of {m.scales.size:,} scales "
                     "are NaN or infinite", figures)
    return Check("scale-finite", Verdict.OK, "every scale finite", figures)


def _unreadable(name: str, m) -> Check | None:
    if m is not None and m.scales_error:
        return Check(name, Verdict.FAIL, f"the scales cannot be read: {m.scales_error}")
    return None


def scale_zero(q, scan, m) -> Check | None:
    if m is None or m.scales is None:
        return None
    zero = int(np.count_nonzero(m.scales == 0))
    figures = {"zero": zero, "scales": int(m.scales.size)}
    if zero:
        return Check("scale-zero", Verdict.WARN, f"{zero:,} of {m.scales.size:,} scales "
                     "are zero: their groups dequantize to 0", figures)
    return Check("scale-zero", Verdict.OK, "no zero scale", figures)


def _promises_power_of_two_layout(q) -> bool:
    scheme = str(q.facts.get("config_scheme") or "").lower()
    return q.facts.get("scale_fmt") == "ue8m0" or scheme.startswith("mx")


def scale_power_of_two(q, scan, m) -> Check | None:
    promised = (q.scale_dtype == "e8m0" or "mx" in q.layout
                or _promises_power_of_two_layout(q))
    if not promised or m is None or m.scales is None:
        return None
    s = m.scales[np.isfinite(m.scales) & (m.scales > 0)]
    mantissa = np.frexp(s.astype(np.float64))[0]
    bad = int(np.count_nonzero(mantissa != 0.5))
    why = "scale_fmt ue8m0" if q.facts.get("scale_fmt") == "ue8m0" else (
        "E8M0 scales" if q.scale_dtype == "e8m0" else "an MX layout")
    figures = {"not_power_of_two": bad, "scales": int(m.scales.size)}
    if bad:
        example = float(s[mantissa != 0.5][0])
        return Check("scale-power-of-two", Verdict.FAIL,
                     f"{bad:,} of {m.scales.size:,} scales are not powers of two (e.g. "
                     f"{example:.6g}) where {why} promises them", figures)
    return Check("scale-power-of-two", Verdict.OK, f"every scale a power of two ({why})",
                 figures)


def values_finite(q, scan, m) -> Check | None:
    if m is None or m.values is None:
        return None
    bad = m.values.nonfinite
    if bad:
        return Check("values-finite", Verdict.FAIL, f"{bad:,} of {m.values.count:,} "
                     "dequantized values are NaN or infinite", {"nonfinite": bad})
    return Check("values-finite", Verdict.OK, "every dequantized value finite",
                 {"nonfinite": 0})


def is_mx(q) -> bool:
    """Whether ``q``'s scales follow an MX rule (a power of two per block from the amax's
    binade): its layout or the scheme its config names says MX."""
    return "mx" in f"{q.layout} {q.facts.get('config_scheme') or ''}".lower()


def _share_check(name: str, part: int, whole: int, warn: float, fail: float | None,
                 text: str, healthy: str, figures: dict) -> Check:
    share = part / whole if whole else 0.0
    figures = {**figures, "share": share, "warn_above": warn, "fail_above": fail}
    if whole >= 2 and part < MIN_FLAGGED:
        return Check(name, Verdict.OK, healthy.format(share=_pct(share)), figures)
    if fail is not None and share > fail:
        verdict = Verdict.FAIL
    elif share > warn:
        verdict = Verdict.WARN
    else:
        return Check(name, Verdict.OK, healthy.format(share=_pct(share)), figures)
    limit = fail if verdict is Verdict.FAIL else warn
    return Check(name, verdict, f"{_pct(share)} of {whole:,} groups {text} "
                 f"(> {_pct(limit)})", figures)


def _log_binom(n: int, k: np.ndarray, p: float) -> np.ndarray:
    """log P(Binomial(n, p) = k), elementwise over ``k``."""
    lg = np.vectorize(math.lgamma)
    return (lg(n + 1.0) - lg(k + 1.0) - lg(n - k + 1.0) + k * math.log(p)
            + (n - k) * math.log1p(-p))


def chance_share(element: str, n: int) -> float:
    """P(a healthy group of ``n`` under an amax scale meets ``stats``' clip rule): its
    amax at the top, the other ``n - 1`` spread evenly below (the worst non-increasing
    density, torch's uniform init).  The top code's interval: half a step (floats, amax
    / max), a whole one (integers: compressed-tensors' amax / 127.5 for INT8)."""
    tops = element_top(element)
    if tops is None or n < 2:
        return 0.0
    top, below = tops
    under = 3.0 if element == "float4_e2m1fn" else 2 * below - top
    p_top = (top - below) / (1 if element.startswith(("int", "uint")) else 2) / top
    p_below = ((top - below) + (below - under)) / 2 / top
    rest = n - 1
    least = clip_count(n) - 1  # extras beyond the amax
    extras = np.arange(least, min(rest, least + 60 + 12 * int(math.sqrt(rest * p_top))) + 1)
    if not extras.size:
        return 0.0
    total = 0.0
    cond = p_below / (1 - p_top)
    for e, log_e in zip(extras, _log_binom(rest, extras, p_top)):
        limit = math.ceil((1 + e) / PILE_UP) - 1  # at_below < (1 + e) / PILE_UP
        b = np.arange(0, min(limit, rest - e) + 1)
        if b.size:
            total += float(np.exp(log_e + _log_binom(rest - int(e), b, cond)).sum())
    return min(1.0, total)


def _beyond_chance(part: int, whole: int, chance: float) -> bool:
    """Whether ``part`` of ``whole`` groups is beyond a Binomial(whole, chance) at
    CLIP_ALPHA (upper tail)."""
    if chance <= 0:
        return part > 0
    if chance >= 1 or part <= math.floor(whole * chance):
        return False  # a median is >= floor(n p): the tail from there holds >= 1/2
    # the terms fall from ``part`` on (above the mean); 40 sd + 100 further they are below
    # e^-800 of the first: not millions of lgamma calls for a tensor of millions of groups
    reach = 100 + int(40 * math.sqrt(whole * chance * (1 - chance)))
    k = np.arange(part, min(whole, part + reach) + 1)
    return float(np.exp(_log_binom(whole, k, chance)).sum()) < CLIP_ALPHA


def clipping(q, scan, m) -> Check | None:
    c = m.codes if m is not None else None
    if c is None or not c.nonzero_groups or is_mx(q):  # MX: the exporter's rule decides
        return None
    chance = chance_share(q.element, round(c.elements / max(1, c.groups)))
    if c.nonzero_groups >= 2 and not _beyond_chance(c.clipping, c.nonzero_groups, chance):
        share = c.clipping / c.nonzero_groups
        return Check("clipping", Verdict.OK, f"{_pct(share)} of groups clip at the top "
                     f"code, within chance ({_pct(chance)} per group for evenly spread "
                     "values)", {"groups": c.clipping, "at_max": c.at_max, "share": share,
                                 "chance_per_group": chance, "warn_above": CLIP_WARN,
                                 "fail_above": CLIP_FAIL})
    return _share_check(
        "clipping", c.clipping, c.nonzero_groups, CLIP_WARN, CLIP_FAIL,
        f"pile codes at the top ({c.top:g}): scales too small?",
        "{share} of groups clip at the top code", {"groups": c.clipping,
                                                   "at_max": c.at_max})


def lowest_codes(q, scan, m) -> Check | None:
    c = m.codes if m is not None else None
    if c is None or not c.nonzero_groups:
        return None
    return _share_check(
        "lowest-codes", c.lowest, c.nonzero_groups, LOWEST_WARN, LOWEST_FAIL,
        f"use only codes up to {c.top / 2:g} of {c.top:g}: scales too large?",
        "{share} of groups stay in the lowest half of the codes", {"groups": c.lowest})


def zero_groups(q, scan, m) -> Check | None:
    c = m.codes if m is not None else None
    if c is None or not c.groups:
        return None
    return _share_check("zero-groups", c.zero_groups, c.groups, ZERO_GROUPS_WARN, None,
                        "are all zero", "{share} of groups are all zero",
                        {"groups": c.zero_groups})


def bits_per_param(q, scan, m) -> Check | None:
    nominal = q.facts.get("nominal_bits")
    if not isinstance(nominal, (int, float)) or nominal <= 0 or "codes" not in q.parts:
        return None
    bits = q.bits_per_param
    figures = {"bits_per_param": bits, "nominal_bits": nominal}
    if bits > nominal * (1 + BITS_MARGIN):
        return Check("bits-per-param", Verdict.WARN, f"{bits:.3f} bits/param stored, the "
                     f"layout's nominal is {nominal:g} (+{_pct(bits / nominal - 1)})",
                     figures)
    return Check("bits-per-param", Verdict.OK, f"{bits:.3f} bits/param (nominal "
                 f"{nominal:g})", figures)


def family(text: str) -> str | None:
    """The element family a scheme's name says: fp4, fp8 or int (None: it does not say)."""
    text = text.lower()
    if "fp4" in text or "e2m1" in text:
        return "fp4"
    if "fp8" in text or "e4m3" in text or "e5m2" in text or text == "float-quantized":
        return "fp8"
    if (text in ("pack-quantized", "int-quantized") or text.startswith(("int", "w4a", "w8a"))
            or "awq" in text or "gptq" in text):
        return "int"
    return None


def element_family(element: str) -> str | None:
    if element.startswith("float4"):
        return "fp4"
    if element.startswith("float8"):
        return "fp8"
    if element.startswith(("int", "uint")):
        return "int"
    return None


def config_names(config: dict | None) -> list[str]:
    """The scheme names a ``quantization_config`` gives: ``format`` / ``quant_algo`` /
    ``quant_method`` / ``fmt`` at the top and in each of its ``config_groups``."""
    if not isinstance(config, dict):
        return []
    groups = config.get("config_groups")
    places = [config]
    if isinstance(groups, dict):
        places += [g for g in groups.values() if isinstance(g, dict)]
    names = []
    for place in places:
        for key in ("format", "quant_algo", "quant_method", "fmt"):
            value = place.get(key)
            if isinstance(value, str) and value not in names:
                names.append(value)
    return names


def config_scheme(q, scan, m) -> Check | None:
    names = [str(q.facts["config_scheme"])] if q.facts.get("config_scheme") else []
    names += [n for n in config_names(scan.config) if n not in names]
    promised = {f for f in map(family, names) if f}
    held = element_family(q.element)
    if not promised or held is None:
        return None
    figures = {"config": names, "promised": sorted(promised), "element": q.element}
    if held in promised:
        return Check("config-scheme", Verdict.OK, f"{q.element}, as the config's "
                     f"{', '.join(names)} says", figures)
    return Check("config-scheme", Verdict.FAIL, f"the config names {', '.join(names)} "
                 f"({'/'.join(sorted(promised))}), the tensor holds {q.element}", figures)


#: The generic checks, in the order they are reported.
CHECKS = (structure, scale_count, scale_dtype, scale_finite, scale_zero, scale_power_of_two,
          values_finite, clipping, lowest_codes, zero_groups, bits_per_param, config_scheme)


def run_check(check, *args) -> Check | None:
    """One check, ``check(*args)`` (a generic one takes ``q, scan, measured``, a layout
    one ``q, scan``); a library error while it reads (a part that fails to open) is its
    failure, in one line, under the check's name."""
    try:
        return check(*args)
    except FmtError as error:
        return Check(getattr(check, "__name__", "check").replace("_", "-"), Verdict.FAIL,
                     f"could not be read: {error}")
