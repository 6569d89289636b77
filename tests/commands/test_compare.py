"""``fmt compare``: every figure against an independent numpy computation written here
(torchao's SQNR, DeepGEMM's calc_diff, llama.cpp's KL divergence as those projects write
them), checkpoints matched by name, mismatches as data errors, NaN/inf, and results that
do not depend on the chunk size or the number of workers."""

from __future__ import annotations

import csv
import io
import math

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_fits,
    assert_usage_error,
    invoke,
    json_of,
    succeeds,
)
from safetensors.numpy import save_file

from fmtcli.compare import compare_sources
from fmtcli.inputs.tensors import TensorSource

RNG = np.random.default_rng(16)


def source(array: np.ndarray, key: str | None = None) -> TensorSource:
    return TensorSource("mem", key, array.shape, str(array.dtype), lambda: array)


def fp8(x: np.ndarray) -> np.ndarray:
    """x through E4M3 with one amax scale (what a dequantized FP8 checkpoint holds)."""
    scale = np.float32(448 / np.abs(x).max())
    return ((x * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / scale)


def reference(x: np.ndarray, y: np.ndarray) -> dict:
    """The figures by their definitions, in float64, over every element (finite data)."""
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    nz = x != 0
    rel = np.abs(y[nz] - x[nz]) / np.abs(x[nz])
    return {
        # torchao.quantization.utils.compute_error: 20 * log10(norm(x) / norm(x - y))
        "sqnr_db": 20 * math.log10(np.linalg.norm(x) / np.linalg.norm(x - y)),
        "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))),
        # DeepGEMM calc_diff: 1 - 2 * (x * y).sum() / (x * x + y * y).sum()
        "calc_diff": float(1 - 2 * (x * y).sum() / (x * x + y * y).sum()),
        "rel_frobenius": float(np.linalg.norm(y - x) / np.linalg.norm(x)),
        "max_abs_error": float(np.abs(y - x).max()),
        "max_rel_error": float(rel.max()),
        "median": float(np.sort(rel)[math.ceil(0.5 * rel.size) - 1]),
        "p99": float(np.sort(rel)[math.ceil(0.99 * rel.size) - 1]),
        "differ": int((x != y).sum()),
    }


def test_figures_are_those_of_the_definitions():
    x = (RNG.standard_normal((96, 130)) * 0.02).astype(np.float32)
    x[5, 5] = 0.0
    y = fp8(x)
    stats = compare_sources([source(x)], [source(y)], "r", "t").tensors[0].stats
    ref = reference(x, y)
    for name in ("sqnr_db", "cosine", "rel_frobenius", "max_abs_error", "max_rel_error"):
        assert getattr(stats, name) == pytest.approx(ref[name], rel=1e-12), name
    # DeepGEMM's form cancels: agreement to its own rounding (~1e-16 / calc_diff)
    assert stats.calc_diff == pytest.approx(ref["calc_diff"], rel=1e-9)
    assert stats.differ == ref["differ"] and stats.count == x.size
    assert stats.nonzero == x.size - 1
    # the histogram's quantile: the lower edge of a bin 2**-7 wide holding the order statistic
    for q, name in ((stats.median_rel_error, "median"), (stats.p99_rel_error, "p99")):
        assert q <= ref[name] < q * (1 + 2 ** -7), name


def test_identical_and_zero_tensors():
    x = RNG.standard_normal(1000).astype(np.float32)
    same = compare_sources([source(x)], [source(x.copy())], "r", "t").total
    assert same.sqnr_db == math.inf and same.calc_diff == 0 and same.differ == 0
    assert same.cosine == 1.0 and same.max_rel_error == 0
    zero = compare_sources([source(x)], [source(np.zeros_like(x))], "r", "t").total
    assert zero.sqnr_db == 0.0 and zero.calc_diff == 1.0 and math.isnan(zero.cosine)
    assert zero.p99_rel_error == 1.0 and zero.rel_frobenius == 1.0


def test_nan_and_inf_are_counted_and_make_figures_unbounded():
    x = RNG.standard_normal((10, 20)).astype(np.float32)
    y = x + np.float32(1e-3)
    x2, y2 = x.copy(), y.copy()
    x2[0, 0], y2[0, 0] = np.nan, np.nan  # NaN on both sides: left out, not a difference
    x2[0, 1] = np.inf  # inf in the reference: left out
    s = compare_sources([source(x2)], [source(y2)], "r", "t").total
    assert (s.ref_nan, s.ref_inf, s.test_nan, s.test_inf) == (1, 1, 1, 0)
    assert s.differ == x.size - 1 and s.unbounded == 0
    keep = np.ones(x.size, bool)
    keep[:2] = False
    ref = reference(x.ravel()[keep], y.ravel()[keep])
    assert s.sqnr_db == pytest.approx(ref["sqnr_db"], rel=1e-12)
    y2[3, 3] = np.nan  # NaN in the test where the reference is finite: unbounded
    s = compare_sources([source(x2)], [source(y2)], "r", "t").total
    assert s.unbounded == 1 and s.test_nan == 2
    assert s.sqnr_db == -math.inf and s.max_abs_error == math.inf
    assert s.max_rel_error == math.inf and math.isnan(s.cosine) and math.isnan(s.calc_diff)


def kl_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """llama.cpp perplexity --kl-divergence: sum p_ref * (log p_ref - log p_test) per row."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    lp = x - x.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    lq = y - y.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    return (np.exp(lp) * (lp - lq)).sum(1)


def test_logits_kl_and_top_k():
    x = (RNG.standard_normal((2, 50, 40)) * 3).astype(np.float32)
    y = (x + RNG.standard_normal(x.shape).astype(np.float32) * 0.5)
    lg = compare_sources([source(x)], [source(y)], "r", "t", logits=True).total.logits
    xr, yr = x.reshape(-1, 40), y.reshape(-1, 40)
    kl = kl_reference(xr, yr)
    assert lg.rows == 100 and lg.bad_rows == 0
    assert lg.kl_mean == pytest.approx(kl.mean(), rel=1e-12)
    assert lg.kl_max == pytest.approx(kl.max(), rel=1e-12)
    median = np.sort(kl)[49]
    assert lg.kl_median <= median < lg.kl_median * (1 + 2 ** -7)
    assert lg.top1_agreement == (xr.argmax(1) == yr.argmax(1)).mean()
    top = [len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) for a, b in zip(xr, yr)]
    assert lg.top5_overlap == pytest.approx(sum(top) / 500)
    x[0, 3, 7] = np.nan
    lg = compare_sources([source(x)], [source(y)], "r", "t", logits=True).total.logits
    assert lg.rows == 99 and lg.bad_rows == 1


def test_masked_logits_and_a_short_last_axis():
    """-inf logits (masked) carry no probability; a -inf in the test where the reference
    has probability is an infinite KL; the top-k overlap of 3 logits is over 3."""
    x = np.array([[0.0, -np.inf, 1.0], [1.0, 2.0, 3.0]], np.float32)
    y = np.array([[0.5, -np.inf, 1.0], [1.0, -np.inf, 3.0]], np.float32)
    lg = compare_sources([source(x)], [source(y)], "r", "t", logits=True).total.logits
    p = np.exp(np.array([0.0, 1.0]) - np.logaddexp(0.0, 1.0))
    q = np.exp(np.array([0.5, 1.0]) - np.logaddexp(0.5, 1.0))
    assert lg.rows == 2 and lg.kl_max == math.inf and lg.kl_mean == math.inf
    assert lg.kl_median <= float((p * np.log(p / q)).sum()) < lg.kl_median * (1 + 2 ** -7)
    assert lg.top1_agreement == 1.0 and lg.top5_overlap == 1.0


@pytest.mark.parametrize("logits", [False, True])
def test_chunks_and_workers_give_the_same_result(logits):
    x = RNG.standard_normal((300, 64)).astype(np.float32)
    x[::7, 3] = 0
    y = fp8(x)
    runs = [compare_sources([source(x)], [source(y)], "r", "t", logits=logits,
                            chunk_elements=chunk, workers=workers).to_dict()
            for chunk, workers in ((1 << 20, 1), (1024, 1), (1024, 3), (2048, 2))]
    assert runs[1] == runs[2]  # the workers change nothing
    for run in runs[1:]:  # counts, maxima and quantiles exact; sums to their last bits
        for key, value in runs[0]["total"].items():
            if isinstance(value, dict):
                assert value == pytest.approx(run["total"][key], rel=1e-12), key
            else:
                assert value == pytest.approx(run["total"][key], rel=1e-12), key
        assert run["total"]["p99_rel_error"] == runs[0]["total"]["p99_rel_error"]
        assert run["total"]["differ"] == runs[0]["total"]["differ"]


def checkpoints(tmp_path, test_changes=None):
    tensors = {f"layers.{i}.{n}.weight": (RNG.standard_normal((16, 24)) * 0.1).astype(
        np.float32) for i in range(3) for n in ("q", "k")}
    tensors["position_ids"] = np.arange(8, dtype=np.int64)
    quantized = {k: fp8(v) if v.dtype == np.float32 else v for k, v in tensors.items()}
    (test_changes or (lambda t: None))(quantized)
    save_file(tensors, str(tmp_path / "ref.safetensors"))
    save_file(quantized, str(tmp_path / "test.safetensors"))
    return tensors, quantized


def test_checkpoints_matched_by_name_and_one_side_listed(tmp_path):
    def change(t):
        del t["layers.0.q.weight"]
        t["extra.bias"] = np.ones(4, np.float32)

    ref, test = checkpoints(tmp_path, change)
    result = invoke("compare", tmp_path / "ref.safetensors", tmp_path / "test.safetensors",
                    "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_of("compare", tmp_path / "ref.safetensors", tmp_path / "test.safetensors")
    assert doc["only_in_ref"] == ["layers.0.q.weight"] and doc["only_in_test"] == ["extra.bias"]
    assert "only in REF (not compared): 'layers.0.q.weight'" in result.stderr
    assert "only in TEST" in result.stderr and "skipped 'position_ids'" not in result.stdout
    assert [t["name"] for t in doc["tensors"]] == sorted(set(ref) - {"layers.0.q.weight",
                                                                   "position_ids"})
    assert [s["reason"] for s in doc["skipped"]] == ["dtype int64 is not a real "
                                                     "floating-point type"] * 2
    for t in doc["tensors"]:
        assert t["sqnr_db"] == pytest.approx(reference(ref[t["name"]], test[t["name"]])[
            "sqnr_db"], rel=1e-12)
    roles = {r["pattern"]: r for r in doc["roles"]}
    assert roles["layers.*.k.weight"]["tensors"] == 3
    x = np.concatenate([ref[f"layers.{i}.k.weight"].ravel() for i in range(3)])
    y = np.concatenate([test[f"layers.{i}.k.weight"].ravel() for i in range(3)])
    assert roles["layers.*.k.weight"]["sqnr_db"] == pytest.approx(reference(x, y)["sqnr_db"],
                                                                  rel=1e-12)
    assert doc["total"]["count"] == 5 * 16 * 24
    only = json_of("compare", tmp_path / "ref.safetensors", tmp_path / "test.safetensors",
                   "--key", "layers.2.*")
    assert [t["name"] for t in only["tensors"]] == ["layers.2.k.weight", "layers.2.q.weight"]


def test_csv_one_row_per_tensor(tmp_path):
    checkpoints(tmp_path)
    out = succeeds("compare", tmp_path / "ref.safetensors", tmp_path / "test.safetensors",
                   "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    doc = json_of("compare", tmp_path / "ref.safetensors", tmp_path / "test.safetensors")
    assert [r["name"] for r in rows] == [t["name"] for t in doc["tensors"]]
    assert [float(r["sqnr_db"]) for r in rows] == [t["sqnr_db"] for t in doc["tensors"]]
    assert rows[0]["shape"] == "16x24" and "kl_mean" not in rows[0]


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t.update({"layers.1.q.weight": np.zeros((24, 16), np.float32)}),
     "'layers.1.q.weight': shapes differ: REF (16, 24), TEST (24, 16)"),
    (lambda t: t.update({"layers.2.k.weight": t["layers.2.k.weight"].astype(np.float16)}),
     "'layers.2.k.weight': dtypes differ: REF float32, TEST float16"),
    (lambda t: [t.pop(k) for k in list(t)] and t.update({"other": np.ones(2, np.float32)}),
     "no tensor name in common"),
])
def test_mismatches_are_data_errors_naming_the_tensor(tmp_path, change, fragment):
    checkpoints(tmp_path, change)
    assert_data_error(invoke("compare", tmp_path / "ref.safetensors",
                             tmp_path / "test.safetensors"), fragment)


def test_any_dtype_reads_both_as_float64(tmp_path):
    x = RNG.standard_normal((40, 30)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "b.npy", x.astype(ml_dtypes.bfloat16))
    assert_data_error(invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy"),
                      "dtypes differ", "--any-dtype")
    doc = json_of("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--any-dtype")
    ref = reference(x, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert doc["total"]["sqnr_db"] == pytest.approx(ref["sqnr_db"], rel=1e-12)
    assert doc["tensors"][0]["test_dtype"] == "bfloat16"


@pytest.mark.slow
def test_usage_errors(tmp_path):
    checkpoints(tmp_path)
    np.save(tmp_path / "a.npy", np.ones((16, 24), np.float16))
    assert_usage_error(invoke("compare", tmp_path / "a.npy", tmp_path / "test.safetensors"),
                       "REF is one array", "--key")
    assert_usage_error(invoke("compare", tmp_path / "a.npy", tmp_path / "a.npy", "--csv",
                              "--json"), "--csv and --json")
    assert_usage_error(invoke("compare", tmp_path / "a.npy"), "TEST")
    assert_usage_error(invoke("compare", tmp_path / "a.npy", tmp_path / "a.npy", "--key", "w"),
                       "--key", "single arrays")
    assert_data_error(invoke("compare", tmp_path / "a.npy", tmp_path / "missing.npy"),
                      "missing.npy")
    assert_data_error(invoke("compare", tmp_path / "ref.safetensors",
                             tmp_path / "test.safetensors", "--key", "nothing*"), "nothing*")
    # an .npy beside a checkpoint pairs with the one tensor --key picks
    doc = json_of("compare", tmp_path / "ref.safetensors", tmp_path / "a.npy", "--key",
                  "layers.0.q.weight", "--any-dtype")
    assert doc["tensors"][0]["name"] == "layers.0.q.weight"
    assert doc["tensors"][0]["test_dtype"] == "float16"
    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    assert_data_error(invoke("compare", tmp_path / "a.npy", tmp_path / "test.safetensors",
                             "--key", "layers.1.k.weight"),
                      "'layers.1.k.weight': shapes differ: REF (4,), TEST (16, 24)")


def test_a_long_name_breaks_at_dots(tmp_path):
    name = "model." + ".".join(["a_rather_long_module_name"] * 6) + ".weight"
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    save_file({name: x}, str(tmp_path / "r.safetensors"))
    save_file({name: fp8(x)}, str(tmp_path / "t.safetensors"))
    out = succeeds("compare", tmp_path / "r.safetensors", tmp_path / "t.safetensors",
                   env={"COLUMNS": "80"}).stdout
    lines = [line.rstrip() for line in out[:out.index("figure")].splitlines() if line.strip()]
    assert len(lines) >= 3 and all(line.endswith(".") for line in lines[:2]), lines
    assert "".join(lines).startswith(name) and max(map(len, lines)) <= 80


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("many", [1, 4, 12])
def test_tables_fit(tmp_path, width, many):
    names = [f"model.layers.{i}.self_attn.very_long_projection_name_{i % 3}.weight"
             for i in range(many)]
    ref = {n: (RNG.standard_normal((8, 32)) * 0.1).astype(np.float32) for n in names}
    save_file(ref, str(tmp_path / "r.safetensors"))
    save_file({n: fp8(v) for n, v in ref.items()}, str(tmp_path / "t.safetensors"))
    for extra in ([], ["--logits"]):
        out = succeeds("compare", tmp_path / "r.safetensors", tmp_path / "t.safetensors",
                       *extra, env={"COLUMNS": str(width)}).stdout
        assert_fits(out, width)
        assert ("By role, worst first" in out) == (many > 8)
        assert ("KL mean" in out) == bool(extra)


def test_worst_first(tmp_path):
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    ref = {f"l.{i}.w": x for i in range(3)}
    test = {"l.0.w": x + 1e-3, "l.1.w": x + 1e-1, "l.2.w": x + 1e-2}
    save_file(ref, str(tmp_path / "r.safetensors"))
    save_file({k: v.astype(np.float32) for k, v in test.items()}, str(tmp_path / "t.safetensors"))
    out = succeeds("compare", tmp_path / "r.safetensors", tmp_path / "t.safetensors").stdout
    assert out.index("l.1.w") < out.index("l.2.w") < out.index("l.0.w")
