"""A tensor's name among many (issue 22, item 6 and the "one screen" papercut): in a folder
whose files repeat a tensor name, a tensor is its file and its name -- ``fmt compare``
pairs by both, every table shows ``file:key`` where names repeat, ``--key`` takes that
name, JSON carries the file; a prefix every name shares (``model_state_dict.``) is said
once above a table instead of on every row; a checkpoint summary stays about a screen."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_fits, invoke, json_of, run_fmt, succeeds
from safetensors.numpy import save_file

from fmtcli.inputs.tensors import TensorInfo

RNG = np.random.default_rng(22)


def weights(*shape, scale=0.05) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def dup(tmp_path):
    """The issue's folder: two files, each holding a different 64x64 ``w``."""
    folder = tmp_path / "dup"
    folder.mkdir()
    save_file({"w": weights(64, 64)}, str(folder / "a.safetensors"))
    save_file({"w": weights(64, 64), "only_b": weights(8)}, str(folder / "b.safetensors"))
    return folder


def mpnn_state(hidden: int = 16) -> dict[str, np.ndarray]:
    """A LigandMPNN-shaped state dict: every name under ``model_state_dict.``."""
    state = {"features.edge_embedding.weight": weights(hidden, 40),
             "W_out.weight": weights(21, hidden), "W_out.bias": weights(21, scale=0.01)}
    for side, layers in (("encoder_layers", 3), ("decoder_layers", 3)):
        for layer in range(layers):
            for part in ("W1", "W2", "W3", "dense.W_in", "dense.W_out"):
                state[f"{side}.{layer}.{part}.weight"] = weights(hidden, hidden)
                state[f"{side}.{layer}.{part}.bias"] = weights(hidden, scale=0.01)
            state[f"{side}.{layer}.norm1.weight"] = 1 + weights(hidden)
    return {f"model_state_dict.{k}": v for k, v in state.items()}


@pytest.fixture
def mpnn(tmp_path):
    """Five checkpoints of the same model in one folder (as LigandMPNN ships them)."""
    folder = tmp_path / "mpnn"
    folder.mkdir()
    for name in ("ligandmpnn_v_32_005", "proteinmpnn_v_48_002", "proteinmpnn_v_48_020",
                 "solublempnn_v_48_010", "solublempnn_v_48_030"):
        save_file(mpnn_state(), str(folder / f"{name}.safetensors"))
    return folder


def lines_of(*args, columns: int = 80) -> list[str]:
    out = succeeds(*args, env={"COLUMNS": str(columns)}).stdout
    assert_fits(out, columns)
    return out.splitlines()


# -- fmt compare: pairs by file and name ------------------------------------------------------

def test_compare_a_folder_with_itself_pairs_each_file_with_itself(dup):
    """The issue's case: both w's compared with the other file's w gave -3.06 dB."""
    doc = json_of("compare", dup, dup)
    assert [t["name"] for t in doc["tensors"]] == ["a.safetensors:w", "only_b",
                                                   "b.safetensors:w"]
    assert all(t["sqnr_db"] == "inf" and t["differ"] == 0 for t in doc["tensors"])
    assert doc["total"]["sqnr_db"] == "inf"
    first = doc["tensors"][0]
    assert first["key"] == "w"
    assert first["ref_source"].endswith("a.safetensors")
    assert first["test_source"].endswith("a.safetensors")


def test_compare_a_folder_with_its_copy_pairs_files_by_relative_path(dup, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in ("a", "b"):
        (copy / f"{f}.safetensors").write_bytes((dup / f"{f}.safetensors").read_bytes())
    doc = json_of("compare", dup, copy)
    assert all(t["sqnr_db"] == "inf" for t in doc["tensors"])
    assert doc["tensors"][2]["test_source"] == str(copy / "b.safetensors")


@pytest.mark.slow
def test_compare_one_file_with_the_folder_pairs_its_own_file(dup):
    result = run_fmt("compare", dup / "a.safetensors", dup, "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert [t["name"] for t in doc["tensors"]] == ["a.safetensors:w"]
    assert doc["tensors"][0]["sqnr_db"] == "inf"
    assert doc["only_in_test"] == ["only_b", "b.safetensors:w"]
    assert "only in TEST (not compared): 'only_b', 'b.safetensors:w'" in \
        result.stderr.decode()


def test_compare_with_nothing_in_common_says_names_are_matched_by_file(dup, tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"w": weights(64, 64)}, str(other))
    assert_data_error(invoke("compare", dup, other), "no tensor name in common",
                      "matched by file and name")


def test_compare_of_folders_of_npy_files_pairs_by_file(tmp_path):
    for side in ("ref", "test"):
        (tmp_path / side).mkdir()
        for name, scale in (("a", 1.0), ("b", 1000.0)):
            np.save(tmp_path / side / f"{name}.npy", np.linspace(-scale, scale, 50,
                                                                 dtype=np.float32))
    doc = json_of("compare", tmp_path / "ref", tmp_path / "test")
    assert [t["name"] for t in doc["tensors"]] == ["a.npy", "b.npy"]
    assert all(t["sqnr_db"] == "inf" for t in doc["tensors"])


def test_compare_keeps_plain_names_where_they_are_unique(tmp_path):
    """A sharded checkpoint (its names unique) against one file: matched by name alone."""
    shards = tmp_path / "sharded"
    shards.mkdir()
    x, y = weights(8, 8), weights(4)
    save_file({"x": x}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({"y": y}, str(shards / "model-00002-of-00002.safetensors"))
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    single = tmp_path / "single.safetensors"
    save_file({"y": y, "x": x}, str(single))
    doc = json_of("compare", shards, single)
    assert [t["name"] for t in doc["tensors"]] == ["x", "y"]
    assert all(t["sqnr_db"] == "inf" for t in doc["tensors"])


def test_compare_key_takes_the_file_and_name_a_table_shows(dup):
    doc = json_of("compare", dup, dup, "--key", "b.safetensors:w")
    assert [t["name"] for t in doc["tensors"]] == ["b.safetensors:w"]
    assert doc["tensors"][0]["ref_source"].endswith("b.safetensors")
    both = json_of("compare", dup, dup, "--key", "w")
    assert [t["name"] for t in both["tensors"]] == ["a.safetensors:w", "b.safetensors:w"]


@pytest.mark.slow
def test_compare_roles_merge_a_name_across_files(mpnn):
    doc = json_of("compare", mpnn, mpnn)
    assert len(doc["tensors"]) == 5 * len(mpnn_state())
    assert all(t["sqnr_db"] == "inf" for t in doc["tensors"])
    roles = {r["pattern"]: r["tensors"] for r in doc["roles"]}
    assert roles["model_state_dict.encoder_layers.*.W1.weight"] == 15
    assert roles["model_state_dict.W_out.bias"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 120])
def test_compare_tables_show_files_and_cut_the_shared_prefix(mpnn, columns):
    lines = lines_of("compare", mpnn, mpnn, columns=columns)
    assert lines[0] == "Names below are under model_state_dict."
    text = "\n".join(lines)
    assert "model_state_dict" not in "\n".join(lines[1:])
    assert "x15" in text and "x5" in text  # roles of names across the files
    assert "20 more roles" in text
    worst = text[text.index("Worst 5 of 345 tensors"):]
    assert ".safetensors:" in worst  # each of the worst tensors with its file
    assert len(lines) <= 60
    doc = json_of("compare", mpnn, mpnn)
    assert doc["tensors"][0]["name"].startswith("ligandmpnn_v_32_005.safetensors:"
                                                "model_state_dict.")


# -- fmt quantize: the file wherever names repeat -----------------------------------------------

def test_quantize_rows_show_the_file_where_names_repeat(dup):
    text = "\n".join(lines_of("quantize", dup, "--block", "32"))
    assert "a.safetensors:w" in text and "b.safetensors:w" in text
    assert "only_b" in text and "b.safetensors:only_b" not in text
    doc = json_of("quantize", dup, "--block", "32")
    assert [t["source"].rsplit("/", 1)[-1] for t in doc["tensors"]] == [
        "a.safetensors", "b.safetensors", "b.safetensors"]
    assert [t["key"] for t in doc["tensors"]] == ["w", "only_b", "w"]


@pytest.mark.slow
def test_quantize_worst_list_and_blocks_name_the_file(mpnn):
    text = "\n".join(lines_of("quantize", mpnn, "--recipe", "nvfp4", "--worst-blocks", "3",
                              "--top", "10", columns=200))  # wide: each name beside its row
    worst = text[text.index("Worst 10 of"):text.index("Total of")]
    rows = [line for line in worst.splitlines()[4:] if line.strip()]
    assert len(rows) == 10
    assert all(".safetensors:" in line for line in rows)  # the issue: three alike, no file
    blocks = text[text.index("Worst 3 blocks"):]
    assert blocks.count(".safetensors:") == 3


def test_quantize_key_takes_the_file_and_name(dup):
    doc = json_of("quantize", dup, "--key", "b.safetensors:w")
    assert [(t["source"].rsplit("/", 1)[-1], t["key"]) for t in doc["tensors"]] == [
        ("b.safetensors", "w")]
    glob = json_of("quantize", dup, "--key", "*.safetensors:w")
    assert len(glob["tensors"]) == 2


@pytest.mark.slow
def test_quantize_summary_cuts_the_shared_prefix_and_fits_a_screen(mpnn):
    for columns in (80, 120):
        lines = lines_of("quantize", mpnn, "--recipe", "nvfp4", columns=columns)
        assert lines[0] == "Names below are under model_state_dict."
        assert not any("model_state_dict" in line for line in lines[1:])
        assert len(lines) <= 75, (columns, len(lines))
    doc = json_of("quantize", mpnn, "--recipe", "nvfp4")
    assert all(t["key"].startswith("model_state_dict.") for t in doc["tensors"])
    assert all(g["pattern"].startswith("model_state_dict.") for g in doc["groups"])


@pytest.mark.slow
def test_pt_files_of_a_ligandmpnn_folder(tmp_path):
    """The real layout: .pt files holding {'num_edges', 'model_state_dict': {...}}."""
    torch = pytest.importorskip("torch")
    folder = tmp_path / "pt"
    folder.mkdir()
    for name in ("v_48_002", "v_48_020", "v_32_010"):
        state = {k: torch.from_numpy(v) for k, v in mpnn_state().items()}
        nested = {"num_edges": 48, "noise_level": 0.2,
                  "model_state_dict": {k.removeprefix("model_state_dict."): v
                                       for k, v in state.items()}}
        torch.save(nested, folder / f"{name}.pt")
    doc = json_of("compare", folder, folder)
    assert doc["total"]["sqnr_db"] == "inf" and len(doc["tensors"]) == 3 * len(state)
    lines = lines_of("quantize", folder, "--recipe", "nvfp4")
    assert lines[0] == "Names below are under model_state_dict."
    assert "v_48_020.pt:" in "\n".join(lines)


# -- the pieces ------------------------------------------------------------------------------

def info(source: str, key: str | None) -> TensorInfo:
    return TensorInfo(source, key, (4,), "float32")


def test_tensor_names_qualify_only_repeated_keys():
    from fmtcli.inputs.checkpoints import tensor_names

    tensors = [info("d/a.pt", "w"), info("d/b.pt", "w"), info("d/b.pt", "x"),
               info("d/sub/c.pt", "w")]
    assert tensor_names(tensors) == ["a.pt:w", "b.pt:w", "x", "sub/c.pt:w"]
    assert tensor_names([info("x/a.pt", "w"), info("y/a.pt", "w")]) == ["x/a.pt:w",
                                                                        "y/a.pt:w"]
    assert tensor_names([info("d/a.pt", "w")], repeated={"w"}) == ["a.pt:w"]
    assert tensor_names([info("d/c.npy", None)]) == ["d/c.npy"]


def test_shared_prefix_is_dotted_and_never_a_whole_name():
    from fmtcli.inputs.checkpoints import shared_prefix, without_prefix

    assert shared_prefix(["model_state_dict.W.weight", "model_state_dict.W.bias"]) == \
        "model_state_dict.W."
    assert shared_prefix(["model.a", "model.layers.*.b", "model.layers.0.b"]) == "model."
    assert shared_prefix(["conv1.weight", "conv10.weight"]) == ""
    assert shared_prefix(["a.b", "a.b"]) == "a."
    assert shared_prefix(["a.", "a.b"]) == ""
    assert shared_prefix(["l.0.w", "l.1.w", "l.*.w"]) == ""  # never down to a layer index
    assert shared_prefix(["m.layers.0.w", "m.layers.1.w"]) == "m."
    assert shared_prefix(["model.x"]) == "" and shared_prefix(["m.x", None]) == ""
    assert without_prefix("a.pt:model.x", "model.x", "model.") == "a.pt:x"
    assert without_prefix("x", "x", "model.") == "x"
