"""The checkpoint report of ``fmt quantize``: the summary (by role, worst tensors, total),
``--per-tensor``, ``--top``/``--sort``, ``--worst-blocks``, ``--csv``, names broken only at
dots, and the progress bar's tensor name."""

from __future__ import annotations

import csv
import io
import math

import pytest
from cli_helpers import assert_usage_error, invoke, json_of, succeeds
from report_files import TROUBLE, bert_like

from fmtcli.cli import quantize as quantize_cli
from fmtcli.engine.ranking import METRICS, worst_tensors
from fmtcli.render import quantize as quantize_render
from fmtcli.render.csvout import FIELDS, cell
from fmtcli.render.plaintable import dotted_lines, split_at_index
from fmtcli.render.widgets import sparkline


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_like(tmp_path_factory.mktemp("report"))


def at80(*args) -> str:
    return succeeds("quantize", *args, env={"COLUMNS": "80"}).stdout


@pytest.mark.slow
def test_a_checkpoint_gets_the_summary_and_per_tensor_every_row(bert):
    out = at80(bert)
    assert out.startswith("By role: 86 tensors in 16 roles, under block 128")
    assert "Worst 5 of 86 tensors by flushed" in out and "Total of" in out
    assert "--per-tensor shows every tensor" in " ".join(out.split())
    every = at80(bert, "--per-tensor")
    assert every.startswith("Quantization error per tensor") and "By role" not in every
    assert every.count("per-tensor") >= 86 and len(every.splitlines()) > 250


def test_a_handful_of_tensors_keeps_the_row_per_tensor(tmp_path):
    import numpy as np

    for i in range(quantize_cli.SUMMARY_ABOVE):
        np.save(tmp_path / f"t{i}.npy", np.linspace(-1, 1, 256, dtype=np.float32) * (i + 1))
    out = at80(*sorted(tmp_path.glob("*.npy")))
    assert out.startswith("Quantization error per tensor")
    np.save(tmp_path / "t9.npy", np.ones(256, np.float32))
    out = at80(*sorted(tmp_path.glob("*.npy")))  # a summary (its roles are the tensors)
    assert "Worst 5 of 9 tensors" in out and "Quantization error per tensor" not in out


def test_the_cli_and_the_renderer_agree_on_the_summary_threshold():
    assert quantize_cli.SUMMARY_ABOVE == quantize_render.SUMMARY_ABOVE


@pytest.mark.slow
def test_the_worst_tensor_leads_and_top_limits(bert):
    out = at80(bert, "--top", "3")
    worst = out[out.index("Worst 3 of 86"):out.index("Total of")]
    rows = [line for line in worst.splitlines() if "64" in line]
    assert len(rows) == 3
    assert TROUBLE.removeprefix("encoder.layer.") in rows[0]
    assert "Worst" not in at80(bert, "--top", "0")


def test_sort_orders_by_each_metric(bert):
    from fmtcli.inputs.tensors import load_inputs
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    result = quantize(load_inputs([str(bert)], None), [build_scheme(block=128)])
    tensors = result.quantized
    key = {"flushed": lambda s: -s.flushed_fraction, "p99": lambda s: -s.p99_rel_error,
           "sqnr": lambda s: s.sqnr_db, "median": lambda s: -s.median_rel_error,
           "saturated": lambda s: -s.saturated_fraction}
    for metric in METRICS:
        ranked = worst_tensors(tensors, sort=metric, top=len(tensors))
        assert len(ranked) == len(tensors)
        values = [key[metric](t.schemes[-1]) for t in ranked]
        assert values == sorted(values), metric
    assert worst_tensors(tensors, sort="flushed", top=1)[0].tensor.key == TROUBLE
    assert worst_tensors(tensors, top=0) == []


def test_nan_sorts_last():
    from types import SimpleNamespace

    from fmtcli.engine.ranking import badness

    def stats(sqnr):
        return SimpleNamespace(sqnr_db=sqnr, flushed_fraction=0.0, p99_rel_error=0.01,
                               median_rel_error=0.01, saturated_fraction=0.0)

    assert badness(stats(math.nan), "sqnr") > badness(stats(80.0), "sqnr")
    assert badness(stats(10.0), "sqnr") < badness(stats(80.0), "sqnr")


def test_sort_and_top_refuse_bad_values(bert):
    assert_usage_error(invoke("quantize", bert, "--sort", "loudest"), "--sort")
    assert_usage_error(invoke("quantize", bert, "--top", "-1"), "--top")


@pytest.mark.slow
def test_worst_blocks_table_and_json(bert):
    doc = json_of("quantize", bert, "--worst-blocks", "2", "--compare", "none")
    (first, second) = doc["worst_blocks"]
    assert first["tensor"].endswith(TROUBLE) and first["flushed"] >= second["flushed"]
    out = at80(bert, "--worst-blocks", "2", "--compare", "none")
    assert "Worst 2 blocks under block 128" in out
    section = out[out.index("Worst 2 blocks"):]
    assert TROUBLE in section or TROUBLE.removeprefix("encoder.layer.") in section
    assert f"{first['flushed']}/{first['size']}" in section
    assert f"({first['block'][0]}, {first['block'][1]})" in section


def test_blocks_by_role_names_the_role_whose_blocks_flush(bert):
    out = at80(bert)
    section = out[out.index("Roles whose blocks flush or saturate"):]
    assert "intermediate." in section and "x6" in section
    assert "other roles with blocks: none flushes or saturates" in section


@pytest.mark.slow
def test_csv_is_one_row_per_tensor_and_scheme(bert):
    text = succeeds("quantize", bert, "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    doc = json_of("quantize", bert)
    tensors = [t for t in doc["tensors"] if t["schemes"]]
    assert len(rows) == sum(len(t["schemes"]) for t in tensors) == 2 * 86
    assert tuple(rows[0]) == FIELDS
    pairs = [(tensor, s) for tensor in tensors for s in tensor["schemes"]]
    for row, (t, s) in zip(rows, pairs):
        assert row["tensor"] == t["key"] and row["scheme"] == s["label"]
        assert row["shape"] == "x".join(map(str, t["shape"]))
        for name in ("count", "flushed", "saturated", "above_max", "nonzero"):
            assert int(row[name]) == s[name]
        outside = s["median_rel_error_outside_amax_block"]  # null under per-tensor scaling
        assert row["median_rel_error_outside_amax_block"] == (
            "" if outside is None else repr(float(outside)))
        for name in ("sqnr_db", "median_rel_error", "p99_rel_error", "max_abs_error", "rmse",
                     "bias", "flushed_fraction"):
            assert float(row[name]) == s[name]  # every digit
        assert row["block"] == ("" if s["block"] is None else str(s["block"]))
    assert all(r["key"] != "embeddings.position_ids" for r in rows)  # skipped: no row


def test_csv_writes_nan_and_infinities_as_pandas_reads_them(tmp_path):
    import numpy as np

    np.save(tmp_path / "zeros.npy", np.zeros(64, np.float32))  # no signal: SQNR NaN
    np.save(tmp_path / "huge.npy", np.full(64, 1e38, np.float32))
    text = succeeds("quantize", tmp_path / "zeros.npy", tmp_path / "huge.npy", "--csv",
                    "--overflow", "ieee", "--per", "tensor", "--fixed-scale", "1e10").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    values = {v for r in rows for v in r.values()}
    assert "nan" in values and ("inf" in values or "-inf" in values)
    assert not values & {"NaN", "Infinity", "-Infinity", "None"}
    assert cell(math.inf) == "inf" and cell(-math.inf) == "-inf" and cell(math.nan) == "nan"
    assert cell(None) == "" and cell(0.1) == "0.1"


def test_csv_and_json_are_alternatives(bert):
    assert_usage_error(invoke("quantize", bert, "--csv", "--json"), "--csv", "--json")


def test_names_break_only_after_dots_continuation_indented():
    name = "encoder.layer.0.attention.output.LayerNorm.weight"
    lines = dotted_lines(name, 24)
    assert "".join(line.strip() for line in lines) == name
    assert all(len(line) <= 24 for line in lines)
    assert all(line.startswith("    ") for line in lines[1:])
    assert all(line.rstrip().endswith(".") for line in lines[:-1])
    assert dotted_lines(name, 80) == [name]


def test_split_at_the_layer_index():
    assert split_at_index("encoder.layer.3.output.dense.weight") == \
        ("encoder.layer.", "3.output.dense.weight")
    assert split_at_index("encoder.layer.*.output.dense.weight") == \
        ("encoder.layer.", "*.output.dense.weight")
    assert split_at_index("pooler.dense.weight") == ("", "pooler.dense.weight")
    assert split_at_index("conv1.weight") == ("", "conv1.weight")


@pytest.mark.slow
def test_per_tensor_names_are_whole_where_they_fit(bert):
    out = at80(bert, "--per-tensor")
    names = [line.strip().split("  ")[0] for line in out.splitlines()
             if line.startswith(" encoder.")]
    assert names and all(n.startswith("encoder.layer.") and n.endswith(("weight", "bias"))
                         for n in names)


def test_sparkline_spans_the_exponents():
    assert sparkline({3: 1, 5: 4}) == "\u2582.\u2588"
    assert sparkline({0: 5}) == "\u2588"
    assert len(sparkline({e: 1 for e in range(-40, 40)}, width=16)) <= 16
    assert sparkline({}) == ""


def test_one_tensor_shows_its_block_facts(tmp_path):
    import numpy as np

    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    x[:4] = 1e-9
    x[5] = 300
    np.save(tmp_path / "x.npy", x.reshape(32, 128))
    out = at80(tmp_path / "x.npy")
    assert "blocks that flush" in out and "1 of 32 (3.12%)" in out
    assert "log2(scale)" in out


def test_progress_names_the_tensor_over_bytes(monkeypatch):
    from fmtcli.cli.output import StderrProgress

    progress = StderrProgress("quantizing")
    progress.tensor("model.safetensors:encoder.layer.11.attention.self.query.weight")
    assert progress.name.endswith("attention.self.query.weight")
    assert len(progress.name) <= StderrProgress.NAME_CELLS
    progress.tensor("short\nname")
    assert "\n" not in progress.name
