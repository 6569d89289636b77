"""``.ckpt`` files: PyTorch Lightning's and Stable Diffusion's training checkpoints.

A torch.save dict ``{"state_dict": {...}, "epoch", "global_step", "optimizer_states",
"lr_schedulers", "hyper_parameters"}``, read with ``torch.load(weights_only=True)`` only: the
weights under ``state_dict`` (keys as the same file read as ``.pt`` names them), and one
``Note:`` naming what else it holds (Adam's moments are not weights); a ``.ckpt`` without a
``state_dict`` is read as ``.pt``; a class safe loading refuses (Lightning's
``AttributeDict``), a damaged file and an empty one are one ``Error:`` line; without torch
the line a ``.pt`` file gets.
"""

from __future__ import annotations

import importlib.util
import json
import warnings

import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_usage_error,
    invoke,
    json_of,
    run_fmt,
    strict_loads,
)

from fmtcli.inputs.files import TABLE, TENSOR_SUFFIXES
from fmtcli.inputs.tensors import load_inputs
from fmtcli.inputs.torchfile import TrainingStateNote, load_ckpt, load_torch

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="writing a .ckpt needs torch")
EXACT_KEYS = ("count", "nonzero", "flushed", "saturated", "max_abs_error", "median_rel_error",
              "p99_rel_error", "rmse", "sqnr_db", "scales")


class AttributeDict(dict):
    """A stand-in for Lightning's ``hyper_parameters`` class: any class safe loading lacks."""


def weights(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"model.encoder.weight": rng.standard_normal((24, 64)).astype(np.float32),
            "model.encoder.bias": rng.standard_normal(24).astype(np.float32),
            "model.head.weight": (rng.standard_normal((8, 24)) * 30).astype(np.float32),
            "model.norm.running_var": rng.random(24).astype(np.float32)}


def lightning_dict(arrays: dict[str, np.ndarray], hyper=None) -> dict:
    """A checkpoint as Lightning's Trainer saves one: weights, Adam's state, counters."""
    import torch

    state = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    moments = {i: {"step": torch.tensor(7.0), "exp_avg": torch.zeros_like(t),
                   "exp_avg_sq": torch.ones_like(t)} for i, t in enumerate(state.values())}
    return {"epoch": 2, "global_step": 140, "pytorch-lightning_version": "2.4.0",
            "state_dict": state,
            "loops": {"fit_loop": {"epoch_progress": {"total": {"completed": 2}}}},
            "callbacks": {}, "optimizer_states": [{"state": moments, "param_groups": [
                {"lr": 1e-3, "betas": (0.9, 0.999), "params": list(moments)}]}],
            "lr_schedulers": [{"last_epoch": 140, "_last_lr": [1e-3]}],
            "hyper_parameters": {"lr": 1e-3, "width": 64} if hyper is None else hyper}


def write_ckpt(path, obj) -> None:
    import torch

    torch.save(obj, path)


def stats_of(doc: dict) -> dict:
    return {t["key"]: [{k: s[k] for k in EXACT_KEYS} for s in t["schemes"]]
            for t in doc["tensors"]}


def test_ckpt_is_in_the_suffix_table_and_read_in_folders():
    assert TABLE[".ckpt"].loader is load_ckpt
    assert ".ckpt" in TENSOR_SUFFIXES


@needs_torch
def test_a_lightning_ckpt_through_fmt_quantize_is_its_state_dict(tmp_path):
    arrays = weights()
    write_ckpt(tmp_path / "epoch=2-step=140.ckpt", lightning_dict(arrays))
    np.savez(tmp_path / "same.npz", **{f"state_dict.{k}": v for k, v in arrays.items()})
    done = run_fmt("quantize", tmp_path / "epoch=2-step=140.ckpt", "--format", "e4m3fn",
                   "--json")
    assert done.returncode == 0, done.stderr
    doc = strict_loads(done.stdout.decode())
    assert [t["key"] for t in doc["tensors"]] == [f"state_dict.{k}" for k in arrays]
    same = json_of("quantize", tmp_path / "same.npz", "--format", "e4m3fn")  # in-process
    assert stats_of(doc) == stats_of(same)
    assert doc["total"] == same["total"]  # the buffer is left out of both totals alike
    notes = [line for line in done.stderr.decode().splitlines() if "training checkpoint" in line]
    assert len(notes) == 1 and notes[0].startswith("Note: ")
    assert "not read: 'optimizer_states' (12 tensors), " in notes[0]  # 4 x (step, exp_avg, _sq)
    for left in ("'epoch'", "'global_step'", "'lr_schedulers'", "'hyper_parameters'"):
        assert left in notes[0]
    assert "TrainingStateNote" not in notes[0]  # fmtcli's own note, not a warning
    assert "Traceback" not in done.stderr.decode()


@needs_torch
def test_a_lightning_ckpt_through_the_python_api(tmp_path):
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    arrays = weights()
    write_ckpt(tmp_path / "last.ckpt", lightning_dict(arrays))
    with pytest.warns(TrainingStateNote, match="optimizer_states") as caught:
        sources = load_inputs([str(tmp_path / "last.ckpt")])
    assert len([w for w in caught if w.category is TrainingStateNote]) == 1
    assert [s.key for s in sources] == [f"state_dict.{k}" for k in arrays]
    for source, array in zip(sources, arrays.values()):
        np.testing.assert_array_equal(np.asarray(source.array()), array)
    result = quantize(sources, [build_scheme(recipe="mxfp8")])
    assert result.total[0].count == sum(a.size for k, a in arrays.items()
                                        if not k.endswith("running_var"))


@needs_torch
def test_the_same_file_named_pt_reads_every_tensor(tmp_path):
    write_ckpt(tmp_path / "m.ckpt", lightning_dict(weights()))
    (tmp_path / "m.pt").write_bytes((tmp_path / "m.ckpt").read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # .pt says nothing
        every = [s.key for s in load_torch(str(tmp_path / "m.pt"))]
    assert "optimizer_states.0.state.0.exp_avg" in every and len(every) == 4 + 12


@needs_torch
def test_ckpt_files_in_a_folder_are_read_and_named_by_file(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    write_ckpt(folder / "epoch=0-step=70.ckpt", lightning_dict(weights(1)))
    write_ckpt(folder / "last.ckpt", lightning_dict(weights(2)))
    result = invoke("quantize", folder, "--format", "e4m3fn", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["tensors"]) == 8
    assert {t["source"].rsplit("/", 1)[-1] for t in doc["tensors"]} == {
        "epoch=0-step=70.ckpt", "last.ckpt"}
    assert result.stderr.count("training checkpoint") == 2  # one note per file


@needs_torch
def test_a_ckpt_without_state_dict_is_read_as_pt(tmp_path):
    import torch

    arrays = weights()
    write_ckpt(tmp_path / "v1-5.ckpt", {k: torch.from_numpy(v) for k, v in arrays.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sources = load_ckpt(str(tmp_path / "v1-5.ckpt"))
    assert [s.key for s in sources] == list(arrays)


@needs_torch
def test_a_class_safe_loading_refuses_is_one_error_line_with_a_way_out(tmp_path):
    write_ckpt(tmp_path / "hp.ckpt", lightning_dict(weights(), AttributeDict(lr=1e-3)))
    done = run_fmt("quantize", tmp_path / "hp.ckpt")
    stderr = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b""
    assert stderr.count("\n") == 1 and stderr.startswith("Error: ")
    assert "AttributeDict" in stderr and "nothing in the file was executed" in stderr
    assert "['state_dict']" in stderr and "Traceback" not in stderr


def hostile(tmp_path, name: str):
    good = tmp_path / "good.ckpt"
    if name in ("truncated", "half-pickle"):
        import torch

        torch.save(lightning_dict(weights()), good, _use_new_zipfile_serialization=name
                   == "truncated")
    path = tmp_path / f"{name}.ckpt"
    if name == "empty":
        path.write_bytes(b"")
    elif name == "text":
        path.write_text("epoch: 3\nstate_dict: {}\n")
    elif name == "zeros":
        path.write_bytes(bytes(4096))
    else:
        data = good.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    return path


HOSTILE = {"empty": "empty file", "text": "neither a torch zip archive nor a pickle",
           "zeros": "not a readable torch checkpoint",
           "truncated": "a damaged or truncated torch zip archive",
           "half-pickle": "not a readable torch checkpoint"}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_ckpt_is_one_error_line(tmp_path, name):
    if not HAS_TORCH and name in ("truncated", "half-pickle"):
        pytest.skip("writing a .ckpt needs torch")
    path = hostile(tmp_path, name)
    result = invoke("quantize", path)
    if HAS_TORCH:
        assert_data_error(result, f"{name}.ckpt", HOSTILE[name])
    else:
        assert_usage_error(result, f"{name}.ckpt", "needs torch")


@pytest.mark.skipif(HAS_TORCH, reason="checks the message without torch")
def test_without_torch_a_ckpt_gets_the_line_a_pt_file_gets(tmp_path):
    lines = {}
    for kind in (".pt", ".ckpt"):
        (tmp_path / f"m{kind}").write_bytes(b"PK\x03\x04 not read")
        done = run_fmt("quantize", tmp_path / f"m{kind}")
        assert done.returncode == 2 and "Traceback" not in done.stderr.decode()
        lines[kind] = done.stderr.decode().replace(f"m{kind}", "FILE")
    assert lines[".pt"] == lines[".ckpt"]
    assert "needs torch" in lines[".ckpt"] and "pip install 'fmtcli[torch]'" in lines[".ckpt"]
