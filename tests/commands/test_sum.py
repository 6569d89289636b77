"""``fmt sum`` and ``fmtcli.arithmetic.summation``: running sums held in a format.

Every order is checked bit for bit against the same algorithm written here with exact
Fractions and ``arith_oracle``'s rounding (no fmtcli): sequential, pairwise, Kahan and
blocked sums in BF16, FP16, FP8 and float32, in nearest and directed modes, on both paths
of the library (numpy's ``add.accumulate`` where the accumulator holds the values, the
exact loop elsewhere).  Then the article's figures: BF16 summing 0.01 ten thousand times
stalls (at 350 values, at 4), an FP32 master copy keeps the updates that a BF16 weight
loses (Micikevicius et al. 2018, §3.1); inputs, refusals, JSON and the table's width.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from arith_oracle import FLOAT32, FLOAT64, OVERFLOW, round_binary, round_listed
from cli_helpers import (
    assert_data_error,
    assert_fits,
    assert_usage_error,
    invoke,
    json_of,
    run_fmt,
    strict_loads,
    succeeds,
)

from fmtcli.arithmetic.ops import arithmetic_spec
from fmtcli.arithmetic.pairs import add_arrays, pair_adder
from fmtcli.arithmetic.runs import running_sum
from fmtcli.arithmetic.summation import sum_values, weight_update
from fmtcli.numerics.rounding import round_to_format

LISTED = {"bfloat16": "bfloat16", "float16": "float16", "e4m3fn": "float8_e4m3fn",
          "e5m2": "float8_e5m2", "e2m1": "float4_e2m1fn"}
ALL_MODES = ["nearest-even", "nearest-away", "toward-zero", "up", "down", "stochastic"]


def oracle_any(q: Fraction, name: str, mode: str, u: float | None = None):
    """q rounded to the format by the oracle (OVERFLOW past its max)."""
    if name in ("float32", "float64"):
        return round_binary(q, **(FLOAT32 if name == "float32" else FLOAT64), mode=mode, u=u)
    return round_listed(q, LISTED[name], mode, u)


def oracle_round(q: Fraction, name: str, mode: str, u: float | None = None) -> Fraction:
    result = oracle_any(q, name, mode, u)
    assert result != OVERFLOW, "keep the oracle's sums in range"
    return result


def draws(mode: str, seed: int):
    """The uniforms of stochastic rounding as fmt sum draws them: one per rounding, from a
    generator seeded with the seed (one generator per accumulator); None otherwise."""
    if mode != "stochastic":
        while True:
            yield None
    rng = np.random.default_rng(seed)
    while True:
        yield rng.random()


def oracle_sequential(values, name, mode, u=None) -> tuple[Fraction, int]:
    """(sum, stalled_at) of s = fl(s + x) in exact arithmetic (``u``: the draws)."""
    u = draws(mode, 0) if u is None else u
    s, last = Fraction(0), 0
    for i, x in enumerate(values, 1):
        new = oracle_round(s + Fraction(x), name, mode, next(u))
        if new != s:
            last = i
        s = new
    return s, last


def oracle_pairwise(values, name, mode) -> Fraction:
    u = draws(mode, 0)
    level = [Fraction(x) for x in values]
    if len(level) == 1:
        return oracle_round(level[0], name, mode, next(u))
    while len(level) > 1:
        pairs = [oracle_round(level[i] + level[i + 1], name, mode, next(u))
                 for i in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def oracle_kahan(values, name, mode) -> Fraction:
    u = draws(mode, 0)
    fl = lambda q: oracle_round(q, name, mode, next(u))  # noqa: E731
    s = c = Fraction(0)
    for x in values:
        y = fl(Fraction(x) - c)
        t = fl(s + y)
        c = fl(fl(t - s) - y)
        s = t
    return s


def oracle_blocked(values, name, mode, block) -> Fraction:
    """Blocks of ``block`` values (the last padded with zeros) summed side by side -- the
    j-th additions of every block, then the (j+1)-th: the draws' order -- then the block
    sums in order."""
    u = draws(mode, 0)
    blocks = -(-len(values) // block)
    padded = [Fraction(x) for x in values] + [Fraction(0)] * (blocks * block - len(values))
    partial = [Fraction(0)] * blocks
    for j in range(block):
        partial = [oracle_round(partial[b] + padded[b * block + j], name, mode, next(u))
                   for b in range(blocks)]
    return oracle_sequential([float(x) for x in partial], name, mode, u)[0]


def stored_float32(n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * scale).astype(np.float32).astype(np.float64)


def accumulator(result, name):
    (row,) = [a for a in result.accumulators if a.format == name]
    return row


# -- bit for bit against the oracle --------------------------------------------------------

@pytest.mark.parametrize(("name", "mode"), [("bfloat16", "nearest-even"),
                                            ("bfloat16", "toward-zero"), ("float16", "up"),
                                            ("float16", "nearest-away"),
                                            ("e4m3fn", "nearest-even"), ("e5m2", "toward-zero"),
                                            ("float32", "nearest-even")])
def test_sequential_sums_are_the_exact_recurrence(name, mode):
    values = stored_float32(600, 1, 0.5 if name.startswith("e") else 1.0)
    result = sum_values(values, [name], "float32", "sequential", mode)
    expected, _ = oracle_sequential(values.tolist(), name, mode)
    assert Fraction(accumulator(result, result.accumulators[0].format).sum) == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32"])
def test_the_numpy_path_equals_the_exact_recurrence(name):
    """Values the accumulator holds exactly run as numpy's add.accumulate in its dtype."""
    values = stored_float32(1500, 2)
    result = sum_values(values, [name], name, "sequential")
    row = result.accumulators[0]
    assert row.method.startswith("numpy add.accumulate")
    stored = [float(oracle_round(Fraction(x), name, "nearest-even")) for x in values]
    expected, last = oracle_sequential(stored, name, "nearest-even")
    assert Fraction(row.sum) == expected


@pytest.mark.parametrize(("name", "mode"), [("bfloat16", "nearest-even"), ("float16", "up"),
                                            ("e4m3fn", "toward-zero")])
def test_pairwise_kahan_and_blocked_are_their_exact_algorithms(name, mode):
    values = stored_float32(333, 3, 0.25)
    check_orders(values, name, mode)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bfloat16", "float16", "e4m3fn", "float32"])
def test_stochastic_sums_are_the_exact_recurrence_with_one_draw_per_addition(name):
    """Stochastic rounding: the i-th addition goes up (toward +inf) when the generator's
    i-th uniform is below (x - lo) / (hi - lo), in every order."""
    values = stored_float32(400, 7, 0.25 if name == "e4m3fn" else 1.0)
    values = (values - 0.25 * values.std()).astype(np.float32).astype(np.float64)  # s < 0
    row = sum_values(values, [name], "float32", "sequential", "stochastic").accumulators[0]
    assert Fraction(row.sum) == oracle_sequential(values.tolist(), name, "stochastic")[0]
    check_orders(values[:333], name, "stochastic")


def check_orders(values, name, mode):
    listed = values.tolist()
    pairwise = sum_values(values, [name], "float32", "pairwise", mode).accumulators[0]
    assert Fraction(pairwise.sum) == oracle_pairwise(listed, name, mode)
    kahan = sum_values(values[:150], [name], "float32", "kahan", mode).accumulators[0]
    assert Fraction(kahan.sum) == oracle_kahan(listed[:150], name, mode)
    blocked = sum_values(values, [name], "float32", "blocked:16", mode).accumulators[0]
    assert Fraction(blocked.sum) == oracle_blocked(listed, name, mode, 16)
    assert "side by side" in blocked.method
    long = sum_values(values, [name], "float32", "blocked:100", mode).accumulators[0]
    assert "each in runs" in long.method  # 4 blocks of 100: each block's own running sum
    assert Fraction(long.sum) == oracle_blocked(listed, name, mode, 100)


# -- the adder: TwoSum pairs rounded once, scalar, numpy and in runs -----------------------

def hard_pairs(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Operands (a, b): a a value of the format (powers of two among them: binade edges),
    b a float64 placing a + b on, just off and midway between grid points, with bits far
    below float64's reach of a + b (TwoSum inexact), or anywhere."""
    spec = arithmetic_spec(name)[0]
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(spec.min_exponent - spec.mantissa_bits, spec.max_exponent - 1,
                                n)
    a = round_to_format(rng.standard_normal(n) * scale, spec).astype(np.float64)
    edge = rng.random(n) < 0.2
    a[edge] = np.copysign(2.0 ** rng.integers(spec.min_exponent, spec.max_exponent - 1,
                                              edge.sum()), a[edge])
    _, e = np.frexp(np.abs(a))
    ulp = np.ldexp(1.0, np.maximum(e, spec.min_exponent + 1) - spec.mantissa_bits - 1)
    offset = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0, 1.5], n)
    tiny = rng.choice([-1, 0, 1], n) * np.ldexp(1.0, -rng.choice([20, 52, 53, 54, 60, 200], n))
    b = rng.choice([-1.0, 1.0], n) * ulp * (offset + tiny)
    anywhere = rng.random(n) < 0.3
    with np.errstate(over="ignore"):
        b[anywhere] = rng.standard_normal(anywhere.sum()) * scale[anywhere] * \
            2.0 ** rng.integers(-80, 80, anywhere.sum())
    keep = np.isfinite(b) & (a != 0)
    return a[keep], b[keep]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bfloat16", "float16", "e4m3fn", "e5m2", "e2m1", "float32",
                                  "float64"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_an_addition_is_the_exact_sum_rounded_once(name, mode):
    """pair_adder (scalar) and add_arrays (numpy) against the oracle, where TwoSum's float64
    sum is inexact, at ties, at binade edges; stochastic with uniforms next to the exact
    rest (where the comparison is closest)."""
    spec = arithmetic_spec(name)[0]
    a, b = hard_pairs(name, 700, 11)
    exact = [Fraction(x) + Fraction(y) for x, y in zip(a.tolist(), b.tolist())]
    u = np.random.default_rng(12).random(a.size)
    if mode == "stochastic":  # u just below, at and above the rest, in units of 2^-53
        for i, q in enumerate(exact):
            lo, hi = oracle_any(q, name, "down"), oracle_any(q, name, "up")
            if OVERFLOW not in (lo, hi) and lo != hi:
                step = int((q - lo) / (hi - lo) * 2 ** 53) + i % 3 - 1
                u[i] = min(max(step, 0), 2 ** 53 - 1) / 2 ** 53
    add = pair_adder(spec, mode)
    together = add_arrays(a, b, spec, mode, u=u)
    for i, q in enumerate(exact):
        want = oracle_any(q, name, mode, float(u[i]))
        got = add(float(a[i]), float(b[i]), float(u[i]))
        assert got == together[i] or (math.isnan(got) and math.isnan(together[i]))
        if want == OVERFLOW:  # past max: max, inf or NaN by the mode and the format
            assert abs(got) >= spec.max or math.isnan(got), (a[i], b[i])
        else:
            assert Fraction(got) == want, (a[i], b[i], u[i])


def scalar_running_sum(values, spec, mode, seed):
    """The recurrence with the scalar adder alone, one uniform per step."""
    rng = np.random.default_rng(seed)
    add = pair_adder(spec, mode)
    us = rng.random(values.size).tolist() if mode == "stochastic" else [0.0] * values.size
    s, last, absorbed = 0.0, 0, 0
    for i, (x, u) in enumerate(zip(values.tolist(), us), 1):
        new = add(s, x, u)
        if new == s or (new != new and s != s):
            absorbed += x != 0
        else:
            last = i
        s = new
    return s, last, absorbed


RUN_DATA = {"normal": lambda rng: stored_float32(6000, 8),
            "positive": lambda rng: np.abs(stored_float32(6000, 9)),
            "constant": lambda rng: np.full(4000, float(np.float32(0.01))),
            "subnormal": lambda rng: rng.standard_normal(3000) * 1e-41,
            "scales": lambda rng: rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000),
            "halves": lambda rng: 2.0 ** -9 * rng.choice([-1.0, 1.0, 3.0], 3000)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bfloat16", "float16", "e4m3fn", "float32", "float64"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_runs_within_binades_are_the_scalar_recurrence(name, mode):
    """The vectorised runs give the scalar adder's sum, stall point and absorbed count to
    the bit: random walks, one-signed sums that run away from their terms, subnormal sums,
    terms of many scales, and ties (nearest-even's runs stop there)."""
    spec = arithmetic_spec(name)[0]
    for label, make in RUN_DATA.items():
        values = make(np.random.default_rng(5))
        if name == "e4m3fn" and label == "scales":
            continue  # past e4m3fn's range
        got = running_sum(values, spec, mode, np.random.default_rng(3))
        want = scalar_running_sum(values, spec, mode, 3)
        assert got[1:] == want[1:] and math.copysign(1, got[0]) == math.copysign(1, want[0]) \
            and (got[0] == want[0] or math.isnan(got[0]) and math.isnan(want[0])), label


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["up", "toward-zero", "stochastic"])
def test_directed_sums_far_above_their_terms_are_exact(mode):
    """``-r up`` runs a BF16 sum of N(0, 1) terms away from them (every positive term a
    whole step up): the additions TwoSum cannot hold in float64, once the slow path."""
    values = stored_float32(3000, 10)
    row = sum_values(values, ["bf16"], "float32", "sequential", mode).accumulators[0]
    assert row.method.startswith("runs within binades")
    assert Fraction(row.sum) == oracle_sequential(values.tolist(), "bfloat16", mode)[0]


# -- sums beyond float64 -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("order", ["sequential", "pairwise", "kahan", "blocked:2"])
def test_a_sum_beyond_float64_is_exact_and_its_overflow_an_infinite_error(tmp_path, order):
    """1e308 + 1e308 = 2e308 exactly: math.fsum raised OverflowError (exit 70).  The exact
    sum is inf in float64 (written ≈ 2e308), float64's running sum overflows to inf, an
    infinite error."""
    path = tmp_path / "big.npy"
    np.save(path, np.array([1e308, 1e308]))
    doc = json_of("sum", path, "--format", "float64", "--order", order)
    assert doc["exact"] == "inf" and doc["exact_text"] == "≈ 2.0000000000000000e+308"
    row = {a["format"]: a for a in doc["accumulators"]}["float64"]
    assert row["sum"] == "inf" and row["abs_error"] == "inf" and row["rel_error"] == "inf"
    words = " ".join(succeeds("sum", path, "--format", "float64", "--order", order).stdout
                     .split())
    assert "exact sum ≈ 2.0000000000000000e+308 (the stored values' exact sum: beyond " \
        "float64)" in words


@pytest.mark.slow
def test_a_finite_sum_of_an_overflowing_sequence_is_exact(tmp_path):
    """1e308 + 1e308 - 1e308: the exact sum 1e308 is a float64; the running sums overflow."""
    path = tmp_path / "big.npy"
    np.save(path, np.array([1e308, 1e308, -1e308]))
    result = run_fmt("sum", str(path), "--format", "float64", "-a", "fp64", "--json")
    assert result.returncode == 0, result.stderr
    doc = strict_loads(result.stdout)
    assert doc["exact"] == 1e308 and doc["exact_text"] == "1e+308"
    assert doc["accumulators"][0]["sum"] == "inf" and not result.stderr


def test_an_update_beyond_float64_is_no_internal_error():
    doc = json_of("sum", "--update", "1e308", "--count", "10", "--format", "float64",
                  "-a", "fp64")
    assert doc["update"]["exact"] == "-inf"
    assert doc["accumulators"][0]["sum"] == "-inf"


def test_the_exact_sum_and_the_relative_error_are_exact():
    values = stored_float32(5000, 4)
    result = sum_values(values, ["bfloat16", "float64"])
    exact = sum(Fraction(x) for x in values.tolist())
    assert result.exact == float(exact)
    row = accumulator(result, "bfloat16")
    assert row.rel_error == pytest.approx(float(abs(Fraction(row.sum) - exact) / abs(exact)),
                                          rel=1e-15)
    assert row.abs_error == float(Fraction(row.sum) - exact)


# -- the article ---------------------------------------------------------------------------

def test_bf16_summing_001_ten_thousand_times_stalls_at_350_values_at_4():
    """In BF16 the spacing of [4, 8) is 2^-5: half of it exceeds 0.01, so s + 0.01 = s."""
    doc = json_of("sum")
    assert doc["count"] == 10_000 and doc["format"] == "float32"
    rows = {a["format"]: a for a in doc["accumulators"]}
    assert set(rows) == {"bfloat16", "float16", "float32", "float64"}
    for row in rows.values():
        assert set(row) >= {"format", "sum", "exact", "rel_error", "stalled_at"}
    x = float(np.float32(0.01))
    expected, last = oracle_sequential([x] * 10_000, "bfloat16", "nearest-even")
    assert last == rows["bfloat16"]["stalled_at"] == 350
    assert rows["bfloat16"]["sum"] == float(expected) == 4.0
    assert rows["bfloat16"]["next_value"] == x
    assert rows["float16"]["stalled_at"] == 2798 and rows["float16"]["sum"] == 32.0
    assert rows["float32"]["stalled_at"] is None and rows["float64"]["stalled_at"] is None
    assert rows["bfloat16"]["rel_error"] == pytest.approx(0.96, abs=1e-6)
    assert rows["float64"]["rel_error"] == 0.0  # float64 adds float32 values exactly here
    assert doc["exact"] == math.fsum([x] * 10_000)


def test_pairwise_and_kahan_keep_what_sequential_bf16_loses():
    rows = {o: accumulator(sum_values(np.full(10_000, 0.01), ["bfloat16"], order=o),
                           "bfloat16") for o in ("sequential", "pairwise", "kahan")}
    assert rows["sequential"].rel_error > 0.9
    assert rows["pairwise"].rel_error < 0.01 and rows["kahan"].rel_error < 0.02
    assert rows["pairwise"].stalled_at is None and rows["pairwise"].absorbed is None


def test_stochastic_rounding_keeps_a_bf16_sum_growing():
    row = sum_values(np.full(10_000, 0.01), ["bfloat16"], rounding="stochastic",
                     seed=1).accumulators[0]
    assert row.stalled_at is None and row.rel_error < 0.05
    assert 0 < row.absorbed < 10_000  # each addition moves it with probability x / spacing


def test_a_bf16_weight_loses_every_small_update_an_fp32_master_copy_keeps():
    """Micikevicius et al. 2018, §3.1: w -= 1e-5 on w = 1: BF16's spacing below 1 is 2^-8,
    so w - 1e-5 rounds back to 1 every time; FP32 (spacing 2^-24) moves."""
    doc = json_of("sum", "--update", "1e-4*1e-1", "--count", "1000")
    rows = {a["format"]: a for a in doc["accumulators"]}
    assert set(rows) == {"bfloat16", "float32"}
    u = float(np.float32(1e-5))
    assert doc["update"] == {"weight": 1.0, "update": u, "steps": 1000,
                             "exact": float(1 - 1000 * Fraction(u))}
    assert rows["bfloat16"]["absorbed"] == 1000 and rows["bfloat16"]["sum"] == 1.0
    assert rows["bfloat16"]["stalled_at"] == 0
    assert rows["float32"]["absorbed"] == 0 and rows["float32"]["stalled_at"] is None
    w = Fraction(1)
    for _ in range(1000):
        w = round_binary(w - Fraction(u), **FLOAT32, mode="nearest-even")
    assert Fraction(rows["float32"]["sum"]) == w


def test_updates_large_enough_for_bf16_are_kept():
    result = weight_update(2.0 ** -6, 10, accumulators=["bf16"])
    row = result.accumulators[0]
    assert row.absorbed == 0 and row.sum == 1 - 10 * 2.0 ** -6


# -- inputs and refusals -------------------------------------------------------------------

def test_inputs_from_files_stdin_random_and_constants(tmp_path):
    path = tmp_path / "x.npy"
    values = stored_float32(100, 5)
    np.save(path, values.reshape(10, 10))
    from_file = json_of("sum", path, "-a", "fp64")
    assert from_file["count"] == 100 and from_file["exact"] == math.fsum(values.tolist())
    text = "\n".join(map(repr, values.tolist()))
    assert json_of("sum", "-", "-a", "fp64", input=text)["exact"] == from_file["exact"]
    drawn = json_of("sum", "--random", "1000", "--dist", "lognormal", "--seed", "3")
    assert drawn["count"] == 1000 and drawn["exact"] > 0
    assert drawn == json_of("sum", "--random", "1000", "--dist", "lognormal", "--seed", "3")
    constant = json_of("sum", "--constant", "2^-10", "--count", "7", "--format", "bf16")
    assert constant["exact"] == 7 * 2.0 ** -10 and constant["inputs_rounded"] == 0


USAGE = [(["--random", "5", "--constant", "1"], "one input"),
         (["--count", "5", "--random", "5"], "--count"),
         (["--order", "blocked"], "blocked:B"), (["--order", "blocked:0"], "block size"),
         (["--order", "zigzag"], "unknown order"), (["--random", "5", "--dist", "cauchy"],
                                                    "distribution"),
         (["--format", "bf16,fp16"], "one format"), (["--accumulator", ""], "--accumulator"),
         (["-a", "nope"], "unknown format"), (["--constant", "abc"], "cannot read"),
         (["--constant", "1e10", "--format", "fp16"], "beyond float16"),
         (["--update", "1e-3", "--random", "5"], "--update"),
         (["--update", "1e-3", "--order", "kahan"], "sequential"),
         (["--weight", "2"], "--weight goes with --update"),
         (["--random", "600000", "--order", "kahan"], "kahan"),
         (["--random", "3000000", "-a", "e5m2"], "Python loop"),
         (["--random", "5", "-a", "e8m0"], "no negative"), (["--count", "0"], "--count"),
         (["--update", "1e-3", "--count", "10000000"], "--count 10,000,000 updates")]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragment"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(args, fragment):
    assert_usage_error(invoke("sum", *args), fragment)


def test_data_errors(tmp_path):
    assert_data_error(invoke("sum", tmp_path / "missing.npy"))
    bad = tmp_path / "nan.npy"
    np.save(bad, np.array([1.0, np.nan]))
    assert_data_error(invoke("sum", bad), "finite")


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", [[], ["--update", "1e-3*1e-2"],
                                  ["--random", "2000", "--order", "blocked:64", "-a",
                                   "e4m3,e5m2,bf16,tf32,fp32"],
                                  ["--constant", "-1e-30", "--count", "5", "-a", "e2m1,fp64"]])
def test_the_table_fits_uncut(width, args):
    out = succeeds("sum", *args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)


def test_the_table_says_where_and_at_what_value_bf16_stalled():
    words = " ".join(succeeds("sum", env={"COLUMNS": "80"}).stdout.split())
    assert "bfloat16: 4 + 0.009999999776482582 = 4 from value 351 on" in words


def test_json_is_strict_when_a_sum_overflows():
    doc = json_of("sum", "--constant", "400", "--count", "10", "-a", "e4m3fn")
    row = doc["accumulators"][0]
    assert row["sum"] == "nan" and row["rel_error"] == "nan"
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_kahan_in_numpy_scalars_is_the_exact_algorithm(name):
    """Values the accumulator holds: Kahan runs on numpy / ml_dtypes scalars."""
    values = stored_float32(300, 6, 0.1)
    row = sum_values(values, [name], name, "kahan").accumulators[0]
    assert row.method.startswith("numpy")
    stored = [float(oracle_round(Fraction(x), name, "nearest-even")) for x in values]
    assert Fraction(row.sum) == oracle_kahan(stored, name, "nearest-even")
