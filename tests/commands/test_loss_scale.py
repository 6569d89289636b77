"""``fmt scale-search --loss-scale``: the loss-scale sweep 2**0 .. 2**32 over gradients.

The counts are checked against a direct count: round (g * S) in float32 to the format with
``fmtcli.numerics.rounding.round_to_format`` for every S and count zeros, subnormals and inf/NaN over
the nonzero finite gradients.  The GradScaler figures are checked against a small simulation
of torch.amp.GradScaler's update rule written here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import (
    assert_error,
    assert_no_traceback,
    assert_usage_error,
    invoke,
    strict_loads,
)
from inputs import INPUT_KINDS, save, write_input
from search_helpers import EXPONENTS, direct_counts, log_uniform, sweep

from fmtcli.loss_scale import example_gradients

ROW_KEYS = {"scale", "log2_scale", "flushed", "flushed_fraction", "subnormal",
            "subnormal_fraction", "overflow", "overflow_fraction", "saturated",
            "saturated_fraction", "kept", "kept_fraction"}
SCALER_KEYS = {"init_scale", "growth_factor", "backoff_factor", "growth_interval",
               "settles_at", "settles_at_log2", "steps_to_settle", "capped_at_sweep"}
F32 = np.float32


# -- helpers ----------------------------------------------------------------------------




def assert_rows_match(doc: dict, direct: dict, what: str = "") -> None:
    nonzero = direct["nonzero"]
    assert doc["nonzero"] == nonzero, (what, doc["nonzero"], nonzero)
    assert [r["log2_scale"] for r in doc["scales"]] == EXPONENTS
    n = max(nonzero, 1)
    for row in doc["scales"]:
        e = row["log2_scale"]
        flushed, subnormal, overflow, saturated = direct["rows"][e]
        assert row["scale"] == 2.0 ** e
        assert (row["flushed"], row["subnormal"], row["overflow"], row["saturated"]) == \
            (flushed, subnormal, overflow, saturated), (what, e, row, direct["rows"][e])
        kept = nonzero - flushed - overflow - saturated
        assert row["kept"] == kept, (what, e)
        for key, count in (("flushed", flushed), ("subnormal", subnormal),
                           ("overflow", overflow), ("saturated", saturated), ("kept", kept)):
            assert row[f"{key}_fraction"] == count / n, (what, e, key)


def expected_summary(direct: dict) -> dict:
    """safe range, most kept and best safe by their definitions: best safe is, among the
    scales S where nothing overflows or saturates at S nor at 2S (else at S), the one with
    the fewest flushed, then the fewest subnormal, then the smallest."""
    rows = direct["rows"]
    safe = [e for e in EXPONENTS if rows[e][2] == rows[e][3] == 0]
    lost = {e: rows[e][0] + rows[e][2] + rows[e][3] for e in EXPONENTS}
    most = min(EXPONENTS, key=lambda e: (lost[e], e))  # fewest lost; ties: smallest scale
    roomy = [e for e in safe if e == EXPONENTS[-1] or e + 1 in safe] or safe
    best_safe = min(roomy, key=lambda e: (rows[e][0], rows[e][1], e)) if safe else None
    if not direct["nonzero"]:
        most = best_safe = None
    return {"safe": safe, "most_kept": most, "best_safe": best_safe}


def assert_summary(doc: dict, direct: dict, what: str = "") -> None:
    exp = expected_summary(direct)
    if exp["safe"]:
        assert doc["safe_range"] == {"min": 2.0 ** min(exp["safe"]),
                                     "max": 2.0 ** max(exp["safe"])}, what
        assert exp["safe"] == list(range(min(exp["safe"]), max(exp["safe"]) + 1))
    else:
        assert doc["safe_range"] is None, what
    if exp["most_kept"] is None:
        assert doc["most_kept"] is None, what
    else:
        assert doc["most_kept"]["log2_scale"] == exp["most_kept"], (what, doc["most_kept"])
    if exp["best_safe"] is None:
        assert doc["best_safe"] is None, what
    else:
        assert doc["best_safe"]["log2_scale"] == exp["best_safe"], (what, doc["best_safe"])
        assert doc["best_safe"]["overflow"] == 0


def simulate_grad_scaler(overflows, steps: int = 40000, top: int = 32):
    """torch.amp.GradScaler's defaults on one tensor seen every step: start 2**16, halve on
    an overflowing step (which is skipped), double after 2000 overflow-free steps in a row.
    ``overflows(e)`` tells whether the scale 2**e overflows; the scale is not grown past
    2**top (the sweep's end).  Returns the log2 scale before each step."""
    e, clean, trace = 16, 0, []
    for _ in range(steps):
        trace.append(e)
        if e < 0:
            break  # overflows below 2**0: never settles within the sweep
        if overflows(e):
            e -= 1
            clean = 0
        else:
            clean += 1
            if clean == 2000:
                clean = 0
                if e < top:
                    e += 1
    return trace


def settled(trace: list[int], top: int = 32):
    """(settled log2 scale, steps until it is first reached): the largest scale used on the
    overflow-free steps of the last 8000 steps -- the scaler then keeps probing twice that
    and backing off."""
    if trace[-1] < 0:
        return None, None
    tail = trace[-8000:]
    low = min(tail)
    # after settling the trace alternates between s (2000 steps) and s + 1 (1 step)
    s = low if tail.count(low) > tail.count(low + 1) else low + 1
    return s, trace.index(s)





def edge_values(thresholds: dict) -> np.ndarray:
    """Each threshold, its float32 neighbours, and each of them divided by 2**e: the values
    whose fate flips exactly at a swept scale."""
    out = []
    for t in thresholds.values():
        t = float(t)
        if not math.isfinite(t):
            continue
        t32 = F32(t)
        for v in (np.nextafter(t32, F32(0)), t32, np.nextafter(t32, F32(np.inf))):
            for e in (0, 1, 7, 16, 17, 31, 32):
                w = F32(float(v) / 2.0 ** e)
                if w != 0 and float(w) * 2.0 ** e == float(v):  # exact in float32
                    out += [w, -w]
    return np.array(out, dtype=np.float32)


# -- the sweep against a direct count ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_counts_match_a_direct_count_for_every_scale(tmp_path, fmt):
    rng = np.random.default_rng(17)
    g = log_uniform(rng, 20000, -60, 20)
    tiny = log_uniform(rng, 500, -149, -120)  # float32 subnormals and their neighbours
    probe = sweep(save(tmp_path / "probe.npy", g[:10]), "--format", fmt)
    edges = edge_values(probe["thresholds"])
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    data = np.concatenate([g, tiny, edges, specials])
    rng.shuffle(data)
    doc = sweep(save(tmp_path / "g.npy", data), "--format", fmt)
    assert doc["format"] == fmt
    assert doc["count"] == data.size
    direct = direct_counts([data], fmt)
    assert direct["nonzero"] == data.size - 6  # zeros, -0, NaN and +-inf are not counted
    assert_rows_match(doc, direct, fmt)
    assert_summary(doc, direct, fmt)


def test_fp16_thresholds_by_hand():
    doc = sweep()
    t = doc["thresholds"]
    # smallest value not flushed: just above half the smallest subnormal (2**-25 ties to 0);
    # thresholds are float64 (right for float32 data too)
    assert t["kept"] == float(np.nextafter(2.0 ** -25, 1.0))
    # the midpoint between the largest subnormal and 2**-14 rounds up (to even)
    assert t["normal"] == 2.0 ** -14 - 2.0 ** -25
    # 65504 + half an ulp (16) rounds to inf
    assert t["overflow"] == 65520.0


@pytest.mark.parametrize("fmt, kept, normal, overflow", [
    ("bfloat16", float(np.nextafter(2.0 ** -134, 1.0)), 2.0 ** -126 - 2.0 ** -134,
     (2 - 2 ** -8) * 2.0 ** 127),
    ("float8_e4m3fn", float(np.nextafter(2.0 ** -10, 1.0)), 2.0 ** -6 - 2.0 ** -10,
     float(np.nextafter(464.0, 1000.0))),
    ("float8_e5m2", float(np.nextafter(2.0 ** -17, 1.0)), 2.0 ** -14 - 2.0 ** -17, 61440.0),
])
def test_other_format_thresholds_by_hand(tmp_path, fmt, kept, normal, overflow):
    path = save(tmp_path / "one.npy", np.ones(4, np.float32))
    t = sweep(path, "--format", fmt)["thresholds"]
    assert (t["kept"], t["normal"], t["overflow"]) == (kept, normal, overflow)


@pytest.mark.slow
def test_bf16_almost_never_flushes_and_fp8_overflows_early(tmp_path):
    rng = np.random.default_rng(2)
    g = log_uniform(rng, 5000, -100, -1)
    path = save(tmp_path / "g.npy", g)
    bf16 = sweep(path, "--format", "bf16")
    fp16 = sweep(path)
    e4m3 = sweep(path, "--format", "e4m3fn")
    e5m2 = sweep(path, "--format", "e5m2")
    assert all(r["flushed"] == 0 for r in bf16["scales"])  # bf16 reaches 2**-133
    assert all(r["overflow"] == 0 for r in bf16["scales"])
    assert bf16["safe_range"] == {"min": 1.0, "max": 2.0 ** 32}
    assert fp16["scales"][0]["flushed_fraction"] > 0.5
    # the narrower the range, the earlier the overflow
    assert e4m3["safe_range"]["max"] < e5m2["safe_range"]["max"] <= fp16["safe_range"]["max"]
    # e4m3 flushes more than e5m2 at every scale (fewer binades below 1)
    assert all(a["flushed"] >= b["flushed"] for a, b in zip(e4m3["scales"], e5m2["scales"]))
    for doc, fmt in ((e4m3, "float8_e4m3fn"), (e5m2, "float8_e5m2")):
        assert_rows_match(doc, direct_counts([g], fmt), fmt)


def test_a_format_without_inf_or_nan_never_overflows(tmp_path):
    """FP4 E2M1 has neither inf nor NaN: beyond max it saturates, so no scale overflows
    (the overflow threshold is infinite, written "inf" in strict JSON)."""
    rng = np.random.default_rng(4)
    g = log_uniform(rng, 2000, -10, 10)
    doc = sweep(save(tmp_path / "g.npy", g), "--format", "e2m1")
    assert doc["format"] == "float4_e2m1fn"
    assert doc["thresholds"]["overflow"] == "inf"
    assert doc["thresholds"]["kept"] == float(np.nextafter(0.25, 1.0))
    assert all(r["overflow"] == 0 for r in doc["scales"])
    # but what lies past max is clipped: counted as saturated, not kept, and not safe
    assert doc["thresholds"]["saturate"] == 7.0  # the tie between 6 (odd) and 8 rounds up
    assert all(r["saturated"] > 0 for r in doc["scales"])  # |g| up to 2**10 > 7 at S = 1
    assert doc["safe_range"] is None and doc["best_safe"] is None
    assert_rows_match(doc, direct_counts([g], "float4_e2m1fn"), "e2m1")
    assert doc["grad_scaler"]["capped_at_sweep"] is True


def test_nan_inf_and_zeros_are_not_gradients(tmp_path):
    g = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-3, -2.0 ** -30, 70000.0, 2.0 ** -10],
                 dtype=np.float32)
    doc = sweep(save(tmp_path / "g.npy", g))
    assert doc["count"] == 9 and doc["nonzero"] == 4
    row0 = doc["scales"][0]
    assert row0["flushed"] == 1  # 2**-30
    assert row0["overflow"] == 1  # 70000 > 65520
    assert row0["subnormal"] == 0
    assert row0["flushed_fraction"] == 0.25 and row0["overflow_fraction"] == 0.25
    assert doc["safe_range"] is None  # 70000 overflows at every scale
    assert_rows_match(doc, direct_counts([g]))


def test_all_zero_gradients(tmp_path):
    doc = sweep(save(tmp_path / "z.npy", np.zeros(64, np.float32)))
    assert doc["nonzero"] == 0 and doc["count"] == 64
    assert all(r["flushed"] == r["overflow"] == 0 for r in doc["scales"])
    assert doc["safe_range"] == {"min": 1.0, "max": 2.0 ** 32}


# -- summary and GradScaler ---------------------------------------------------------------------------

def gradients_with_max(rng, top: float, n: int = 3000) -> np.ndarray:
    g = log_uniform(rng, n, -40, math.log2(top) - 0.5)
    g[0] = F32(top)
    return g


GRAD_SCALER_CASES = {
    # name: largest |g| -> (expected settle log2, expected steps)
    "grows to 2^19": (0.1, 19, 3 * 2000),  # 0.1 * 2**20 > 65520
    "backs off to 2^12": (10.0, 12, 4),  # 10 * 2**13 > 65520
    "backs off to 2^0": (40000.0, 0, 16),  # 40000 * 2 > 65520
    "stays at 2^16": (0.75, 16, 0),  # 0.75 * 2**17 = 98304 overflows, 2**16 does not
    "overflows at 2^0": (70000.0, None, None),
    "never overflows": (1e-6, 32, 16 * 2000),  # 1e-6 * 2**32 = 4295
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GRAD_SCALER_CASES))
def test_grad_scaler_settles_where_a_simulation_does(tmp_path, case):
    top, settle, steps = GRAD_SCALER_CASES[case]
    g = gradients_with_max(np.random.default_rng(5), top)
    doc = sweep(save(tmp_path / "g.npy", g))
    direct = direct_counts([g])
    assert_rows_match(doc, direct, case)
    assert_summary(doc, direct, case)
    scaler = doc["grad_scaler"]
    assert SCALER_KEYS <= scaler.keys()
    assert scaler["init_scale"] == 2.0 ** 16 and scaler["growth_factor"] == 2.0
    assert scaler["backoff_factor"] == 0.5 and scaler["growth_interval"] == 2000
    trace = simulate_grad_scaler(lambda e: direct["rows"][e][2] > 0)
    sim_settle, sim_steps = settled(trace)
    assert (sim_settle, sim_steps) == (settle, steps), (case, sim_settle, sim_steps)
    assert scaler["settles_at_log2"] == sim_settle, (case, scaler)
    assert scaler["settles_at"] == (None if sim_settle is None else 2.0 ** sim_settle)
    assert scaler["steps_to_settle"] == sim_steps, (case, scaler)
    assert scaler["capped_at_sweep"] == (sim_settle == 32), (case, scaler)
    if settle is not None:  # where it settles: the largest scale without overflow
        assert 2.0 ** settle == doc["safe_range"]["max"]


def test_most_kept_and_best_safe_differ_when_the_top_overflows():
    """The built-in gradients: a few large values overflow before the tiny ones stop
    flushing, so the scale that keeps the most overflows a little."""
    doc = sweep()
    rows = {r["log2_scale"]: r for r in doc["scales"]}
    lost = {e: r["flushed"] + r["overflow"] for e, r in rows.items()}
    most = min(lost, key=lambda e: (lost[e], e))
    assert doc["most_kept"]["log2_scale"] == most
    assert rows[most]["overflow"] > 0
    safe = [e for e, r in rows.items() if r["overflow"] == 0]
    # GradScaler settles at the edge; the recommendation keeps one binade of headroom
    assert max(safe) == doc["grad_scaler"]["settles_at_log2"] == 18
    assert doc["best_safe"]["log2_scale"] == 17
    assert "2S" in doc["best_safe"]["rule"]


# -- the built-in example ------------------------------------------------------------------------------

@pytest.mark.slow
def test_built_in_example_has_many_values_below_fp16_and_loss_scaling_fixes_it():
    doc = sweep()
    assert doc["format"] == "float16"
    assert doc["tensors"][0]["source"] == "<built-in gradients>"
    assert doc["count"] == doc["nonzero"] == 1 << 20
    g = example_gradients().array()
    # 2**20 values: several chunks on forked workers, merged
    assert_rows_match(doc, direct_counts([g]), "built-in")
    assert doc["scales"][0]["flushed_fraction"] > 0.5  # many values below FP16's range
    best = doc["best_safe"]
    assert best["flushed_fraction"] < 0.01 and best["overflow"] == 0
    assert best["kept_fraction"] > 0.99
    assert doc["safe_range"]["min"] == 1.0 and doc["safe_range"]["max"] < 2.0 ** 32
    hist = {b["log2"]: b["count"] for b in doc["log2_histogram"]}
    assert sum(count for k, count in hist.items() if k < -24) > 0.5 * doc["nonzero"]


def test_built_in_example_table():
    result = invoke("loss-scale")
    assert_no_traceback(result)
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout
    for text in ("float16", "flushed", "subnormal", "overflow", "kept", "2^0", "2^32",
                 "safe scales (no overflow): 2^0 .. 2^18", "best without overflow",
                 "GradScaler", "settles at 2^18"):
        assert text in out, text
    assert "log2|g|" not in out  # the histogram only with --histogram


# -- histogram ------------------------------------------------------------------------------------------

def test_histogram_json_is_a_count_of_floor_log2(tmp_path):
    rng = np.random.default_rng(8)
    g = np.concatenate([log_uniform(rng, 4000, -149, 40),
                        np.array([0, np.nan, np.inf, 2.0 ** -149, 1.0, -0.75], np.float32)])
    doc = sweep(save(tmp_path / "g.npy", g))
    a = np.abs(g[np.isfinite(g) & (g != 0)]).astype(np.float64)
    k = np.floor(np.log2(a)).astype(int)
    expected = {int(v): int(c) for v, c in zip(*np.unique(k, return_counts=True))}
    assert {b["log2"]: b["count"] for b in doc["log2_histogram"]} == expected
    assert [b["log2"] for b in doc["log2_histogram"]] == sorted(expected)


def test_histogram_table_marks_the_regions(tmp_path):
    # 2**-40 flushes, 2**-20 is subnormal, 1 is normal, 2**17 overflows (at S = 1)
    g = np.array([2.0 ** -40, 2.0 ** -20, 1.0, 1.5, 2.0 ** 17, -2.0 ** 17], np.float32)
    path = save(tmp_path / "g.npy", g)
    result = invoke("loss-scale", path, "--histogram")
    assert_no_traceback(result)
    assert result.exit_code == 0, result.stderr
    table = result.stdout[result.stdout.index("log2|g|"):]
    lines = {line.split()[0]: line.split() for line in table.splitlines()
             if line.strip() and line.split()[0].lstrip("-").isdigit()}
    assert set(lines) == {"-40", "-20", "0", "17"}, lines
    assert lines["-40"][3] == "flush"
    assert lines["-20"][3] == "subnormal"
    assert lines["0"][3] == "normal"
    assert lines["17"][3] == "overflow"
    assert "at S = 1" in table
    # the JSON carries the same bins
    doc = sweep(path)
    assert {b["log2"]: b["count"] for b in doc["log2_histogram"]} == \
        {-40: 1, -20: 1, 0: 2, 17: 2}


def test_histogram_needs_loss_scale(tmp_path):
    path = save(tmp_path / "g.npy", np.ones(8, np.float32))
    assert_usage_error(invoke("scale-search", path, "--histogram"), "--loss-scale")
    assert_usage_error(invoke("scale-search", "--histogram"), "--loss-scale")


# -- inputs ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_every_input_kind(tmp_path, kind):
    args, arrays, stdin = write_input(kind, tmp_path)
    doc = sweep(*args, input=stdin)
    assert doc["count"] == sum(a.size for a in arrays)
    assert len(doc["tensors"]) == len(arrays)
    direct = direct_counts(arrays)
    assert_rows_match(doc, direct, kind)
    assert_summary(doc, direct, kind)


@pytest.mark.parametrize("text", ["1e-300 0.001", "1e300 0.001"])
def test_float64_gradients_beyond_float32_range(text):
    result = invoke("loss-scale", "-", "--json", input=text)
    assert_no_traceback(result)
    assert result.exit_code == 0, result.stderr
    doc = strict_loads(result.stdout)
    assert doc["nonzero"] == 2
    tiny = text.startswith("1e-300")
    for row in doc["scales"]:
        big = int(0.001 * row["scale"] >= 65520)  # 0.001 itself overflows from 2**26 on
        assert (row["flushed"], row["overflow"]) == ((1, big) if tiny else (0, 1 + big))


# -- errors ---------------------------------------------------------------------------------------------

def test_formats_without_zero_are_a_usage_error(tmp_path):
    path = save(tmp_path / "g.npy", np.ones(8, np.float32))
    assert_usage_error(invoke("loss-scale", path, "--format", "e8m0"), "no zero")


@pytest.mark.parametrize("args, code, fragment", [
    (["--format", "float9_nope"], 2, "unknown format"),
    (["--key", "w"], 2, "--key"),
    (["/nonexistent/dir/g.npy"], 1, "no such file"),
])
def test_loss_scale_errors(args, code, fragment):
    assert_error(invoke("loss-scale", *args), code, fragment)


def test_loss_scale_on_a_checkpoint_key(tmp_path: Path):
    rng = np.random.default_rng(3)
    a, b = log_uniform(rng, 300, -40, 0), log_uniform(rng, 200, -30, 10)
    np.savez(tmp_path / "grads.npz", a=a, b=b)
    doc = sweep(tmp_path / "grads.npz", "--key", "b")
    assert [t["key"] for t in doc["tensors"]] == ["b"]
    assert_rows_match(doc, direct_counts([b]), "key b")


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--json"], ["--histogram"], ["--format", "bf16", "--json"]])
def test_the_old_spelling_still_works_with_a_deprecation_note(args):
    """``fmt scale-search --loss-scale`` is ``fmt loss-scale`` with one note on stderr:
    the same stdout, byte for byte."""
    new = invoke("loss-scale", *args)
    old = invoke("scale-search", "--loss-scale", *args)
    assert new.exit_code == old.exit_code == 0
    assert old.stdout == new.stdout and new.stderr == ""
    assert old.stderr.startswith("Note: 'fmt scale-search --loss-scale' is deprecated: use "
                                 "'fmt loss-scale'") and old.stderr.count("\n") == 1


def test_loss_scale_refuses_what_belongs_to_scale_search():
    for args in (["--block", "32"], ["--per", "tensor"], ["--metric", "mse"]):
        assert_usage_error(invoke("loss-scale", *args), "No such option")
