"""``fmt kv``: FP8 KV-cache scales in vLLM's direction, checked against numpy written here
(vLLM's round trip q = cast(x / k_scale), x_hat = q * k_scale with ml_dtypes' cast), the
scales written by --out applied as vLLM applies them, layouts, errors and widths."""

from __future__ import annotations

import json
import math
import os
import stat

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_fits,
    assert_usage_error,
    invoke,
    json_of,
    run_fmt,
    run_fmt_each,
    strict_loads,
    succeeds,
)
from safetensors.numpy import load_file, save_file

from fmtcli.base.errors import DataError
from fmtcli.kv import analyse_kv, candidate_scale, example_kv, measure
from fmtcli.numerics.formats import get_format

RNG = np.random.default_rng(61)
E4M3 = get_format("e4m3fn")


def vllm_round_trip(x: np.ndarray, k_scale, cache=ml_dtypes.float8_e4m3fn) -> np.ndarray:
    """What vLLM's FP8 KV cache does (saturating cast of x / k_scale, times k_scale)."""
    scaled = np.asarray(x, np.float32) / np.float32(k_scale) if np.ndim(k_scale) == 0 else \
        np.asarray(x, np.float32) / np.asarray(k_scale, np.float32)[None, :, None]
    fp8_max = float(ml_dtypes.finfo(cache).max)
    q = np.clip(scaled, -fp8_max, fp8_max).astype(cache).astype(np.float32)
    return q * (np.float32(k_scale) if np.ndim(k_scale) == 0
                else np.asarray(k_scale, np.float32)[None, :, None])


def vllm_loaded_scale(checkpoint_scale, fnuz_gpu: bool) -> np.ndarray:
    """The scale vLLM applies for a checkpoint's k_scale/v_scale: doubled on a GPU whose FP8
    is fnuz (``if current_platform.is_fp8_fnuz(): k_scale *= 2`` in
    ``BaseKVCacheMethod.process_weights_after_loading``,
    vllm/model_executor/layers/quantization/kv_cache.py), as loaded elsewhere.  The cache
    is float8_e4m3fnuz there (``RocmPlatform.fp8_dtype``), float8_e4m3fn elsewhere."""
    scale = np.asarray(checkpoint_scale, np.float32)
    return scale * np.float32(2) if fnuz_gpu else scale


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("width", [80, 120])
def test_tables_fit(width, fmt):
    out = succeeds("kv", "--format", fmt, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    assert "What unit scales cost" in out
    assert ("--out writes half" in out) == (fmt == "e4m3fnuz")


def kv_file(tmp_path, seed: int = 5):
    rng = np.random.default_rng(seed)
    tensors = {f"layers.{i}.{kind}": (rng.standard_t(3, (64, 2, 16)) * (i + 1)).astype(
        np.float32) for i in range(2) for kind in ("k", "v")}
    save_file(tensors, str(tmp_path / "kv.safetensors"))
    return tensors


@pytest.mark.slow
@pytest.mark.parametrize("candidates", ["amax", "unit,amax,amax-x2,p99.99,mse"])
def test_scales_written_give_the_figures_reported_as_vllm_applies_them_on_both_gpus(
        tmp_path, candidates):
    """e4m3fnuz: vLLM doubles a checkpoint's scales on fnuz GPUs (MI300), so --out writes
    half the applied scale; e4m3fn: written as applied, and applied as loaded on OCP GPUs
    (and doubled on fnuz ones, where nothing then clips: amax / 224 within 240)."""
    tensors = kv_file(tmp_path)
    docs, written = {}, {}
    for fmt in ("e4m3fnuz", "e4m3fn"):
        out = tmp_path / f"{fmt}.safetensors"
        result = invoke("kv", tmp_path / "kv.safetensors", "--format", fmt, "--candidates",
                        candidates, "--out", out, "--json")
        assert result.exit_code == 0, result.stderr
        docs[fmt], written[fmt] = json.loads(result.stdout), load_file(str(out))
        assert docs[fmt]["scales"] == {k: v.tolist() for k, v in written[fmt].items()}
    assert "halved" in invoke("kv", tmp_path / "kv.safetensors", "--format", "e4m3fnuz",
                              "--out", tmp_path / "again.json").stderr
    assert docs["e4m3fnuz"]["checkpoint_factor"] == 0.5
    assert docs["e4m3fn"]["checkpoint_factor"] == 1.0
    for fmt, fnuz_gpu, cache in (("e4m3fnuz", True, ml_dtypes.float8_e4m3fnuz),
                                 ("e4m3fn", False, ml_dtypes.float8_e4m3fn)):
        for stream in docs[fmt]["streams"]:
            applied = vllm_loaded_scale(written[fmt][stream["name"]], fnuz_gpu)
            rec = stream["recommended"]
            assert applied.ravel().tolist() == rec["scales"]  # what fmt measured
            x = tensors[f"layers.{stream['layer']}.{stream['stream']}"]
            x_hat = vllm_round_trip(x, applied if applied.shape else applied.item(), cache)
            reported = next(c for c in stream["candidates"] if c["granularity"]
                            == rec["granularity"] and c["candidate"] == rec["candidate"])
            assert reported["sqnr_db"] == pytest.approx(sqnr(x, x_hat), rel=1e-6)
            assert reported["flushed"] == int(((x_hat == 0) & (x != 0)).sum())
            if candidates == "amax" and rec["granularity"] == "tensor":
                amax = np.abs(x).max()
                assert applied.item() == np.float32(amax / (240 if fnuz_gpu else 448))
    for stream in docs["e4m3fn"]["streams"]:  # an OCP checkpoint on an MI300
        x = tensors[f"layers.{stream['layer']}.{stream['stream']}"]
        applied = vllm_loaded_scale(written["e4m3fn"][stream["name"]], fnuz_gpu=True)
        scaled = x / (applied if applied.shape == () else applied[None, :, None])
        assert np.abs(scaled).max() <= 240


@pytest.mark.slow
def test_tiny_or_zero_k_is_refused_naming_the_tensor_and_nothing_warns(tmp_path):
    rng = np.random.default_rng(3)
    np.save(tmp_path / "layers.0.k.npy", (rng.standard_normal((16, 2, 8)) * 1e-43).astype(
        np.float32))  # float32 subnormals only: amax / 448 is below 2^-149
    result = invoke("kv", tmp_path / "layers.0.k.npy")
    assert_data_error(result, "layers.0.k.npy", "smallest normal", "2^-126")
    assert "Note" not in result.stderr and "Warning" not in result.stderr
    k = (rng.standard_normal((16, 2, 8))).astype(np.float32)
    k[3] = 1e-40  # one token whose every head is tiny: no per-token-head scale for it
    np.save(tmp_path / "layers.1.k.npy", k)
    assert_data_error(invoke("kv", tmp_path / "layers.1.k.npy"), "layers.1.k.npy",
                      "in a token's head")
    assert succeeds("kv", tmp_path / "layers.1.k.npy", "--granularity", "tensor,head"
                    ).stderr == ""
    np.save(tmp_path / "layers.2.k.npy", np.zeros((4, 2, 8), np.float32))
    assert_data_error(invoke("kv", tmp_path / "layers.2.k.npy"), "layers.2.k.npy",
                      "every value is 0")
    np.save(tmp_path / "layers.3.k.npy", np.full((4, 2, 8), np.finfo(np.float32).max,
                                                 np.float32))
    assert succeeds("kv", tmp_path / "layers.3.k.npy").stderr == ""
    x = (rng.standard_normal((64, 2, 8)) * 1e-35).astype(np.float32)  # amax / 448: normal
    for candidate in ("p99.99", "mse"):  # never a scale below float32's smallest normal
        assert candidate_scale(x, "token-head", candidate, E4M3).min() >= 2.0 ** -126
    fnuz = get_format("e4m3fnuz")  # written halved: applied scales stay >= 2^-125
    assert candidate_scale(x * 4, "token-head", "mse", fnuz).min() >= 2.0 ** -125


@pytest.mark.slow
def test_out_safetensors_needs_no_safetensors_package_and_has_a_new_files_mode(tmp_path):
    kv_file(tmp_path)
    blocker = tmp_path / "blocked" / "safetensors"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'safetensors'\")\n")
    old = os.umask(0o027)
    try:
        proc = run_fmt("kv", tmp_path / "kv.safetensors", "--granularity", "tensor",
                       "--out", tmp_path / "s.safetensors",
                       env={"PYTHONPATH": str(blocker.parent)})
        assert proc.returncode == 0, proc.stderr.decode()
        succeeds("kv", "--out", tmp_path / "s.json")
        succeeds("quantize", tmp_path / "kv.safetensors", "--out", tmp_path / "q.safetensors")
    finally:
        os.umask(old)
    assert set(load_file(str(tmp_path / "s.safetensors"))) == {
        f"model.layers.{i}.self_attn.{k}_scale" for i in range(2) for k in ("k", "v")}
    modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode)
             for name in ("s.safetensors", "s.json", "q.safetensors")}
    assert modes == dict.fromkeys(modes, 0o640)  # 0666 less the umask, as quantize's


def test_format_goes_through_the_shared_parser():
    result = succeeds("kv", "--format", "fp8", "--granularity", "tensor", "--candidates",
                      "amax", "--json")
    assert json.loads(result.stdout)["format"] == "float8_e4m3fn"
    assert "'fp8' is ambiguous; using float8_e4m3fn" in result.stderr
    doc = json_of("kv", "--format", "torch.float8_e4m3fnuz", "--granularity", "tensor",
                  "--candidates", "amax")
    assert doc["format"] == "float8_e4m3fnuz" and doc["fp8_max"] == 240.0
    assert_usage_error(invoke("kv", "--format", "bf16"), "KV-cache format", "e4m3fnuz")
    assert_usage_error(invoke("kv", "--format", "e4m3fn,e5m2"), "one format")


# -- a dump read one stream at a time ---------------------------------------------------------

def test_kv_streams_are_made_when_read_and_not_kept():
    """kv_streams checks every K and V once (a bad one is refused before any analysis) and
    keeps only how to make them: the analysis holds one stream at a time, not the dump."""
    from fmtcli.inputs.source import TensorSource
    from fmtcli.kv.inputs import KvStreams, kv_streams

    rng = np.random.default_rng(0)
    data = {f"layers.{i}.{s}": rng.standard_normal((8, 2, 4)).astype(np.float32)
            for i in range(3) for s in "kv"}
    opened = []

    def source(key, array):
        return TensorSource("dump", key, array.shape, "float32",
                            lambda: opened.append(key) or array)

    streams = kv_streams([source(k, a) for k, a in data.items()])
    assert isinstance(streams, KvStreams) and sorted(opened) == sorted(data)
    assert all(callable(f) for f in streams.loaders.values())
    np.testing.assert_array_equal(streams[(2, "v")], data["layers.2.v"])
    bad = dict(data, **{"layers.2.v": np.full((8, 2, 4), np.nan, np.float32)})
    with pytest.raises(DataError, match="layers.2.v"):
        kv_streams([source(k, a) for k, a in bad.items()])


def test_kv_on_a_sharded_folder_equals_one_file(tmp_path):
    """K in one shard, V in another, read as a folder (fresh process): the same figures as
    the same tensors in one file; bounded by one stream, not the dump."""
    rng = np.random.default_rng(1)
    k = {f"layers.{i}.k": rng.standard_normal((64, 2, 16)).astype(np.float32) for i in range(2)}
    v = {f"layers.{i}.v": (rng.standard_t(3, (64, 2, 16)) * 0.1).astype(np.float32)
         for i in range(2)}
    (tmp_path / "shards").mkdir()
    save_file(k, str(tmp_path / "shards" / "k.safetensors"))
    save_file(v, str(tmp_path / "shards" / "v.safetensors"))
    save_file({**k, **v}, str(tmp_path / "one.safetensors"))
    (c1, o1, e1), (c2, o2, e2) = run_fmt_each([
        ["kv", tmp_path / "shards", "--candidates", "unit,amax", "--json"],
        ["kv", tmp_path / "one.safetensors", "--candidates", "unit,amax", "--json"]])
    assert c1 == c2 == 0, (e1, e2)
    sharded, one = strict_loads(o1.decode()), strict_loads(o2.decode())
    sharded.pop("inputs"), one.pop("inputs")
    assert sharded == one and len(one["streams"]) == 4
