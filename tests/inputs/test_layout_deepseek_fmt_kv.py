"""Layout readers: DeepSeek-V3 FP8 block scales, fmt's own ``--out`` codes and scales, and
KV-cache scales (``fmtcli/inputs/layouts/deepseek_fp8.py``, ``fmt_out.py``,
``kv_scales.py``).

DeepSeek's fixtures are written in the test from the published definition (DeepSeek-V3
``README_WEIGHTS.md`` and ``inference/kernel.py``: float8_e4m3fn codes, one float32
``weight_scale_inv`` per 128 x 128 block, x = code * scale_inv): no DeepSeek library
installs here.  The reference decoding is float64 (code * scale, exact) rounded once to
float32, which is what a float32 product gives, so the reader must match it bit for bit.
fmt's own layout is written by ``fmt quantize --out`` itself; its reference is the engine:
the values must equal ``--out x.npy``'s dequantized x_q bit for bit, and ``fmt compare``'s
SQNR must be what ``fmt quantize --json`` says.  KV scales are written by ``fmt kv --out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import invoke, json_of, quantize_json, run_fmt, strict_loads

from fmtcli.engine.writers import write_safetensors
from fmtcli.inputs import layouts
from fmtcli.inputs.layouts.base import LayoutNote
from fmtcli.inputs.tensors import load_path
from fmtcli.streaming.stream import ChunkReader

E4M3 = ml_dtypes.float8_e4m3fn
CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
          "activation_scheme": "dynamic"}


# -- DeepSeek-V3 FP8, written from its definition --------------------------------------------

def deepseek_quantize(w: np.ndarray, block: int = 128, ue8m0: bool = False):
    """DeepSeek-V3's block quantization of one O x I matrix (its ``weight_quant``): pad to
    whole blocks with zeros, scale_inv = amax / 448 per block (UE8M0: rounded up to a power
    of two), codes = cast(x / scale_inv), the padding cut off again."""
    o, i = w.shape
    go, gi = -(-o // block), -(-i // block)
    padded = np.zeros((go * block, gi * block), np.float32)
    padded[:o, :i] = w
    tiles = padded.reshape(go, block, gi, block)
    amax = np.abs(tiles).max(axis=(1, 3)).astype(np.float32)
    scale = np.maximum(amax, np.float32(1e-12)) / np.float32(448)
    if ue8m0:
        scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)
    codes = (tiles / scale[:, None, :, None]).astype(E4M3).reshape(padded.shape)[:o, :i]
    return np.ascontiguousarray(codes), scale.astype(np.float32)


def reference_decode(codes: np.ndarray, scale: np.ndarray, block: int = 128) -> np.ndarray:
    """x = code * scale_inv[i // block, j // block] in float64 (exact), rounded once to
    float32; leading axes are matrices of their own."""
    values = codes.astype(np.float64)
    per = np.repeat(np.repeat(scale.astype(np.float64), block, axis=-2), block, axis=-1)
    return (values * per[..., :codes.shape[-2], :codes.shape[-1]]).astype(np.float32)


def one_error_line(stderr: str) -> str:
    """A refusal after the notes: exactly one ``Error:`` line, the last, no traceback (the
    LayoutNote that read the layout comes first)."""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    assert all(line.startswith("Note: ") for line in lines[:-1]), stderr
    return errors[0]


def deepseek_folder(folder: Path, tensors: dict, config: dict | None = CONFIG) -> Path:
    folder.mkdir(exist_ok=True)
    write_safetensors(str(folder / "model.safetensors"), tensors)
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    return folder


def only_quantized(folder: Path) -> layouts.Quantized:
    found = layouts.scan(load_path(str(folder), as_stored=True),
                         layouts.read_config(str(folder))).quantized
    assert len(found) == 1, [q.key for q in found]
    return found[0]


@pytest.fixture
def weights():
    rng = np.random.default_rng(24)
    return {"proj": rng.standard_normal((200, 300)).astype(np.float32) * 0.02,
            "experts": rng.standard_normal((3, 130, 260)).astype(np.float32) * 0.05}


def test_deepseek_decodes_code_times_scale_inv_per_128x128_block_with_partial_edges(
        tmp_path, weights):
    codes, scale = deepseek_quantize(weights["proj"])  # 200 x 300: edge blocks 72 and 44
    assert scale.shape == (2, 3)
    folder = deepseek_folder(tmp_path / "m", {"model.layers.0.mlp.down_proj.weight": codes,
                                              "model.layers.0.mlp.down_proj.weight_scale_inv":
                                                  scale})
    q = only_quantized(folder)
    assert (q.layout, q.key, q.shape, q.element) == (
        "deepseek-fp8", "model.layers.0.mlp.down_proj.weight", (200, 300), "float8_e4m3fn")
    assert q.facts["scale_direction"].startswith("dequantization") and not q.problems
    assert q.facts["config_scheme"] == "fp8" and q.facts["nominal_bits"] == 8 + 32 / 128 ** 2
    got = q.dequantize()
    np.testing.assert_array_equal(got.view(np.uint32), reference_decode(codes, scale)
                                  .view(np.uint32))
    # the zero padding left the edge blocks' scales those of their real values
    assert scale[1, 2] == np.float32(np.abs(weights["proj"][128:, 256:]).max()) / np.float32(448)
    np.testing.assert_allclose(got, weights["proj"], rtol=0.07, atol=1e-6)


def test_deepseek_stacked_experts_are_blocked_matrix_by_matrix(tmp_path, weights):
    stacked = weights["experts"]  # E x O x I = 3 x 130 x 260, grid 3 x 2 x 3
    pairs = [deepseek_quantize(m) for m in stacked]
    codes = np.stack([c for c, _ in pairs])
    scale = np.stack([s for _, s in pairs])
    folder = deepseek_folder(tmp_path / "m", {"mlp.experts.weight": codes,
                                              "mlp.experts.weight_scale_inv": scale})
    q = only_quantized(folder)
    assert q.matrix == (390, 260) and not q.problems
    np.testing.assert_array_equal(q.dequantize(), reference_decode(codes, scale))
    rows = q.read(slice(125, 140), slice(0, 260))  # across the first two experts' seam
    np.testing.assert_array_equal(rows, reference_decode(codes, scale).reshape(390, 260)[125:140])


@pytest.mark.parametrize("stored", ["float32", "float8_e8m0fnu", "uint8"])
def test_deepseek_ue8m0_scales_as_float32_e8m0fnu_or_uint8_bytes_decode_alike(
        tmp_path, weights, stored):
    codes, scale = deepseek_quantize(weights["proj"], ue8m0=True)
    exponent = np.log2(scale)
    assert np.array_equal(exponent, np.round(exponent))  # powers of two
    grid = {"float32": scale, "float8_e8m0fnu": scale.astype(ml_dtypes.float8_e8m0fnu),
            "uint8": (exponent + 127).astype(np.uint8)}[stored]
    folder = deepseek_folder(tmp_path / stored, {"w": codes, "w_scale_inv": grid},
                             {**CONFIG, "scale_fmt": "ue8m0"})
    q = only_quantized(folder)
    assert q.facts["scale_fmt"] == "ue8m0" and not q.problems
    assert "power of two" in q.facts["scale_rule"]
    assert q.facts["nominal_bits"] == 8 + (32 if stored == "float32" else 8) / 128 ** 2
    assert q.scale_dtype == ("float32" if stored == "float32" else "e8m0")
    np.testing.assert_array_equal(q.scales_reader(), scale)
    np.testing.assert_array_equal(q.dequantize(), reference_decode(codes, scale))


@pytest.mark.slow  # fresh processes
def test_deepseek_a_grid_of_the_wrong_shape_is_a_problem_and_one_error_line(tmp_path, weights):
    codes, scale = deepseek_quantize(weights["proj"])
    folder = deepseek_folder(tmp_path / "m", {"w": codes, "w_scale_inv": scale[:, :2]})
    q = only_quantized(folder)
    assert q.problems and "[2, 2]" in q.problems[0] and "[2, 3]" in q.problems[0]
    done = run_fmt("quantize", folder)
    assert done.returncode == 1 and done.stdout == b""
    assert "w_scale_inv" in one_error_line(done.stderr.decode())


@pytest.mark.slow  # fresh processes
def test_fmt_quantize_and_compare_read_a_deepseek_folder_in_a_fresh_process(tmp_path, weights):
    codes, scale = deepseek_quantize(weights["proj"])
    folder = deepseek_folder(tmp_path / "m", {"w": codes, "w_scale_inv": scale,
                                              "norm": np.ones(300, np.float32)})
    original = tmp_path / "orig.safetensors"
    write_safetensors(str(original), {"w": weights["proj"], "norm": np.ones(300, np.float32)})
    done = run_fmt("quantize", folder, "--json")
    assert done.returncode == 0, done.stderr
    doc = strict_loads(done.stdout)
    assert [t["key"] for t in doc["tensors"]] == ["w", "norm"]  # the scale grid is no tensor
    assert doc["tensors"][0]["dtype"] == "float32"
    assert b"deepseek-fp8" in done.stderr  # the LayoutNote
    done = run_fmt("compare", original, folder, "--json")
    assert done.returncode == 0, done.stderr
    doc = strict_loads(done.stdout)
    by_key = {t["key"]: t for t in doc["tensors"]}
    assert set(by_key) == {"w", "norm"} and by_key["w"]["layout"] == "deepseek-fp8"
    # e4m3 blocks of 128 x 128 against the original: some 30 dB; the norm is the same
    assert 25 < by_key["w"]["sqnr_db"] < 40 and float(by_key["norm"]["sqnr_db"]) == math.inf


def test_a_chunk_of_a_deepseek_tensor_is_decoded_from_its_rows_not_the_whole(tmp_path,
                                                                            weights):
    codes, scale = deepseek_quantize(weights["experts"][0])
    folder = deepseek_folder(tmp_path / "m", {"w": codes, "w_scale_inv": scale})
    with pytest.warns(LayoutNote):
        (source,) = load_path(str(folder))
    q = source.quantized
    calls = []
    rows_reader = q.rows_reader

    def spy(r0, r1):
        calls.append((r0, r1))
        return rows_reader(r0, r1)

    def whole():
        raise AssertionError("the whole tensor was opened")

    q.rows_reader, source.opener = spy, whole
    reader = ChunkReader(source)
    chunk = reader.read(slice(64, 72), slice(0, 260))
    assert calls == [(64, 72)] and chunk.shape == (8, 260) and chunk.dtype == np.float32
    np.testing.assert_array_equal(chunk, reference_decode(codes, scale)[64:72])


def test_fmt_quantize_of_a_deepseek_folder_equals_its_dequantized_values_as_npy(tmp_path,
                                                                               weights):
    codes, scale = deepseek_quantize(weights["proj"])
    folder = deepseek_folder(tmp_path / "m", {"w": codes, "w_scale_inv": scale})
    np.save(tmp_path / "w.npy", reference_decode(codes, scale))
    mine = quantize_json(folder, "--block", "32", "--compare", "all")
    theirs = quantize_json(tmp_path / "w.npy", "--block", "32", "--compare", "all")

    def figures(doc):
        return [{k: v for k, v in s.items() if k not in ("tensor",)}
                for s in doc["tensors"][0]["schemes"]]

    assert figures(mine) == figures(theirs)
    assert mine["total"] == theirs["total"]


# -- fmt's own --out layout --------------------------------------------------------------------

SCHEMES = [
    ("--block", "16"),
    ("--tile", "8x16"),
    ("--per", "tensor"),
    ("--block", "8", "--axis", "0"),
    ("--recipe", "mxfp8"),
    ("--recipe", "mxfp4"),
    ("--recipe", "nvfp4"),
    ("--format", "bfloat16", "--per", "row"),
    ("--format", "hifloat8", "--block", "32"),
    ("--format", "e3m2", "--block", "32"),
]


@pytest.fixture
def matrix(tmp_path):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((24, 64)) * np.exp(rng.standard_normal((24, 1)))).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
@pytest.mark.parametrize("args", SCHEMES, ids=" ".join)
def test_fmt_out_codes_and_scales_decode_to_the_engine_x_q_bit_for_bit(matrix, tmp_path,
                                                                       suffix, args):
    values = tmp_path / "xq.npy"
    coded = tmp_path / f"q{suffix}"
    quantize_json(matrix, *args, "--out", values)
    quantize_json(matrix, *args, "--out", coded)
    found = layouts.scan(load_path(str(coded), as_stored=True)).quantized
    assert [q.key for q in found] == ["x"] and not found[0].problems
    q = found[0]
    assert q.layout == "fmt-out" and q.facts["scale_direction"].startswith("quantization")
    assert q.facts["nominal_bits"] == pytest.approx(q.bits_per_param)  # ragged tiles too
    expected = np.load(values)
    got = q.dequantize()
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(expected[expected == 0])) \
        or "nvfp4" in args  # NVFP4's dead blocks: +0 either way


def test_fmt_compare_of_the_out_file_has_the_sqnr_fmt_quantize_reports(tmp_path):
    rng = np.random.default_rng(8)
    tensors = {"a.weight": rng.standard_normal((64, 96)).astype(np.float32),
               "b": (rng.standard_normal((3, 8, 40)) * 3).astype(np.float32),
               "c": rng.standard_normal(10).astype(np.float32)}
    model = tmp_path / "m.safetensors"
    write_safetensors(str(model), tensors)
    for suffix in (".safetensors", ".npz"):
        out = tmp_path / f"q{suffix}"
        doc = quantize_json(model, "--block", "16", "--out", out)
        reported = {t["key"]: t["schemes"][-1]["sqnr_db"] for t in doc["tensors"]}
        assert doc["tensors"][0]["schemes"][-1]["label"] == "block 16"
        compared = json_of("compare", model, out)
        got = {t["key"]: t["sqnr_db"] for t in compared["tensors"]}
        assert set(got) == set(reported) == set(tensors)
        for key, sqnr in reported.items():  # the same x_q; the sums' order differs
            assert round(got[key], 2) == round(sqnr, 2) and abs(got[key] - sqnr) < 1e-5, key


def test_fmt_out_detection_is_strict(tmp_path):
    codes = np.arange(64, dtype=np.uint8).reshape(8, 8)
    scales = np.ones((8, 1), np.float32)
    plain = tmp_path / "plain.safetensors"
    write_safetensors(str(plain), {"w.codes": codes, "w.scales": scales})  # no metadata
    assert layouts.scan(load_path(str(plain), as_stored=True)).quantized == []
    np.savez(tmp_path / "old.npz", **{"w.codes": codes, "w.scales": scales})  # no member
    assert layouts.scan(load_path(str(tmp_path / "old.npz"), as_stored=True)).quantized == []
    marked = {"fmtcli": "x_q = decode(codes) / scales"}
    other = tmp_path / "other.safetensors"  # the marker, but int8 codes / no entry
    write_safetensors(str(other), {"w.codes": codes.view(np.int8), "w.scales": scales,
                                   "v.codes": codes, "v.scales": scales}, marked)
    assert layouts.scan(load_path(str(other), as_stored=True)).quantized == []


def _description(**changes) -> str:
    entry = {"scheme": {"format": "float8_e4m3fn", "label": "row", "granularity": "row"},
             "tile": [1, 8], "shape": [8, 8], "matrix": [8, 8]}
    entry.update(changes)
    return json.dumps(entry)


@pytest.mark.parametrize("entry, scales_shape, fragment", [
    (_description(), (8, 2), "[8, 2]"),
    (_description(shape=[4, 16]), (8, 1), "[4, 16]"),
    (_description(scheme={"format": "float9_x"}), (8, 1), "unknown format"),
    ("{not json", (8, 1), "metadata entry"),
])
def test_a_broken_fmt_out_file_is_a_problem_and_one_error_line(tmp_path, entry, scales_shape,
                                                                fragment):
    path = tmp_path / "q.safetensors"
    write_safetensors(str(path), {"w.codes": np.zeros((8, 8), np.uint8),
                                  "w.scales": np.ones(scales_shape, np.float32)},
                      {"fmtcli": "x_q = decode(codes) / scales", "w": entry})
    (q,) = layouts.scan(load_path(str(path), as_stored=True)).quantized
    assert q.problems and fragment in q.problems[0]
    result = invoke("quantize", path)
    assert result.exit_code == 1 and result.stdout == "" and result.exception is not None
    assert fragment in one_error_line(result.stderr)


# -- KV scales ---------------------------------------------------------------------------------

def kv_checkpoint(path: Path, k, v, extra: dict | None = None) -> Path:
    rng = np.random.default_rng(3)
    tensors = {"model.layers.0.self_attn.q_proj.weight":
               rng.standard_normal((16, 32)).astype(np.float32),
               "model.layers.0.self_attn.k_scale": np.asarray(k, np.float32),
               "model.layers.0.self_attn.v_scale": np.asarray(v, np.float32), **(extra or {})}
    write_safetensors(str(path), tensors)
    return path


def test_fmt_kv_out_scales_are_claimed_left_out_of_the_data_and_keep_their_direction(
        tmp_path):
    out = tmp_path / "kv.safetensors"
    json_of("kv", "--out", out)  # the built-in example's recommended scales
    found = layouts.scan(load_path(str(out), as_stored=True)).quantized
    assert found and {q.layout for q in found} == {"kv-scales"}
    assert {q.facts["stream"] for q in found} == {"k", "v"}
    for q in found:
        assert not q.problems and "codes" not in q.parts
        assert q.facts["scale_direction"] == "dequantization (x = code * scale)"
        assert q.facts["format"] == "float8_e4m3fn"  # fmt kv's metadata
        values = q.scales_reader()
        assert values.shape == q.shape and np.all(values > 0) and np.all(np.isfinite(values))
        np.testing.assert_array_equal(q.dequantize(), values)
        assert q.facts["covered_amax"] == [float(s) * 448.0 for s in values.reshape(-1)]


def test_kv_scales_per_tensor_and_per_head_and_fmt_quantize_skips_them(tmp_path):
    path = kv_checkpoint(tmp_path / "m.safetensors", 0.02, [0.01, 0.02, 0.04, 0.08])
    found = {q.facts["stream"]: q for q in
             layouts.scan(load_path(str(path), as_stored=True)).quantized}
    assert found["k"].facts["granularity"] == "tensor" and found["k"].facts["heads"] is None
    assert found["v"].facts["granularity"] == "head" and found["v"].facts["heads"] == 4
    assert found["k"].group.spelling == "tensor" and found["v"].group.block == 1
    assert found["k"].facts["layer"] == 0 and not found["k"].problems
    with pytest.warns(LayoutNote, match="2 scale tensors without codes"):
        keys = [s.key for s in load_path(str(path))]
    assert keys == ["model.layers.0.self_attn.q_proj.weight"]
    doc = quantize_json(path)
    assert [t["key"] for t in doc["tensors"]] == keys


@pytest.mark.parametrize("k, v, fragment", [
    (np.full((2, 4), 0.1), 0.1, "one per tensor or one per KV head"),
    (np.full(8, 0.1), np.full(4, 0.1), "8 heads"),
])
def test_kv_scales_of_the_wrong_shape_are_problems(tmp_path, k, v, fragment):
    path = kv_checkpoint(tmp_path / "m.safetensors", k, v)
    problems = [p for q in layouts.scan(load_path(str(path), as_stored=True)).quantized
                for p in q.problems]
    assert problems and any(fragment in p for p in problems)


def test_tensors_named_like_kv_scales_but_not_scales_stay_data(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(str(path), {"a.k_scale": np.ones((64, 128), np.float32),
                                  "b.v_scale": np.ones(4, np.int32),
                                  "kscale": np.ones(1, np.float32)})
    assert layouts.scan(load_path(str(path), as_stored=True)).quantized == []


def test_a_transformers_format_pt_metadata_is_not_taken_for_the_kv_format(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(str(path), {"model.layers.3.self_attn.k_scale": np.float32([0.5])},
                      {"format": "pt"})
    (q,) = layouts.scan(load_path(str(path), as_stored=True)).quantized
    assert (q.element, q.facts["fp8_max"], q.facts["layer"]) == ("float8_e4m3fn", 448.0, 3)
    assert q.facts["covered_amax"] == [224.0] and q.facts["format_from"] == "vLLM's fp8 default"


def test_fmt_out_codes_beyond_the_format_s_bits_are_one_error_line(tmp_path):
    path = tmp_path / "q.safetensors"
    entry = json.dumps({"scheme": {"format": "float4_e2m1fn", "granularity": "row"},
                        "tile": [1, 8], "shape": [2, 8], "matrix": [2, 8]})
    codes = np.full((2, 8), 3, np.uint8)
    codes[1, 5] = 0x13  # a high nibble in a 4-bit code
    write_safetensors(str(path), {"w.codes": codes, "w.scales": np.ones((2, 1), np.float32)},
                      {"fmtcli": "x_q = decode(codes) / scales", "w": entry})
    (q,) = layouts.scan(load_path(str(path), as_stored=True)).quantized
    np.testing.assert_array_equal(q.read(slice(0, 1), slice(0, 8)), np.full((1, 8), 1.5))
    result = invoke("quantize", path)
    assert result.exit_code == 1 and "codes beyond float4_e2m1fn's 4 bits" in one_error_line(
        result.stderr)


def test_fmt_out_nvfp4_blocks_whose_scale_is_inf_decode_to_zero_as_the_engine_makes_them(
        tmp_path):
    x = np.ones((2, 32), np.float32)
    x[0, 0], x[1, 16:] = 1000, 1e-9  # the last block's E4M3 scale underflows: dead
    np.save(tmp_path / "x.npy", x)
    quantize_json(tmp_path / "x.npy", "--recipe", "nvfp4", "--out", tmp_path / "xq.npy")
    quantize_json(tmp_path / "x.npy", "--recipe", "nvfp4", "--out", tmp_path / "q.safetensors")
    (q,) = layouts.scan(load_path(str(tmp_path / "q.safetensors"), as_stored=True)).quantized
    assert np.isinf(q.scales_reader()[1, 1])
    got = q.dequantize()
    assert np.array_equal(got, np.load(tmp_path / "xq.npy")) and not got[1, 16:].any()
