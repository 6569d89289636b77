"""What ``fmt attention``'s emulation can hold: the checks that keep every figure finite.

The emulated kernels read Q, K, V as float32 (or narrower) and accumulate in float32;
standard attention stores S in F (or float16 for FP8/6/4).  A finite input beyond those
ranges would come out as inf or NaN (and numpy's overflow warnings): it is refused here with
one DataError line naming the input, the value and the range, before the work starts.
"""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.errors import DataError
from fmtcli.numerics.formats import FormatSpec, get_format
from fmtcli.numerics.tiles import is_narrow

F32_MAX = float(np.finfo(np.float32).max)
#: The smallest magnitude that a cast to float32 (nearest-even) makes inf: max + ulp / 2.
F32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103


def first_flagged(bad: np.ndarray, x: np.ndarray) -> str:
    """'1e+300 at [0, 0, 3, 1]': the first flagged entry of ``x`` and its index."""
    index = np.unravel_index(int(np.argmax(bad)), x.shape)
    return f"{float(x[index]):.6g} at [{', '.join(map(str, index))}]"


def check_float32_range(x: np.ndarray, label: str) -> None:
    """Refuse an input that float32 cannot hold: every kernel emulated here reads Q, K, V
    as float32 (or narrower), and the float64 reference stays finite for inputs within
    float32's range (|S| <= 1.2e77 sqrt(d))."""
    bad = np.abs(x) >= F32_OVERFLOW
    if bad.any():
        raise DataError(f"{label} holds {first_flagged(bad, x)}, beyond float32's range (max "
                        f"{F32_MAX:.6g}), which the emulated kernels read it in")


def check_scores(largest: float, spec: FormatSpec, dim: int, labels=("Q", "K")) -> None:
    """Refuse inputs whose scores overflow where the methods hold them: ``largest`` is the
    largest |row max| of S = Q K^T / sqrt(d) (exact, from the reference).  Q K^T is a float32
    product before the 1/sqrt(d) (both methods); standard attention stores S in F (wide F)
    or float16 (narrow F).  (A score below -max alone is harmless: its weight is 0 either
    way; a row whose largest score overflows is not.)"""
    where = f"{labels[0]} and {labels[1]}: the scores Q K^T / sqrt(d) reach {largest:.3g}"
    if largest * math.sqrt(dim) >= F32_MAX:
        raise DataError(f"{where}; Q K^T is {largest * math.sqrt(dim):.3g} before the "
                        f"1/sqrt(d), beyond float32's range (max {F32_MAX:.3g}) where the "
                        "kernels accumulate it")
    store = spec if not is_narrow(spec) else get_format("float16")
    if largest >= store.max:
        raise DataError(f"{where}, beyond {store.name}'s range (max {store.max:g}) where "
                        "standard attention stores S: give smaller inputs"
                        + (" or a wider format" if not is_narrow(spec) else ""))


def overflowed(what: str) -> DataError:
    return DataError(f"{what} overflows on these inputs (a value beyond its format's range "
                     "came out as inf or NaN): give smaller inputs")
