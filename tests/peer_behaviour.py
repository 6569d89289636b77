"""What the installed ml_dtypes does where its releases differ, found by casting a few
inputs (never read from its version), so that a test of a peer holds for every release
that pyproject allows.  Seen so far (0.5.0, 0.5.3, 0.6.0, 0.7.0):

- float64 input: 0.5 and 0.6 cast through float32 (rounding twice: 68.00000357 becomes 64
  in float8_e4m3fn); 0.7 rounds once, as the engine (72);
- E8M0, float32 subnormals in (2**-127, 1.5 * 2**-127): 0.5 and 0.6 round them up to
  2**-126; 0.7 to the nearest, 2**-127, as the engine;
- E8M0 ties 1.5 * 2**k: 0.5.0 goes to the even code (2**k for odd k: 3 becomes 2); 0.5.3,
  0.6 and 0.7 up in magnitude, as the engine (3 becomes 4).

Each detector asserts that ml_dtypes does one of the two known things: a release that does
a third thing fails the tests until someone looks at it.  Imports nothing from fmtcli.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np


def ml_cast(x: np.ndarray, name: str) -> np.ndarray:
    """x cast to ml_dtypes' ``name`` and back to x's dtype."""
    with np.errstate(all="ignore"):
        return x.astype(getattr(ml_dtypes, name)).astype(x.dtype)


@functools.cache
def rounds_float64_through_float32(name: str) -> bool:
    """Whether ml_dtypes casts float64 to ``name`` through float32: just above and just below
    the tie between 1 and the next value of the format (closer than float32 resolves), a
    single rounding gives the two neighbours; through float32 both are the tie's value."""
    low, high = 1.0, 1.0 + float(ml_dtypes.finfo(getattr(ml_dtypes, name)).eps)
    tie = (low + high) / 2
    x = np.array([tie * (1 + 2.0**-40), tie * (1 - 2.0**-40)])
    got = ml_cast(x, name).tolist()
    if got == [high, low]:
        return False
    assert np.array_equal(got, ml_cast(x.astype(np.float32).astype(np.float64), name)), \
        f"ml_dtypes {ml_dtypes.__version__}: {x} -> {got} in {name}, neither rounded once " \
        "nor through float32"
    return True


@functools.cache
def e8m0_subnormals_round_up() -> bool:
    """Whether ml_dtypes rounds the float32 subnormals just above 2**-127 up to 2**-126 in
    E8M0 (else to the nearest, 2**-127)."""
    got = float(ml_cast(np.array([1.25 * 2.0**-127], np.float32), "float8_e8m0fnu")[0])
    assert got in (2.0**-127, 2.0**-126), (ml_dtypes.__version__, got)
    return got == 2.0**-126


@functools.cache
def e8m0_ties_to_even_code() -> bool:
    """Whether ml_dtypes sends an E8M0 tie 1.5 * 2**k to the even code (2**k for odd k;
    3 -> 2) rather than up in magnitude (3 -> 4)."""
    got = float(ml_cast(np.array([3.0], np.float32), "float8_e8m0fnu")[0])
    assert got in (2.0, 4.0), (ml_dtypes.__version__, got)
    return got == 2.0


def e8m0_differences(x32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the installed ml_dtypes' E8M0 differs from the nearest-even-up rule (a mask over
    float32 ``x32``), and the values it stores there (float32)."""
    a = np.abs(x32.astype(np.float64))
    mask = np.zeros(x32.shape, bool)
    alternative = np.zeros(x32.shape, np.float32)
    positive = (x32 > 0) & np.isfinite(x32)
    if e8m0_subnormals_round_up():
        sub = positive & (a > 2.0**-127) & (a < 1.5 * 2.0**-127)
        mask |= sub
        alternative[sub] = 2.0**-126
    if e8m0_ties_to_even_code():
        with np.errstate(invalid="ignore"):
            mantissa, exponent = np.frexp(a)
        k = exponent - 1  # x = 1.5 * 2**k
        ties = positive & (mantissa == 0.75) & (k >= -126) & (k <= 127) & (k % 2 != 0)
        mask |= ties
        alternative[ties] = (a[ties] / 1.5).astype(np.float32)
    return mask, alternative
