"""Tensors a command skips (an int64 ``position_ids``, integer ids): said once, as a ``Note:``
on stderr, listed under ``skipped`` in ``--json``, and a real-looking checkpoint whose first
tensor is skipped still renders at any width (issue 9, item 6).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import invoke, strict_loads
from oracle import write_safetensors


def checkpoint_like_a_real_one(path) -> list[str]:
    """An int64 position_ids first (skipped), then 108 float tensors: 2-D weights, 1-D
    biases and norms, 1-element gains, bf16 and fp16 ones; long dotted keys."""
    rng = np.random.default_rng(6)
    arrays = {"embeddings.position_ids": np.arange(512, dtype=np.int64)[None]}
    shapes = [("attention.self.query.weight", (64, 64)), ("attention.self.query.bias", (64,)),
              ("attention.self.value.weight", (64, 64)), ("attention.output.LayerNorm.bias", (64,)),
              ("intermediate.dense.weight", (256, 64)), ("intermediate.dense.bias", (256,)),
              ("output.dense.weight", (64, 256)), ("output.LayerNorm.weight", (64,)),
              ("extra.scalar_gain", (1,))]
    for layer in range(12):
        for name, shape in shapes:
            x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            if "value" in name:
                x = x.astype(ml_dtypes.bfloat16)
            elif "LayerNorm" in name:
                x = x.astype(np.float16)
            arrays[f"encoder.layer.{layer}.{name}"] = x
    write_safetensors(path, arrays)
    return list(arrays)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("extra", [[], ["--recipe", "mxfp8"]])
def test_a_real_looking_checkpoint_renders_at_any_width(tmp_path, columns, extra):
    keys = checkpoint_like_a_real_one(tmp_path / "model.safetensors")
    result = invoke("quantize", tmp_path / "model.safetensors", *extra, "--top", "20",
                    env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    assert "\u2026" not in result.stdout
    for part in ("encoder.", "attention.", "scalar_gain", "Total", "per-tensor"):
        assert part in result.stdout, part
    assert "position_ids" not in result.stdout  # skipped: said once, on stderr
    assert result.stderr.count("position_ids") == 1
    assert result.stderr.startswith("Note: skipped")
    assert len(keys) == 109


@pytest.mark.slow
def test_a_skipped_tensor_is_in_the_json_skipped_list(tmp_path):
    checkpoint_like_a_real_one(tmp_path / "model.safetensors")
    result = invoke("quantize", tmp_path / "model.safetensors", "--json", "--compare", "none")
    assert result.exit_code == 0
    doc = strict_loads(result.stdout)
    assert doc["skipped"] == [{"source": str(tmp_path / "model.safetensors"),
                               "key": "embeddings.position_ids", "dtype": "int64",
                               "shape": [1, 512],
                               "reason": "dtype int64 is not a real floating-point type"}]
    assert len(doc["tensors"]) == 109 and len(doc["total"]) == 1


def test_quantize_json_without_skipped_tensors_has_an_empty_list():
    doc = strict_loads(invoke("quantize", "--json").stdout)
    assert doc["skipped"] == []


@pytest.mark.parametrize("command", [["scale-search"], ["loss-scale"]])
def test_scale_search_notes_each_skipped_tensor_once(tmp_path, command):
    np.savez(tmp_path / "c.npz", ids=np.arange(8), w=np.linspace(-1, 1, 64, dtype=np.float32))
    result = invoke(*command, tmp_path / "c.npz")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("Note: skipped") == 1 and "ids" in result.stderr
