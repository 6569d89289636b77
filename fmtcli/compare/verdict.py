"""``fmt compare ORIGINAL QUANTIZED``: a verdict per tensor, beside fmt's own quantization.

Where one side of a pair is a tensor of an already-quantized layout (``inputs.layouts``:
``TensorSource.quantized``, read as its dequantized float32 values), the other side is taken
as the original and quantized by fmt itself under the layout's element format and
granularity (``own_scheme``: ``Quantized.element`` and ``Quantized.group`` as a
``numerics.schemes.Scheme``, run by ``engine.run.quantize_tensor``,
``x_q = cast(x * s) / s``):

- float8/float4 elements with float32 (or bfloat16) scales: the amax rule, s = max / amax
  per group (DeepSeek-V3's 128x128 weight blocks: ``README_WEIGHTS.md``);
- an E4M3 scale per block of 16: the ``nvfp4`` recipe (an E4M3 block scale times a float32
  tensor scale, amax rule: NVIDIA's NVFP4);
- E8M0 scales (powers of two): blocks use the OCP MX rule ``mx-floor`` (``mxfp8``/``mxfp4``
  recipes: OCP MX v1.0 section 6.3), tiles the power of two that does not saturate
  (``pow2-floor``: DeepSeek-V3.1's UE8M0 scale_inv = 2^ceil(log2(amax / 448)));
- fmt's own ``--out`` (layout ``fmt-out``): the scheme the file records (``facts["scheme"]``:
  its rule, margin, scale format), so a healthy file equals fmt's own;
- symmetric integers (int1-int8, compressed-tensors' pack-quantized): the symmetric grid
  amax / q_max per group (``compare.integer``), which fmt's formats do not hold;
- an element format fmt has no name for (integers with zero points): no fmt's own, the
  verdict stands on the cosine alone.

The verdict (``judge``) flags the failures of an exporter that ModelOpt issue #2160 shows
(NVFP4 weights whose dequantized values correlate badly with the original) and the ones a
wrong scale makes (a half-size scale halves every value: the cosine stays ~1, the SQNR
falls to 6 dB):

- ``cosine < COSINE_FLOOR`` (0.99) where fmt's own reaches 0.99 (its cosine estimated from
  its SQNR, ``own_cosine``: a format too coarse for these values, fmt's own under 0.99
  too, leaves the judgement to the SQNR rule; healthy 4-bit exports sit near 0.993), or
- the exported SQNR more than ``SQNR_GAP_DB`` (6 dB) below fmt's own of the same tensor:
  an error energy four times fmt's own (twice its RMS error).  An exporter that uses the
  same amax rule lands within a fraction of a dB of fmt's own; one that searches its
  scales (MSE, GPTQ) lands above it, which is never flagged;
- a non-finite value where the original is finite (SQNR -inf).

Roles and the total merge fmt's own exactly: 10 log10(sum x^2 / sum e^2) over their
tensors, where a tensor no layout claimed (a norm weight kept in bfloat16) counts with its
own exported error (fmt's own export would keep it as the export keeps it).

``RawCodesNote``: float8 (or one-byte) tensors read without their scales are raw codes; a
pair of such a tensor with a wider one whose SQNR is below 0 dB is named in one note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fmtcli.base.choices import Granularity, ScaleRule
from fmtcli.base.errors import FmtError, Note, shown
from fmtcli.compare.stats import Accumulator, CompareStats
from fmtcli.inputs.source import TensorSource
from fmtcli.inputs.storage import itemsize
from fmtcli.streaming.metrics import scaled_sum

COSINE_FLOOR = 0.99
SQNR_GAP_DB = 6.0
OK, FLAG = "ok", "flag"
NARROW_BYTES = 1  # a stored element this wide is a code (float8, uint8, int8)


class RawCodesNote(Note):
    """Pairs whose narrow side looks like codes read without their scales."""


@dataclass(frozen=True)
class Judgement:
    """One pair's verdict: the quantized side's ``layout`` (None for a tensor no layout
    claimed), fmt's own scheme (its label) and SQNR (dB) on the original, the verdict
    (``ok``/``flag``) and why; ``own_x2``/``own_e2`` (the original's and fmt's own error
    energy, float64) are what roles and the total merge."""

    layout: str | None
    fmt_scheme: str | None
    fmt_sqnr_db: float | None
    verdict: str
    reasons: tuple[str, ...]
    own_x2: float = 0.0
    own_e2: float = 0.0

    def to_dict(self) -> dict:
        return {"layout": self.layout, "fmt_scheme": self.fmt_scheme,
                "fmt_sqnr_db": self.fmt_sqnr_db, "verdict": self.verdict,
                "reasons": list(self.reasons)}


NO_JUDGEMENT = {"layout": None, "fmt_scheme": None, "fmt_sqnr_db": None, "verdict": None,
                "reasons": []}


def own_scheme(q):
    """fmt's Scheme of the same element format and granularity as ``q`` (a
    ``layouts.base.Quantized``), or None where fmt has no such format."""
    from fmtcli.numerics.formats import get_format
    from fmtcli.numerics.schemes import ScaleFormat, Scheme, recipe_fields

    try:
        fmt = get_format(q.element)
    except FmtError:
        return None
    group = q.group
    fields = dict(granularity=group.kind, block=group.block or 128, axis=group.axis,
                  tile=group.tile or (1, 128))
    if getattr(q, "layout", None) == "fmt-out":  # fmt's --out records the scheme it used
        recorded = _recorded_scheme(q.facts.get("scheme"), fmt, fields)
        if recorded is not None:
            return recorded
    block = group.kind is Granularity.BLOCK
    if q.scale_dtype == "float8_e4m3fn":
        recipe = "nvfp4" if block and group.block == 16 and fmt.name == "float4_e2m1fn" \
            else None
        base = recipe_fields(recipe) if recipe else dict(scale_format=ScaleFormat.E4M3_FP32)
        return Scheme(**{**base, **fields, "format": fmt})
    if q.scale_dtype == "e8m0":
        if not block:
            return Scheme(format=fmt, scale_rule=ScaleRule.POW2_FLOOR, **fields)
        names = {"float8_e4m3fn": "mxfp8", "float4_e2m1fn": "mxfp4"}
        recipe = names.get(fmt.name) if group.block == 32 else None
        base = recipe_fields(recipe) if recipe else dict(scale_rule=ScaleRule.MX_FLOOR)
        return Scheme(**{**base, **fields, "format": fmt})
    return Scheme(format=fmt, scale_rule=ScaleRule.AMAX, **fields)


def _recorded_scheme(recorded, fmt, fields: dict):
    """The Scheme of fmt-out's recorded ``Scheme.to_dict()`` (its rule, margin, scale
    format and recipe name; rounding nearest-even) in ``fields``' groups; None where it does
    not parse."""
    from fmtcli.numerics.schemes import ScaleFormat, Scheme

    if not isinstance(recorded, dict):
        return None
    try:
        return Scheme(**fields, format=fmt, scale_rule=ScaleRule(recorded["scale_rule"]),
                      margin=int(recorded.get("margin") or 0),
                      scale_format=ScaleFormat(recorded["scale_format"]),
                      percentile=recorded.get("percentile"),
                      fixed_scale=recorded.get("fixed_scale"), recipe=recorded.get("recipe"))
    except (FmtError, KeyError, TypeError, ValueError):
        return None


def _energy(small: float, big: float, tiny: float) -> float:
    value, power = scaled_sum(small, big, tiny)
    return math.ldexp(value, power)


def judge_pair(ref: TensorSource, test: TensorSource, stats: CompareStats,
               acc: Accumulator, **options) -> Judgement:
    """The verdict of one pair of a comparison with a quantized side; ``options`` go to
    ``engine.run.quantize_tensor`` (``chunk_elements``, ``workers``)."""
    q = test.quantized if test.quantized is not None else ref.quantized
    own_sqnr, label = None, None
    x2, e2 = acc.cross["sum_x2"], acc.cross["sum_e2"]
    run = None if q is None else _own_run(ref if test.quantized is not None else test, q,
                                          options)
    if run is not None:
        own = run.stats()
        own_sqnr = own.sqnr_db
        label = own.scheme.label if own.scheme.recipe else \
            f"{own.scheme.format.name} {own.scheme.label}"
        a = run.acc
        x2 = _energy(a.sum_x2, a.sum_x2_big, a.sum_x2_tiny)
        e2 = math.inf if a.unbounded else _energy(a.sum_err2, a.sum_err2_big,
                                                  a.sum_err2_tiny)
    if run is None and q is not None:  # an integer grid fmt has no format for
        from fmtcli.compare.integer import own_integer

        own = own_integer(ref if test.quantized is not None else test, q)
        if own is not None:
            own_sqnr, x2, e2, label = own
    verdict, reasons = judge(stats, own_sqnr)
    return Judgement(getattr(q, "layout", None), label, own_sqnr, verdict, reasons, x2, e2)


def _own_run(original: TensorSource, q, options: dict):
    """fmt's own ``SchemeRun`` of the original under ``own_scheme(q)``, or None (no such
    scheme, or one the engine refuses for this tensor)."""
    scheme = own_scheme(q)
    if scheme is None:
        return None
    from fmtcli.engine.run import quantize_tensor

    try:
        runs, _ = quantize_tensor(original, [scheme], **options)
    except FmtError:
        return None
    return runs[0]


def judge(stats: CompareStats, own_sqnr: float | None) -> tuple[str, tuple[str, ...]]:
    """(``ok`` or ``flag``, the reasons): the rules of the module docstring."""
    reasons = []
    sqnr, cosine = stats.sqnr_db, stats.cosine
    if sqnr == -math.inf:
        reasons.append("non-finite values where the original is finite")
    elif cosine < COSINE_FLOOR:  # NaN (an all-zero side) is not judged
        reach = own_cosine(own_sqnr)
        if reach is None or reach >= COSINE_FLOOR:
            shown_reach = "" if reach is None else \
                f" (fmt's own reaches {math.floor(reach * 1e4) / 1e4:.4f})"
            reasons.append(f"cosine {cosine:.4f} < {COSINE_FLOOR}{shown_reach}")
    if (own_sqnr is not None and math.isfinite(sqnr) and not math.isnan(own_sqnr)
            and own_sqnr - sqnr > SQNR_GAP_DB):
        reasons.append(f"SQNR {sqnr:.2f} dB: {own_sqnr - sqnr:.1f} dB below fmt's own "
                       f"{own_sqnr:.2f} dB" if math.isfinite(own_sqnr) else
                       f"SQNR {sqnr:.2f} dB where fmt's own is lossless (inf dB)")
    return (FLAG if reasons else OK), tuple(reasons)


def own_cosine(own_sqnr: float | None) -> float | None:
    """The cosine fmt's own quantization reaches, from its SQNR: 1 / sqrt(1 + 10^(-SQNR/10))
    (exact where its error is uncorrelated with x, as round-to-nearest's is to within its
    sums' rounding); None without fmt's own."""
    if own_sqnr is None or math.isnan(own_sqnr):
        return None
    return 1 / math.sqrt(1 + 10 ** (-own_sqnr / 10)) if own_sqnr > -300 else 0.0


def merged(judgements: list[Judgement]) -> tuple[float | None, int]:
    """(fmt's own SQNR over ``judgements``' tensors, how many are flagged): None where
    none of them had fmt's own."""
    if not any(j.fmt_sqnr_db is not None for j in judgements):
        return None, sum(j.verdict == FLAG for j in judgements)
    x2 = float(sum(j.own_x2 for j in judgements))
    e2 = float(sum(j.own_e2 for j in judgements))
    if e2 == 0:
        sqnr = math.inf if x2 > 0 else math.nan
    else:  # an infinite error (a NaN/inf in REF) is -inf dB, a NaN sum NaN; never log10(0)
        ratio = x2 / e2
        sqnr = (math.nan if math.isnan(ratio) else 10 * math.log10(ratio) if ratio > 0
                else -math.inf)
    return sqnr, sum(j.verdict == FLAG for j in judgements)


def raw_codes(ref: TensorSource, test: TensorSource, stats: CompareStats) -> bool:
    """Whether a pair looks like codes read without their scales: neither side a known
    layout, one side stored in one byte (float8, int8/uint8), the other wider, SQNR < 0."""
    if ref.quantized is not None or test.quantized is not None or not stats.sqnr_db < 0:
        return False
    sizes = sorted(_bytes(s.dtype) for s in (ref, test))
    return sizes[0] <= NARROW_BYTES < sizes[1]


def _bytes(dtype: str) -> float:
    try:
        return itemsize(dtype)
    except KeyError:
        return math.inf


def raw_codes_note(names: list[str], pairs: dict[str, tuple[str, str]]) -> str:
    """The one note naming the pairs ``raw_codes`` found (``pairs``: name -> dtypes)."""
    first = names[0]
    listing = ", ".join(shown(n) for n in names[:3]) + (
        f" and {len(names) - 3:,} more" if len(names) > 3 else "")
    narrow, wide = pairs[first]
    return (f"SQNR below 0 dB between {narrow} and {wide} ({listing}): likely raw codes "
            "read without their scales, a quantized layout fmt does not know "
            "(fmt audit lists the layouts it reads)")
