"""fmt train's --capture: the tensors of chosen steps as safetensors, read by fmt quantize."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from fmtcli.base.errors import UsageError
from fmtcli.train.capture import Capture, step_file
from fmtcli.train.results import TrainSettings

torch = pytest.importorskip("torch")

from cli_helpers import run_fmt  # noqa: E402

from fmtcli.train.loop import train  # noqa: E402
from fmtcli.train.model import build_model  # noqa: E402

TINY = dict(steps=4, layers=1, width=16, heads=2, seq=8, batch=2, log_every=2, warmup=2)


def read_safetensors(path: str) -> dict:
    """A plain reader (the format: 8-byte length, JSON header, raw little-endian bytes)."""
    with open(path, "rb") as handle:
        n = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(n))
        data = handle.read()
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F32"
        lo, hi = entry["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], "<f4").reshape(entry["shape"])
    return out


@pytest.fixture(scope="module")
def captured(text, tmp_path_factory) -> tuple[str, object]:
    folder = str(tmp_path_factory.mktemp("capture") / "steps")  # made by the capture
    result = train(TrainSettings(**TINY, data=text, capture_dir=folder, capture_steps=(1, 3)),
                   ["tensorwise"])
    return folder, result


def test_files_names_and_shapes(captured):
    folder, result = captured
    assert sorted(os.listdir(folder)) == ["step-000001.safetensors", "step-000003.safetensors"]
    assert list(result.captured) == [step_file(folder, 1), step_file(folder, 3)]
    tensors = read_safetensors(step_file(folder, 1))
    tokens = TINY["batch"] * TINY["seq"]
    assert list(tensors)[:3] == ["layers.0.attn.qkv.input", "layers.0.attn.qkv.weight",
                                 "layers.0.attn.qkv.grad_output"]
    assert tensors["layers.0.attn.qkv.input"].shape == (tokens, 16)
    assert tensors["layers.0.attn.qkv.weight"].shape == (48, 16)
    assert tensors["layers.0.attn.qkv.grad_output"].shape == (tokens, 48)
    assert tensors["layers.0.mlp.fc2.input"].shape == (tokens, 64)
    assert len(tensors) == 4 * 3  # four Linears (the FP32 head is not captured)
    assert all(np.all(np.isfinite(a)) for a in tensors.values())
    assert np.count_nonzero(tensors["layers.0.mlp.fc1.grad_output"]) > 0


def test_step_one_weights_are_the_initial_model(captured):
    folder, result = captured
    model = build_model(result.settings, result.settings.seed)
    tensors = read_safetensors(step_file(folder, 1))
    for name, p in model.named_parameters():
        if name.endswith(".weight") and name.rpartition(".")[0] + ".input" in tensors:
            assert np.array_equal(tensors[name], p.detach().numpy()), name
    later = read_safetensors(step_file(folder, 3))
    assert not np.array_equal(later["layers.0.mlp.fc1.weight"],
                              tensors["layers.0.mlp.fc1.weight"])  # trained in between


def test_existing_files_refused_before_training(captured, text):
    folder, _ = captured
    before = os.stat(step_file(folder, 1)).st_mtime_ns
    with pytest.raises(UsageError, match="exists.*force"):
        train(TrainSettings(**TINY, data=text, capture_dir=folder, capture_steps=(1,)), [])
    assert os.stat(step_file(folder, 1)).st_mtime_ns == before
    Capture.plan(folder, (1,), force=True)  # with force: accepted


def test_bad_folders(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        Capture.plan(str(afile), (1,))
    with pytest.raises(UsageError, match="parent"):
        Capture.plan(str(tmp_path / "no" / "such"), (1,))
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_fmt_quantize_reads_a_captured_file(captured):
    folder, _ = captured
    result = run_fmt("quantize", step_file(folder, 3), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    names = [t["key"] for t in doc["tensors"]]
    assert "layers.0.mlp.fc1.grad_output" in names and "layers.0.attn.qkv.input" in names
