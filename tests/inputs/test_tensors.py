"""Inputs of ``fmt quantize``: .npy .npz .safetensors .pt/.pth, text/CSV/JSON, stdin,
several files and directories, and every way an input can be bad.

Test data are written here, in tmp_path: .safetensors by ``oracle``'s own
writer that follows the published layout (and, where installed, by the safetensors package).
"""

from __future__ import annotations

import importlib.util
import json
import zipfile

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_no_traceback,
    assert_usage_error,
    invoke,
    only_scheme,
    quantize_json,
    strict_loads,
)
from oracle import assert_matches_reference, heavy_tailed, ref_quantize, write_safetensors

from fmtcli.inputs.tensors import load_inputs, load_path

EXACT_KEYS = ("count", "nonzero", "flushed", "saturated", "max_abs_error", "median_rel_error",
              "p99_rel_error", "rmse", "sqnr_db", "bias", "scales")


def stats_equal(a: dict, b: dict) -> None:
    for key in EXACT_KEYS:
        assert a[key] == b[key], (key, a[key], b[key])


@pytest.fixture
def data():
    return heavy_tailed(np.random.default_rng(41), (48, 160))


def schemes_of(path, *args):
    return quantize_json(path, *args)["tensors"][0]["schemes"]


# -- .npy --------------------------------------------------------------------------------------

def test_npy_is_memory_mapped_and_matches_reference(tmp_path, data):
    path = tmp_path / "x.npy"
    np.save(path, data)
    (src,) = load_path(str(path))
    assert isinstance(src.array(), np.memmap)
    assert (src.shape, src.dtype, src.key) == (data.shape, "float32", None)
    per_tensor, block = schemes_of(path)
    for stats, tile in [(per_tensor, (10 ** 9, 10 ** 9)), (block, (1, 128))]:
        xq, grid, sat, ov = ref_quantize(data, tile)
        assert_matches_reference(stats, data, xq, sat, ov, stats["label"])


def test_npy_fortran_order_and_big_endian_read_like_plain_npy(tmp_path, data):
    plain = tmp_path / "plain.npy"
    np.save(plain, data)
    np.save(tmp_path / "fortran.npy", np.asfortranarray(data))
    np.save(tmp_path / "big_endian.npy", data.astype(">f4"))
    np.save(tmp_path / "fortran3d.npy", np.asfortranarray(data.reshape(6, 8, 160)))
    expected = schemes_of(plain)
    for name in ("fortran.npy", "big_endian.npy", "fortran3d.npy"):
        for a, b in zip(expected, schemes_of(tmp_path / name)):
            stats_equal(a, b)


def test_npy_half_precision_input(tmp_path, data):
    np.save(tmp_path / "h.npy", data.astype(np.float16))
    doc = quantize_json(tmp_path / "h.npy", "--compare", "none")
    assert doc["tensors"][0]["dtype"] == "float16"
    wide = data.astype(np.float16).astype(np.float32)
    xq, grid, sat, ov = ref_quantize(wide, (1, 128))
    assert_matches_reference(only_scheme(doc), wide, xq, sat, ov, "float16")


def test_object_npy_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([1.0, "boom", None], dtype=object), allow_pickle=True)
    assert_data_error(invoke("quantize", path, "--json"), "obj.npy")


# -- .npz --------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_npz_every_array_or_the_chosen_keys(tmp_path, data, save):
    path = tmp_path / "ck.npz"
    other = heavy_tailed(np.random.default_rng(42), (300,))
    save(path, w=data, b=other, step=np.array(7))
    np.save(tmp_path / "w.npy", data)
    doc = quantize_json(path)
    assert [t["key"] for t in doc["tensors"]] == ["w", "b", "step"]
    assert "int64" in doc["tensors"][2]["skipped"]
    assert doc["total"][0]["count"] == data.size + other.size
    for a, b in zip(doc["tensors"][0]["schemes"], schemes_of(tmp_path / "w.npy")):
        stats_equal(a, b)
    only_w = quantize_json(path, "--key", "w")
    assert [t["key"] for t in only_w["tensors"]] == ["w"] and only_w["total"] is None
    for a, b in zip(only_w["tensors"][0]["schemes"], doc["tensors"][0]["schemes"]):
        stats_equal(a, b)
    both = quantize_json(path, "--key", "b", "--key", "w")
    assert sorted(t["key"] for t in both["tensors"]) == ["b", "w"]


def test_uncompressed_npz_members_are_memory_mapped(tmp_path, data):
    np.savez(tmp_path / "s.npz", w=data)
    (src,) = load_path(str(tmp_path / "s.npz"))
    arr = src.array()
    assert isinstance(arr, np.memmap)
    np.testing.assert_array_equal(arr, data)
    np.savez_compressed(tmp_path / "c.npz", w=data)
    (src,) = load_path(str(tmp_path / "c.npz"))
    np.testing.assert_array_equal(src.array(), data)


# -- .safetensors ---------------------------------------------------------------------------------

def test_safetensors_float_dtypes_read_without_torch(tmp_path):
    rng = np.random.default_rng(43)
    base = heavy_tailed(rng, (16, 64), spread=1.0)
    tensors = {
        "f32": base,
        "f16": base.astype(np.float16),
        "bf16": base.astype(ml_dtypes.bfloat16),
        "f8": np.clip(base, -448, 448).astype(ml_dtypes.float8_e4m3fn),
        "position_ids": np.arange(64, dtype=np.int64),
    }
    path = write_safetensors(tmp_path / "m.safetensors", tensors, metadata={"format": "np"})
    sources = {s.key: s for s in load_path(str(path))}
    assert list(sources) == list(tensors)
    for key in ("f32", "f16", "bf16", "f8"):
        arr = sources[key].array()
        assert arr.dtype == tensors[key].dtype, key
        np.testing.assert_array_equal(arr.view(np.uint8), tensors[key].view(np.uint8))
    assert sources["position_ids"].skipped is not None
    assert [sources[k].dtype for k in tensors] == ["float32", "float16", "bfloat16",
                                                   "float8_e4m3fn", "int64"]

    result = invoke("quantize", path, "--json", "--compare", "none")
    assert result.exit_code == 0, result.stderr
    doc = strict_loads(result.stdout)
    by_key = {t["key"]: t for t in doc["tensors"]}
    assert "int64" in by_key["position_ids"]["skipped"]
    assert "position_ids" in result.stderr
    for key in ("f32", "f16", "bf16", "f8"):
        wide = tensors[key].astype(np.float32)
        xq, grid, sat, ov = ref_quantize(wide, (1, 128))
        assert_matches_reference(by_key[key]["schemes"][0], wide, xq, sat, ov, key)
    assert doc["total"][0]["count"] == 4 * base.size


def test_safetensors_key_names_and_globs(tmp_path):
    rng = np.random.default_rng(44)
    tensors = {"layers.0.attn.weight": heavy_tailed(rng, (8, 32)),
               "layers.0.attn.bias": heavy_tailed(rng, (32,)),
               "layers.1.attn.weight": heavy_tailed(rng, (8, 32)),
               "embed.weight": heavy_tailed(rng, (4, 32))}
    path = write_safetensors(tmp_path / "m.safetensors", tensors)
    doc = quantize_json(path, "--key", "layers.*.weight")
    assert [t["key"] for t in doc["tensors"]] == ["layers.0.attn.weight", "layers.1.attn.weight"]
    doc = quantize_json(path, "--key", "embed.weight")
    assert [t["key"] for t in doc["tensors"]] == ["embed.weight"]


def test_unknown_key_lists_the_available_keys(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors",
                             {"alpha": np.ones(4, np.float32), "beta": np.ones(4, np.float32)})
    result = invoke("quantize", path, "--key", "gamma")
    assert_data_error(result, "gamma", "alpha", "beta")


def test_safetensors_written_by_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(45)
    tensors = {"w": heavy_tailed(rng, (20, 48)), "h": heavy_tailed(rng, (96,)).astype(np.float16),
               "ids": np.arange(5, dtype=np.int64)}
    path = tmp_path / "pkg.safetensors"
    st.save_file(tensors, str(path), metadata={"k": "v"})
    doc = quantize_json(path, "--compare", "none")
    by_key = {t["key"]: t for t in doc["tensors"]}
    assert set(by_key) == {"w", "h", "ids"} and "skipped" in by_key["ids"]
    for key in ("w", "h"):
        wide = tensors[key].astype(np.float32)
        xq, grid, sat, ov = ref_quantize(wide, (1, 128))
        assert_matches_reference(by_key[key]["schemes"][0], wide, xq, sat, ov, key)


# -- .pt / .pth -------------------------------------------------------------------------------------

def test_torch_state_dict_nested_bfloat16_and_int64(tmp_path):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 64, generator=g) * 0.02
    state = {
        "encoder": {"layer": {"weight": weight, "bias": torch.randn(64, generator=g)},
                    "norm": [torch.ones(64, dtype=torch.float16)]},
        "emb.weight": (torch.randn(10, 64, generator=g)).to(torch.bfloat16),
        "position_ids": torch.arange(64),
        "step": 3,
        "fp8": (torch.randn(4, 64, generator=g)).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "model.pth"
    torch.save(state, path)
    result = invoke("quantize", path, "--json", "--compare", "none")
    assert_no_traceback(result)
    assert result.exit_code == 0, result.stderr
    doc = strict_loads(result.stdout)
    keys = [t["key"] for t in doc["tensors"]]
    assert keys == ["encoder.layer.weight", "encoder.layer.bias", "encoder.norm.0",
                    "emb.weight", "position_ids", "fp8"]
    by_key = {t["key"]: t for t in doc["tensors"]}
    assert "int64" in by_key["position_ids"]["skipped"]
    assert "position_ids" in result.stderr and "skipped" in result.stderr
    assert by_key["emb.weight"]["dtype"] == "bfloat16"
    assert by_key["fp8"]["dtype"] == "float8_e4m3fn"
    bf16 = state["emb.weight"].view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    fp8 = state["fp8"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    for key, x in [("encoder.layer.weight", weight.numpy()), ("emb.weight", bf16),
                   ("fp8", fp8)]:
        wide = x.astype(np.float32)
        xq, grid, sat, ov = ref_quantize(wide, (1, 128))
        assert_matches_reference(by_key[key]["schemes"][0], wide, xq, sat, ov, key)
    assert doc["total"][0]["count"] == 24 * 64 + 64 + 64 + 10 * 64 + 4 * 64
    # .pt reads the same as .pth
    torch.save(state, tmp_path / "model.pt")
    assert [t["key"] for t in quantize_json(tmp_path / "model.pt")["tensors"]] == keys


def test_torch_legacy_serialization_is_readable(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(4, 8)}, path, _use_new_zipfile_serialization=False)
    doc = quantize_json(path)
    assert [t["key"] for t in doc["tensors"]] == ["w"]


def test_corrupt_torch_file(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "bad.pt").write_bytes(b"\x80\x02not really a checkpoint" * 4)
    assert_data_error(invoke("quantize", tmp_path / "bad.pt"), "bad.pt")


# -- text, CSV, JSON, stdin ------------------------------------------------------------------------

def test_text_csv_and_json_files(tmp_path):
    values = heavy_tailed(np.random.default_rng(46), (6, 40), spread=1.0).astype(np.float64)
    np.save(tmp_path / "ref.npy", values)
    expected = schemes_of(tmp_path / "ref.npy")
    (tmp_path / "v.csv").write_text("\n".join(",".join(repr(float(v)) for v in row)
                                              for row in values) + "\n")
    (tmp_path / "v.txt").write_text("# a comment\n" + "\n".join(
        "  ".join(repr(float(v)) for v in row) for row in values))
    (tmp_path / "v.json").write_text(json.dumps(values.tolist()))
    for name in ("v.csv", "v.txt", "v.json"):
        doc = quantize_json(tmp_path / name)
        assert doc["tensors"][0]["shape"] == [6, 40], name
        for a, b in zip(expected, doc["tensors"][0]["schemes"]):
            stats_equal(a, b)


def test_numbers_from_stdin(tmp_path):
    text = "100, 0.001 -0.002 0.0005,3e-4\t7e-5\r\n"
    doc = quantize_json("-", input=text)
    (tensor,) = doc["tensors"]
    assert tensor["source"] == "<stdin>" and tensor["shape"] == [6]
    np.save(tmp_path / "same.npy", np.array([100, 0.001, -0.002, 0.0005, 3e-4, 7e-5]))
    for a, b in zip(tensor["schemes"], schemes_of(tmp_path / "same.npy")):
        stats_equal(a, b)
    assert tensor["schemes"][0]["flushed"] == 1  # 7e-5 * 4.48 is below E4M3's 2**-10
    doc = quantize_json("-", "--per", "tensor", input="[[1, 2], [3, 4.5]]")
    assert doc["tensors"][0]["shape"] == [2, 2]
    assert only_scheme(doc)["scales"]["min"] == np.float32(448 / 4.5)


@pytest.mark.slow
def test_safetensors_loading_does_not_import_torch(tmp_path):
    import subprocess
    import sys

    path = write_safetensors(tmp_path / "m.safetensors",
                             {"b": np.ones((4, 8), ml_dtypes.bfloat16),
                              "f8": np.ones(8, ml_dtypes.float8_e4m3fn)})
    code = ("import sys\n"
            "from fmtcli.inputs.tensors import load_inputs\n"
            "from fmtcli.quantize import quantize\n"
            "from fmtcli.numerics.schemes import build_scheme\n"
            f"sources = load_inputs([{str(path)!r}])\n"
            "quantize(sources, [build_scheme()])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print([s.dtype for s in sources])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "bfloat16" in proc.stdout and "float8_e4m3fn" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("text", ["", "   \n", "1 2 x\n", "[[1, 2], [3]]", "{\"a\": 1}",
                                  "[\"a\"]", "[]"])
def test_bad_text_on_stdin(text):
    assert_data_error(invoke("quantize", "-", input=text))


# -- several inputs -----------------------------------------------------------------------------

def test_several_files_and_a_directory_give_one_entry_per_tensor_and_a_total(tmp_path, data):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    np.save(d / "a.npy", data)
    np.savez(d / "sub" / "b.npz", x=data[:10], y=data[10:20])
    (d / "notes.md").write_text("not a tensor")
    np.save(tmp_path / "c.npy", data[:5])
    doc = quantize_json(d, tmp_path / "c.npy")
    names = [(t["source"].replace(str(tmp_path), ""), t["key"]) for t in doc["tensors"]]
    assert names == [("/ckpt/a.npy", None), ("/ckpt/sub/b.npz", "x"), ("/ckpt/sub/b.npz", "y"),
                     ("/c.npy", None)]
    total = doc["total"]
    assert len(total) == 2
    assert total[0]["count"] == data.size + 10 * 160 + 10 * 160 + 5 * 160
    assert total[1]["flushed"] == sum(t["schemes"][1]["flushed"] for t in doc["tensors"])


def test_non_float_tensors_are_skipped_but_nothing_usable_is_an_error(tmp_path):
    np.savez(tmp_path / "ints.npz", a=np.arange(10), mask=np.ones(3, bool))
    np.save(tmp_path / "c.npy", np.ones(4, np.complex64))
    result = invoke("quantize", tmp_path / "ints.npz", tmp_path / "c.npy")
    assert_data_error(result, "nothing to quantize")
    np.save(tmp_path / "f.npy", np.ones((2, 8), np.float32))
    doc = quantize_json(tmp_path / "ints.npz", tmp_path / "c.npy", tmp_path / "f.npy")
    skipped = [t for t in doc["tensors"] if t["skipped"]]
    assert len(skipped) == 3 and len(doc["tensors"]) == 4


def test_empty_tensor_is_skipped_and_alone_an_error(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((0, 4), np.float32))
    assert_data_error(invoke("quantize", tmp_path / "e.npy"), "empty")
    np.savez(tmp_path / "m.npz", e=np.zeros(0, np.float32), x=np.ones(4, np.float32))
    doc = quantize_json(tmp_path / "m.npz")
    assert doc["tensors"][0]["skipped"] == "empty" and doc["tensors"][1]["schemes"]


# -- bad inputs: one 'Error:' line, exit 1, nothing on stdout, no traceback ------------------------

def _npy_bytes(arr) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, arr)
    return buffer.getvalue()


def _bad_files(tmp_path):
    ok = _npy_bytes(np.ones((64, 64), np.float32))
    f32 = np.ones(16, np.float32)
    cases = {
        "missing.npy": None,
        "truncated.npy": ok[:len(ok) // 2],
        "truncated_header.npy": ok[:40],
        "tiny.npy": ok[:5],
        "garbage.npy": b"this is not an array at all" * 5,
        "garbage.npz": b"PK but not really a zip" * 10,
        "unsupported.bin": b"1 2 3",
        "empty.safetensors": b"",
        "short_header.safetensors": b"\x10\x00\x00",
    }
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
    write_safetensors(tmp_path / "header_too_long.safetensors", {"a": f32}, header_length=10 ** 6)
    write_safetensors(tmp_path / "header_past_end.safetensors", {"a": f32},
                      header_length=2 ** 63)
    write_safetensors(tmp_path / "offsets_past_end.safetensors", {"a": f32},
                      entries={"a": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}})
    path = write_safetensors(tmp_path / "truncated_data.safetensors", {"a": f32, "b": f32})
    path.write_bytes(path.read_bytes()[:-20])
    write_safetensors(tmp_path / "wrong_size.safetensors", {"a": f32},
                      entries={"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}})
    write_safetensors(tmp_path / "entry_not_object.safetensors", {}, entries={"a": [1, 2]})
    write_safetensors(tmp_path / "missing_field.safetensors", {},
                      entries={"a": {"dtype": "F32", "shape": [4]}})
    (tmp_path / "header_not_json.safetensors").write_bytes(
        (8).to_bytes(8, "little") + b"notjson!" + f32.tobytes())
    (tmp_path / "header_list.safetensors").write_bytes(
        (8).to_bytes(8, "little") + b"[1,2,3] " + f32.tobytes())
    # npz: a zip whose member is not an .npy, and one with a pickled object array
    with zipfile.ZipFile(tmp_path / "bad_member.npz", "w") as z:
        z.writestr("a.npy", b"\x93NUMPY garbage")
    np.savez(tmp_path / "objects.npz", a=np.array([1, None], dtype=object))
    np.savez_compressed(tmp_path / "objects_compressed.npz", a=np.array([1, None], dtype=object))
    stored = _npy_bytes(np.ones(1000, np.float32))
    with zipfile.ZipFile(tmp_path / "cut.npz", "w") as z:
        z.writestr("a.npy", stored)
    raw = (tmp_path / "cut.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[:len(raw) // 2])
    (tmp_path / "ragged.json").write_text("[[1, 2], [3]]")
    (tmp_path / "words.csv").write_text("a,b\n1,2\n")
    (tmp_path / "latin1.txt").write_bytes(b"1 2 \xff\xfe\n")
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    np.save(tmp_path / "complex.npy", np.ones(4, np.complex128))
    np.save(tmp_path / "empty.npy", np.zeros(0, np.float32))
    return sorted(p.name for p in tmp_path.iterdir()) + ["missing.npy"]


BAD = ["missing.npy", "truncated.npy", "truncated_header.npy", "tiny.npy", "garbage.npy",
       "garbage.npz", "unsupported.bin", "empty.safetensors", "short_header.safetensors",
       "header_too_long.safetensors", "header_past_end.safetensors",
       "offsets_past_end.safetensors", "truncated_data.safetensors", "wrong_size.safetensors",
       "entry_not_object.safetensors", "missing_field.safetensors",
       "header_not_json.safetensors", "header_list.safetensors", "bad_member.npz",
       "objects.npz", "objects_compressed.npz", "cut.npz", "ragged.json", "words.csv",
       "latin1.txt", "strings.npy", "complex.npy", "empty.npy"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_one_error_line(tmp_path, name):
    _bad_files(tmp_path)
    result = invoke("quantize", tmp_path / name, "--json")
    if name.endswith(".bin") and importlib.util.find_spec("torch") is None:
        # without torch a .bin cannot be read at all: a missing optional package is exit 2,
        # and the line says how to install it
        assert_usage_error(result, name, "needs torch", "pip install 'fmtcli[torch]'")
    else:
        assert_data_error(result, name)


def test_bad_input_among_good_ones_still_fails_cleanly(tmp_path, data):
    _bad_files(tmp_path)
    np.save(tmp_path / "good.npy", data)
    assert_data_error(invoke("quantize", tmp_path / "good.npy", tmp_path / "truncated.npy"),
                      "truncated.npy")


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [16], "data_offsets": ["0", "64"]},
    {"dtype": "F32", "shape": [-4, -4], "data_offsets": [0, 64]},
], ids=["string-offsets", "negative-shape"])
def test_safetensors_header_with_wrong_types_is_an_error(tmp_path, entry):
    path = write_safetensors(tmp_path / "odd.safetensors", {"a": np.ones(16, np.float32)},
                             entries={"a": entry})
    assert_data_error(invoke("quantize", path, "--json"), "odd.safetensors")


def test_unsupported_safetensors_dtype_is_skipped(tmp_path):
    f32 = np.ones((2, 8), np.float32)
    path = write_safetensors(tmp_path / "m.safetensors", {"w": f32, "c": np.ones(4, np.float32)},
                             entries={"c": {"dtype": "C64", "shape": [2],
                                            "data_offsets": [64, 80]}})
    doc = quantize_json(path)
    by_key = {t["key"]: t for t in doc["tensors"]}
    assert "C64" in by_key["c"]["skipped"] and by_key["w"]["schemes"]


def test_load_inputs_keeps_the_order_of_the_paths(tmp_path, data):
    np.save(tmp_path / "b.npy", data)
    np.save(tmp_path / "a.npy", data[:2])
    sources = load_inputs([str(tmp_path / "b.npy"), str(tmp_path / "a.npy")])
    assert [s.source.rsplit("/", 1)[1] for s in sources] == ["b.npy", "a.npy"]
