"""Number formats: a spec holds a format's defining parameters; every figure is derived.

A binary floating-point format is fixed by its exponent bits, mantissa bits, exponent
bias, whether it has a sign bit, whether exponent field 0 holds subnormals (and zero), and
what its top codes mean (``Specials``).  Everything else -- ``max``, ``smallest_normal``,
``smallest_subnormal``, ``eps``, the exponent range, the number of finite values -- is
computed exactly from those (every figure is a dyadic rational that a Python float holds
exactly) and is named as ``numpy.finfo`` names it.

The registry holds every float format of ml_dtypes under its ml_dtypes/torch name plus
``tfloat32`` and the tapered HiFloat8 (``hifloat8``: its mantissa bits change with the
exponent, ``numerics.tapered``); custom formats are parsed from names such as ``e5m10``,
``e4m3fnuz`` or ``e4m3_b11`` (see ``parse_custom``).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from enum import Enum

from fmtcli.base.choices import ARTICLE_FORMATS as ARTICLE_FORMATS  # re-exported
from fmtcli.base.choices import RECIPE_NAMES
from fmtcli.base.errors import Param, UnknownFormatError, UsageError, shown
from fmtcli.numerics.tapered import HIF8_TAPER, Taper


class Specials(str, Enum):
    """What the format's top codes mean.

    - ``ieee``: the all-ones exponent holds inf (mantissa 0) and NaN (mantissa != 0).
    - ``fn``: finite; only the all-ones code (exponent and mantissa) is NaN, per sign.
    - ``fnuz``: finite, unsigned zero; the negative-zero code is the single NaN.
    - ``finite``: every code is a number; no inf, no NaN (OCP MX FP6 and FP4).
    - ``infnuz``: +-inf, one zero, its negative-zero code the one NaN (tapered: HiFloat8).
    """

    IEEE = "ieee"
    FN = "fn"
    FNUZ = "fnuz"
    FINITE = "finite"
    INF_NUZ = "infnuz"


@dataclass(frozen=True)
class FormatSpec:
    """A binary floating-point format, stored as its defining parameters only.

    ``subnormals=False`` means exponent field 0 is an ordinary binade: the format has no
    zero and no subnormals (E8M0, the OCP MX scale format).  ``taper``: a tapered format
    (``numerics.tapered``), whose range figures come from it; its ``exponent_bits`` is
    then the widest exponent field, ``mantissa_bits`` those of 1's binade (what ``eps``
    says), and ``bias`` 0.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: Specials = Specials.IEEE
    signed: bool = True
    subnormals: bool = True
    aliases: tuple[str, ...] = field(default=(), compare=False)
    description: str = field(default="", compare=False)
    taper: Taper | None = None

    def __post_init__(self) -> None:
        if (self.specials is Specials.INF_NUZ) != (self.taper is not None) or (
                self.taper and self.taper.mantissa_at(0) != self.mantissa_bits):
            raise UsageError("a tapered format has 'infnuz' specials and 1's mantissa bits")
        if not 1 <= self.exponent_bits <= 11:
            raise UsageError(f"exponent bits must be 1..11, got {self.exponent_bits}")
        if not 0 <= self.mantissa_bits <= 52:
            raise UsageError(f"mantissa bits must be 0..52, got {self.mantissa_bits}")
        if self.specials in (Specials.FNUZ, Specials.INF_NUZ) and not self.signed:
            raise UsageError("an unsigned format has no negative-zero code to hold NaN ('fnuz')")
        if self.specials is Specials.IEEE and self.exponent_bits == 1:
            raise UsageError("an IEEE-style format needs at least 2 exponent bits")
        if self.max_exponent > 1023 or self.min_exponent - self.mantissa_bits < -1074:
            raise UsageError(f"bias {self.bias} puts {self.name}'s range outside float64's")
        if self.smallest_subnormal > 1:
            raise UsageError(f"bias {self.bias} leaves {self.name} unable to represent 1 or less")

    # -- code layout ---------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total storage bits (sign + exponent + mantissa)."""
        if self.taper is not None:
            return self.taper.bits
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def _top_field(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def _max_exponent_field(self) -> int:
        """Biased exponent field of the largest finite value."""
        if self.specials is Specials.IEEE:
            return self._top_field - 1
        if self.specials is Specials.FN and self.mantissa_bits == 0:
            return self._top_field - 1  # the whole top binade is the NaN code
        return self._top_field

    @property
    def _max_mantissa_field(self) -> int:
        full = (1 << self.mantissa_bits) - 1
        if self.specials is Specials.FN and self.mantissa_bits > 0:
            return full - 1  # all-ones is NaN
        return full

    # -- derived figures (exact) ---------------------------------------------------------
    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal value (``finfo.minexp``)."""
        if self.taper is not None:
            return self.taper.normal_from
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max_exponent(self) -> int:
        """Unbiased exponent of the largest finite value (``finfo.maxexp - 1``)."""
        if self.taper is not None:
            return math.frexp(self.taper.max)[1] - 1
        return self._max_exponent_field - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.taper is not None:
            return self.taper.max
        significand = 1 + self._max_mantissa_field / (1 << self.mantissa_bits)
        return math.ldexp(significand, self.max_exponent)

    @property
    def smallest_normal(self) -> float:
        """Smallest positive value with full precision, 2**min_exponent."""
        return math.ldexp(1.0, self.min_exponent)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value (equal to smallest_normal when there are no subnormals)."""
        if self.taper is not None:
            return self.taper.smallest_subnormal
        if not self.subnormals or self.mantissa_bits == 0:
            return self.smallest_normal
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """2**-mantissa_bits: the relative spacing of normal values, which is the spacing
        just above 1 wherever 1 is a normal value (as ``numpy.finfo.eps``)."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def has_inf(self) -> bool:
        return self.specials in (Specials.IEEE, Specials.INF_NUZ)

    @property
    def has_nan(self) -> bool:
        if self.specials is Specials.IEEE:
            return self.mantissa_bits > 0
        return self.specials in (Specials.FN, Specials.FNUZ, Specials.INF_NUZ)

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def has_negative_zero(self) -> bool:
        return (self.signed and self.has_zero
                and self.specials not in (Specials.FNUZ, Specials.INF_NUZ))

    @property
    def nan_codes(self) -> int:
        """How many codes are NaN."""
        signs = 2 if self.signed else 1
        if self.specials is Specials.IEEE:
            return signs * ((1 << self.mantissa_bits) - 1)
        if self.specials is Specials.FN:
            return signs
        if self.specials in (Specials.FNUZ, Specials.INF_NUZ):
            return 1
        return 0

    @property
    def finite_values(self) -> int:
        """How many distinct finite values the format holds (+0 and -0 count once)."""
        if self.taper is not None:  # a sign for each, and one zero
            return (2 if self.signed else 1) * self.taper.positive_values + 1
        codes = 1 << self.bits
        codes -= self.nan_codes
        if self.has_inf:
            codes -= 2 if self.signed else 1
        if self.has_negative_zero:
            codes -= 1
        return codes

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits of a normal value: (mantissa_bits + 1) * log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def dynamic_range_binades(self) -> float:
        """log2(max / smallest_subnormal): how many powers of two the format spans."""
        return math.log2(self.max / self.smallest_subnormal)

    @property
    def min(self) -> float:
        """Most negative finite value (the smallest value for an unsigned format)."""
        return -self.max if self.signed else self.smallest_subnormal

    @property
    def ml_dtype(self):
        """The numpy/ml_dtypes dtype with these exact parameters, or None (e.g. tfloat32)."""
        return _ml_dtype_for(self.name)

    def to_dict(self) -> dict:
        """The spec and every derived figure, under stable snake_case keys."""
        return {
            "name": self.name, "aliases": list(self.aliases), "description": self.description,
            "bits": self.bits, "exponent_bits": self.exponent_bits,
            "mantissa_bits": self.mantissa_bits, "bias": self.bias, "signed": self.signed,
            "specials": self.specials.value, "max": self.max, "min": self.min,
            "smallest_normal": self.smallest_normal,
            "smallest_subnormal": self.smallest_subnormal, "eps": self.eps,
            "min_exponent": self.min_exponent, "max_exponent": self.max_exponent,
            "finite_values": self.finite_values, "decimal_digits": self.decimal_digits,
            "dynamic_range_binades": self.dynamic_range_binades, "has_inf": self.has_inf,
            "has_nan": self.has_nan, "has_zero": self.has_zero,
            "has_negative_zero": self.has_negative_zero,
            **({} if self.taper is None else {"taper": self.taper.spans}),
        }

    def __str__(self) -> str:
        return self.name


# -- registry -------------------------------------------------------------------------

def _spec(name, e, m, bias=None, specials=Specials.IEEE, *, aliases=(), **rest):
    bias = default_bias(e, specials) if bias is None else bias
    return FormatSpec(name, e, m, bias, specials, aliases=tuple(aliases), **rest)


def default_bias(exponent_bits: int, specials: Specials) -> int:
    """IEEE's bias 2**(e-1) - 1, one more for ``fnuz`` (as AMD/Graphcore and ml_dtypes)."""
    bias = (1 << (exponent_bits - 1)) - 1
    return bias + 1 if specials is Specials.FNUZ else bias


_REGISTERED = (
    _spec("float32", 8, 23, aliases=("fp32", "float", "single", "f32"),
          description="IEEE 754 binary32"),
    _spec("tfloat32", 8, 10, aliases=("tf32",),
          description="NVIDIA TensorFloat-32: float32's range, float16's precision"),
    _spec("float16", 5, 10, aliases=("fp16", "half", "f16"), description="IEEE 754 binary16"),
    _spec("bfloat16", 8, 7, aliases=("bf16",), description="brain float: float32's range"),
    _spec("float8_e4m3fn", 4, 3, specials=Specials.FN, aliases=("e4m3fn", "fp8_e4m3fn"),
          description="OCP FP8 E4M3 (NVIDIA, Intel, Arm), max 448"),
    _spec("float8_e4m3fnuz", 4, 3, specials=Specials.FNUZ, aliases=("e4m3fnuz", "fp8_e4m3fnuz"),
          description="FP8 E4M3 of AMD MI300 and Graphcore: no -0, max 240"),
    _spec("float8_e5m2", 5, 2, aliases=("e5m2", "fp8_e5m2"),
          description="OCP FP8 E5M2, IEEE-style"),
    _spec("float8_e5m2fnuz", 5, 2, specials=Specials.FNUZ, aliases=("e5m2fnuz", "fp8_e5m2fnuz"),
          description="FP8 E5M2 of AMD MI300 and Graphcore: no inf, no -0"),
    _spec("float8_e4m3", 4, 3, aliases=("e4m3_ieee", "fp8_e4m3_ieee"),
          description="IEEE-style E4M3 with inf and NaN, max 240"),
    _spec("float8_e3m4", 3, 4, aliases=("e3m4",), description="IEEE-style E3M4"),
    _spec("float8_e4m3b11fnuz", 4, 3, bias=11, specials=Specials.FNUZ,
          aliases=("e4m3b11fnuz", "e4m3b11"), description="Graphcore E4M3 with bias 11"),
    _spec("float8_e8m0fnu", 8, 0, specials=Specials.FN, signed=False, subnormals=False,
          aliases=("e8m0", "e8m0fnu", "fp8_e8m0"),
          description="OCP MX scale: unsigned powers of two, no zero"),
    _spec("float6_e2m3fn", 2, 3, specials=Specials.FINITE, aliases=("e2m3", "fp6_e2m3", "e2m3fn"),
          description="OCP MX FP6 E2M3, no inf or NaN"),
    _spec("float6_e3m2fn", 3, 2, specials=Specials.FINITE, aliases=("e3m2", "fp6_e3m2", "e3m2fn"),
          description="OCP MX FP6 E3M2, no inf or NaN"),
    _spec("float4_e2m1fn", 2, 1, specials=Specials.FINITE,
          aliases=("e2m1", "fp4", "fp4_e2m1", "e2m1fn", "float4_e2m1fn_x2"),
          description="OCP MX / NVFP4 element FP4 E2M1, no inf or NaN"),
    _spec("hifloat8", 4, 3, bias=0, specials=Specials.INF_NUZ, aliases=("hif8",), taper=HIF8_TAPER,
          description="Huawei Ascend HiF8, tapered: 3 mantissa bits near 1, 1 at the ends"),
)

REGISTRY: dict[str, FormatSpec] = {spec.name: spec for spec in _REGISTERED}
ALIASES: dict[str, str] = {alias: spec.name for spec in _REGISTERED for alias in spec.aliases}

#: Names that could mean more than one format, with the one chosen and a note for stderr.
AMBIGUOUS = {
    "e4m3": ("float8_e4m3fn",
             "'e4m3' is ambiguous; using float8_e4m3fn (OCP, max 448). "
             "For AMD's variant (max 240) say 'e4m3fnuz'."),
    "fp8": ("float8_e4m3fn",
            "'fp8' is ambiguous; using float8_e4m3fn (OCP E4M3, max 448). "
            "Say 'e5m2' or 'e4m3fnuz' for the others."),
}

_CUSTOM = re.compile(
    r"^e(?P<e>\d+)m(?P<m>\d+)(?:_?b(?P<bias>-?\d+))?(?P<kind>fnuz|fnu|fn)?(?:_b(?P<bias2>-?\d+))?$")


@dataclass(frozen=True)
class FormatTable:
    """The result of ``fmt range``: the formats asked for, in the order given."""

    specs: tuple[FormatSpec, ...]

    def to_dict(self) -> list[dict]:
        """JSON: one object per format (``FormatSpec.to_dict``)."""
        return [spec.to_dict() for spec in self.specs]


def _ml_dtype_for(name: str):
    import numpy as np

    if name in ("float32", "float16"):
        return np.dtype(name)
    if name == "tfloat32":
        return None
    import ml_dtypes

    dtype = getattr(ml_dtypes, name, None)
    return None if dtype is None else np.dtype(dtype)


def parse_custom(text: str) -> FormatSpec | None:
    """Parse a custom format name, or return None when ``text`` is not of the grammar.

    Grammar: ``e<E>m<M>[_b<BIAS>][fn|fnuz|fnu]`` (the bias may also follow the suffix).
    - no suffix: IEEE-style, the top exponent holds inf and NaN;
    - ``fn``: finite, NaN only at the all-ones code;
    - ``fnuz``: finite, no -0, NaN at the negative-zero code; default bias one higher;
    - ``fnu``: unsigned, finite, no zero, NaN at the all-ones code (like E8M0).
    ``E`` is 1..11 and ``M`` 0..52; the default bias is 2**(E-1) - 1.
    """
    match = _CUSTOM.match(text)
    if not match:
        return None
    for group, what in (("e", "exponent bits must be 1..11"), ("m", "mantissa bits must be 0..52"),
                        ("bias", "the bias is too large"), ("bias2", "the bias is too large")):
        if match[group] is not None and len(match[group]) > 6:  # int() of 5,000 digits fails
            raise UnknownFormatError(f"custom format {shown(text)}: {what}")
    e, m = int(match["e"]), int(match["m"])
    kind = match["kind"] or ""
    specials = {"": Specials.IEEE, "fn": Specials.FN, "fnuz": Specials.FNUZ,
                "fnu": Specials.FN}[kind]
    if not 1 <= e <= 11:
        raise UnknownFormatError(f"custom format {shown(text)}: exponent bits must be 1..11")
    if not 0 <= m <= 52:
        raise UnknownFormatError(f"custom format {shown(text)}: mantissa bits must be 0..52")
    if match["bias"] is not None and match["bias2"] is not None:
        raise UnknownFormatError(f"custom format {shown(text)} gives the bias twice")
    bias_text = match["bias"] if match["bias"] is not None else match["bias2"]
    bias = default_bias(e, specials) if bias_text is None else int(bias_text)
    unsigned = kind == "fnu"
    return FormatSpec(text, e, m, bias, specials, signed=not unsigned, subnormals=not unsigned)


def known_names() -> list[str]:
    """Every registered name and alias."""
    return sorted([*REGISTRY, *ALIASES, *AMBIGUOUS])


def resolve_format(name: str) -> tuple[FormatSpec, str | None]:
    """Return the spec for a format name and a note for stderr (or None).

    Accepts registered names, aliases, torch names (``torch.float8_e4m3fn``), any case, and
    custom ``eXmY`` names.  Raises UnknownFormatError naming the closest known names.
    """
    key = name.strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key in AMBIGUOUS:
        chosen, note = AMBIGUOUS[key]
        return REGISTRY[chosen], note
    key = ALIASES.get(key, key)
    if key in REGISTRY:
        return REGISTRY[key], None
    spec = parse_custom(key)
    if spec is not None:
        return spec, None
    if key in RECIPE_NAMES:  # mxfp8, nvfp4, ...: a format with its block size and scale rule
        raise UnknownFormatError(
            f"unknown format {shown(name)}",
            f"{key} is a recipe, not a format: fmt quantize takes it as " + Param("recipe", key))
    close = difflib.get_close_matches(key, known_names(), n=3, cutoff=0.6) \
        if len(key) <= 64 else []
    hint = f"did you mean {', '.join(close)}?" if close else "'fmt range --all' lists them."
    raise UnknownFormatError(
        f"unknown format {shown(name)}",
        f"{hint} Custom formats are written like e5m10, e4m3fnuz, e4m3_b11")


def get_format(name: str) -> FormatSpec:
    """``resolve_format`` without the note, for library users who know what they ask for."""
    return resolve_format(name)[0]
