"""``fmt scale-search --loss-scale``: the recommendation's stated rule, clipping formats,
nothing to sweep, skipped tensors and wording (issue 9: the loss-scale and vocabulary
papercuts, item 4d's degenerate data).  Every run: exit 0 with strict JSON, or one
``Error:`` line; never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_no_traceback, assert_usage_error, invoke, strict_loads, succeeds
from inputs import save
from search_helpers import direct_counts, log_uniform, sweep


def table(*args) -> str:
    return succeeds("loss-scale", *args).stdout


def test_best_safe_prefers_fewer_subnormals_among_scales_that_flush_nothing(tmp_path):
    """|g| in 2**-30 .. 2**-8: nothing flushes from 2**6 on, nothing is subnormal from
    2**16 on, 2**25 overflows.  The smallest scale that flushes nothing (2**6) leaves most
    gradients subnormal; the rule goes on to the fewest subnormal: 2**16."""
    rng = np.random.default_rng(5)
    g = np.concatenate([log_uniform(rng, 4000, -30, -8.5),
                        np.array([2.0 ** -30, -(2.0 ** -8.5)], np.float32)])
    doc = sweep(save(tmp_path / "g.npy", g))
    rows = direct_counts([g])["rows"]
    assert rows[6][0] == 0 and rows[6][1] > 1000  # flushes nothing, many subnormal
    assert rows[16][:2] == (0, 0) and rows[15][1] > 0
    assert min(e for e in rows if rows[e][2]) == 25  # the first overflowing scale
    best = doc["best_safe"]
    assert best["log2_scale"] == 16
    assert best["rule"].startswith("no overflow or saturation at S and 2S")
    assert doc["grad_scaler"]["settles_at_log2"] == 24  # GradScaler: at the edge
    assert "best without overflow: 2^16 (rule: no overflow" in table(tmp_path / "g.npy")


def test_best_safe_keeps_one_binade_of_headroom_below_the_first_overflow(tmp_path):
    """Flushing falls all the way up to the edge: the best keeps a factor 2 below the
    largest safe scale, where a step's slightly larger gradient would overflow."""
    g = np.array([2.0 ** -44, 2.0 ** -43, 2.0 ** -42, 2.0 ** -5], np.float32)
    doc = sweep(save(tmp_path / "g.npy", g))
    rows = {r["log2_scale"]: r for r in doc["scales"]}
    safe_top = int(np.log2(doc["safe_range"]["max"]))
    assert safe_top == 20  # 2**-5 * 2**21 = 65536 overflows float16
    assert rows[20]["flushed"] == 0 < rows[19]["flushed"] < rows[18]["flushed"]
    assert doc["best_safe"]["log2_scale"] == safe_top - 1


def test_without_headroom_the_rule_says_so(tmp_path):
    g = np.array([2.0 ** -30, 40000.0], np.float32)  # 2**1 already overflows
    doc = sweep(save(tmp_path / "g.npy", g))
    assert doc["best_safe"]["log2_scale"] == 0
    assert "none has it at 2S too" in doc["best_safe"]["rule"]


@pytest.mark.slow
@pytest.mark.parametrize("data", [np.zeros(64, np.float32), np.full(3, np.nan, np.float32),
                                  np.array([np.inf, 0.0, -np.inf], np.float32)],
                         ids=["zeros", "nan", "inf and zero"])
def test_nothing_to_sweep_recommends_nothing(tmp_path, data):
    path = save(tmp_path / "g.npy", data)
    doc = sweep(path)
    assert doc["nonzero"] == 0
    assert doc["best_safe"] is None and doc["most_kept"] is None
    assert any("nothing to sweep" in n for n in doc["notes"]), doc["notes"]
    out = table(path)
    assert "nothing to sweep" in out
    assert "best without" not in out and "keeps the most" not in out


def test_a_clipping_format_counts_saturation_and_says_so(tmp_path):
    """FP6 E3M2 (max 28, no inf/NaN): a gradient of 1 clips from S = 2**5 (32 > 30) on."""
    g = np.array([1.0, 2.0 ** -6], np.float32)
    doc = sweep(save(tmp_path / "g.npy", g), "--format", "e3m2")
    rows = {r["log2_scale"]: r for r in doc["scales"]}
    assert doc["thresholds"]["saturate"] == 30.0
    assert rows[4]["saturated"] == 0 and rows[5]["saturated"] == 1
    assert rows[5]["kept"] == 1 and rows[5]["kept_fraction"] == 0.5
    assert doc["safe_range"]["max"] == 2.0 ** 4
    out = table(tmp_path / "g.npy", "--format", "e3m2")
    assert "saturated" in out and "best without saturation" in out
    assert "no inf/NaN" in out


def test_rows_count_and_fraction_of_every_statistic(tmp_path):
    doc = sweep(save(tmp_path / "g.npy", np.array([1e-9, 1.0, 3e4], np.float32)))
    for row in doc["scales"]:
        for key in ("flushed", "subnormal", "overflow", "saturated", "kept"):
            assert isinstance(row[key], int), key
            assert row[f"{key}_fraction"] == row[key] / 3, key
        assert row["kept"] == 3 - row["flushed"] - row["overflow"] - row["saturated"]


def test_grad_scaler_wording_is_singular_for_one_step(tmp_path):
    out = table(save(tmp_path / "one.npy", np.ones((1, 1), np.float32)))
    text = " ".join(out.split())  # the line may wrap
    assert "settles at 2^15 after about 1 step" in text
    assert "1 steps" not in text


def test_skipped_tensors_are_listed(tmp_path):
    np.savez(tmp_path / "m.npz", ids=np.arange(4, dtype=np.int64),
             g=np.full(4, 1e-6, np.float32))
    doc = sweep(tmp_path / "m.npz")
    assert doc["skipped"] == [{"source": str(tmp_path / "m.npz"), "key": "ids",
                               "shape": [4], "dtype": "int64",
                               "reason": "dtype int64 is not a real floating-point type"}]
    assert [t["key"] for t in doc["tensors"]] == ["g"]


BATTERY = {
    "subnormal only": np.full(8, 1e-40, np.float32),
    "huge float32": np.array([1e38, -3e38], np.float32),
    "float64 beyond float32": np.array([1e300, -3e299, 1e-310], np.float64),
    "1x1": np.ones((1, 1), np.float32),
    "bfloat16-sized": np.array([2.0 ** -130, 1.0], np.float32),
}
FORMATS = ["float16", "bf16", "e5m2", "e4m3fnuz", "e2m1", "e2m3", "e3m1", "e5m0", "e8m0",
           "e11m52", "e8m23"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("data", list(BATTERY.values()), ids=list(BATTERY))
def test_battery(tmp_path, data, fmt):
    path = save(tmp_path / "g.npy", data)
    result = invoke("loss-scale", path, "--format", fmt, "--json")
    assert_no_traceback(result)
    assert "RuntimeWarning" not in result.stderr
    if fmt == "e8m0":
        assert_usage_error(result, "has no zero")
        return
    assert result.exit_code == 0, (result.exit_code, result.stderr)
    doc = strict_loads(result.stdout)
    for row in doc["scales"]:
        assert row["kept"] + row["flushed"] + row["overflow"] + row["saturated"] == doc["nonzero"]
    best = doc["best_safe"]
    assert best is None or (best["overflow"] == best["saturated"] == 0)
    shown_table = invoke("loss-scale", path, "--format", fmt, "--histogram")
    assert_no_traceback(shown_table)
    assert shown_table.exit_code == 0 and "RuntimeWarning" not in shown_table.stderr
