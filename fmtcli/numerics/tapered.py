"""Tapered formats: the number of mantissa bits depends on the binade (HiFloat8).

A tapered format's values are still, binade by binade, a sign and ``2**e * (1 + k/2**m)``
for ``k = 0 .. 2**m - 1``, but ``m`` (the mantissa bits) changes with the exponent ``e``: a
``Taper`` lists ``m`` for every binade from the lowest to the highest.  Everything the
registry shows is derived from that list (``Taper.max``, ``smallest_normal``, ...), and the
rounding engine rounds in each binade at that binade's spacing ``2**(e - m(e))``
(``ulp_exponents``), which is exact because every binade starts at a power of two the
format holds.

HiFloat8 (HiF8; Luo et al. 2024, "Ascend HiFloat8 Format for Deep Learning",
arXiv:2409.16626), the only tapered format registered: 8 bits, a sign, a prefix-coded
"dot" field that gives the width D of the exponent field, the exponent in sign-magnitude
form with its leading magnitude bit implicit, and the mantissa in the bits left:

====== ===== ================= ========= =======================
dot    D     exponents E       mantissa  binades
====== ===== ================= ========= =======================
11     4     +-8 .. +-15       1 bit     16
10     3     +-4 .. +-7        2 bits    8
01     2     +-2, +-3          3 bits    4
001    1     +-1               3 bits    2
0001   0     0                 3 bits    1
0000   -     denormal: 2**(M - 23), M = 1..7 (the 3 bits hold the exponent)  7
====== ===== ================= ========= =======================

Specials: 0x00 is the one zero (no -0), 0x80 (the negative-zero code) the one NaN, and
0x6F/0xEF (where 1.5 * 2**15 would be) are +-inf; so max = 2**15, the smallest normal
2**-15, the smallest denormal 2**-22, and 253 finite values.  The paper rounds to nearest
with ties away from zero ("TA", ``--rounding nearest-away``); the engine's other modes
apply on the same grid.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fmtcli.base.errors import UsageError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Taper:
    """The value set of a tapered format, by binade.

    ``lowest``: the exponent of the lowest binade (its first value is the smallest positive
    value); ``mantissa``: the mantissa bits of each binade from there up; ``normal_from``:
    the exponent of the smallest value of the normal encoding (below it, denormals);
    ``inf_at_top``: the top binade's last code is inf, not a value; ``layout``: the name of
    the code layout (``LAYOUTS``) that codes are read and written with; ``bits`` the code's
    width and ``exponent_widths`` the narrowest and widest exponent field of the layout.
    """

    lowest: int
    mantissa: tuple[int, ...]
    normal_from: int
    inf_at_top: bool
    layout: str
    bits: int
    exponent_widths: tuple[int, int]

    @property
    def highest(self) -> int:
        """Exponent of the top binade."""
        return self.lowest + len(self.mantissa) - 1

    def mantissa_at(self, exponent: int) -> int:
        """Mantissa bits of the binade [2**exponent, 2**(exponent + 1))."""
        if not self.lowest <= exponent <= self.highest:
            raise UsageError(f"2**{exponent} is outside the format's binades")
        return self.mantissa[exponent - self.lowest]

    @property
    def max(self) -> float:
        """Largest finite value: the top binade's last value (or the one before inf)."""
        m = self.mantissa[-1]
        last = (1 << m) - 1 - int(self.inf_at_top)
        return math.ldexp(1 + last / (1 << m), self.highest)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.lowest)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.normal_from)

    @property
    def positive_values(self) -> int:
        """How many finite values above zero: 2**m per binade, less the inf code."""
        return sum(1 << m for m in self.mantissa) - int(self.inf_at_top)

    @property
    def spans(self) -> list[dict]:
        """The binades grouped by mantissa bits, bottom first (for JSON)."""
        out: list[dict] = []
        for i, m in enumerate(self.mantissa):
            if out and out[-1]["mantissa_bits"] == m:
                out[-1]["exponents"][1] = self.lowest + i
            else:
                out.append({"exponents": [self.lowest + i, self.lowest + i], "mantissa_bits": m})
        return out

    @functools.cached_property
    def _ulp_table(self) -> np.ndarray:
        import numpy as np  # formats (and this) load without numpy; rounding brings it

        e = np.arange(self.lowest, self.highest + 1, dtype=np.int32)
        return e - np.asarray(self.mantissa, dtype=np.int32)

    def ulp_exponents(self, exponent: np.ndarray) -> np.ndarray:
        """log2 of the spacing at values of binade ``exponent`` (an int array): the lowest
        binade's below it (zero and the smallest value), the top binade's above it."""
        import numpy as np

        where = np.clip(exponent - self.lowest, 0, len(self.mantissa) - 1)
        return self._ulp_table[where]


def _hif8_value(code: int) -> float:
    """The value of one HiF8 code, read field by field as the paper lays them out."""
    negative, rest = code >> 7, code & 0x7F
    if rest == 0:
        return math.nan if negative else 0.0
    if rest == 0x6F:
        return -math.inf if negative else math.inf
    if rest >> 3 == 0:  # dot 0000: denormal, the 3 low bits are an exponent
        magnitude = math.ldexp(1.0, (rest & 7) - 23)
    else:
        # dot prefix codes: 11 -> D 4, 10 -> D 3, 01 -> D 2, 001 -> D 1, 0001 -> D 0
        width, dot_bits = ((4, 2) if rest >> 5 == 3 else (3, 2) if rest >> 5 == 2
                           else (2, 2) if rest >> 5 == 1 else (1, 3) if rest >> 4 == 1
                           else (0, 4))
        m = 7 - dot_bits - width
        field = (rest >> m) & ((1 << width) - 1)
        exponent = 0
        if width:
            magnitude_bits = field & ((1 << (width - 1)) - 1)
            exponent = (1 << (width - 1)) | magnitude_bits  # the implicit leading 1
            exponent = -exponent if field >> (width - 1) else exponent
        magnitude = math.ldexp(1 + (rest & ((1 << m) - 1)) / (1 << m), exponent)
    return -magnitude if negative else magnitude


@functools.cache
def _hif8_codes() -> np.ndarray:
    import numpy as np

    return np.array([_hif8_value(code) for code in range(256)], dtype=np.float64)


LAYOUTS = {"hif8": _hif8_codes}

HIF8_TAPER = Taper(lowest=-22, mantissa=(0,) * 7 + (1,) * 8 + (2,) * 4 + (3,) * 7
                   + (2,) * 4 + (1,) * 8, normal_from=-15, inf_at_top=True, layout="hif8",
                   bits=8, exponent_widths=(0, 4))


def mantissa_bits_at(spec, exponent: int) -> int:
    """Mantissa bits of a format (a ``FormatSpec``) in the binade of 2**exponent: its
    ``mantissa_bits``, or the taper's where it is tapered."""
    return spec.mantissa_bits if spec.taper is None else spec.taper.mantissa_at(exponent)


def check_one_precision(spec, who: str) -> None:
    """Refuse a tapered format where ``who`` computes with one precision for all values."""
    if spec.taper is not None:
        raise UsageError(f"{spec.name} is a tapered format (its mantissa bits change with "
                         f"the exponent): {who} takes formats of one precision",
                         "fmt range, fmt underflow and fmt quantize take it")


def code_values(taper: Taper) -> np.ndarray:
    """Every code's value (float64, code order) under the taper's layout."""
    return LAYOUTS[taper.layout]()


def decode(codes, taper: Taper) -> np.ndarray:
    """Values (float64) of a tapered format's codes."""
    import numpy as np

    return code_values(taper)[np.asarray(codes).astype(np.intp)]


@functools.cache
def _sorted_codes(layout: str) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    values = LAYOUTS[layout]()
    finite = np.flatnonzero(np.isfinite(values))
    order = np.argsort(values[finite], kind="stable")
    return values[finite][order], finite[order]


def encode(values, taper: Taper) -> np.ndarray:
    """Codes (uint8) of values the format holds exactly: +-0 is the zero code, NaN the NaN
    code, +-inf the inf codes; a value the format does not hold raises UsageError."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    table = code_values(taper)
    ordered, codes = _sorted_codes(taper.layout)
    where = np.clip(np.searchsorted(ordered, v), 0, ordered.size - 1)
    out = codes[where]
    out = np.where(np.isnan(v), np.flatnonzero(np.isnan(table))[0], out)
    for sign in (1, -1):
        out = np.where(v == sign * np.inf, np.flatnonzero(table == sign * np.inf)[0], out)
    held = (ordered[where] == v) | ~np.isfinite(v)
    if not held.all():
        bad = float(v[~held].reshape(-1)[0])
        raise UsageError(f"{bad!r} is not a value of the format (round it first)")
    return out.astype(np.uint8 if taper.bits <= 8 else np.uint16)
