"""``fmt scale-search`` (tensor scales) through the command line.

Every figure is checked against an independent computation: the brute-force reference of
``oracle`` (numpy + ml_dtypes), hand-written scale rules (OCP MX, powers of two,
np.percentile), a hand-written Transformer Engine delayed-scaling loop, and the ``fmt
quantize`` command for the same scheme.  JSON is parsed strictly (no NaN literals).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_error,
    assert_no_traceback,
    assert_usage_error,
    invoke,
    quantize_json,
    strict_loads,
)
from inputs import INPUT_KINDS, save, write_input
from oracle import beyond_max, cast, heavy_tailed, ref_quantize, ref_stats
from search_helpers import DELAYED_NAMES, by_name, search

E4M3 = "float8_e4m3fn"
E4M3_MAX = 448.0
BIG = 10 ** 9
RULE_NAMES = ["amax", "amax margin 1", "amax margin 2", "amax margin 3", "pow2-floor",
              "pow2-ceil", "pow2-nearest", "mx-floor", "mx-rceil"]
PERCENTILE_NAMES = ["percentile 99.9", "percentile 99.99", "percentile 99.999"]
# candidate -> (reference rule, margin) of the non-percentile rules
RULE_REF = {"amax": ("amax", 0), "amax margin 1": ("amax", 1), "amax margin 2": ("amax", 2),
            "amax margin 3": ("amax", 3), "pow2-floor": ("pow2-floor", 0),
            "pow2-ceil": ("pow2-ceil", 0), "pow2-nearest": ("pow2-nearest", 0),
            "mx-floor": ("mx-floor", 0), "mx-rceil": ("mx-rceil", 0)}
TOP_KEYS = {"format", "granularity", "scheme", "metric", "best", "steps", "tensors",
            "candidates", "notes"}
CANDIDATE_KEYS = {"name", "scale_rule", "scale", "scales", "flushed_fraction",
                  "saturated_fraction", "median_rel_error", "p99_rel_error", "sqnr_db", "mse",
                  "note"}
DELAYED_KEYS = {"overflow_steps", "steps", "overflow_step_fraction"}
METRICS = ["mse", "sqnr", "median-rel", "p99-rel", "flushed"]


# -- helpers ----------------------------------------------------------------------------







def num(value) -> float:
    """A JSON statistic as a float ('nan'/'inf'/'-inf' are strings in --json)."""
    return float(value)


def minimised(candidate: dict, metric: str) -> float:
    """The metric as a number to minimise (SQNR negated); NaN ranks last."""
    key = {"mse": "mse", "sqnr": "sqnr_db", "median-rel": "median_rel_error",
           "p99-rel": "p99_rel_error", "flushed": "flushed_fraction"}[metric]
    value = num(candidate[key])
    if metric == "sqnr":
        value = -value
    return math.inf if math.isnan(value) else value


def f32_scale(value: float) -> float:
    return float(np.float32(value))


def quantize_fixed(x, scale: float, fmt: str = E4M3):
    """x_q = cast(x * scale) / scale with one given float32 scale (saturating cast), and the
    number of values beyond max."""
    x = np.asarray(x, dtype=np.float32)
    s = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        xs = (x * s).astype(np.float32)
        big = int(np.count_nonzero(beyond_max(xs, fmt) & np.isfinite(xs)))
        xq = (cast(xs, fmt) / s).astype(np.float32)
    return xq, big


def sum_sq_err(x, xq) -> float:
    x = np.asarray(x, np.float64).reshape(-1)
    xq = np.asarray(xq, np.float64).reshape(-1)
    return float(np.sum((xq - x) ** 2))


def with_amax(rng, shape, amax: float) -> np.ndarray:
    """Random values whose largest magnitude is exactly ``amax`` (a float32)."""
    x = rng.standard_normal(shape)
    x = x / np.abs(x).max() * amax
    x = x.astype(np.float32)
    x.reshape(-1)[0] = np.float32(amax)
    return x


def te_delayed(steps: list[np.ndarray], history: int, algorithm: str, fmt: str = E4M3,
               fmax: float = E4M3_MAX) -> dict:
    """Transformer Engine's delayed scaling, written out: step 0 has no history (scale 1);
    step t uses max / f(amax of the H steps before it), f = max or the most recent."""
    amaxes = [float(np.abs(s).max()) for s in steps]
    scales, overflow, err2, n, saturated = [], 0, 0.0, 0, 0
    for t, x in enumerate(steps):
        past = amaxes[max(0, t - history):t]
        if past:
            ref = max(past) if algorithm == "max" else past[-1]
            scale = f32_scale(fmax / ref)
        else:
            scale = 1.0
        scales.append(scale)
        if float(np.float32(amaxes[t]) * np.float32(scale)) > fmax:  # x * scale as computed
            overflow += 1
        xq, big = quantize_fixed(x, scale, fmt)
        err2 += sum_sq_err(x, xq)
        n += x.size
        saturated += big
    return {"scales": scales, "overflow_steps": overflow, "mse": err2 / n,
            "saturated_fraction": saturated / n}


def assert_rel(a, b, rel: float = 1e-5, what: str = "") -> None:
    a, b = num(a), num(b)
    assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-30), (what, a, b)


# -- input kinds (shared with test_loss_scale) ---------------------------------------------

# -- JSON shape ----------------------------------------------------------------------------

@pytest.fixture
def matrix(tmp_path):
    x = heavy_tailed(np.random.default_rng(11), (48, 64), spread=1.5)
    x[5, :40] = 0.0  # zeros: fractions over nonzero (flushed) vs every value (saturated)
    return save(tmp_path / "m.npy", x), x


def test_json_document_shape_and_keys(matrix):
    path, x = matrix
    doc = search(path)
    assert TOP_KEYS <= doc.keys(), TOP_KEYS - doc.keys()
    assert doc["format"] == E4M3 and doc["granularity"] == "tensor"
    assert doc["scheme"]["granularity"] == "tensor" and doc["scheme"]["format"] == E4M3
    assert doc["metric"] == "mse" and doc["steps"] == 1
    assert len(doc["tensors"]) == 1 and doc["tensors"][0]["shape"] == [48, 64]
    names = [c["name"] for c in doc["candidates"]]
    assert names == RULE_NAMES + PERCENTILE_NAMES + ["mse search"]
    assert doc["best"] in names
    for c in doc["candidates"]:
        assert CANDIDATE_KEYS <= c.keys(), (c["name"], CANDIDATE_KEYS - c.keys())
        assert not DELAYED_KEYS & c.keys(), c["name"]
        assert {"min", "max", "count", "distinct"} <= c["scales"].keys()
        # one scale per tensor: the scale itself, equal to the summary's
        assert c["scales"]["count"] == 1
        assert isinstance(c["scale"], float) and c["scale"] == c["scales"]["min"] > 0
        assert c["count"] == x.size
        for key in ("flushed_fraction", "saturated_fraction"):
            assert 0.0 <= c[key] <= 1.0, (c["name"], key, c[key])
    assert by_name(doc)["amax"]["scale_rule"] == "amax"
    assert by_name(doc)["pow2-floor"]["scale_rule"] == "pow2-floor"
    assert by_name(doc)["mx-floor"]["scale_rule"] == "mx-floor"
    assert by_name(doc)["percentile 99.9"]["scale_rule"] == "percentile"
    assert by_name(doc)["percentile 99.99"]["percentile"] == 99.99
    assert by_name(doc)["amax margin 2"]["margin"] == 2


def test_json_is_strict_with_nan_statistics(tmp_path):
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    x[7] = np.nan  # poisons every per-tensor amax: NaN scales and statistics
    result = invoke("scale-search", save(tmp_path / "n.npy", x), "--json")
    assert_no_traceback(result)
    assert result.exit_code == 0, result.stderr
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout
    doc = strict_loads(result.stdout)
    amax = by_name(doc)["amax"]
    # every finite input comes out NaN: an unbounded error (metrics), so mse is inf
    assert amax["mse"] == "inf" and amax["scale"] is None and amax["scales"]["nan"] == 1


def test_block_granularity_reports_a_summary_not_one_scale(matrix):
    path, x = matrix
    doc = search(path, "--block", "32")
    amax = by_name(doc)["amax"]
    assert amax["scale"] is None
    assert amax["scales"]["count"] == x.size // 32
    grid = np.abs(x).reshape(-1, 32).max(axis=1).astype(np.float64)
    assert (grid == 0).any()  # an all-zero block gets scale 1
    scales = np.where(grid > 0, E4M3_MAX / np.where(grid > 0, grid, 1), 1.0).astype(np.float32)
    assert amax["scales"]["min"] == float(scales.min())
    assert amax["scales"]["max"] == float(scales.max())
    assert amax["scales"]["distinct"] == np.unique(scales).size


# -- the best by every metric -----------------------------------------------------------------

@pytest.fixture(scope="module")
def metric_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("metric")
    rng = np.random.default_rng(23)
    x = heavy_tailed(rng, (32, 64), spread=2.0)
    one = save(d / "x.npy", x)
    seq = [save(d / f"s{i}.npy", heavy_tailed(rng, (16, 32), spread=1.0) * amp)
           for i, amp in enumerate([1.0, 3.0, 0.5])]
    return {"per tensor": [one], "block 32": [one, "--block", "32"],
            "sequence": [*seq], "tile": [one, "--tile", "8x16"]}


@pytest.mark.slow
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("setting", ["per tensor", "block 32", "sequence", "tile"])
def test_best_is_no_worse_than_any_candidate(metric_inputs, metric, setting):
    doc = search(*metric_inputs[setting], "--metric", metric)
    assert doc["metric"] == metric
    candidates = doc["candidates"]
    if setting == "sequence":
        assert {c["name"] for c in candidates} >= set(DELAYED_NAMES)
    best = by_name(doc)[doc["best"]]
    values = [minimised(c, metric) for c in candidates]
    assert minimised(best, metric) <= min(values), (metric, doc["best"], values)
    # ties go to the first listed
    first = next(c for c, v in zip(candidates, values) if v == min(values))
    assert doc["best"] == first["name"]


def test_best_differs_by_metric_on_heavy_tails(tmp_path):
    """Many small values and a few large outliers: clipping the outliers (percentile) gives
    the small values resolution (median error) but costs the outliers (MSE)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4100) * 1e-3).astype(np.float32)
    x[::1025] = 100.0  # 4 outliers, just under 0.1%
    path = save(tmp_path / "tails.npy", x)
    by_median = search(path, "--metric", "median-rel")
    by_mse = search(path, "--metric", "mse")
    by_flushed = search(path, "--metric", "flushed")
    assert by_median["best"].startswith("percentile"), by_median["best"]
    assert not by_mse["best"].startswith("percentile"), by_mse["best"]
    assert by_flushed["best"].startswith("percentile"), by_flushed["best"]
    c = by_name(by_mse)
    assert c["percentile 99.9"]["median_rel_error"] < c["amax"]["median_rel_error"] / 4
    assert c["percentile 99.9"]["mse"] > 100 * c["amax"]["mse"]
    assert c["percentile 99.9"]["saturated_fraction"] == 4 / 4100
    # the same candidates whatever the metric: only the choice changes
    assert by_name(by_median)["amax"]["mse"] == c["amax"]["mse"]


# -- candidate values ---------------------------------------------------------------------------

def test_amax_candidate_equals_the_quantize_command(matrix):
    path, x = matrix
    doc = search(path)
    amax = by_name(doc)["amax"]
    q = quantize_json(path, "--per", "tensor", "--scale-rule", "amax", "--compare", "none")
    stats = q["tensors"][0]["schemes"][0]
    assert_rel(amax["mse"], stats["rmse"] ** 2, 1e-12, "mse")
    assert amax["flushed_fraction"] == stats["flushed_fraction"]
    assert amax["median_rel_error"] == stats["median_rel_error"]
    assert amax["p99_rel_error"] == stats["p99_rel_error"]
    assert_rel(amax["sqnr_db"], stats["sqnr_db"], 1e-12, "sqnr")
    assert amax["saturated_fraction"] == stats["saturated"] / stats["count"]
    # and the reference by definition
    xq, grid, sat, _ = ref_quantize(x, (BIG, BIG))
    ref = ref_stats(x, xq)
    assert_rel(amax["mse"], ref["rmse"] ** 2, 1e-5, "mse vs reference")
    assert amax["scale"] == float(grid[0, 0]) == f32_scale(E4M3_MAX / float(np.abs(x).max()))


def test_rule_scales_follow_their_definitions(matrix):
    path, x = matrix
    c = by_name(search(path))
    amax = float(np.abs(x).max())
    amax_scale = c["amax"]["scale"]
    assert amax_scale == f32_scale(E4M3_MAX / amax)
    for m in (1, 2, 3):
        assert c[f"amax margin {m}"]["scale"] == amax_scale / 2 ** m
    raw = E4M3_MAX / amax
    floor, ceil = 2.0 ** math.floor(math.log2(raw)), 2.0 ** math.ceil(math.log2(raw))
    assert c["pow2-floor"]["scale"] == floor <= amax_scale  # the power of two at or below
    assert c["pow2-ceil"]["scale"] == ceil >= amax_scale
    assert c["pow2-nearest"]["scale"] == (floor if math.log2(raw) - math.log2(floor) < 0.5
                                          else ceil)
    emax = 8  # floor(log2 448)
    assert c["mx-floor"]["scale"] == 2.0 ** -(math.floor(math.log2(amax)) - emax)  # OCP §6.3
    assert c["mx-rceil"]["scale"] == 2.0 ** -math.ceil(math.log2(amax / E4M3_MAX))
    for name in ("mx-floor", "mx-rceil"):
        assert c[name]["scales"]["count"] == 1


def test_mx_floor_can_saturate_and_rceil_cannot(tmp_path):
    """amax 500 in E4M3: the OCP floor rule gives X = 2**0 and 500 > 448 saturates."""
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    x[0] = 500.0
    c = by_name(search(save(tmp_path / "s.npy", x)))
    assert c["mx-floor"]["scale"] == 1.0
    assert c["mx-floor"]["saturated_fraction"] == 1 / 256
    assert c["mx-rceil"]["scale"] == 0.5 and c["mx-rceil"]["saturated_fraction"] == 0.0
    assert c["amax"]["saturated_fraction"] == 0.0


def nearest_rank(a: np.ndarray, q: float) -> float:
    """The q-th percentile by nearest rank: the value of rank ceil(q/100 * n), computed
    exactly (no float rounding of q/100 * n)."""
    rank = math.ceil(Fraction(str(q)) / 100 * a.size)
    return float(np.sort(a.reshape(-1))[max(rank, 1) - 1])


def test_percentile_per_tensor_is_the_histogram_percentile(tmp_path):
    x = np.random.default_rng(8).standard_normal(20011).astype(np.float32)
    c = by_name(search(save(tmp_path / "p.npy", x)))
    a = np.abs(x)
    for q in (99.9, 99.99, 99.999):
        cand = c[f"percentile {q:g}"]
        assert cand["percentile"] == q and cand["scale_rule"] == "percentile"
        # nearest rank (the smallest |x| with at least q% at or below it), reported as the
        # upper edge of its histogram bin: within 2**-7 above
        v = nearest_rank(a, q)
        ratio = cand["scale"] * v / E4M3_MAX
        assert 1 / (1 + 2 ** -7) * (1 - 1e-6) <= ratio <= 1 + 1e-6, (q, ratio)
        # and the quantization with that scale is exact
        xq, big = quantize_fixed(x, cand["scale"])
        assert_rel(cand["mse"], sum_sq_err(x, xq) / x.size, 1e-5, f"{q} mse")
        assert cand["saturated_fraction"] == big / x.size
    linear = float(np.percentile(a, 99.9))  # the usual definition, dense data: close too
    assert abs(c["percentile 99.9"]["scale"] * linear / E4M3_MAX - 1) <= 2 ** -7
    assert c["percentile 99.9"]["scale"] > c["percentile 99.99"]["scale"] > c["amax"]["scale"]


def test_percentile_rank_is_exact_when_q_times_n_is_a_whole_number(tmp_path):
    """99.9 / 100 * 4000 is 3996.0000000000005 in floating point: the rank must be 3996
    (the largest small value), not 3997 (an outlier)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4000) * 1e-3).astype(np.float32)
    x[::1000] = 100.0  # 4 outliers = exactly 0.1%: the 99.9th percentile is rank 3996
    c = by_name(search(save(tmp_path / "tails.npy", x)))
    v = nearest_rank(np.abs(x), 99.9)
    assert v < 0.01  # the largest of the small values
    assert c["percentile 99.9"]["saturated_fraction"] == 4 / 4000
    assert c["percentile 99.9"]["scale"] * v / E4M3_MAX == pytest.approx(1, rel=2 ** -7)


def test_percentile_per_block_is_np_percentile_of_each_block(tmp_path):
    rng = np.random.default_rng(9)
    x = heavy_tailed(rng, (24, 300), spread=1.0)  # 300 = 128 + 128 + 44: a ragged block
    doc = search(save(tmp_path / "b.npy", x), "--block", "128")
    c = by_name(doc)
    blocks = [x[r, s:s + 128] for r in range(24) for s in (0, 128, 256)]
    for q in (99.9, 99.99, 99.999):
        cand = c[f"percentile {q:g}"]
        p = [np.float32(np.percentile(np.abs(b), q)) for b in blocks]
        scales = [f32_scale(E4M3_MAX / float(v)) for v in p]
        assert cand["scale"] is None and cand["scales"]["count"] == len(blocks)
        assert cand["scales"]["min"] == min(scales), q
        assert cand["scales"]["max"] == max(scales), q
        assert cand["scales"]["distinct"] == len(set(scales)), q
        err2 = big = 0
        for b, s in zip(blocks, scales):
            bq, n = quantize_fixed(b, s)
            err2 += sum_sq_err(b, bq)
            big += n
        assert_rel(cand["mse"], err2 / x.size, 1e-5, f"{q} mse")
        assert cand["saturated_fraction"] == big / x.size, q
        # clipping: every block's scale at least its amax scale, some above
        assert cand["scales"]["min"] >= c["amax"]["scales"]["min"], q
        assert cand["scales"]["max"] > c["amax"]["scales"]["max"], q


def test_mse_search_beats_amax_and_every_coarse_grid_point(matrix):
    path, x = matrix
    c = by_name(search(path))
    found = c["mse search"]
    assert found["mse"] <= c["amax"]["mse"]
    note = found["note"]
    assert "grid search" in note and "log2" in note and "1/32" in note, note
    # the scale is the amax scale times 2**(k/32), within the searched range x2 .. x2^-6
    k = math.log2(found["scale"] / c["amax"]["scale"]) * 32
    assert abs(k - round(k)) < 1e-3 and -192 <= round(k) <= 32, k
    # its MSE is the one of that scale, and no worse than any point of the coarse grid
    xq, _ = quantize_fixed(x, found["scale"])
    assert_rel(found["mse"], sum_sq_err(x, xq) / x.size, 1e-5)
    amax = float(np.abs(x).max())
    for margin in np.arange(-1.0, 6.0 + 1e-9, 0.25):
        xq, _ = quantize_fixed(x, f32_scale(E4M3_MAX / amax * 2.0 ** -margin))
        assert found["mse"] <= sum_sq_err(x, xq) / x.size * (1 + 1e-6), margin


def test_mse_search_finds_a_better_scale_than_amax_when_there_is_one(tmp_path):
    """Gaussian data: the amax scale is not the MSE-optimal one; the search finds a better
    factor between the points of its coarse 1/4-binade grid (the 1/32 refinement)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4096).astype(np.float32)
    c = by_name(search(save(tmp_path / "g.npy", x)))
    found = c["mse search"]
    assert found["mse"] < c["amax"]["mse"]
    k = math.log2(found["scale"] / c["amax"]["scale"]) * 32
    assert abs(k - round(k)) < 1e-3 and round(k) % 8 != 0, k  # off the coarse grid
    xq, _ = quantize_fixed(x, found["scale"])
    assert_rel(found["mse"], sum_sq_err(x, xq) / x.size, 1e-5)
    # the note names the factor it found
    factor = float(found["note"].rsplit("best factor 2^", 1)[1].split()[0].rstrip(";.,"))
    assert abs(factor - round(k) / 32) < 1e-3, (factor, k)
    # and nothing on the 1/32 grid next to it is better
    amax = float(np.abs(x).max())
    for j in (round(k) - 1, round(k) + 1):
        xq, _ = quantize_fixed(x, f32_scale(E4M3_MAX / amax * 2.0 ** (j / 32)))
        assert found["mse"] <= sum_sq_err(x, xq) / x.size * (1 + 1e-6), j


def test_a_tensor_of_several_chunks_on_several_workers(tmp_path):
    """More values than one chunk (2**18): per-tensor amax and percentile histograms are
    gathered over chunks on forked workers; one worker gives the same document."""
    x = heavy_tailed(np.random.default_rng(21), (600, 512), spread=1.0)
    path = save(tmp_path / "big.npy", x)
    doc = search(path, "--workers", "2")
    assert search(path, "--workers", "1")["candidates"] == doc["candidates"]
    c = by_name(doc)
    xq, grid, _, _ = ref_quantize(x, (BIG, BIG))
    assert_rel(c["amax"]["mse"], ref_stats(x, xq)["rmse"] ** 2, 1e-5)
    assert c["amax"]["scale"] == float(grid[0, 0])
    v = nearest_rank(np.abs(x), 99.99)
    ratio = c["percentile 99.99"]["scale"] * v / E4M3_MAX
    assert 1 / (1 + 2 ** -7) * (1 - 1e-6) <= ratio <= 1 + 1e-6, ratio


# -- delayed scaling -----------------------------------------------------------------------------

AMPS_3D = [600.0, 1.0, 4.0, 0.5, 8.0, 2.0]


@pytest.fixture
def sequence_3d(tmp_path):
    rng = np.random.default_rng(4)
    x = np.stack([with_amax(rng, (16, 32), a) for a in AMPS_3D])
    return save(tmp_path / "seq.npy", x), x


def assert_delayed(cand: dict, expected: dict, steps: int, what: str) -> None:
    assert DELAYED_KEYS <= cand.keys(), what
    assert cand["steps"] == steps, what
    assert cand["overflow_steps"] == expected["overflow_steps"], (what, cand["overflow_steps"])
    assert cand["overflow_step_fraction"] == expected["overflow_steps"] / steps, what
    assert cand["scales"]["count"] == steps, what
    assert cand["scales"]["min"] == min(expected["scales"]), (what, cand["scales"])
    assert cand["scales"]["max"] == max(expected["scales"]), (what, cand["scales"])
    assert cand["scales"]["distinct"] == len(set(expected["scales"])), what
    assert_rel(cand["mse"], expected["mse"], 1e-5, f"{what} mse")
    assert cand["saturated_fraction"] == pytest.approx(expected["saturated_fraction"],
                                                       abs=1e-12), what


@pytest.mark.slow
@pytest.mark.parametrize("history", [None, 2, 1])
def test_delayed_scaling_over_the_first_axis(sequence_3d, history):
    path, x = sequence_3d
    args = [path, "--over-first-axis"] + ([] if history is None else ["--history", history])
    doc = search(*args)
    assert doc["steps"] == len(AMPS_3D)
    assert len(doc["tensors"]) == 1 and doc["tensors"][0]["shape"] == [6, 16, 32]
    c = by_name(doc)
    steps = list(x)
    for algorithm in ("max", "most_recent"):
        cand = c[f"delayed {algorithm}"]
        expected = te_delayed(steps, history or 1024, algorithm)
        assert_delayed(cand, expected, len(steps), f"{algorithm} H={history}")
        assert f"history {history or 1024}" in cand["note"]
        assert "scale 1" in cand["note"]
    # the other candidates are taken over all steps, each step with its own scales
    assert c["amax"]["scales"]["count"] == len(AMPS_3D)
    err2 = sum(sum_sq_err(s, quantize_fixed(s, f32_scale(E4M3_MAX / a))[0])
               for s, a in zip(steps, AMPS_3D))
    assert_rel(c["amax"]["mse"], err2 / x.size, 1e-5, "amax over the steps")


@pytest.mark.slow
def test_history_changes_the_delayed_result(sequence_3d):
    path, x = sequence_3d
    long = by_name(search(path, "--over-first-axis"))["delayed max"]
    short = by_name(search(path, "--over-first-axis", "--history", "2"))["delayed max"]
    # history 1024 remembers the 600 of step 0 for every step; history 2 forgets it
    assert long["overflow_steps"] == 1 and short["overflow_steps"] == 2
    assert long["mse"] != short["mse"]
    assert long["scales"]["min"] == f32_scale(E4M3_MAX / 600.0)
    assert long["scales"]["max"] == 1.0  # step 0


def test_delayed_scaling_over_several_files(tmp_path):
    rng = np.random.default_rng(6)
    amps = [2.0, 1.0, 3.0, 0.001]
    steps = [with_amax(rng, (10, 24), a) for a in amps]
    paths = [save(tmp_path / f"step{i}.npy", s) for i, s in enumerate(steps)]
    doc = search(*paths)
    assert doc["steps"] == 4 and len(doc["tensors"]) == 4
    assert [t["source"] for t in doc["tensors"]] == [str(p) for p in paths]
    c = by_name(doc)
    for algorithm in ("max", "most_recent"):
        expected = te_delayed(steps, 1024, algorithm)
        assert_delayed(c[f"delayed {algorithm}"], expected, 4, algorithm)
    # by hand: max uses 448/2 at step 2 (3 * 224 > 448); most_recent uses 448/1 there
    assert c["delayed max"]["overflow_steps"] == 1
    assert c["delayed most_recent"]["overflow_steps"] == 1
    assert c["delayed most_recent"]["saturated_fraction"] > c["delayed max"]["saturated_fraction"]
    # the order of the files is the order of the steps
    rev = by_name(search(*reversed(paths)))
    expected = te_delayed(steps[::-1], 1024, "max")
    assert_delayed(rev["delayed max"], expected, 4, "reversed")


def test_a_stationary_sequence_never_overflows(tmp_path):
    rng = np.random.default_rng(0)
    x = np.stack([with_amax(rng, (8, 16), 9.0) for _ in range(4)])
    c = by_name(search(save(tmp_path / "same.npy", x), "--over-first-axis"))
    for name in DELAYED_NAMES:
        assert c[name]["saturated_fraction"] == 0.0
        assert c[name]["overflow_steps"] == 0, (name, c[name]["overflow_steps"])


def test_a_single_tensor_has_no_delayed_rows_and_a_note(matrix):
    path, _ = matrix
    doc = search(path)
    assert not set(DELAYED_NAMES) & set(by_name(doc))
    assert any("delayed scaling" in n and "sequence" in n for n in doc["notes"]), doc["notes"]


def test_blocked_granularity_has_no_delayed_rows_and_a_note(tmp_path):
    rng = np.random.default_rng(1)
    paths = [save(tmp_path / f"s{i}.npy", rng.standard_normal((4, 64)).astype(np.float32))
             for i in range(3)]
    doc = search(*paths, "--block", "32")
    assert doc["steps"] == 3
    assert not set(DELAYED_NAMES) & set(by_name(doc))
    assert any("delayed scaling" in n and "per tensor" in n for n in doc["notes"]), doc["notes"]


def test_over_first_axis_of_a_1d_tensor_is_a_usage_error(tmp_path):
    path = save(tmp_path / "v.npy", np.arange(1, 65, dtype=np.float32))
    result = invoke("scale-search", path, "--over-first-axis", "--json")
    assert_usage_error(result, "--over-first-axis")


# -- granularity options ---------------------------------------------------------------------------

GRANULARITIES = [  # options, reference tile, expected scheme fields
    (["--block", "32"], (1, 32), {"granularity": "block", "block": 32, "axis": -1}),
    (["--block", "16", "--axis", "0"], (16, 1), {"granularity": "block", "block": 16,
                                                  "axis": 0}),
    (["--tile", "8x32"], (8, 32), {"granularity": "tile", "tile": [8, 32]}),
    (["--per", "row"], (1, BIG), {"granularity": "row"}),
    (["--per", "column"], (BIG, 1), {"granularity": "column"}),
    (["--per", "tensor"], (BIG, BIG), {"granularity": "tensor"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("options, tile, fields", GRANULARITIES,
                         ids=[" ".join(g[0]) for g in GRANULARITIES])
def test_granularity_options_as_quantize(tmp_path, options, tile, fields):
    x = heavy_tailed(np.random.default_rng(12), (64, 96), spread=1.5)
    x[3, 10:70] = 0.0
    x[40:, 7] = 0.0
    path = save(tmp_path / "g.npy", x)
    doc = search(path, *options)
    for key, value in fields.items():
        assert doc["scheme"][key] == value, (key, doc["scheme"])
    assert doc["granularity"] == fields["granularity"]
    c = by_name(doc)
    # the amax candidate is what quantize reports for the same options
    q = quantize_json(path, *options, "--scale-rule", "amax", "--compare", "none")
    stats = q["tensors"][0]["schemes"][0]
    assert_rel(c["amax"]["mse"], stats["rmse"] ** 2, 1e-12)
    assert c["amax"]["flushed_fraction"] == stats["flushed_fraction"]
    assert c["amax"]["median_rel_error"] == stats["median_rel_error"]
    assert c["amax"]["scales"] == stats["scales"]
    # every non-percentile rule against the brute-force reference
    for name, (rule, margin) in RULE_REF.items():
        xq, grid, sat, _ = ref_quantize(x, tile, rule=rule, margin=margin)
        ref = ref_stats(x, xq)
        assert_rel(c[name]["mse"], ref["rmse"] ** 2, 1e-5, name)
        assert c[name]["flushed_fraction"] == ref["flushed"] / ref["nonzero"], name
        assert c[name]["saturated_fraction"] == sat / x.size, name
        assert c[name]["scales"]["min"] == float(grid.min()), name
        assert c[name]["scales"]["max"] == float(grid.max()), name
    has_percentile = set(PERCENTILE_NAMES) <= set(c)
    if fields["granularity"] == "column":
        assert not set(PERCENTILE_NAMES) & set(c)
        assert any("percentile" in n and "column" in n for n in doc["notes"]), doc["notes"]
    else:
        assert has_percentile
    assert "mse search" in c


@pytest.mark.slow
@pytest.mark.parametrize("options, tile", [(["--tile", "128x128"], (128, 128)),
                                           (["--block", "128", "--axis", "0"], (128, 1))])
def test_tiles_spanning_every_row_still_work(tmp_path, options, tile):
    """A tile taller than the tensor spans every row: the engine has no per-tile percentile
    there, so the percentile rows are left out with a note (this used to fail, exit 2)."""
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    path = save(tmp_path / "wide.npy", x)
    doc = search(path, *options)
    c = by_name(doc)
    assert not set(PERCENTILE_NAMES) & set(c)
    assert any("percentile" in n for n in doc["notes"]), doc["notes"]
    xq, grid, _, _ = ref_quantize(x, tile)
    assert_rel(c["amax"]["mse"], ref_stats(x, xq)["rmse"] ** 2, 1e-5)
    assert c["amax"]["scales"]["count"] == grid.size
    # a tensor taller than the tile keeps its percentile rows
    tall = save(tmp_path / "tall.npy", np.concatenate([x] * 3))  # 192 rows
    assert set(PERCENTILE_NAMES) <= set(by_name(search(tall, *options)))


def test_recipes_are_not_an_option_of_scale_search(matrix):
    path, _ = matrix
    result = invoke("scale-search", path, "--recipe", "mxfp8")
    assert_usage_error(result, "--recipe")


def test_block_and_per_are_alternatives(matrix):
    path, _ = matrix
    result = invoke("scale-search", path, "--block", "32", "--per", "row")
    assert_usage_error(result, "alternatives")


@pytest.mark.parametrize("fmt", ["float8_e5m2", "float4_e2m1fn", "float8_e8m0fnu"])
def test_other_formats_give_sane_fractions(tmp_path, fmt):
    """e8m0 has no negatives: their NaN must not make the saturated count negative (it
    used to report -48.6%)."""
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    doc = search(save(tmp_path / "f.npy", x), "--format", fmt)
    assert doc["format"] == fmt
    for c in doc["candidates"]:
        assert 0.0 <= c["saturated_fraction"] <= 1.0, (c["name"], c["saturated_fraction"])
        assert 0.0 <= c["flushed_fraction"] <= 1.0, (c["name"], c["flushed_fraction"])


# -- every input kind ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_every_input_kind(tmp_path, kind):
    args, arrays, stdin = write_input(kind, tmp_path)
    doc = search(*args, input=stdin)
    assert doc["steps"] == len(arrays) and len(doc["tensors"]) == len(arrays)
    assert [t["shape"] for t in doc["tensors"]] == [list(a.shape) for a in arrays]
    if kind == "safetensors-bf16":
        assert doc["tensors"][0]["dtype"] == "bfloat16"
    c = by_name(doc)
    total = sum(a.size for a in arrays)
    assert c["amax"]["count"] == total
    # per tensor amax over every tensor: the reference, tensor by tensor
    err2 = 0.0
    scales = []
    for a in arrays:
        xq, grid, _, _ = ref_quantize(a, (BIG, BIG))
        err2 += sum_sq_err(a, xq)
        scales.append(float(grid[0, 0]))
    assert_rel(c["amax"]["mse"], err2 / total, 1e-5, kind)
    assert c["amax"]["scales"]["min"] == min(scales)
    assert c["amax"]["scales"]["max"] == max(scales)
    # a checkpoint's tensors, or files of different shapes, are not a sequence of steps
    assert not set(DELAYED_NAMES) & set(c)
    assert any("delayed scaling needs a sequence" in n for n in doc["notes"]), doc["notes"]
    # the same input through quantize gives the same amax statistics
    q = quantize_json(*args, "--per", "tensor", "--compare", "none", input=stdin)
    stats = q["total"][0] if q["total"] else q["tensors"][0]["schemes"][0]
    assert_rel(c["amax"]["mse"], stats["rmse"] ** 2, 1e-9, kind)
    assert c["amax"]["flushed_fraction"] == stats["flushed_fraction"]


def test_over_first_axis_with_a_key(tmp_path):
    rng = np.random.default_rng(7)
    seq = np.stack([with_amax(rng, (8, 16), a) for a in (1.0, 5.0, 2.0)])
    np.savez(tmp_path / "c.npz", seq=seq, other=np.ones(4, np.float32))
    doc = search(tmp_path / "c.npz", "--key", "seq", "--over-first-axis")
    assert doc["steps"] == 3
    expected = te_delayed(list(seq), 1024, "max")
    assert_delayed(by_name(doc)["delayed max"], expected, 3, "npz key")


# -- table -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_table_marks_the_best_row(tmp_path):
    rng = np.random.default_rng(4)
    x = np.stack([with_amax(rng, (16, 32), a) for a in AMPS_3D])
    path = save(tmp_path / "seq.npy", x)
    doc = search(path, "--over-first-axis", "--metric", "median-rel")
    result = invoke("scale-search", path, "--over-first-axis", "--metric", "median-rel")
    assert_no_traceback(result)
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout
    for header in ("rule", "scale", "flushed", "saturated", "median rel", "SQNR", "MSE",
                   "overflow steps"):
        assert header in out, header
    marked = [line for line in out.splitlines() if "<- best" in line]
    assert len(marked) == 1, marked
    names = sorted(by_name(doc), key=len, reverse=True)  # 'amax margin 1' before 'amax'
    assert next(n for n in names if marked[0].strip().startswith(n)) == doc["best"], marked
    assert "best by median-rel" in out
    assert "1/32" in out  # the MSE search's resolution, in the caption
    assert "1/6" in out  # the delayed rows' overflow steps (step 0 holds the 600)


# -- errors ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, code, fragment", [
    (["--format", "float9_nope"], 2, "unknown format"),
    (["--metric", "rmse"], 2, "--metric"),
    (["--history", "0"], 2, "--history"),
    (["--histogram"], 2, "--loss-scale"),
    (["--block", "0"], 2, "--block"),
    (["--tile", "3y4"], 2, "--tile"),
    (["--axis", "1"], 2, "--axis"),
])
def test_usage_errors(matrix, args, code, fragment):
    path, _ = matrix
    assert_error(invoke("scale-search", path, *args), code, fragment)


def test_missing_file_and_key_without_file(tmp_path):
    assert_data_error(invoke("scale-search", tmp_path / "nope.npy"), "no such file")
    assert_usage_error(invoke("scale-search", "--key", "w"), "--key")
    np.savez(tmp_path / "c.npz", a=np.ones(4, np.float32))
    assert_data_error(invoke("scale-search", tmp_path / "c.npz", "--key", "zz"), "zz")


def test_built_in_example_without_a_file():
    doc = search()
    assert doc["tensors"][0]["source"] == "<built-in example>"
    c = by_name(doc)
    # the article's figures: per-tensor E4M3 flushes 16%, median error ~14%
    assert c["amax"]["flushed_fraction"] == pytest.approx(0.16, abs=0.01)
    assert c["percentile 99.9"]["median_rel_error"] < c["amax"]["median_rel_error"]
