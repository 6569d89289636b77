"""``fmt softmax`` and ``fmtcli.attention.softmax``: the online softmax trace.

Checked against oracles written here, apart from the library: the softmax-weighted average
in plain float64 numpy and in 50-digit mpmath; the same recurrence written one key at a time
with numpy's and ml_dtypes' scalar types (float32, float16, bfloat16), whose trace the
library must reproduce bit for bit; the article's figures (18.81 after block 1, 22.14 at the
end).  Then the running-sum effect of BF16/FP16, the inputs (lists, files, stdin), every
refusal, and the table at 80 and 120 columns.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import ml_dtypes
import mpmath
import numpy as np
import pytest
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

from fmtcli.attention import online_softmax, random_inputs, read_numbers, softmax_reference
from fmtcli.base.errors import DataError, UsageError

ARTICLE = (["--scores", "1,3,2,0", "--values", "10,20,30,40", "--block", "2"])
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# -- oracles (no fmtcli) -----------------------------------------------------------------

def float64_softmax_average(scores, values) -> np.ndarray:
    """softmax(s) @ v in plain float64."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.exp(s - s.max())
    return p @ np.asarray(values, dtype=np.float64) / p.sum()


def mpmath_softmax_average(scores, values) -> list:
    """The same to 50 digits (values a vector)."""
    with mpmath.workdps(50):
        m = max(mpmath.mpf(float(x)) for x in scores)
        p = [mpmath.exp(mpmath.mpf(float(x)) - m) for x in scores]
        return mpmath.fsum(pi * mpmath.mpf(float(v)) for pi, v in zip(p, values)) / mpmath.fsum(p)


def scalar_trace(scores, values, block: int, dtype) -> list[dict]:
    """The online softmax one key at a time in the scalar type ``dtype`` (numpy / ml_dtypes
    arithmetic, each operation rounded to the type; exp taken in float64 and rounded once):
    after each block, (running max, running sum, weighted sum, output)."""
    t = dtype
    s = [t(x) for x in scores]
    v = [np.asarray(row).astype(t) for row in values]
    m, l_run, acc, out = -math.inf, t(0), None, []
    for start in range(0, len(s), block):
        chunk = range(start, min(len(s), start + block))
        m_new = max(m, max(float(s[i]) for i in chunk))
        rescale = t(math.exp(float(t(m - m_new)))) if start else t(0)
        l_blk, acc_blk = None, None
        for i in chunk:
            p = t(math.exp(float(t(float(s[i]) - m_new))))
            pv = (p * v[i]).astype(t)
            l_blk = p if l_blk is None else t(l_blk + p)
            acc_blk = pv if acc_blk is None else (acc_blk + pv).astype(t)
        if start:
            l_run = t(t(rescale * l_run) + l_blk)
            acc = ((rescale * acc).astype(t) + acc_blk).astype(t)
        else:
            l_run, acc = l_blk, acc_blk
        m = m_new
        out.append({"running_max": m, "running_sum": float(l_run),
                    "weighted_sum": np.asarray(acc, np.float64),
                    "output": np.asarray((acc / l_run).astype(t), np.float64)})
    return out


# -- the article's example ---------------------------------------------------------------

def test_no_arguments_is_the_articles_example_in_the_table():
    out = succeeds("softmax", env={"COLUMNS": "80"}).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()[:1] in ("1", "2")]
    assert rows[0][:3] == ["1", "1,", "3"] and rows[0][-1] == "18.81", rows
    assert rows[1][:3] == ["2", "2,", "0"] and rows[1][-1] == "22.14", rows
    assert rows[0][-4:-1] == ["-", "1.135", "21.35"]  # rescale, l = 1 + e^-2, acc
    assert rows[1][-4:-1] == ["1", "1.553", "34.38"]
    assert "the article's example" in out and "float32" in out


def test_the_articles_example_in_json():
    doc = json_of("softmax")
    assert doc == json_of("softmax", *ARTICLE)  | {"source": doc["source"]}
    first, last = doc["blocks"]
    assert round(first["output"], 2) == 18.81 and round(doc["output"], 2) == 22.14
    assert last["output"] == doc["output"]
    assert (first["scores"], last["scores"]) == ([1.0, 3.0], [2.0, 0.0])
    assert (first["block_max"], first["running_max"], first["rescale"]) == (3.0, 3.0, None)
    assert (last["block_max"], last["running_max"], last["rescale"]) == (2.0, 3.0, 1.0)
    assert first["running_sum"] == pytest.approx(1 + math.exp(-2), rel=1e-7)
    assert first["weighted_sum"] == pytest.approx(10 * math.exp(-2) + 20, rel=1e-7)
    exact = float(mpmath_softmax_average([1, 3, 2, 0], [10, 20, 30, 40]))
    assert doc["reference"] == pytest.approx(exact, rel=1e-15)
    assert doc["abs_error"] == doc["max_abs_error"] == pytest.approx(abs(doc["output"] - exact))
    assert doc["abs_error"] <= 2 * doc["eps"] * exact
    assert (doc["format"], doc["block"], doc["keys"], doc["dim"]) == ("float32", 2, 4, None)
    assert [(b["start"], b["stop"]) for b in doc["blocks"]] == [(0, 2), (2, 4)]


# -- against the oracles -----------------------------------------------------------------

@pytest.mark.parametrize(("keys", "dim", "block"), [(1, 1, 1), (7, 1, 3), (100, 1, 32),
                                                    (1000, 8, 64), (257, 3, 1000)])
def test_float32_agrees_with_the_float64_oracle_to_float_rounding(keys, dim, block):
    s, v = random_inputs(keys, dim, seed=keys)
    result = online_softmax(s, v, block)
    oracle = float64_softmax_average(s, v)
    magnitude = np.max(float64_softmax_average(s, np.abs(v)))
    np.testing.assert_allclose(np.asarray(result.reference), oracle, rtol=0,
                               atol=1e-14 * magnitude)
    np.testing.assert_allclose(np.asarray(result.output), oracle, rtol=0,
                               atol=8 * np.finfo(np.float32).eps * magnitude)
    assert result.rel_error <= 8 * np.finfo(np.float32).eps


def test_float64_arithmetic_agrees_to_float64_rounding():
    s, v = random_inputs(2000, 4, seed=3)
    result = online_softmax(s, v, 50, "float64")
    assert result.format == "float64" and result.inputs_rounded == 0
    assert result.rel_error < 1e-14


def test_the_reference_is_the_50_digit_answer():
    rng = np.random.default_rng(11)
    s, v = rng.standard_normal(300) * 5, rng.standard_normal(300)
    exact = mpmath_softmax_average(s, v)
    assert abs(float(softmax_reference(s, v)) - float(exact)) <= 1e-16 * abs(float(exact))


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("keys", "dim", "block"), [(9, 1, 2), (64, 1, 8), (50, 3, 7)])
def test_the_trace_is_the_recurrence_rounded_step_by_step(name, keys, dim, block):
    """Every block's statistics equal, bit for bit, the recurrence computed one key at a
    time in numpy's / ml_dtypes' own scalar arithmetic of that type."""
    s, v = random_inputs(keys, dim, seed=7)
    s = s * 3  # a spread of maxima: the running max changes more often
    result = online_softmax(s, v, block, name)
    oracle = scalar_trace(s, v if dim > 1 else v[:, None], block, DTYPES[name])
    assert len(result.blocks) == len(oracle)
    for b, o in zip(result.blocks, oracle):
        assert b.running_max == o["running_max"]
        assert b.running_sum == o["running_sum"]
        np.testing.assert_array_equal(np.atleast_1d(b.weighted_sum), o["weighted_sum"])
        np.testing.assert_array_equal(np.atleast_1d(b.output), o["output"])


def test_a_larger_max_rescales_what_was_accumulated():
    result = online_softmax([0, 1, 2, 3], [1, 1, 1, 1], 1, "float64")
    assert [b.rescale for b in result.blocks] == [None, *[math.exp(-1)] * 3]
    assert [b.running_max for b in result.blocks] == [0, 1, 2, 3]
    assert result.output == 1.0  # any average of ones


# -- what BF16 and FP16 running sums do ---------------------------------------------------

def sum_errors(keys: int, name: str, seeds=range(4)) -> float:
    """The median relative error of the running sum l over a few random draws."""
    return float(np.median([online_softmax(*random_inputs(keys, 1, seed), 32, name)
                            .sum_rel_error for seed in seeds]))


def test_bf16_running_sums_lose_what_float32_keeps():
    s, v = random_inputs(4096, 1, seed=0)
    f32, bf16 = online_softmax(s, v, 32), online_softmax(s, v, 32, "bf16")
    fp16 = online_softmax(s, v, 32, "fp16")
    assert f32.rel_error < 2e-7 and f32.sum_rel_error < 2e-7
    assert bf16.max_abs_error > 100 * f32.max_abs_error
    assert fp16.max_abs_error > 10 * f32.max_abs_error
    assert bf16.sum_rel_error > 1e-3 and fp16.sum_rel_error > 1e-5


@pytest.mark.slow
def test_the_bf16_running_sum_error_grows_with_the_keys():
    """l grows with the keys while each block adds about the same: in BF16 (8 bits) the
    additions round away more and more of what a block adds (float32 keeps it)."""
    small, large = sum_errors(512, "bf16"), sum_errors(32768, "bf16")
    assert large > 20 * small and large > 0.1
    assert sum_errors(32768, "float32") < 2e-6


def test_json_of_bf16_vs_float32_on_4096_random_keys():
    bf16 = json_of("softmax", "--random", "4096", "--format", "bf16")
    f32 = json_of("softmax", "--random", "4096")
    assert bf16["abs_error"] > 100 * f32["abs_error"]
    assert bf16["inputs_rounded"] > 0 and f32["inputs_rounded"] == 0
    assert len(bf16["blocks"]) == 128 and bf16["blocks"][-1]["stop"] == 4096


def test_stochastic_rounding_is_reproducible_from_the_seed():
    s, v = random_inputs(2048, 1, seed=1)
    one = online_softmax(s, v, 32, "bf16", "stochastic", seed=5)
    assert one == online_softmax(s, v, 32, "bf16", "stochastic", seed=5)
    assert one.output != online_softmax(s, v, 32, "bf16").output


def test_formats_that_overflow_give_nan_and_strict_json(tmp_path):
    np.save(tmp_path / "s.npy", np.zeros(70000, np.float32))
    np.save(tmp_path / "v.npy", np.ones(70000, np.float32))
    doc = json_of("softmax", "--scores", tmp_path / "s.npy", "--values", tmp_path / "v.npy",
                  "--format", "fp16", "--block", "1000")
    assert doc["running_sum"] == "inf" and doc["output"] == "nan"
    assert doc["sum_reference"] == 70000


def test_sums_past_float64s_range_are_computed_not_a_crash():
    """Issue 22 item 14: the exact sums of the reference (1e308 + 1e308) pass float64's
    max; they are scaled by a power of two, and the reference is the 50-digit answer.
    The trace in float64 overflows, as float64 arithmetic does: inf, reported as such."""
    doc = json_of("softmax", "--scores", "0,0", "--values", "1e308,1e308", "--format",
                  "float64")
    assert doc["reference"] == 1e308 and doc["running_sum"] == 2.0
    assert doc["output"] == "inf" and doc["abs_error"] == "inf"
    scores, values = [0.0, -1.0, 0.5, 0.0], [1.7e308, 1.7e308, -1e308, 1.6e308]
    exact = float(mpmath_softmax_average(scores, values))
    assert float(softmax_reference(scores, values)) == pytest.approx(exact, rel=1e-15)
    matrix = np.array([values, [1.0, 2.0, 3.0, 4.0]]).T  # a large and a small component
    both = softmax_reference(scores, matrix)
    assert float(both[0]) == pytest.approx(exact, rel=1e-15)
    assert float(both[1]) == pytest.approx(float(mpmath_softmax_average(scores, [1, 2, 3, 4])),
                                           rel=1e-15)
    result = online_softmax(scores, values, 2, "float64")
    assert result.rel_error == math.inf and math.isfinite(result.sum_reference)
    # scores 2e308 apart: s - m is -inf, a weight of 0, as exactly; no numpy warning
    quiet = succeeds("softmax", "--scores", "-1e308,1e308", "--values", "1,2", "--format",
                     "float64", "--json")
    assert strict_loads(quiet.stdout)["reference"] == 2.0 and quiet.stderr == ""


def test_the_reference_is_exact_to_longdouble_on_a_million_keys():
    """The vectorised sums (error-free pairwise additions) against mpmath's exact ones on
    2**20 keys whose terms cancel (positive and negative values)."""
    rng = np.random.default_rng(5)
    s, v = rng.standard_normal(1 << 20) * 2, rng.standard_normal(1 << 20)
    with mpmath.workdps(40):
        m = mpmath.mpf(float(s.max()))
        e = [mpmath.exp(mpmath.mpf(float(x)) - m) for x in s[:4096]]
        exact = mpmath.fsum(a * mpmath.mpf(float(b)) for a, b in zip(e, v[:4096])) / mpmath.fsum(e)
    assert abs(float(softmax_reference(s[:4096], v[:4096])) - float(exact)) <= 1e-17
    whole = float(softmax_reference(s, v))
    assert abs(whole - float64_softmax_average(s, v)) <= 1e-14


def test_the_recurrence_rounds_l_and_acc_together_once_a_block(monkeypatch):
    """Issue 22 item 17: 2**20 keys of 16 components in bf16 with stochastic rounding took
    129 s, four roundings per block in a Python loop.  l and acc now go through each
    rounding together, and a rescale of 1 (the max did not change) is not rounded (1 * x
    is x in every mode): about one rounding per block, plus one per key of a block."""
    from fmtcli.attention import softmax as module

    calls = []
    original = module._Rounder.__call__
    monkeypatch.setattr(module._Rounder, "__call__",
                        lambda self, x: calls.append(np.size(x)) or original(self, x))
    s, v = random_inputs(4096, 8, seed=2)
    result = online_softmax(s, v, 16, "bf16", "stochastic")
    blocks = len(result.blocks)
    changes = sum(1 for b in result.blocks[1:] if b.rescale != 1)
    assert len(calls) <= blocks + changes + 16 + 8, (len(calls), blocks, changes)
    assert result.sum_rel_error < 0.05


@pytest.mark.slow
def test_thousands_of_blocks_are_drawn_line_by_line():
    """--all-blocks of 65,536 blocks ran past 10 minutes in rich's layout: above
    render.PLAIN_ROWS rows the trace has one-line headers and its title and caption apart,
    so render.Fit draws it line by line (plaintable), every row, within 80 columns."""
    from fmtcli.render import PLAIN_ROWS
    from fmtcli.render.plaintable import is_plain
    from fmtcli.render.softmax import _trace_table

    keys = PLAIN_ROWS + 5
    out = table(80, "--random", str(keys), "--block", "1", "--all-blocks")
    numbers = [int(line.split()[0]) for line in out.splitlines()
               if line.strip() and line.split()[0].isdigit()]
    assert numbers == list(range(1, keys + 1))
    assert "arithmetic: max exact" in out and "running sum l" in out
    trace = online_softmax(*random_inputs(keys, 1, 0), 1)
    assert is_plain(_trace_table(trace, False, True, plain=True))


# -- vectors and inputs ------------------------------------------------------------------

def test_vector_values_one_row_per_key(tmp_path):
    rng = np.random.default_rng(2)
    s, v = rng.standard_normal(10), rng.standard_normal((10, 3))
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "v.npy", v)
    doc = json_of("softmax", "--scores", tmp_path / "s.npy", "--values", tmp_path / "v.npy",
                  "--block", "4")
    assert doc["dim"] == 3 and len(doc["output"]) == 3 and len(doc["abs_error"]) == 3
    assert all(len(b["weighted_sum"]) == 3 for b in doc["blocks"])
    oracle = float64_softmax_average(s.astype(np.float32), v.astype(np.float32))
    np.testing.assert_allclose(doc["reference"], oracle, rtol=1e-14)
    np.testing.assert_allclose(doc["output"], oracle, rtol=1e-6)
    assert doc["worst"] == int(np.argmax(doc["abs_error"]))
    assert "s.npy" in doc["source"]


def test_files_of_every_kind_and_stdin(tmp_path):
    (tmp_path / "s.txt").write_text("1\n3\n2\n0\n")
    (tmp_path / "v.csv").write_text("10,20,30,40\n")
    (tmp_path / "v.json").write_text("[[10], [20], [30], [40]]")
    expected = json_of("softmax")["output"]
    for values in ("v.csv", "v.json"):
        doc = json_of("softmax", "--scores", tmp_path / "s.txt", "--values",
                      tmp_path / values, "--block", "2")
        assert doc["output"] == expected and doc["dim"] is None
    doc = json_of("softmax", "--scores", "-", "--values", "10,20,30,40", "--block", "2",
                  input="1 3 2 0\n")
    assert doc["output"] == expected and doc["source"] == "<stdin>"


def test_lists_take_every_number_syntax():
    doc = json_of("softmax", "--scores", "2^0,0x1.8p1,2*1,0", "--values", "1e1,20,3*10,40",
                  "--block", "2")
    assert doc["output"] == json_of("softmax")["output"]


def test_read_numbers_shapes(tmp_path):
    np.save(tmp_path / "row.npy", np.arange(4.0)[None, :])
    np.save(tmp_path / "col.npy", np.arange(4.0)[:, None])
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 2)))
    assert read_numbers(str(tmp_path / "row.npy"), "--scores")[0].shape == (4,)
    assert read_numbers(str(tmp_path / "col.npy"), "--values", matrix=True)[0].shape == (4,)
    with pytest.raises(DataError, match="must be a vector or a"):
        read_numbers(str(tmp_path / "cube.npy"), "--values", matrix=True)
    with pytest.raises(UsageError, match="neither a list of numbers"):
        read_numbers("1,two", "--scores")


# -- refusals ----------------------------------------------------------------------------

USAGE = [
    (["--block", "0"], "'--block': 0 is not in the range 1<=x<=1048576"),
    (["--block", "-2", "--random", "5"], "'--block': -2 is not in the range"),
    (["--scores", "1,2", "--values", "1"], "2 scores but 1 value"),
    (["--scores", "1,2", "--values", "1,2,3"], "2 scores but 3 values"),
    (["--scores", "1,nan", "--values", "1,2"], "scores must be finite"),
    (["--scores", "1,2", "--values", "inf,2"], "values must be finite"),
    (["--scores", "", "--values", "1"], "--scores must not be empty"),
    (["--scores", "1,2"], "give --scores and --values together"),
    (["--values", "1,2"], "give --scores and --values together"),
    (["--random", "5", "--scores", "1"], "not both"),
    (["--random", "5", "--values", "1"], "not both"),
    (["--dim", "3"], "--dim goes with --random"),
    (["--scores", "-", "--values", "-"], "it can be read once"),
    (["--random", "0"], "--random"),
    (["--random", "3", "--dim", "0"], "--dim"),
    (["--random", "2000000"], "'--random': 2000000 is not in the range 1<=x<=1048576"),
    (["--random", "1000", "--dim", "100000"], "at most"),
    (["--random", "100000", "--block", "1"], "give a larger block"),
    (["--format", "nope"], "unknown format 'nope'"),
    (["--format", ""], "--format must not be empty"),
    (["--format", "fp16,bf16"], "--format takes one format"),
    (["--format", "e8m0"], "give a signed format"),
    (["--format", "float64", "--rounding", "up"], "--rounding up needs a format narrower"),
    (["--scores", "1,70000", "--values", "1,2", "--format", "fp16"], "beyond float16's range"),
    (["--scores", "1,x", "--values", "1,2"], "neither a list of numbers"),
    (["--scores", "1e999", "--values", "1"], "outside float64's range"),
    (["--seed", "-1"], "--seed"),
    (["--rounding", "sideways"], "--rounding"),
    (["--block", "two"], "--block"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragment"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(args, fragment):
    assert_usage_error(invoke("softmax", *args), fragment)


@pytest.mark.slow
def test_data_errors(tmp_path):
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan]))
    np.save(tmp_path / "matrix.npy", np.zeros((3, 2)))
    np.savez(tmp_path / "two.npz", a=np.zeros(2), b=np.zeros(2))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.npy").write_bytes(b"not a npy file")
    cases = [(["--scores", tmp_path / "nan.npy", "--values", "1,2"], "must be finite"),
             (["--scores", tmp_path / "matrix.npy", "--values", "1,2,3"], "must be a vector"),
             (["--scores", tmp_path / "two.npz", "--values", "1,2"], "2 usable tensors"),
             (["--scores", tmp_path / "empty.txt", "--values", "1"], "empty.txt"),
             (["--scores", tmp_path / "bad.npy", "--values", "1"], "bad.npy"),
             (["--scores", tmp_path / "missing.npy", "--values", "1"], "no such file"),
             (["--scores", tmp_path, "--values", "1"], "is a directory")]
    for args, fragment in cases:
        assert_data_error(invoke("softmax", *args), fragment)


def test_library_refusals():
    with pytest.raises(UsageError, match="no scores"):
        online_softmax([], [])
    with pytest.raises(UsageError, match="must be a vector"):
        online_softmax([[1, 2]], [1])
    with pytest.raises(UsageError, match="block must be at least 1"):
        online_softmax([1], [1], block=True)


# -- the table ---------------------------------------------------------------------------

def table(width: int, *args) -> str:
    out = succeeds("softmax", *args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    return out


WIDTH_CASES = [[], ["--random", "4096", "--format", "bf16"],
               ["--random", "300", "--dim", "64", "--block", "16", "--format", "e4m3fn"],
               ["--random", "40", "--block", "2", "--all-blocks", "--format", "e5m2"],
               ["--scores", "-1.2345678e-7,3e5,-2,0x1p-20", "--values", "1e30,-2e-30,3,4",
                "--block", "4"]]


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", WIDTH_CASES, ids=["article", "bf16", "vectors", "all",
                                                   "odd"])
def test_the_table_fits_uncut(width, args):
    out = table(width, *args)
    doc = json_of("softmax", *args)
    last = doc["blocks"][-1]
    assert str(last["block"]) in out
    words = " ".join(out.split())
    assert "arithmetic: max exact" in words and f"rounded to {doc['format']}" in words
    assert "abs error" in out and "running sum l" in out


def test_a_long_trace_shows_its_ends_and_all_blocks_shows_every_block():
    short = table(80, "--random", "640", "--block", "32")
    assert "    ..." in short and "4 blocks not shown" in short
    every = table(80, "--random", "640", "--block", "32", "--all-blocks")
    numbers = [int(line.split()[0]) for line in every.splitlines()
               if line.strip() and line.split()[0].isdigit()]
    assert list(range(1, 21)) == numbers[:20]


def test_json_is_one_strict_document_with_the_issues_keys():
    result = succeeds("softmax", "--random", "100", "--dim", "2", "--json")
    doc = strict_loads(result.stdout)
    assert {"blocks", "output", "reference", "abs_error"} <= set(doc)
    assert set(doc["blocks"][0]) == {"block", "start", "stop", "scores", "block_max",
                                     "running_max", "rescale", "block_sum", "running_sum",
                                     "weighted_sum", "output"}
    assert result.stderr == ""


def test_an_ambiguous_format_says_which_on_stderr():
    result = succeeds("softmax", "--format", "e4m3", "--json")
    assert strict_loads(result.stdout)["format"] == "float8_e4m3fn"
    assert result.stderr.startswith("Note:") and "e4m3fn" in result.stderr


@pytest.mark.slow
def test_a_real_run_in_ascii_and_a_refusal_without_traceback():
    env = {**os.environ, "COLUMNS": "80", "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run([sys.executable, "-m", "fmtcli", "softmax", "--random", "100"],
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "online softmax" in proc.stdout.decode("ascii").lower()
    refused = run_fmt("softmax", "--format", " ")
    assert refused.returncode == 2 and refused.stdout == b""
    assert refused.stderr.decode().count("\n") == 1 and b"Traceback" not in refused.stderr
