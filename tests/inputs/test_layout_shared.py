"""The pieces the layout readers and writers share, defined once (``inputs.layouts.base``):
the config-file reader ``json_object`` behind ``layouts.read_config``, ModelOpt's
``hf_quant_config`` and ``fmt quantize --layout``'s copy of the input's config.json.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import json_of

from fmtcli.engine.writers import write_safetensors
from fmtcli.inputs import layouts
from fmtcli.inputs.layouts import base
from fmtcli.inputs.layouts.modelopt_nvfp4 import hf_quant_config

DEEP = "[" * 900 + "]" * 900


@pytest.mark.parametrize("text, expected", [
    ('{"a": 1}', {"a": 1}), ("[1, 2]", None), ("not json", None), ("\xff", None),
    ('{"a": ' + DEEP + "}", None)])
def test_json_object_is_a_dict_or_none(tmp_path, text, expected):
    (tmp_path / "c.json").write_text(text, encoding="latin-1")
    assert base.json_object(str(tmp_path), "c.json") == expected
    assert base.json_object(str(tmp_path), "missing.json") is None
    assert base.json_object(None, "c.json") is None


def test_a_config_over_the_size_limit_is_no_config(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"a": 1}}))
    assert layouts.read_config(str(tmp_path)) == {"a": 1}
    monkeypatch.setattr(base, "MAX_CONFIG_BYTES", 10)
    assert layouts.read_config(str(tmp_path)) is None


def test_every_config_reader_refuses_a_deep_config(tmp_path):
    (tmp_path / "config.json").write_text('{"quantization_config": {"x": ' + DEEP + "}}")
    (tmp_path / "hf_quant_config.json").write_text('{"quantization": {"x": ' + DEEP + "}}")
    assert layouts.read_config(str(tmp_path)) is None
    assert hf_quant_config(str(tmp_path)) is None
    (tmp_path / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "NVFP4"}}')
    assert hf_quant_config(str(tmp_path)) == {"quant_algo": "NVFP4"}


def test_layout_out_copies_the_input_config_through_the_same_reader(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(str(folder / "model.safetensors"),
                      {"l.proj.weight": np.linspace(-1, 1, 64 * 32, dtype=np.float32)
                       .reshape(64, 32)})
    (folder / "config.json").write_text('{"model_type": "llama", "deep": ' + DEEP + "}")
    json_of("quantize", folder, "--per", "row", "--out", tmp_path / "out", "--layout",
            "compressed-tensors")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "model_type" not in written and written["quantization_config"]["format"] == \
        "naive-quantized"


def test_fp4_and_e8m0_values_are_the_definitions_bit_for_bit():
    """OCP MX v1.0: E2M1 (section 5.3.3: sign, 2 exponent bits bias 1, 1 mantissa bit) and
    E8M0 (section 5.4.1: 2^(b - 127), 0xFF NaN), typed here from the specification."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = np.array(e2m1 + [-v for v in e2m1], dtype=np.float32)
    assert base.FP4_VALUES.dtype == np.float32
    assert base.FP4_VALUES.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    codes = np.arange(256, dtype=np.uint8)
    got = base.e8m0_values(codes.reshape(16, 16))
    assert got.shape == (16, 16) and got.dtype == np.float32
    want = np.array([2.0 ** (b - 127) for b in range(255)], dtype=np.float32)
    assert got.reshape(-1)[:255].view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.isnan(got.reshape(-1)[255])
    packed = np.array([[0x21, 0xF8]], dtype=np.uint8)  # low nibble first: 0.5, 1 | -0, -6
    assert base.unpack_fp4(packed).tolist() == [[0.5, 1.0, -0.0, -6.0]]
    assert base.unpack_fp4(packed, low_first=False).tolist() == [[1.0, 0.5, -6.0, -0.0]]


def _deepseek_shards(folder):
    """A sharded DeepSeek-V3 FP8 checkpoint (README_WEIGHTS.md: float8_e4m3fn weight,
    float32 weight_scale_inv per 128x128 block) with its config.json and index."""
    rng = np.random.default_rng(2)
    codes = rng.standard_normal((256, 256)).astype(ml_dtypes.float8_e4m3fn)
    shard = "model-00001-of-00001.safetensors"
    write_safetensors(str(folder / shard), {"l.weight": codes,
                                            "l.weight_scale_inv": np.full((2, 2), 0.5,
                                                                          np.float32)})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"l.weight": shard, "l.weight_scale_inv": shard}}))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
        "activation_scheme": "dynamic"}}))


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_an_index_reads_its_folders_config_wherever_it_is_given(tmp_path, monkeypatch,
                                                                  where):
    """load_path, load_inputs and fmt audit ask one function for the config's folder
    (``tensors.config_folder``): an index named bare in the working directory counts."""
    from fmtcli.inputs.tensors import config_folder, load_inputs, load_path

    _deepseek_shards(tmp_path)
    if where == "here":
        monkeypatch.chdir(tmp_path)
    index = "model.safetensors.index.json" if where == "here" else str(
        tmp_path / "model.safetensors.index.json")
    assert config_folder(index) == ("." if where == "here" else str(tmp_path))
    assert config_folder("-") is None and config_folder(str(tmp_path)) == str(tmp_path)
    for sources in (load_path(index), load_inputs([index])):
        (source,) = sources
        assert source.quantized.facts["config_scheme"] == "fp8"
