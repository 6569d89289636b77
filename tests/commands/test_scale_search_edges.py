"""``fmt scale-search`` on degenerate and hostile data (issue 9, items 4d and the
vocabulary/skipped papercuts): nothing to quantize is said, not ranked; delayed scaling only
over what is meant as steps; candidates speak quantize's vocabulary; skipped tensors are
listed.  Every run: exit 0 with strict JSON, or one ``Error:`` line; never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_no_traceback, invoke, quantize_json, strict_loads, succeeds
from inputs import save
from search_helpers import DELAYED_NAMES, by_name, search

NOTHING = "nothing to quantize"


def table(*args) -> str:
    """The table (invoke's 200 columns): exit 0, nothing on stderr but notes."""
    result = succeeds("scale-search", *args)
    assert all(line.startswith("Note:") for line in result.stderr.splitlines()), result.stderr
    return result.stdout


# -- nothing to quantize -----------------------------------------------------------------------

DEGENERATE = {
    "zeros": np.zeros(100, np.float32),
    "negative zeros": np.full((4, 8), -0.0, np.float32),
    "nan": np.full(10, np.nan, np.float32),
    "inf": np.array([np.inf, -np.inf, np.inf], np.float32),
    "zeros and nan": np.array([0.0, np.nan, 0.0, -np.inf], np.float32),
    "float64 zeros": np.zeros((3, 3), np.float64),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEGENERATE))
def test_a_tensor_with_nothing_to_quantize_ranks_nothing(tmp_path, name):
    path = save(tmp_path / "d.npy", DEGENERATE[name])
    doc = search(path)
    assert doc["best"] is None
    assert doc["candidates"] == []
    assert any(NOTHING in n for n in doc["notes"]), doc["notes"]
    out = table(path)
    assert NOTHING in out
    assert "best" not in out.replace("no scale rule", "")
    assert "3.4028e+38" not in out and "2^+1.25" not in out


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["mse", "sqnr", "median-rel", "p99-rel", "flushed"])
def test_nothing_to_quantize_under_every_metric(tmp_path, metric):
    doc = search(save(tmp_path / "z.npy", np.zeros(7, np.float32)), "--metric", metric)
    assert doc["best"] is None and doc["metric"] == metric


def test_an_all_zero_tensor_among_others_does_not_disturb_them(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    np.savez(tmp_path / "ck.npz", bias=np.zeros(32, np.float32), w=w,
             dead=np.full(4, np.nan, np.float32))
    doc = search(tmp_path / "ck.npz")
    c = by_name(doc)
    assert doc["best"] is not None
    for cand in doc["candidates"]:
        assert cand["count"] == w.size, cand["name"]  # the empty tensors are left out
        assert cand["scales"]["max"] < 1e30, (cand["name"], cand["scales"])
    alone = by_name(search(save(tmp_path / "w.npy", w)))
    for name in ("amax", "percentile 99.9", "mse search"):
        assert c[name]["mse"] == alone[name]["mse"], name
    note = [n for n in doc["notes"] if NOTHING in n]
    assert note and "bias" in note[0] and "dead" in note[0], doc["notes"]
    assert "all zeros" in note[0] and "only NaN/inf" in note[0]


def test_no_best_where_every_candidate_metric_is_undefined(tmp_path):
    """NaN in the tensor makes every scale NaN (as torch.amax): every finite input comes out
    NaN, an unbounded error under every rule, so none is best."""
    x = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    doc = search(save(tmp_path / "n.npy", x))
    assert doc["candidates"] and doc["best"] is None
    assert any("no best" in n for n in doc["notes"]), doc["notes"]
    mse = by_name(doc)["mse search"]
    assert "no scale factor" in mse["note"]
    assert "<- best" not in table(tmp_path / "n.npy")
    # a metric that is defined there still ranks
    assert search(tmp_path / "n.npy", "--metric", "flushed")["best"] == "amax"


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1,), (1, 1), ()])
def test_a_single_element(tmp_path, shape):
    x = np.full(shape, 3.0, np.float32)
    doc = search(save(tmp_path / "one.npy", x))
    c = by_name(doc)
    assert doc["best"] == "amax"
    assert c["amax"]["scale"] == float(np.float32(448.0) / np.float32(3.0))
    assert c["amax"]["sqnr_db"] == "inf" and c["amax"]["mse"] == 0.0
    assert "mse search" in c and "best factor 1 " in c["mse search"]["note"]


@pytest.mark.slow
def test_per_column_of_a_1d_tensor_says_one_scale_per_element(tmp_path):
    path = save(tmp_path / "v.npy", np.arange(1, 9, dtype=np.float32))
    doc = search(path, "--per", "column")
    assert by_name(doc)["amax"]["scales"]["count"] == 8
    assert any("one scale per element" in n and "1-D" in n for n in doc["notes"]), doc["notes"]
    m = search(save(tmp_path / "m.npy", np.ones((4, 8), np.float32)), "--per", "column")
    assert not any("one scale per element" in n for n in m["notes"])
    assert "one scale per element" in table(path, "--per", "column")


# -- delayed scaling: only over steps ------------------------------------------------------------

@pytest.mark.slow
def test_the_tensors_of_a_checkpoint_are_not_steps(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {f"layer{i}.weight": rng.standard_normal((8, 8)).astype(np.float32)
              for i in range(4)}
    np.savez(tmp_path / "ck.npz", **arrays)
    doc = search(tmp_path / "ck.npz")
    assert not set(DELAYED_NAMES) & set(by_name(doc))
    assert doc["sequence"] is None
    assert any("checkpoint are not steps" in n for n in doc["notes"]), doc["notes"]
    assert "overflow steps" not in table(tmp_path / "ck.npz")


def test_files_of_one_shape_are_steps_and_the_caption_says_so(tmp_path):
    rng = np.random.default_rng(2)
    paths = [save(tmp_path / f"s{i}.npy", rng.standard_normal((8, 8)).astype(np.float32) * a)
             for i, a in enumerate((1, 4, 2))]
    doc = search(*paths)
    assert set(DELAYED_NAMES) <= set(by_name(doc))
    assert doc["sequence"] == "each file is one step, in the order given (3 steps)"
    assert doc["sequence"] in by_name(doc)["delayed max"]["note"]
    out = table(*paths)
    assert "each file is one step" in out and "overflow steps" in out
    assert "3 tensors" in out and "tensor(s)" not in out


def test_files_of_different_shapes_are_not_steps(tmp_path):
    a = save(tmp_path / "a.npy", np.ones((4, 4), np.float32))
    b = save(tmp_path / "b.npy", np.ones((2, 8), np.float32))
    doc = search(a, b)
    assert not set(DELAYED_NAMES) & set(by_name(doc))
    assert any("differ in shape" in n for n in doc["notes"]), doc["notes"]


def test_over_first_axis_says_slices_are_steps_and_keeps_empty_steps_in_place(tmp_path):
    x = np.stack([np.full((4, 4), v, np.float32) for v in (1.0, 0.0, 8.0, 2.0)])
    doc = search(save(tmp_path / "seq.npy", x), "--over-first-axis")
    assert doc["sequence"] == "each slice of the first axis is one step (4 steps)"
    c = by_name(doc)
    d = c["delayed most_recent"]
    assert d["steps"] == 4
    # step 1 (zeros) keeps its place in the history (step 2's most recent amax is 0, so it
    # uses scale 1) but adds no statistics: three steps of 16 values
    assert d["count"] == 48 and c["amax"]["count"] == 48
    assert d["overflow_steps"] == 0
    assert any("[1]" in n and NOTHING in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("history", ["1", "2"])
def test_history_one_and_two(tmp_path, history):
    x = np.stack([np.full((2, 4), v, np.float32) for v in (1.0, 3.0, 2.0)])
    doc = search(save(tmp_path / "seq.npy", x), "--over-first-axis", "--history", history)
    assert doc["best"] is not None
    assert f"history {history}," in by_name(doc)["delayed max"]["note"]


# -- one vocabulary, skipped tensors ----------------------------------------------------------

def test_candidates_carry_quantize_statistics_under_the_same_keys(tmp_path):
    rng = np.random.default_rng(9)
    path = save(tmp_path / "w.npy", rng.standard_normal((8, 64)).astype(np.float32) * 50)
    amax = by_name(search(path))["amax"]
    q = quantize_json(path, "--per", "tensor", "--compare", "none")["tensors"][0]["schemes"][0]
    for key in ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "flushed_fraction",
                "saturated", "saturated_fraction", "overflowed", "overflowed_fraction",
                "nan_produced", "nan_produced_fraction", "median_rel_error", "p99_rel_error",
                "max_abs_error", "rmse", "mse", "sqnr_db", "bias", "rel_error_resolution",
                "scales"):
        assert amax[key] == q[key], key
    assert amax["mse"] == pytest.approx(amax["rmse"] ** 2, rel=1e-12)


def test_skipped_tensors_are_listed_with_their_reason(tmp_path):
    np.savez(tmp_path / "m.npz", position_ids=np.arange(6, dtype=np.int64),
             w=np.ones((2, 3), np.float32), empty=np.zeros((0, 3), np.float32))
    doc = search(tmp_path / "m.npz")
    skipped = {s["key"]: s for s in doc["skipped"]}
    assert set(skipped) == {"position_ids", "empty"}
    ids = skipped["position_ids"]
    assert ids["source"] == str(tmp_path / "m.npz") and ids["dtype"] == "int64"
    assert ids["shape"] == [6] and "int64" in ids["reason"]
    assert skipped["empty"]["shape"] == [0, 3] and skipped["empty"]["reason"] == "empty"
    assert [t["key"] for t in doc["tensors"]] == ["w"]
    assert search(save(tmp_path / "w.npy", np.ones(3, np.float32)))["skipped"] == []


# -- a battery of hostile data: exit 0 and strict JSON, or one Error line ----------------------

BATTERY = {
    "subnormal only": np.full(8, 1e-40, np.float32),
    "huge float32": np.array([1e38, -3e38, 2e38], np.float32),
    "float64 beyond float32": np.array([1e300, -3e299, 5e299], np.float64),
    "float64 tiny": np.array([1e-300, 2e-310], np.float64),
    "max float32": np.full(4, np.finfo(np.float32).max, np.float32),
    "one inf among values": np.array([1.0, np.inf, 2.0], np.float32),
    "1x1": np.ones((1, 1), np.float32),
    "float16 subnormal": np.full(5, 2.0 ** -24, np.float16),
}
OPTIONS = [[], ["--per", "row"], ["--per", "column"], ["--block", "2"], ["--metric", "sqnr"],
           ["--metric", "p99-rel"], ["--format", "e2m1"], ["--format", "e5m2"],
           ["--format", "e8m0"]]


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTIONS, ids=" ".join)
@pytest.mark.parametrize("data", list(BATTERY.values()), ids=list(BATTERY))
def test_battery(tmp_path, data, options):
    path = save(tmp_path / "x.npy", data)
    result = invoke("scale-search", path, *options, "--json")
    assert_no_traceback(result)
    if result.exit_code == 0:
        doc = strict_loads(result.stdout)
        assert doc["best"] is None or doc["best"] in by_name(doc)
    else:
        assert result.exit_code in (1, 2), result.exit_code
        assert result.stdout == ""
        assert result.stderr.startswith("Error:") and result.stderr.count("\n") == 1
    table_run = invoke("scale-search", path, *options)
    assert_no_traceback(table_run)
    assert table_run.exit_code == result.exit_code
    assert "RuntimeWarning" not in table_run.stderr + result.stderr


def test_over_first_axis_of_an_empty_first_axis(tmp_path):
    path = save(tmp_path / "e.npy", np.zeros((0, 4), np.float32))
    result = invoke("scale-search", path, "--over-first-axis", "--json")
    assert_no_traceback(result)
    assert result.exit_code in (1, 2) and result.stderr.startswith("Error:")
    assert result.stderr.count("\n") == 1
