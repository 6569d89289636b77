"""Real checkpoint layouts: a Hugging Face model folder given as FILE is one checkpoint.

Sharded safetensors and .bin folders are read in their index's order, each shard once;
config/tokenizer JSON and text beside tensor files are not read as tensors; the index's
faults are one error line; and a real small public checkpoint (MTCNN's weights as the
facenet-pytorch wheel ships them) reads like the same tensors saved to .npz.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_usage_error, invoke, quantize_json, succeeds
from inputs import facenet_weights
from oracle import heavy_tailed, write_safetensors

import fmtcli.inputs.safetensorsfile
from fmtcli.inputs.checkpoints import CheckpointNote
from fmtcli.inputs.tensors import load_inputs, load_path

EXACT_KEYS = ("count", "nonzero", "flushed", "saturated", "max_abs_error", "median_rel_error",
              "p99_rel_error", "rmse", "sqnr_db", "bias", "scales")

# a small model: two shards, each written in its own (header) order
SHARDS = {
    "model-00001-of-00002.safetensors": ["encoder.layer.0.weight", "embeddings.weight",
                                         "encoder.layer.0.bias"],
    "model-00002-of-00002.safetensors": ["encoder.layer.1.weight", "head.weight"],
}
# the index's order: neither the shards' order nor any shard's header order
INDEX_ORDER = ["head.weight", "embeddings.weight", "encoder.layer.1.weight",
               "encoder.layer.0.bias", "encoder.layer.0.weight"]
SIDE_FILES = {
    "config.json": json.dumps({"architectures": ["BertModel"], "hidden_size": 64}),
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}),
    "tokenizer_config.json": json.dumps({"do_lower_case": True}),
    "special_tokens_map.json": json.dumps({"cls_token": "[CLS]"}),
    "generation_config.json": "{}",
    "vocab.txt": "[PAD]\n[UNK]\nhello\n",
    "README.md": "# a model card",
}


def model_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    shapes = {"embeddings.weight": (96, 64), "encoder.layer.0.weight": (64, 64),
              "encoder.layer.0.bias": (64,), "encoder.layer.1.weight": (64, 192),
              "head.weight": (10, 64)}
    return {name: heavy_tailed(rng, shape) for name, shape in shapes.items()}


def write_index(path: Path, weight_map: dict) -> Path:
    path.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return path


def sharded_folder(folder: Path, side_files: bool = True) -> Path:
    """A save_pretrained-shaped folder: two shards, their index (in INDEX_ORDER), and the
    JSON/text files a real one has beside its weights."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = model_tensors()
    for shard, names in SHARDS.items():
        write_safetensors(folder / shard, {name: arrays[name] for name in names})
    shard_of = {name: shard for shard, names in SHARDS.items() for name in names}
    write_index(folder / "model.safetensors.index.json",
                {name: shard_of[name] for name in INDEX_ORDER})
    if side_files:
        for name, text in SIDE_FILES.items():
            (folder / name).write_text(text)
    return folder


def stats_equal(a: dict, b: dict) -> None:
    assert a["label"] == b["label"]
    for key in EXACT_KEYS:
        assert a[key] == b[key], (a["label"], key, a[key], b[key])


def assert_same_statistics(doc: dict, reference: dict) -> None:
    """Every tensor of ``doc`` has the statistics of the same-named tensor of ``reference``,
    and the totals agree."""
    by_key = {t["key"]: t for t in reference["tensors"]}
    for tensor in doc["tensors"]:
        for mine, theirs in zip(tensor["schemes"], by_key[tensor["key"]]["schemes"]):
            stats_equal(mine, theirs)
    for mine, theirs in zip(doc["total"], reference["total"]):
        stats_equal(mine, theirs)


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` by a wrapper that records its first argument."""
    calls, original = [], getattr(owner, name)

    def counted(path, *args, **kwargs):
        calls.append(os.path.basename(str(path)))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


# -- sharded safetensors ------------------------------------------------------------------------

def test_a_sharded_folder_gives_its_tensors_in_the_index_order_reading_each_shard_once(
        tmp_path, monkeypatch):
    folder = sharded_folder(tmp_path / "model")
    headers = count_calls(monkeypatch, fmtcli.inputs.safetensorsfile, "read_safetensors_header")
    doc = quantize_json(folder)
    assert [t["key"] for t in doc["tensors"]] == INDEX_ORDER
    assert sorted(headers) == sorted(SHARDS)  # each shard's header read once, nothing else
    sources = {t["key"]: os.path.basename(t["source"]) for t in doc["tensors"]}
    assert sources == {name: shard for shard, names in SHARDS.items() for name in names}


@pytest.mark.slow
def test_a_sharded_folder_has_the_statistics_of_the_same_tensors_in_one_file(tmp_path):
    folder = sharded_folder(tmp_path / "model")
    arrays = model_tensors()
    single = write_safetensors(tmp_path / "single.safetensors",
                               {name: arrays[name] for name in INDEX_ORDER})
    for options in [(), ("--block", "32")]:
        assert_same_statistics(quantize_json(folder, *options), quantize_json(single, *options))


def test_the_index_given_as_file_reads_the_sharded_checkpoint(tmp_path):
    folder = sharded_folder(tmp_path / "model")
    sources = load_path(str(folder / "model.safetensors.index.json"))
    assert [s.key for s in sources] == INDEX_ORDER


def test_a_snapshot_of_the_hub_cache_whose_files_are_links_to_blobs_is_read(tmp_path):
    source = sharded_folder(tmp_path / "saved")
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, path in enumerate(sorted(source.iterdir())):
        blob = blobs / f"{number:040x}"  # blobs are named by hash, without a suffix
        path.rename(blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    assert [s.key for s in load_inputs([str(snapshot)])] == INDEX_ORDER


def test_config_and_tokenizer_json_beside_model_safetensors_are_not_read_as_tensors(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    arrays = model_tensors()
    write_safetensors(folder / "model.safetensors", arrays)
    for name, text in SIDE_FILES.items():
        (folder / name).write_text(text)
    pooling = folder / "1_Pooling"  # sentence-transformers keep a config in a subfolder
    pooling.mkdir()
    (pooling / "config.json").write_text(json.dumps({"word_embedding_dimension": 64}))
    result = succeeds("quantize", folder, "--block", "64", "--json")  # (no short blocks)
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert [t["key"] for t in doc["tensors"]] == list(arrays)
    assert {os.path.basename(t["source"]) for t in doc["tensors"]} == {"model.safetensors"}


def test_text_files_are_read_from_a_folder_that_holds_no_tensor_files(tmp_path):
    (tmp_path / "a.csv").write_text("1,2\n3,4\n")
    (tmp_path / "b.json").write_text("[0.5, 0.25, 8]")
    doc = quantize_json(tmp_path)
    assert [os.path.basename(t["source"]) for t in doc["tensors"]] == ["a.csv", "b.json"]


def test_text_files_beside_tensor_files_in_a_plain_folder_are_not_read(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 8), np.float32))
    (tmp_path / "meta.json").write_text(json.dumps({"step": 100}))
    (tmp_path / "notes.txt").write_text("trained for 3 epochs")
    doc = quantize_json(tmp_path)
    assert [os.path.basename(t["source"]) for t in doc["tensors"]] == ["w.npy"]
    (tmp_path / "x.json").write_text("[1.5, 2.5]")  # given as FILE, text is numbers
    doc = quantize_json(tmp_path / "w.npy", tmp_path / "x.json")
    assert [t["shape"] for t in doc["tensors"]] == [[4, 8], [2]]


def test_a_tensor_a_shard_holds_but_the_index_does_not_name_is_listed_as_skipped(tmp_path):
    folder = sharded_folder(tmp_path / "model", side_files=False)
    arrays = model_tensors()
    names = SHARDS["model-00002-of-00002.safetensors"]
    write_safetensors(folder / "model-00002-of-00002.safetensors",
                      {**{name: arrays[name] for name in names},
                       "stray.weight": np.ones(8, np.float32)})
    result = succeeds("quantize", folder, "--json")
    doc = json.loads(result.stdout)
    assert [t["key"] for t in doc["tensors"]] == [*INDEX_ORDER, "stray.weight"]
    assert doc["tensors"][-1]["skipped"] == "not named in model.safetensors.index.json"
    assert "stray.weight" in result.stderr and "not named in" in result.stderr


# -- the index's faults: one error line naming the index -----------------------------------------

def _drop_shard(folder: Path) -> None:
    (folder / "model-00002-of-00002.safetensors").unlink()


def _name_a_missing_tensor(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    write_index(folder / "model.safetensors.index.json", index["weight_map"])


def _corrupt_json(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')


def _shard_outside(folder: Path) -> None:
    arrays = model_tensors()
    write_safetensors(folder.parent / "x.safetensors", {"head.weight": arrays["head.weight"]})
    write_index(folder / "model.safetensors.index.json", {"head.weight": "../x.safetensors"})


def _absolute_shard(folder: Path) -> None:
    arrays = model_tensors()
    target = write_safetensors(folder.parent / "y.safetensors",
                               {"head.weight": arrays["head.weight"]})
    write_index(folder / "model.safetensors.index.json", {"head.weight": str(target)})


def _duplicate_name(folder: Path) -> None:
    shard = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(
        f'{{"weight_map": {{"embeddings.weight": "{shard}", "embeddings.weight": "{shard}"}}}}')


def _no_weight_map(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')


def _shard_of_the_other_format(folder: Path) -> None:
    write_index(folder / "model.safetensors.index.json", {"head.weight": "pytorch_model.bin"})


INDEX_FAULTS = {
    "missing-shard": (_drop_shard, "model-00002-of-00002.safetensors", "is missing"),
    "tensor-not-in-its-shard": (_name_a_missing_tensor, "ghost.weight", "not in its shard"),
    "corrupt-json": (_corrupt_json, "corrupt index"),
    "shard-outside-the-folder": (_shard_outside, "../x.safetensors", "refused"),
    "absolute-shard-path": (_absolute_shard, "refused"),
    "duplicate-name": (_duplicate_name, "appears twice"),
    "no-weight-map": (_no_weight_map, "weight_map"),
    "shard-of-the-other-format": (_shard_of_the_other_format, "not a .safetensors file"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", INDEX_FAULTS, ids=list(INDEX_FAULTS))
def test_a_faulty_index_is_one_error_line_naming_it(tmp_path, fault):
    folder = sharded_folder(tmp_path / "model")
    make, *fragments = INDEX_FAULTS[fault]
    make(folder)
    assert_data_error(invoke("quantize", folder, "--json"), "model.safetensors.index.json",
                      *fragments)


# -- .bin checkpoints (torch) ---------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def save_state(torch, path: Path, arrays: dict) -> None:
    torch.save({name: torch.from_numpy(arrays[name].copy()) for name in arrays}, path)


def test_a_sharded_bin_folder_reads_in_the_index_order_each_shard_loaded_once(
        tmp_path, monkeypatch):
    torch = _torch()
    folder = tmp_path / "model"
    folder.mkdir()
    arrays = model_tensors()
    shard_of = {}
    for number, names in enumerate(SHARDS.values(), 1):
        shard = f"pytorch_model-0000{number}-of-00002.bin"
        save_state(torch, folder / shard, {name: arrays[name] for name in names})
        shard_of.update(dict.fromkeys(names, shard))
    write_index(folder / "pytorch_model.bin.index.json",
                {name: shard_of[name] for name in INDEX_ORDER})
    (folder / "config.json").write_text(SIDE_FILES["config.json"])
    loads = count_calls(monkeypatch, torch, "load")
    doc = quantize_json(folder)
    assert [t["key"] for t in doc["tensors"]] == INDEX_ORDER
    assert sorted(loads) == sorted(set(shard_of.values()))
    np.savez(tmp_path / "same.npz", **arrays)
    reference = quantize_json(tmp_path / "same.npz")
    assert_same_statistics(doc, reference)


def test_a_single_pytorch_model_bin_in_a_folder_or_given_as_file(tmp_path):
    torch = _torch()
    folder = tmp_path / "model"
    folder.mkdir()
    arrays = model_tensors()
    save_state(torch, folder / "pytorch_model.bin", arrays)
    (folder / "config.json").write_text(SIDE_FILES["config.json"])
    (folder / "training_args.bin").write_bytes(b"\x80\x04 a pickle of TrainingArguments")
    for path in (folder, folder / "pytorch_model.bin"):
        doc = quantize_json(path)
        assert [t["key"] for t in doc["tensors"]] == list(arrays)


def test_safetensors_are_read_and_the_bin_twin_is_named_in_a_note(tmp_path):
    torch = _torch()
    folder = tmp_path / "model"
    folder.mkdir()
    arrays = model_tensors()
    write_safetensors(folder / "model.safetensors", arrays)
    save_state(torch, folder / "pytorch_model.bin", arrays)
    (folder / "config.json").write_text(SIDE_FILES["config.json"])
    result = succeeds("quantize", folder, "--block", "64", "--json")  # (no short blocks)
    doc = json.loads(result.stdout)
    assert {os.path.basename(t["source"]) for t in doc["tensors"]} == {"model.safetensors"}
    assert len(doc["tensors"]) == len(arrays)
    notes = result.stderr.splitlines()
    assert len(notes) == 1 and notes[0].startswith("Note: ")
    assert "pytorch_model.bin" in notes[0] and "not read" in notes[0]
    assert not notes[0].endswith("(CheckpointNote)")  # fmtcli's own note, not a warning
    with pytest.warns(CheckpointNote, match="pytorch_model.bin"):
        load_inputs([str(folder)])


def test_optimizer_state_beside_the_model_is_not_read(tmp_path):
    torch = _torch()
    folder = tmp_path / "checkpoint-500"
    folder.mkdir()
    arrays = model_tensors()
    write_safetensors(folder / "model.safetensors", arrays)
    torch.save({"state": {0: {"exp_avg": torch.ones(4)}}}, folder / "optimizer.pt")
    (folder / "rng_state.pth").write_bytes(b"\x80\x04 numpy state, refused if read")
    (folder / "trainer_state.json").write_text("{}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sources = load_inputs([str(folder)])
    assert [s.key for s in sources] == list(arrays)
    (note,) = [str(w.message) for w in caught if w.category is CheckpointNote]
    assert "optimizer.pt" in note and "rng_state.pth" in note


def test_a_bin_file_in_a_plain_folder_is_not_read(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 8), np.float32))
    (tmp_path / "blob.bin").write_bytes(b"not a checkpoint")
    doc = quantize_json(tmp_path)
    assert [os.path.basename(t["source"]) for t in doc["tensors"]] == ["w.npy"]


def test_an_explicit_bin_that_is_not_a_checkpoint_is_one_error_line(tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"1 2 3")
    result = invoke("quantize", tmp_path / "blob.bin")
    if importlib.util.find_spec("torch") is None:  # a missing optional package: exit 2
        assert_usage_error(result, "blob.bin", "needs torch", "pip install 'fmtcli[torch]'")
    else:
        assert_data_error(result, "blob.bin", "not a readable torch checkpoint")


# -- a real public checkpoint ---------------------------------------------------------------------

@pytest.mark.parametrize("net", ["pnet", "rnet", "onet"])
def test_mtcnn_weights_from_the_facenet_pytorch_wheel_read_like_the_same_tensors_in_npz(
        tmp_path, net):
    torch = _torch()
    path = facenet_weights() / f"{net}.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    doc = quantize_json(path)
    assert [t["key"] for t in doc["tensors"]] == list(state)
    assert all(t["dtype"] == "float32" and t["skipped"] is None for t in doc["tensors"])
    np.savez(tmp_path / f"{net}.npz", **{name: value.numpy() for name, value in state.items()})
    reference = quantize_json(tmp_path / f"{net}.npz")
    assert [t["shape"] for t in doc["tensors"]] == [t["shape"] for t in reference["tensors"]]
    assert_same_statistics(doc, reference)


@pytest.mark.parametrize("name, what", [("model.safetensors.index.json", "corrupt index"),
                                        ("model.safetensors", "corrupt .safetensors header")])
def test_json_nested_too_deep_is_one_plain_error_line(tmp_path, name, what):
    """Index and safetensors header share one JSON reader (textparse.load_json): deep
    nesting is refused before parsing, in one line with a single colon."""
    text = "[" * 100 + "]" * 100
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(text)
    else:
        raw = text.encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    line = assert_data_error(invoke("quantize", path))
    assert f"{what}: JSON nested more than 64 levels deep" in line and "::" not in line
