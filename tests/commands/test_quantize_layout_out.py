"""``fmt quantize --out DIR --layout L``: checkpoint folders in the ecosystem's layouts.

Round trips: fmt's own layout readers (``inputs.layouts``) read every folder back to the
engine's x_q (the codes are the engine's; the layouts' dequantization scales d = fl32(1/s)
put each value within one float32 ulp of x_q, and exactly on it for power-of-two scales),
so ``fmt compare`` gives the SQNR ``fmt quantize --json`` reported.  The real library:
compressed-tensors (``pytest.importorskip``; run with /tmp/ctcheck/bin/python -m pytest)
loads the folder into a model through its own ``apply_quantization_config`` +
``ModelCompressor`` (strict state-dict load: every name, shape and dtype as it expects)
and decompresses it: float32 FP8 scales decode exactly (its float32 product is fmt's),
NVFP4 comes out in bfloat16, so it must equal the exact float64 decoding of the stored
bytes rounded to bfloat16 (within one bfloat16 ulp, its float32 step before); transformers'
``from_pretrained`` loads a folder written from a tiny Llama and runs it.  Bad options are
one Error line.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_usage_error, invoke, json_of, succeeds

from fmtcli.engine.writers import write_safetensors
from fmtcli.inputs.safetensorsfile import load_safetensors
from fmtcli.inputs.tensors import load_path

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
CASES = [
    ("compressed-tensors", ["--per", "row"], "compressed-tensors-fp8"),
    ("compressed-tensors", ["--per", "tensor"], "compressed-tensors-fp8"),
    ("compressed-tensors", ["--block", "128"], "compressed-tensors-fp8"),
    ("compressed-tensors", ["--tile", "128x128"], "compressed-tensors-fp8"),
    ("compressed-tensors", ["--recipe", "nvfp4"], "compressed-tensors-nvfp4"),
    ("deepseek-fp8", ["--tile", "128x128"], "deepseek-fp8"),
    ("deepseek-fp8", ["--recipe", "deepseek"], "deepseek-fp8"),
    ("modelopt-nvfp4", ["--recipe", "nvfp4"], "modelopt-nvfp4"),
]


def _model(tmp_path, name="m"):
    """A small Hugging Face folder: two linear weights (float32, bfloat16; ragged against
    128), a norm, an embedding, lm_head and an int64 buffer, with a config.json."""
    rng = np.random.default_rng(3)
    folder = tmp_path / name
    folder.mkdir()
    down = (rng.standard_normal((96, 160)) * 0.05).astype(ml_dtypes.bfloat16)
    write_safetensors(str(folder / "model.safetensors"), {
        "model.layers.0.self_attn.q_proj.weight":
            (rng.standard_normal((200, 272)) * 0.02).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": down,
        "model.layers.0.input_layernorm.weight": np.ones(272, np.float32),
        "model.embed_tokens.weight": rng.standard_normal((50, 272)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((50, 272)).astype(np.float32),
        "position_ids": np.arange(10, dtype=np.int64)})
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab": 50}))
    return folder


def _one(tmp_path, rows=300, cols=512):
    rng = np.random.default_rng(7)
    path = tmp_path / "one.safetensors"
    x = (rng.standard_normal((rows, cols)) * rng.choice([0.01, 1.0], (rows, 1)))
    write_safetensors(str(path), {"w.weight": x.astype(np.float32)})
    return path


def _read(folder, key):
    """fmt's reading of ``key`` in a written folder: (the source, its values)."""
    (source,) = [s for s in load_path(str(folder)) if s.key == key]
    return source, np.asarray(source.quantized.rows_reader(0, source.shape[0]))


@pytest.mark.parametrize("layout, options, reader", CASES)
def test_fmt_reads_each_layout_back_to_the_engines_values(tmp_path, layout, options, reader):
    one = _one(tmp_path)
    succeeds("quantize", one, *options, "--out", tmp_path / "x.npy")
    report = json_of("quantize", one, *options, "--out", tmp_path / "out", "--layout", layout)
    assert report["output"]["layout"] == layout and report["output"]["quantized"] == 1
    x_q = np.load(tmp_path / "x.npy")
    source, values = _read(tmp_path / "out", "w.weight")
    assert source.quantized.layout == reader
    assert values.shape == x_q.shape
    gap = np.abs(values.astype(np.float64) - x_q)
    assert np.all(gap <= np.spacing(np.abs(x_q)))  # one float32 ulp at most
    assert 0 < np.count_nonzero(gap) < gap.size  # the roundings do differ, now and then
    compared = json_of("compare", one, tmp_path / "out")["tensors"][0]
    assert compared["sqnr_db"] == pytest.approx(report["tensors"][0]["schemes"][-1]["sqnr_db"],
                                                abs=1e-4)


@pytest.mark.parametrize("layout, options", [
    ("deepseek-fp8", ["--tile", "128x128"]), ("compressed-tensors", ["--per", "row"])])
def test_power_of_two_scales_round_trip_exactly(tmp_path, layout, options):
    one = _one(tmp_path)
    rule = ["--scale-rule", "pow2-floor"]
    succeeds("quantize", one, *options, *rule, "--out", tmp_path / "x.npy")
    succeeds("quantize", one, *options, *rule, "--out", tmp_path / "out", "--layout", layout)
    compared = json_of("compare", tmp_path / "x.npy", tmp_path / "out")["tensors"][0]
    assert compared["differ"] == 0 and compared["sqnr_db"] == "inf"
    if layout == "deepseek-fp8":
        config = json.loads((tmp_path / "out" / "config.json").read_text())
        assert config["quantization_config"]["scale_fmt"] == "ue8m0"


def test_a_folder_keeps_its_config_and_copies_what_is_not_a_linear_weight(tmp_path):
    folder = _model(tmp_path)
    out = tmp_path / "out"
    report = json_of("quantize", folder, "--per", "row", "--out", out, "--layout",
                     "compressed-tensors")
    assert (report["output"]["quantized"], report["output"]["copied"]) == (2, 4)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["vocab"]) == ("llama", 50)
    quant = config["quantization_config"]
    assert quant["format"] == "naive-quantized"
    assert quant["ignore"] == ["lm_head", "model.embed_tokens"]
    assert quant["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    written = {s.key: s for s in load_safetensors(str(out / "model.safetensors"))}
    original = {s.key: s for s in load_safetensors(str(folder / "model.safetensors"))}
    for key in ("lm_head.weight", "model.embed_tokens.weight", "position_ids",
                "model.layers.0.input_layernorm.weight"):
        assert written[key].dtype == original[key].dtype
        assert np.array_equal(written[key].stored(), original[key].stored())
    assert written["model.layers.0.mlp.down_proj.weight"].dtype == "float8_e4m3fn"
    assert written["model.layers.0.mlp.down_proj.weight_scale"].shape == (96, 1)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("name, shape, dtype, quantized", [
    ("model.layers.0.self_attn.q_proj.weight", (8, 16), "float32", True),
    ("model.layers.3.mlp.experts.7.down_proj.weight", (8, 16), "bfloat16", True),
    ("model.layers.3.mlp.shared_experts.up_proj.weight", (8, 16), "bfloat16", True),
    ("encoder.layer.0.output.dense.weight", (8, 16), "float32", True),
    ("model.layers.3.mlp.gate_proj.weight", (8, 16), "float32", True),
    ("model.layers.3.mlp.gate.weight", (8, 16), "float32", False),
    ("model.layers.3.block_sparse_moe.gate.weight", (8, 16), "float32", False),
    ("model.layers.3.mlp.shared_expert_gate.weight", (1, 16), "float32", False),
    ("model.layers.0.mlp.router.weight", (8, 16), "float32", False),
    ("model.embed_tokens.weight", (8, 16), "float32", False),
    ("transformer.wte.weight", (8, 16), "float32", False),
    ("lm_head.weight", (8, 16), "float32", False),
    ("model.norm.weight", (16,), "float32", False),
    ("model.layers.0.mlp.experts.gate_up_proj.weight", (4, 8, 16), "float32", False),
    ("model.layers.0.self_attn.q_proj.bias", (8, 16), "float32", False),
    ("model.layers.0.self_attn.q_proj.weight", (8, 16), "int8", False),
])
def test_which_tensors_are_linear_weights(name, shape, dtype, quantized):
    from fmtcli.inputs.source import from_array
    from fmtcli.quantize.layout_out import is_linear_weight

    source = from_array("f", name, np.zeros(shape, dtype), shape, np.dtype(dtype)
                        if dtype != "bfloat16" else ml_dtypes.bfloat16)
    assert is_linear_weight(name, source) is quantized


def test_key_picks_the_weights_to_quantize_and_the_rest_is_copied(tmp_path):
    folder = _model(tmp_path)
    report = json_of("quantize", folder, "--key", "*q_proj*", "--per", "row", "--out",
                     tmp_path / "out", "--layout", "compressed-tensors")
    assert (report["output"]["quantized"], report["output"]["copied"]) == (1, 5)
    written = {s.key: s for s in load_safetensors(str(tmp_path / "out" / "model.safetensors"))}
    assert written["model.layers.0.self_attn.q_proj.weight"].dtype == "float8_e4m3fn"
    assert written["model.layers.0.mlp.down_proj.weight"].dtype == "bfloat16"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "model.layers.0.mlp.down_proj" in config["quantization_config"]["ignore"]


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    from fmtcli.base.errors import DataError
    from fmtcli.quantize import layout_out

    calls = []
    real = layout_out.engine_codes

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise DataError("disk on fire")
        return real(*args)

    monkeypatch.setattr(layout_out, "engine_codes", failing)
    two = tmp_path / "two.safetensors"
    write_safetensors(str(two), {f"l{i}.proj.weight": np.full((4, 32), i + 1.0, np.float32)
                                 for i in range(3)})
    line = assert_data_error(invoke("quantize", two, "--per", "row", "--out",
                                    tmp_path / "out", "--layout", "compressed-tensors"))
    assert "disk on fire" in line and len(calls) == 2
    assert not (tmp_path / "out").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".fmtcli")] == []


def test_an_empty_directory_is_written_into(tmp_path):
    (tmp_path / "out").mkdir()
    succeeds("quantize", _one(tmp_path), "--per", "row", "--out", tmp_path / "out",
             "--layout", "compressed-tensors")
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors"]


def test_modelopt_writes_its_configs_and_packs_low_nibble_first(tmp_path):
    """ModelOpt does not install here: the folder is decoded from its published definition
    (nvidia-modelopt 0.47.0 ``NVFP4QTensor.dequantize``: the low nibble is the even column,
    ``x = e2m1[code] * weight_scale * weight_scale_2``), exactly in float64, and its configs
    are what ``get_quant_config`` / ``convert_hf_quant_config_format`` write for NVFP4
    weights alone."""
    one = _one(tmp_path, 32, 64)
    succeeds("quantize", one, "--recipe", "nvfp4", "--out", tmp_path / "x.npy")
    succeeds("quantize", one, "--recipe", "nvfp4", "--out", tmp_path / "out", "--layout",
             "modelopt-nvfp4")
    hf = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())
    assert hf["quantization"] == {"quant_algo": "W4A16_NVFP4", "group_size": 16,
                                  "kv_cache_quant_algo": None, "exclude_modules": []}
    quant = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["quant_algo"]) == ("modelopt", "W4A16_NVFP4")
    assert quant["config_groups"]["group_0"]["weights"] == {
        "dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    t = {s.key: s for s in load_safetensors(str(tmp_path / "out" / "model.safetensors"))}
    packed = t["w.weight"].stored()
    scale = t["w.weight_scale"].stored().astype(np.float64)  # float8_e4m3fn values
    second = float(t["w.weight_scale_2"].stored())
    assert t["w.weight_scale_2"].shape == ()
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(32, 64)  # low first
    element = np.where(codes & 8, -1, 1) * E2M1[codes & 7]
    exact = element * np.repeat(scale, 16, axis=1) * second  # float64: exact
    x_q = np.load(tmp_path / "x.npy")
    assert np.all(np.abs(exact - x_q) <= 2 * np.spacing(np.abs(x_q)))


def refused(*args) -> str:
    """``fmt ARGS``, which must be a usage error: its one line."""
    return assert_usage_error(invoke(*args))


@pytest.mark.parametrize("layout, args", [
    ("deepseek-fp8", ["--block", "32"]),
    ("compressed-tensors", ["--recipe", "mxfp8"]),
    ("compressed-tensors", ["--per", "column"]),
    ("compressed-tensors", ["--format", "float8_e5m2", "--per", "row"]),
    ("modelopt-nvfp4", ["--per", "row"]),
])
def test_a_scheme_the_layout_cannot_hold_is_refused(tmp_path, layout, args):
    line = refused("quantize", _one(tmp_path), *args, "--out", tmp_path / "o",
                   "--layout", layout)
    assert "cannot hold" in line and f"--layout {layout}" in line
    assert not (tmp_path / "o").exists()
    if layout == "modelopt-nvfp4":
        assert "--recipe nvfp4" in line


def test_bad_targets_are_refused(tmp_path):
    one = _one(tmp_path)
    layout = ["--layout", "compressed-tensors", "--per", "row"]
    assert "folder" in refused("quantize", one, "--out", tmp_path / "a.safetensors", *layout)
    assert "--out DIR" in refused("quantize", one, *layout)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert "--force" in refused("quantize", one, "--out", busy, *layout)
    assert "notes.txt" in refused("quantize", one, "--out", busy, "--force", *layout)
    assert (busy / "notes.txt").read_text() == "mine"
    folder = _model(tmp_path)
    assert "input" in refused("quantize", folder, "--out", folder, *layout)
    assert "--dask" in refused("quantize", one, "--out", tmp_path / "d", "--dask", "local:1",
                               *layout)


def test_force_replaces_a_folder_fmt_wrote(tmp_path):
    one = _one(tmp_path)
    layout = ["--out", tmp_path / "o", "--layout", "deepseek-fp8", "--tile", "128x128"]
    succeeds("quantize", one, *layout)
    refused("quantize", one, *layout)
    succeeds("quantize", one, *layout, "--force")
    assert sorted(os.listdir(tmp_path / "o")) == ["config.json", "model.safetensors"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".fmtcli")] == []


def test_columns_that_groups_do_not_divide_are_refused(tmp_path):
    one = _one(tmp_path, 8, 40)
    assert "multiple of 16" in refused("quantize", one, "--recipe", "nvfp4", "--out",
                                       tmp_path / "o", "--layout", "compressed-tensors")


def test_nothing_to_quantize_is_refused(tmp_path):
    path = tmp_path / "v.safetensors"
    write_safetensors(str(path), {"norm.weight": np.ones(64, np.float32)})
    assert "no linear weight" in refused("quantize", path, "--per", "row", "--out",
                                         tmp_path / "o", "--layout", "compressed-tensors")


# -- the real library ----------------------------------------------------------------------

def _library_model(folder):
    """A torch model whose modules carry the original folder's tensors by name: Linear for
    2-D *.weight (Embedding for embed_tokens), parameters and buffers for the rest."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Module()
    original = {s.key: s for s in load_safetensors(str(folder / "model.safetensors"))}
    for key, source in original.items():
        *path, leaf = key.split(".")
        parent = model
        for part in path[:-1]:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        if leaf == "weight" and len(source.shape) == 2:
            rows, cols = source.shape
            kind = torch.nn.Embedding(rows, cols) if "embed" in path[-1] else \
                torch.nn.Linear(cols, rows, bias=False)
            parent.add_module(path[-1], kind)
        elif path:
            if not hasattr(parent, path[-1]):
                parent.add_module(path[-1], torch.nn.Module())
            getattr(parent, path[-1]).register_buffer(leaf, torch.zeros(source.shape))
        else:
            model.register_buffer(leaf, torch.zeros(source.shape, dtype=torch.int64))
    return model


def _library_decompress(folder, out):
    """compressed-tensors' own load of a written folder: its config applied to the model,
    compressed, the file's tensors loaded strictly, then decompressed."""
    pytest.importorskip("compressed_tensors")
    pytest.importorskip("transformers")  # compressed-tensors requires it; said, not assumed
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers import CompressedTensorsConfig

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    # the config as the library itself writes it (ModelCompressor.update_config's dump)
    dumped = QuantizationConfig.model_validate(config).model_dump(exclude=["quant_method"])
    for entry in ("config_groups", "format", "ignore", "quantization_status",
                  "kv_cache_scheme", "global_compression_ratio"):
        assert json.loads(json.dumps(dumped[entry], default=str)) == config[entry], entry
    model = _library_model(folder)
    apply_quantization_config(model, QuantizationConfig.model_validate(config))
    compressor = ModelCompressor.from_compression_config(
        CompressedTensorsConfig(**config))
    compressor.compress_model(model)
    stored = load_file(str(out / "model.safetensors"))
    expected = model.state_dict()
    assert set(expected) == set(stored)
    assert {k: v.dtype for k, v in expected.items()} == {k: v.dtype for k, v in stored.items()}
    model.load_state_dict(stored, strict=True)
    compressor.decompress_model(model)
    after = model.state_dict()
    for key in expected:
        if key.endswith(("weight_packed", "weight_scale")) or (
                key.endswith("proj.weight") and expected[key].dtype == torch.float8_e4m3fn):
            weight = key.rsplit(".", 1)[0] + ".weight"
            assert after[weight].dtype in (torch.float32, torch.bfloat16), weight  # decoded
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}, torch


WEIGHTS = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight")


def _engine_values(tmp_path, folder, key, options):
    """fmt's own x_q of one tensor of ``folder`` (``--out x.npy``)."""
    path = tmp_path / f"{key}.npy"
    succeeds("quantize", folder, "--key", key, *options, "--out", path)
    return np.load(path)


@pytest.mark.slow  # importing compressed-tensors and transformers: ~10 s
@pytest.mark.parametrize("options", [["--per", "row"], ["--tile", "128x128"],
                                     ["--per", "tensor"], ["--block", "16"]])
def test_compressed_tensors_decompresses_fp8_to_fmts_values(tmp_path, options):
    folder = _model(tmp_path)
    out = tmp_path / "out"
    succeeds("quantize", folder, *options, "--out", out, "--layout", "compressed-tensors")
    theirs, _ = _library_decompress(folder, out)
    for key in WEIGHTS:
        _, ours = _read(out, key)
        assert np.array_equal(theirs[key], ours), key  # float32 scales: bit for bit
        x_q = _engine_values(tmp_path, folder, key, options)
        gap = np.abs(theirs[key].astype(np.float64) - x_q)
        assert np.all(gap <= np.spacing(np.abs(x_q))), key  # within a float32 ulp
    t = {s.key: s for s in load_safetensors(str(folder / "model.safetensors"))}
    assert np.array_equal(theirs["lm_head.weight"], t["lm_head.weight"].array())


@pytest.mark.slow
def test_compressed_tensors_decompresses_nvfp4_to_the_stored_values(tmp_path):
    folder = _model(tmp_path)
    out = tmp_path / "out"
    succeeds("quantize", folder, "--recipe", "nvfp4", "--out", out, "--layout",
             "compressed-tensors")
    theirs, _ = _library_decompress(folder, out)
    t = {s.key: s for s in load_safetensors(str(out / "model.safetensors"))}
    for m in ("model.layers.0.self_attn.q_proj.", "model.layers.0.mlp.down_proj."):
        packed = t[m + "weight_packed"].stored()
        rows, half = packed.shape
        codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(rows, 2 * half)
        element = np.where(codes & 8, -1, 1) * E2M1[codes & 7]
        scale = np.repeat(t[m + "weight_scale"].stored().astype(np.float64), 16, axis=1)
        exact = element * scale / float(t[m + "weight_global_scale"].stored()[0])
        ulp = np.spacing(np.abs(exact).astype(ml_dtypes.bfloat16)).astype(np.float64)
        assert np.all(np.abs(theirs[m + "weight"] - exact) <= ulp), m  # bfloat16 output
        _, ours = _read(out, m + "weight")
        assert np.all(np.abs(ours - exact) <= np.spacing(np.abs(ours)))
        x_q = _engine_values(tmp_path, folder, m + "weight", ["--recipe", "nvfp4"])
        bf16 = np.spacing(np.abs(x_q).astype(ml_dtypes.bfloat16)).astype(np.float64)
        gap = np.abs(theirs[m + "weight"].astype(np.float64) - x_q)
        assert np.all(gap <= bf16), m  # the engine's values


@pytest.mark.slow
@pytest.mark.parametrize("dtype, options", [("float32", ["--per", "row"]),
                                            ("bfloat16", ["--recipe", "nvfp4"])])
def test_transformers_loads_the_folder_runs_it_and_decodes_fmts_values(tmp_path, dtype,
                                                                        options):
    """A tiny Llama saved by transformers, written by --layout compressed-tensors, loaded
    back by ``AutoModelForCausalLM.from_pretrained`` (compressed-tensors' HF quantizer):
    its first forward decompresses the weights, which are fmt's reading of the folder
    (FP8 float32: bit for bit; NVFP4: bfloat16, within a bfloat16 ulp)."""
    pytest.importorskip("compressed_tensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=100, max_position_embeddings=32,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    kind = getattr(torch, dtype)
    transformers.LlamaForCausalLM(config).to(kind).save_pretrained(tmp_path / "m")
    succeeds("quantize", tmp_path / "m", *options, "--out", tmp_path / "q", "--layout",
             "compressed-tensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q", dtype=kind)
    logits = model(torch.arange(5)[None]).logits
    assert logits.shape == (1, 5, 100) and bool(torch.isfinite(logits).all())
    weights = {k: v for k, v in model.state_dict().items() if k.endswith("proj.weight")}
    assert len(weights) == 7
    for key, weight in weights.items():
        assert weight.dtype == kind, key  # decompressed
        _, ours = _read(tmp_path / "q", key)
        theirs = weight.float().numpy()
        if dtype == "float32":
            assert np.array_equal(theirs, ours), key
        else:
            ulp = np.spacing(np.abs(ours).astype(ml_dtypes.bfloat16)).astype(np.float32)
            assert np.all(np.abs(theirs - ours) <= ulp), key
