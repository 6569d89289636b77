"""``fmt kv``: FP8 KV-cache scales in vLLM's direction, checked against numpy written here
(vLLM's round trip q = cast(x / k_scale), x_hat = q * k_scale with ml_dtypes' cast), the
scales written by --out applied as vLLM applies them, layouts, errors and widths."""

from __future__ import annotations

import json
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
from safetensors.numpy import load_file, save_file

from fmtcli.formats import get_format
from fmtcli.kv import analyse_kv, candidate_scale, example_kv, measure

RNG = np.random.default_rng(61)
E4M3 = get_format("e4m3fn")


def vllm_round_trip(x: np.ndarray, k_scale) -> np.ndarray:
    """What vLLM's FP8 KV cache does (saturating cast of x / k_scale, times k_scale)."""
    scaled = np.asarray(x, np.float32) / np.float32(k_scale) if np.ndim(k_scale) == 0 else \
        np.asarray(x, np.float32) / np.asarray(k_scale, np.float32)[None, :, None]
    q = np.clip(scaled, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return q * (np.float32(k_scale) if np.ndim(k_scale) == 0
                else np.asarray(k_scale, np.float32)[None, :, None])


def sqnr(x, x_hat) -> float:
    x, x_hat = np.asarray(x, np.float64), np.asarray(x_hat, np.float64)
    return 10 * math.log10((x ** 2).sum() / ((x_hat - x) ** 2).sum())


def test_amax_scale_is_vllms_and_the_figures_are_numpys():
    x = (RNG.standard_normal((64, 4, 16)) * 3).astype(np.float32)
    x[0, 0, 0] = 0.0
    x[1, 2, 3] = 1e-6  # flushes under the amax scale
    scale = candidate_scale(x, "tensor", "amax", E4M3)
    assert scale.item() == np.float32(np.abs(x).max() / 448)  # k_scale = amax / fp8_max
    stats, _ = measure(x, scale, E4M3, "tensor", "amax")
    x_hat = vllm_round_trip(x, scale.item())
    assert stats.sqnr_db == pytest.approx(sqnr(x, x_hat), rel=1e-6)
    nz = x != 0
    assert stats.flushed == int(((x_hat == 0) & nz).sum()) >= 1
    assert stats.clipped == 0 and stats.nonzero == int(nz.sum())
    rel = np.abs(x_hat[nz].astype(np.float64) - x[nz]) / np.abs(x[nz])
    assert stats.max_rel_error == pytest.approx(rel.max(), rel=1e-12)
    p99 = np.sort(rel)[math.ceil(0.99 * rel.size) - 1]
    assert stats.p99_rel_error <= p99 < stats.p99_rel_error * (1 + 2 ** -7)
    per_head = candidate_scale(x, "head", "amax", E4M3).ravel()
    assert np.array_equal(per_head, (np.abs(x).max(axis=(0, 2)) / 448).astype(np.float32))


def test_unit_scale_clips_and_flushes():
    x = np.array([1000.0, -500.0, 300.0, 1e-4, -2e-3, 0.0], np.float32).reshape(1, 1, 6)
    stats, _ = measure(x, np.float32(1.0), E4M3, "tensor", "unit")
    assert stats.clipped == 2  # 1000 and -500 lie past 448 (+ half an ulp)
    assert stats.flushed == 1  # 1e-4 < 2**-10, half E4M3's smallest subnormal
    assert stats.count == 6 and stats.nonzero == 5


def test_mse_rule_is_no_worse_than_amax():
    streams = example_kv(layers=1, tokens=64)
    result = analyse_kv(streams, E4M3, ["tensor", "head"], ["amax", "mse"])
    for s in result.streams:
        by = {(t.granularity, t.candidate): t for t in s.stats}
        for g in ("tensor", "head"):
            assert by[(g, "mse")].sqnr_db >= by[(g, "amax")].sqnr_db - 1e-9
        assert s.recommended.sqnr_db == max(t.sqnr_db for t in s.stats)


@pytest.mark.parametrize("out_suffix", [".safetensors", ".json"])
def test_scales_written_and_applied_as_vllm_does_give_the_figures_reported(tmp_path,
                                                                           out_suffix):
    tensors = {f"layers.{i}.{kind}": (RNG.standard_t(3, (32, 2, 8)) * (i + 1)).astype(
        np.float32) for i in range(2) for kind in ("k", "v")}
    save_file(tensors, str(tmp_path / "kv.safetensors"))
    out = tmp_path / f"scales{out_suffix}"
    result = invoke("kv", tmp_path / "kv.safetensors", "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "wrote 4 scales" in result.stderr and "x ~ q * k_scale" in result.stderr
    if out_suffix == ".safetensors":
        written = {k: v for k, v in load_file(str(out)).items()}
    else:
        written = json.loads(out.read_text())["scales"]
    assert set(written) == {f"model.layers.{i}.self_attn.{k}_scale" for i in range(2)
                            for k in ("k", "v")}
    for stream in doc["streams"]:
        scale = np.asarray(written[stream["name"]], np.float32)
        rec = stream["recommended"]
        assert scale.shape == (() if rec["granularity"] == "tensor" else (2,))
        x = tensors[f"layers.{stream['layer']}.{stream['stream']}"]
        reported = next(c for c in stream["candidates"] if c["granularity"]
                        == rec["granularity"] and c["candidate"] == rec["candidate"])
        assert reported["sqnr_db"] == pytest.approx(
            sqnr(x, vllm_round_trip(x, scale if scale.shape else scale.item())), rel=1e-6)
    assert_usage_error(invoke("kv", tmp_path / "kv.safetensors", "--out", out), "--force")
    succeeds("kv", tmp_path / "kv.safetensors", "--out", out, "--force")


def test_progress_counts_every_stream():
    calls = []
    streams = example_kv(layers=2, tokens=16)
    analyse_kv(streams, E4M3, ["tensor"], ["amax"], progress=lambda d, t: calls.append((d, t)))
    total = sum(x.nbytes for x in streams.values())
    assert calls == [(total * i // 4, total) for i in range(1, 5)]


def test_layout_with_a_layers_axis(tmp_path):
    k = RNG.standard_normal((3, 2, 16, 4, 8)).astype(np.float32)  # layers,batch,tokens,...
    v = RNG.standard_normal((3, 2, 16, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "cache.npz", k=k, v=v)
    doc = json_of("kv", tmp_path / "cache.npz", "--layout", "layers,batch,tokens,heads,dim",
                  "--granularity", "head", "--candidates", "amax")
    assert [(s["layer"], s["stream"]) for s in doc["streams"]] == [
        (i, kind) for i in range(3) for kind in ("k", "v")]
    first = doc["streams"][0]
    assert (first["tokens"], first["heads"], first["dim"]) == (32, 4, 8)
    assert np.allclose(first["recommended"]["scales"],
                       (np.abs(k[0]).max(axis=(0, 1, 3)) / 448).astype(np.float32), rtol=0)
    assert_data_error(invoke("kv", tmp_path / "cache.npz"), "layout")


def test_k_and_v_files(tmp_path):
    k = RNG.standard_normal((16, 2, 8)).astype(np.float32)
    v = (RNG.standard_normal((16, 2, 8)) * 0.01).astype(np.float32)
    np.save(tmp_path / "keys.npy", k)
    save_file({"layers.0": v, "layers.1": v * 2}, str(tmp_path / "values.safetensors"))
    doc = json_of("kv", "--k", tmp_path / "keys.npy", "--v", tmp_path / "values.safetensors",
                  "--granularity", "tensor", "--candidates", "amax")
    assert [(s["layer"], s["stream"]) for s in doc["streams"]] == [(0, "k"), (0, "v"),
                                                                   (1, "v")]
    assert doc["streams"][0]["recommended"]["scales"] == [
        float(np.float32(np.abs(k).max() / 448))]
    np.save(tmp_path / "layers.0.k.npy", k)
    assert_data_error(invoke("kv", tmp_path / "layers.0.k.npy", "--k", tmp_path / "keys.npy"),
                      "a second K of layer 0")


def test_errors(tmp_path):
    assert_usage_error(invoke("kv", "--layout", "tokens,heads"), "heads and dim")
    assert_usage_error(invoke("kv", "--format", "fp16"), "e4m3fn")
    assert_usage_error(invoke("kv", "--granularity", "token-head"), "tensor or head")
    assert_usage_error(invoke("kv", "--candidates", "amax,best"), "best")
    assert_usage_error(invoke("kv", "--out", tmp_path / "s.txt"), ".safetensors or .json")
    np.save(tmp_path / "weights.npy", np.ones((4, 4, 4), np.float32))
    assert_data_error(invoke("kv", tmp_path / "weights.npy"), "no K or V tensor")
    bad = np.ones((4, 2, 8), np.float32)
    bad[1, 1, 1] = np.nan
    np.save(tmp_path / "layers.0.k.npy", bad)
    assert_data_error(invoke("kv", tmp_path / "layers.0.k.npy"), "layers.0.k.npy'", "inf or NaN")
    np.save(tmp_path / "layers.0.v.npy", np.ones((0, 2, 8), np.float32))
    assert_data_error(invoke("kv", tmp_path / "layers.0.v.npy"), "no usable K or V", "empty")
    np.save(tmp_path / "layers.1.v.npy", np.ones((4, 2, 8), np.int64))
    assert_data_error(invoke("kv", tmp_path / "layers.1.v.npy"), "no usable K or V", "int64")
    assert_usage_error(invoke("kv", "--out", tmp_path / "no" / "s.json"), "no such directory")


def test_json_direction_and_unit_cost():
    doc = json_of("kv", "--granularity", "tensor,head,tensor")  # the repeat counts once
    assert doc["direction"].startswith("vllm: x ~ q * k_scale")
    assert doc["format"] == "float8_e4m3fn" and doc["fp8_max"] == 448.0
    units = [c for s in doc["streams"] for c in s["candidates"] if c["candidate"] == "unit"]
    assert len(units) == len(doc["streams"])  # 1.0 is measured once per stream
    assert len(doc["streams"][0]["candidates"]) == 1 + 4 * 2
    assert all(u["scale_min"] == u["scale_max"] == 1.0 for u in units)
    k_total = {(c["granularity"], c["candidate"]): c for c in doc["totals"]["k"]}
    assert doc["recommended_total"]["k"]["sqnr_db"] > k_total[("tensor", "unit")]["sqnr_db"]


@pytest.mark.parametrize("width", [80, 120])
def test_tables_fit(width):
    out = succeeds("kv", env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    assert "What unit scales cost" in out
