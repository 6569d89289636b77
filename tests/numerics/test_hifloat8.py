"""HiFloat8 (HiF8), the tapered format, against its definition.

The reference here is written from the paper alone (Luo et al. 2024, "Ascend HiFloat8
Format for Deep Learning", arXiv:2409.16626, §2) and shares no code with
``fmtcli.numerics.tapered``: each of the 256 codes is read as a bit string -- sign, the
prefix-coded dot field (11, 10, 01, 001, 0001 give exponent widths 4, 3, 2, 1, 0; 0000 is
the denormal mode), the exponent in sign-magnitude form with an implicit leading magnitude
bit, the mantissa in the bits left -- and the specials are the paper's: one zero (0x00),
one NaN (0x80), +-inf at 0x6F/0xEF.  Rounding is checked against a brute-force search of
that value set: the paper's TA (nearest, ties away from zero) and the directed modes
exactly, nearest-even as the nearest value with fmtcli's documented tie rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, json_of, only_scheme, quantize_json

from fmtcli.numerics.formats import REGISTRY, FormatSpec, Specials, get_format
from fmtcli.numerics.rounding import all_values, decode, encode, round_to_format
from fmtcli.numerics.tapered import Taper

HIF8 = get_format("hif8")

# dot prefix -> exponent field width D (the mantissa takes the 7 - len(dot) - D bits left)
DOTS = {"11": 4, "10": 3, "01": 2, "001": 1, "0001": 0}


def reference_code(code: int) -> tuple[float, int, int]:
    """(value, mantissa field, mantissa width) of one code, from the paper's layout."""
    bits = format(code, "08b")
    sign = -1.0 if bits[0] == "1" else 1.0
    rest = bits[1:]
    if rest == "0000000":
        return (math.nan if sign < 0 else 0.0), 0, 0
    if rest == "1101111":  # where 1.5 * 2**15 would be
        return sign * math.inf, 0, 0
    if rest.startswith("0000"):  # denormal mode: the 3 bits are M, the value 2**(M - 23)
        return sign * 2.0 ** (int(rest[4:], 2) - 23), 0, 0
    dot = next(d for d in DOTS if rest.startswith(d))
    width = DOTS[dot]
    field, mantissa = rest[len(dot):len(dot) + width], rest[len(dot) + width:]
    exponent = 0
    if width:
        magnitude = int("1" + field[1:], 2)  # the implicit leading 1 of the magnitude
        exponent = -magnitude if field[0] == "1" else magnitude
    m = len(mantissa)
    value = 2.0 ** exponent * (1 + int(mantissa, 2) / 2 ** m)
    return sign * value, int(mantissa, 2), m


REFERENCE = [reference_code(code) for code in range(256)]
VALUES = np.array([v for v, _, _ in REFERENCE])
FINITE = np.unique(VALUES[np.isfinite(VALUES)])  # sorted; one zero
POSITIVE = FINITE[FINITE > 0]
FIELDS = {v: (f, m) for v, f, m in REFERENCE if np.isfinite(v) and v > 0}


# -- the value set and its figures -------------------------------------------------------------

def test_every_code_decodes_as_the_paper_lays_it_out():
    got = decode(np.arange(256), HIF8)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(VALUES))
    same = ~np.isnan(VALUES)
    np.testing.assert_array_equal(got[same], VALUES[same])
    np.testing.assert_array_equal(all_values(HIF8)[same], VALUES[same])
    assert [int(c) for c in np.flatnonzero(np.isnan(VALUES))] == [0x80]
    assert [int(c) for c in np.flatnonzero(np.isinf(VALUES))] == [0x6F, 0xEF]


def test_figures_equal_the_enumeration():
    assert HIF8.name == "hifloat8" and HIF8.bits == 8 and HIF8.specials is Specials.INF_NUZ
    assert HIF8.max == POSITIVE.max() == 2.0 ** 15
    assert HIF8.min == FINITE.min() == -(2.0 ** 15)
    assert HIF8.smallest_subnormal == POSITIVE.min() == 2.0 ** -22
    # the normal encoding's smallest value: dot 11, exponent -15, mantissa 0
    normal = [v for v, _, m in REFERENCE if v > 0 and m > 0]
    assert HIF8.smallest_normal == min(normal) == 2.0 ** -15
    assert HIF8.finite_values == FINITE.size == 253
    assert HIF8.eps == POSITIVE[POSITIVE > 1].min() - 1 == 0.125
    assert (HIF8.min_exponent, HIF8.max_exponent) == (-15, 15)
    assert HIF8.dynamic_range_binades == math.log2(POSITIVE.max() / POSITIVE.min()) == 37
    assert (HIF8.has_inf, HIF8.has_nan, HIF8.has_zero, HIF8.has_negative_zero) == \
        (True, True, True, False)
    assert HIF8.nan_codes == 1
    np.testing.assert_array_equal(-FINITE[FINITE < 0][::-1], POSITIVE)


def test_taper_is_the_abstracts_binades():
    # "7 exponents with 3-bit mantissa, 8 with 2-bit, 16 with 1-bit", denormals 7 more
    by_exponent = {}
    for v, _, m in REFERENCE:
        if np.isfinite(v) and v > 0:
            by_exponent.setdefault(math.floor(math.log2(v)), set()).add(m)
    assert all(len(ms) == 1 for ms in by_exponent.values())
    counts = {m: sum(1 for ms in by_exponent.values() if ms == {m}) for m in range(4)}
    assert counts == {3: 7, 2: 8, 1: 16, 0: 7}
    taper = HIF8.taper
    assert isinstance(taper, Taper)
    for exponent, (m,) in by_exponent.items():
        assert taper.mantissa_at(exponent) == m, exponent
    assert (taper.lowest, taper.highest) == (min(by_exponent), max(by_exponent))
    assert HIF8.to_dict()["taper"][0] == {"exponents": [-22, -16], "mantissa_bits": 0}


def test_encode_gives_the_papers_codes():
    codes = np.arange(256)
    number = ~np.isnan(VALUES)
    np.testing.assert_array_equal(encode(VALUES[number], HIF8), codes[number])
    assert encode(np.array([-0.0, np.nan, -np.nan]), HIF8).tolist() == [0x00, 0x80, 0x80]


def test_a_tapered_spec_needs_its_specials_and_ones_precision():
    with pytest.raises(Exception, match="tapered"):
        FormatSpec("x", 4, 3, 0, Specials.INF_NUZ)  # infnuz without a taper
    with pytest.raises(Exception, match="tapered"):
        FormatSpec("x", 4, 2, 0, Specials.INF_NUZ, taper=HIF8.taper)  # 1 has 3 bits


# -- rounding against the value set ------------------------------------------------------------

def reference_round(x: float, mode: str, saturate: bool = False) -> float:
    """Round x to HiF8 by searching the enumerated values (ieee policy: past the top
    binade's next point, inf)."""
    if math.isnan(x):
        return math.nan
    a, negative = abs(x), x < 0
    top = 1.5 * 2.0 ** 15  # the point the inf code stands for
    grid = np.concatenate([[0.0], POSITIVE, [top]])
    if math.isinf(a) or a > top:
        r = math.inf
    else:
        i = int(np.searchsorted(grid, a))
        if grid[i] == a:
            r = a
        else:
            lo, hi = grid[i - 1], grid[i]
            away = {"toward-zero": False, "up": not negative, "down": negative}.get(mode)
            if away is None:  # nearest
                if a - lo != hi - a:
                    away = hi - a < a - lo
                elif mode == "nearest-away":
                    away = True
                else:  # nearest-even: the even mantissa field; no mantissa bits: up; 0 is even
                    away = lo != 0 and (FIELDS[lo][1] == 0 or FIELDS[lo][0] % 2 == 1)
            r = hi if away else lo
    if r == top or math.isinf(r):
        directed_stop = (mode == "toward-zero" or (mode == "up" and negative)
                         or (mode == "down" and not negative))
        r = HIF8.max if saturate or (directed_stop and not math.isinf(a)) else math.inf
    r = -r if negative else r
    return 0.0 if r == 0 else r  # one zero


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(23)
    mid = (FINITE[1:] + FINITE[:-1]) / 2  # every tie
    around = np.concatenate([mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf)])
    wide = rng.standard_normal(4000) * 2.0 ** rng.integers(-26, 18, 4000)
    edges = [0.0, 2.0 ** -23, 2.0 ** -24, 1.25 * 2 ** 15, 1.2499 * 2 ** 15, 5e4, 1e30,
             np.inf, -np.inf, np.nan]
    x = np.concatenate([around, wide, edges])
    return np.concatenate([x, -x])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["nearest-away", "nearest-even", "toward-zero", "up", "down"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rounding_equals_a_search_of_the_value_set(mode, dtype):
    x = _inputs().astype(dtype)
    got = round_to_format(x, HIF8, mode).astype(np.float64)
    expected = np.array([reference_round(float(v), mode) for v in x])
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero((got != expected) & ~nan)
    assert bad.size == 0, [(float(x[i]), got[i], expected[i]) for i in bad[:5]]
    assert not np.signbit(got[got == 0]).any()  # no -0


def test_the_papers_thresholds():
    ta = lambda v, policy="ieee": float(round_to_format(np.array([v]), HIF8,  # noqa: E731
                                                       "nearest-away", policy)[0])
    assert ta(1.25 * 2 ** 15) == math.inf and ta(1.2499 * 2 ** 15) == 2 ** 15
    assert ta(1.25 * 2 ** 15, "saturate") == 2 ** 15 and ta(math.inf, "saturate") == 2 ** 15
    assert ta(2.0 ** -23) == 2.0 ** -22 and ta(0.99 * 2.0 ** -23) == 0.0
    assert ta(1.0625) == 1.125 and ta(-1.0625) == -1.125  # ties away from zero


def test_stochastic_rounding_lands_on_a_neighbour():
    x = _inputs()
    x = x[np.isfinite(x) & (np.abs(x) < 2 ** 15)]
    got = round_to_format(x, HIF8, "stochastic", seed=5)
    lo = np.array([reference_round(v, "down") for v in x])
    hi = np.array([reference_round(v, "up") for v in x])
    assert ((got == lo) | (got == hi)).all()


# -- the commands --------------------------------------------------------------------------

def test_fmt_range_shows_the_taper():
    (spec,) = json_of("range", "hif8")
    assert (spec["name"], spec["max"], spec["finite_values"]) == ("hifloat8", 32768.0, 253)
    assert spec["taper"][-1] == {"exponents": [8, 15], "mantissa_bits": 1}
    out = invoke("range", "hif8").stdout
    assert "0-4" in out and "0-3" in out and "2^-22" in out


def test_fmt_underflow_stores_in_hif8():
    rows = json_of("underflow", "1e-3", "3e-7", "1e-8", "40000", "--format", "hif8",
                   "--rounding", "nearest-away")
    assert [(r["stored"], r["status"]) for r in rows] == [
        (2.0 ** -10, "rounded"), (2.0 ** -22, "subnormal"), (0.0, "flushed"),
        (2.0 ** 15, "rounded")]


def test_fmt_quantize_in_hif8_equals_the_reference(tmp_path):
    x = (np.random.default_rng(1).standard_normal(4096) * 3).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    scheme = only_scheme(quantize_json(str(tmp_path / "x.npy"), "--format", "hif8",
                                       "--fixed-scale", "1", "--rounding", "nearest-away"))
    q = np.array([reference_round(float(v), "nearest-away", saturate=True) for v in x])
    assert scheme["format"] == "hifloat8"
    assert math.isclose(scheme["max_abs_error"], float(np.max(np.abs(q - x))), rel_tol=1e-6)
    assert math.isclose(scheme["rmse"], float(np.sqrt(np.mean((q - x) ** 2))), rel_tol=1e-6)


@pytest.mark.parametrize("command", [("calc", "1+2"), ("sum", "1 2 3", "--accumulator"),
                                     ("softmax", "--format")])
def test_arithmetic_commands_refuse_a_tapered_format(command):
    args = [*command, "hif8"] if command[-1].startswith("--") else [*command, "--format", "hif8"]
    assert_usage_error(invoke(*args), "tapered format")


def test_hifloat8_is_registered_once_with_its_alias():
    assert REGISTRY["hifloat8"] is HIF8 and get_format("HiF8") is HIF8
    assert HIF8.ml_dtype is None
