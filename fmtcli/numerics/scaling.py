"""Scale rules: from the largest magnitude of a block (amax) to the block's scale.

Direction, everywhere in fmtcli: ``x_q = cast(x * scale) / scale``.  A scale multiplies the
data into the element format's range; dividing by it comes back.  (OCP MX and NVFP4 store the
inverse, the *decode* scale ``X = 1 / scale``; fmtcli reports ``scale`` as defined here.)

Rules (``emax_elem`` = floor(log2(max)) of the element format, ``max`` its largest value):

- ``amax``: ``scale = max / amax`` (times ``2**-margin``), as Transformer Engine and torchao
  compute FP8 scales; the block's largest value lands on ``max``.
- ``pow2-floor`` / ``pow2-ceil`` / ``pow2-nearest``: the amax scale rounded to a power of
  two by floor / ceil / nearest of its log2.  Floor never pushes amax past max; ceil can.
- ``mx-floor``: the OCP MX v1.0 rule (§6.3), ``X = 2**(floor(log2 amax) - emax_elem)``; it can
  saturate the block's largest values (amax 500 in E4M3: X = 1, and 500 > 448).
- ``mx-ceil``: ``X = 2**(ceil(log2 amax) - emax_elem)``.
- ``mx-even``: amax first rounded to the element's mantissa width (its significand
  rounded half-up, as torchao's ``EVEN`` mode), then as ``mx-floor``.
- ``mx-rceil``: ``X = 2**ceil(log2(amax / max))``, NVIDIA's cuBLAS/Transformer Engine rule:
  never saturates.
- ``percentile``: ``scale = max / percentile_q(|x|)`` over the block: clips the largest
  values (they saturate) to give the rest finer resolution.  The block statistic is passed
  in place of amax.
- ``fixed``: one given scale (delayed scaling computes it from earlier tensors' amax).
MX exponents are clamped to E8M0's range, 2**-127 .. 2**127.  A custom format whose max
lies beyond float32's (``e8m4fn``: 2**128 * 1.9375; ``e9m3``) cannot have its top reached by
a float32 product: under the float32 product every rule aims at 2**127 in its place
(``float32_top``), so ``amax * scale`` stays finite; its roundings are held in float64.

The scaled product's width (``Product``), one rule for every command:

- ``float32`` (the default of ``quantize`` and ``scale-search``, for every data type): the
  data is taken as float32 (float64 data rounded to the nearest float32; data beyond
  float32's range is a data error that suggests ``exact``), the scale is float32, and
  ``x * scale`` is one correctly rounded float32 multiplication before the cast, as eager
  torch kernels compute it.  A float64 and a float32 file of the same values agree.
  Errors are still measured against the data as stored (float64 stays float64).
- ``exact`` (the default of ``underflow``, whose values are typed literals): x and the
  scale are float64 and so is the product: exact for float32 data with float32 scales and
  for power-of-two scales (24 x 24 bits fit in 53), otherwise rounded once to 53 bits.
  Scales keep the float32 value of the ``float32`` rule where it lies in float32's normal
  range, and are float64 where it does not (data beyond float32's range, tiny amaxes).

Scales are float32 (``exact``: see above).  A scale beyond float32's normal range (amax
below max / 3.4e38, or a huge margin) is clamped into it: the largest float32 (2**127 for
power-of-two rules) or the smallest normal (``exact``: float64's range instead).  A block
whose amax is 0 gets scale 1 (there is nothing to scale; its values stay 0).  A block
holding NaN gets a NaN scale and an infinite amax gives scale 0 (``amax``) or NaN (MX), as the
real recipes do: such a block comes out NaN or zero, and fmtcli counts it.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.choices import Product, ScaleRule
from fmtcli.base.errors import UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.tapered import mantissa_bits_at

# The grid of the MSE scale search (scale-search, kv): margins in binades below the amax
# scale, first every quarter binade from -1 to 6, then steps of 1/32 around the best
COARSE = np.arange(-1.0, 6.0 + 1e-9, 0.25)
FINE_STEP = 1 / 32

MX_RULES = (ScaleRule.MX_FLOOR, ScaleRule.MX_CEIL, ScaleRule.MX_EVEN, ScaleRule.MX_RCEIL)
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
F64_MAX, F64_TINY = float(np.finfo(np.float64).max), float(np.finfo(np.float64).tiny)
E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT = -127, 127


def emax_elem(spec: FormatSpec) -> int:
    """floor(log2(max)) of the element format: 8 for E4M3 (448), 2 for FP4 (6)."""
    return math.frexp(spec.max)[1] - 1


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """Exact floor(log2 a) for positive finite float64 a (frexp, no log rounding)."""
    return np.frexp(a)[1].astype(np.int64) - 1


def _ceil_log2(a: np.ndarray) -> np.ndarray:
    """Exact ceil(log2 a) for positive finite float64 a."""
    mantissa, exponent = np.frexp(a)
    return exponent.astype(np.int64) - (mantissa == 0.5)


def amax_to_scale(amax, spec: FormatSpec, rule: ScaleRule | str = ScaleRule.AMAX,
                  margin: float = 0, product: Product | str = Product.FLOAT32) -> np.ndarray:
    """Scale (same shape as ``amax``) for blocks of the element format ``spec``: float32,
    or float64 under ``Product.EXACT`` (module docstring).

    ``x_q = cast(x * scale) / scale``.  ``margin`` divides the scale by 2**margin, leaving
    headroom above the block's amax (a negative margin clips; fractional margins serve the
    MSE search of ``fmt scale-search``).  For ``percentile`` pass the block's percentile of
    |x| as ``amax``.
    """
    rule = ScaleRule(rule)
    exact = Product(product) is Product.EXACT
    if not exact:  # the float32 rule sees the data as float32 (monotone: the same amax)
        with np.errstate(over="ignore"):
            amax = np.asarray(amax).astype(np.float32)
    if rule is ScaleRule.FIXED:
        raise UsageError("a fixed scale is given, not computed from amax")
    a = np.asarray(amax, dtype=np.float64)
    fmax = spec.max if exact else float32_top(spec)
    scale = np.ones(a.shape, dtype=np.float64)
    positive = (a > 0) & np.isfinite(a)
    ap = np.where(positive, a, 1.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if rule in (ScaleRule.AMAX, ScaleRule.PERCENTILE):
            if fmax <= F32_MAX:
                # one correctly rounded float32 division, as recipes (and the CUDA path) do
                raw = np.divide(np.float32(fmax), ap.astype(np.float32)).astype(np.float64)
            else:  # the exact product with a max beyond float32's
                raw = fmax / ap
        elif rule in (ScaleRule.POW2_FLOOR, ScaleRule.POW2_CEIL, ScaleRule.POW2_NEAREST):
            raw = fmax / ap
            if rule is ScaleRule.POW2_FLOOR:
                power = _floor_log2(raw)
            elif rule is ScaleRule.POW2_CEIL:
                power = _ceil_log2(raw)
            else:
                power = np.rint(np.log2(raw)).astype(np.int64)
            raw = np.ldexp(1.0, power.astype(np.int32))
        else:
            exponent = _mx_exponent(ap, spec, rule, fmax)
            exponent = np.clip(exponent, E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT)
            raw = np.ldexp(1.0, (-exponent).astype(np.int32))
        raw = raw * 2.0 ** -margin
        if rule not in MX_RULES:  # stay a finite, normal float32 (tiny amax, huge margin)
            top = F32_MAX if rule in (ScaleRule.AMAX, ScaleRule.PERCENTILE) else 2.0 ** 127
            if exact:  # beyond float32's normal range: the float64 value
                if rule in (ScaleRule.AMAX, ScaleRule.PERCENTILE):
                    wide = (fmax / ap) * 2.0 ** -margin
                    raw = np.where((raw >= F32_TINY) & (raw <= top), raw, wide)
                raw = np.clip(raw, F64_TINY, F64_MAX if top == F32_MAX else 2.0 ** 1023)
            else:
                raw = np.clip(raw, F32_TINY, top)
        scale = np.where(positive, raw, scale)
        if rule in MX_RULES:
            scale = np.where(np.isinf(a), np.nan, scale)
        else:
            scale = np.where(np.isinf(a), 0.0, scale)
        scale = np.where(np.isnan(a), np.nan, scale)
    return scale if exact else scale.astype(np.float32)


def float32_top(spec: FormatSpec) -> float:
    """The element max the float32 product aims at: ``spec.max``, or 2**127 for a format
    whose max lies beyond float32's (``e8m4fn``, ``e9m3``): its top binades are out of
    the product's reach, and 2**127 leaves room for the rounding of ``amax * scale``."""
    return spec.max if spec.max <= F32_MAX else 2.0 ** 127


def _mx_exponent(ap: np.ndarray, spec: FormatSpec, rule: ScaleRule,
                 fmax: float | None = None) -> np.ndarray:
    """Unbiased E8M0 exponent X of the decode scale 2**X (before clamping); ``fmax`` the
    element max aimed at (``spec.max``, or ``float32_top`` under the float32 product)."""
    fmax = spec.max if fmax is None else fmax
    emax = math.frexp(fmax)[1] - 1
    if rule is ScaleRule.MX_FLOOR:
        return _floor_log2(ap) - emax
    if rule is ScaleRule.MX_CEIL:
        return _ceil_log2(ap) - emax
    if rule is ScaleRule.MX_EVEN:
        # Round amax's float32 significand half-up at the element's mantissa width
        # (a carry bumps the exponent field, up to 255 = 2**128 for amax near float32's
        # max: no wrap to inf), then floor as mx-floor; subnormal amaxes count as 2**-126.
        bits = ap.astype(np.float32).view(np.uint32).astype(np.int64)
        field = (bits + (1 << (23 - mantissa_bits_at(spec, emax) - 1))) >> 23
        return np.maximum(field, 1) - 127 - emax
    if rule is ScaleRule.MX_RCEIL:
        return _ceil_log2(ap / fmax)
    raise UsageError(f"not an MX rule: {rule.value}")


NVFP4_SCALE_FORMAT = "float8_e4m3fn"  # the format NVFP4 stores its block scales in


def scale_to_e4m3(scale_decode: np.ndarray) -> np.ndarray:
    """Round decode scales to float8_e4m3fn (nearest-even, saturating), as NVFP4 stores them."""
    from fmtcli.numerics.formats import get_format
    from fmtcli.numerics.rounding import round_to_format

    return round_to_format(np.asarray(scale_decode, dtype=np.float32),
                           get_format(NVFP4_SCALE_FORMAT), overflow="saturate")
