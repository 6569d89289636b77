"""Hostile and odd input files (issue 9 items 7-10, 14, 15, 17 and the loader papercuts).

Each file is crafted here, in tmp_path.  A bad one must end in one ``DataError`` (exit 1) with
a one-line message, no traceback and no warning, without reading more than the file (or its
header) declares; an odd but valid one must load with the right values.  Library tests run
with every warning turned into an error, so a numpy RuntimeWarning fails them.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
import warnings
import zipfile

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_data_error, invoke, quantize_json
from oracle import write_safetensors

from fmtcli.base.errors import DataError, Note
from fmtcli.inputs import npyfile, textparse
from fmtcli.inputs.tensors import load_inputs, load_path


@pytest.fixture(autouse=True)
def warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("default", Note)  # fmt's own notes (say, blocks shorter than asked)
        yield


def refused(path, *fragments: str, open_arrays: bool = False) -> str:
    """load_inputs([path]) (and opening every array) raises one one-line DataError."""
    with pytest.raises(DataError) as caught:
        for source in load_inputs([str(path)]):
            if open_arrays and source.skipped is None:
                source.array()
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def values(path) -> list[np.ndarray]:
    return [np.asarray(s.array()) for s in load_inputs([str(path)]) if s.skipped is None]


def npy_bytes(arr, version=None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, arr)
    else:
        np.lib.format.write_array(buffer, arr, version=version)
    return buffer.getvalue()


def npy_with_header(header: str, data: bytes = b"", version: int = 1) -> bytes:
    raw = header.encode("latin1")
    width = "<H" if version == 1 else "<I"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(width, len(raw)) + raw + data


# -- item 7: nesting depth -------------------------------------------------------------------------

DEEP = "[" * 10_000 + "1" + "]" * 10_000


@pytest.mark.parametrize("name", ["deep.json", "deep.txt", "deep.csv"])
def test_deeply_nested_json_file_is_refused(tmp_path, name):
    (tmp_path / name).write_text(DEEP)
    refused(tmp_path / name, "nested more than 64 levels")


def test_deeply_nested_json_on_stdin():
    assert_data_error(invoke("quantize", "-", input=DEEP), "<stdin>", "nested")


def test_deeply_nested_safetensors_header(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    raw = ('{"__metadata__": {"a": "b"}, "x": ' + deep + "}").encode()
    (tmp_path / "d.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    refused(tmp_path / "d.safetensors", "nested more than 64 levels")


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    deep = "[" * 5000 + '\\"{'
    path = write_safetensors(tmp_path / "m.safetensors", {"w": np.ones(4, np.float32)},
                             metadata={"note": deep})
    np.testing.assert_array_equal(values(path)[0], np.ones(4))
    nested = json.dumps([[[[1.5]]]])
    (tmp_path / "n.json").write_text(nested)
    assert values(tmp_path / "n.json")[0].shape == (1, 1, 1, 1)


# -- item 8: numbers with thousands of digits ------------------------------------------------------

def test_long_numbers_in_json_and_csv_round_like_1e999(tmp_path):
    """A value beyond float64 becomes inf (IEEE round-to-nearest, as 1e999 does); a long
    decimal is read to its nearest float64."""
    big, small = "9" * 5000, "0." + "1" * 5000
    (tmp_path / "a.json").write_text(f"[{big}, -{big}, {small}, 1e999, 1]")
    (tmp_path / "a.csv").write_text(f"{big}, -{big}, {small}, 1e999, 1\n")
    for name in ("a.json", "a.csv"):
        got = values(tmp_path / name)[0]
        np.testing.assert_array_equal(got, [np.inf, -np.inf, float(small), np.inf, 1.0])


def test_long_integer_in_safetensors_header(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {},
                             entries={"a": {"dtype": "F32", "shape": [4],
                                            "data_offsets": [0, 16]}})
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = raw[8:8 + length].decode().rstrip().replace("[4]", "[" + "9" * 5000 + "]")
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(16))
    refused(path, "corrupt .safetensors entry 'a'")


def test_long_integer_in_npy_header(tmp_path):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + "9" * 5000 + ",), }"
    (tmp_path / "x.npy").write_bytes(npy_with_header(header, bytes(16), version=2))
    refused(tmp_path / "x.npy", "corrupt .npy header")


# -- item 9: .npz ----------------------------------------------------------------------------------

def _corrupt_central_crc(path) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.index(b"PK\x01\x02") + 16
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_npz_member_with_a_bad_crc(tmp_path, save):
    path = tmp_path / "c.npz"
    save(path, w=np.arange(256, dtype=np.float32))
    _corrupt_central_crc(path)
    refused(path, "c.npz", "'w'", "corrupt", open_arrays=True)
    assert_data_error(invoke("quantize", path, "--json"), "corrupt")


def test_npz_damaged_deflate_stream(tmp_path):
    path = tmp_path / "d.npz"
    np.savez_compressed(path, w=np.random.default_rng(0).standard_normal(5000))
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    refused(path, "d.npz", open_arrays=True)


def test_compressed_member_inflates_in_bounded_memory(tmp_path, monkeypatch):
    """A member that inflates to far more than the file: past INFLATE_IN_MEMORY it goes to
    a temporary file, so the process's own allocations stay small."""
    monkeypatch.setattr(npyfile, "INFLATE_IN_MEMORY", 1 << 20)
    monkeypatch.setattr(npyfile, "_CHUNK", 1 << 20)
    path = tmp_path / "bomb.npz"
    x = np.zeros((4096, 2048), np.float32)  # 32 MiB of zeros: a few tens of KiB compressed
    x[7, 9] = 3.5
    np.savez_compressed(path, x=x)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        (source,) = load_path(str(path))
        arr = source.array()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert arr.shape == x.shape and arr[7, 9] == 3.5 and float(np.abs(arr).sum()) == 3.5


def test_compressed_member_shape_is_checked_against_the_directory(tmp_path):
    """A header declaring more data than the member holds is refused before inflating."""
    member = npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,)"
                             ", }", bytes(64))
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", member)
    refused(path, "wrong size", "4,000,000,000 bytes")


def _zip(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_npz_odd_member_layouts(tmp_path):
    good = npy_bytes(np.arange(4, dtype=np.float32))
    refused(_zip(tmp_path / "none.npz", {"readme.txt": b"hi"}), "hold no tensors")
    with zipfile.ZipFile(tmp_path / "dir.npz", "w") as archive:
        archive.writestr(zipfile.ZipInfo("sub.npy/"), b"")
        archive.writestr("sub.npy/w.npy", good)
    assert [s.key for s in load_path(str(tmp_path / "dir.npz"))] == ["sub.npy/w"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        _zip(tmp_path / "dup.npz", {"w.npy": good, "x.npy": good})
        with zipfile.ZipFile(tmp_path / "dup.npz", "a") as archive:
            archive.writestr("w.npy", good)
    refused(tmp_path / "dup.npz", "two members are named 'w.npy'")
    (source,) = load_path(str(_zip(tmp_path / "up.npz", {"../x.npy": good})))
    assert source.key == "../x" and not (tmp_path.parent / "x.npy").exists()
    np.testing.assert_array_equal(source.array(), np.arange(4))


def test_npz_member_name_not_utf8(tmp_path):
    path = _zip(tmp_path / "n.npz", {"a.npy": npy_bytes(np.ones(2, np.float32))})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"PK\x01\x02")
    raw[at + 9] |= 0x08  # general purpose flag bit 11: the name is UTF-8
    raw[at + 46] = 0xFF  # ... but it is not
    path.write_bytes(bytes(raw))
    refused(path, "not a readable .npz file")


def test_npz_encrypted_flag_is_refused(tmp_path):
    path = _zip(tmp_path / "e.npz", {"a.npy": npy_bytes(np.ones(2, np.float32))})
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"PK\x01\x02") + 8] |= 0x01
    path.write_bytes(bytes(raw))
    refused(path, "encrypted")


def test_stored_member_spilling_past_its_entry(tmp_path):
    member = npy_bytes(np.ones(16, np.float32))
    path = _zip(tmp_path / "s.npz", {"a.npy": member[:-8]})
    refused(path, "wrong size")


# -- item 10 and 14: .npy headers ------------------------------------------------------------------

def test_npy_header_declaring_4_gib_is_refused_at_once(tmp_path):
    raw = b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{'descr': '<f4'"
    (tmp_path / "h.npy").write_bytes(raw)
    tracemalloc.start()
    try:
        refused(tmp_path / "h.npy", "corrupt .npy header", "4,294,967,280")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_npy_with_a_huge_shape_in_a_small_file(tmp_path):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648, 2147483648), }"
    (tmp_path / "big.npy").write_bytes(npy_with_header(header, bytes(64)))
    refused(tmp_path / "big.npy", "truncated or wrong size")
    assert_data_error(invoke("quantize", tmp_path / "big.npy"), "truncated")


@pytest.mark.parametrize("header", [
    "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (True,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': " + "(1," * 65 + ")" * 65 + ", }",
    "{'descr': '<f4', 'fortran_order': 'no', 'shape': (4,), }",
    "{'descr': '<f4', 'shape': (4,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}",
    "[1, 2, 3]",
    "__import__('os').system('echo hi')",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)" + ", }" + "\x00",
    "((((" * 300,
], ids=["negative", "bool", "float", "65-dims", "fortran-str", "missing", "extra", "list",
        "code", "nul", "parens"])
def test_npy_header_that_is_not_what_numpy_writes(tmp_path, header):
    (tmp_path / "bad.npy").write_bytes(npy_with_header(header, bytes(16)))
    refused(tmp_path / "bad.npy", "corrupt .npy header")


def test_npy_unknown_version_and_cut_headers(tmp_path):
    good = npy_bytes(np.ones(4, np.float32))
    (tmp_path / "v9.npy").write_bytes(good[:6] + b"\x09\x00" + good[8:])
    refused(tmp_path / "v9.npy", "version 9.0")
    for cut in (6, 7, 9, 20):
        (tmp_path / f"cut{cut}.npy").write_bytes(good[:cut])
        refused(tmp_path / f"cut{cut}.npy", "truncated")
    (tmp_path / "data.npy").write_bytes(good[:-1])
    refused(tmp_path / "data.npy", "truncated")


def test_npy_layouts_load_with_the_right_values(tmp_path):
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    cases = {
        "be4.npy": x.astype(">f4"), "be8.npy": x.astype(">f8"),
        "fortran.npy": np.asfortranarray(x), "v2.npy": x, "v3.npy": x,
    }
    for name, arr in cases.items():
        version = {"v2.npy": (2, 0), "v3.npy": (3, 0)}.get(name)
        (tmp_path / name).write_bytes(npy_bytes(arr, version))
        (got,) = values(tmp_path / name)
        np.testing.assert_array_equal(got, arr, err_msg=name)
    np.save(tmp_path / "scalar.npy", np.float32(2.5))
    (got,) = values(tmp_path / "scalar.npy")
    assert got.shape == () and got == 2.5
    sub = npy_with_header("{'descr': '(2,)<f4', 'fortran_order': False, "
                          "'shape': (3,), }", np.arange(6, dtype="<f4").tobytes())
    (tmp_path / "sub.npy").write_bytes(sub)
    (got,) = values(tmp_path / "sub.npy")
    np.testing.assert_array_equal(got, np.arange(6).reshape(3, 2))


@pytest.mark.parametrize("arr, reason", [
    (np.zeros((0, 5), np.float32), "empty"),
    (np.zeros((3, 0, 2), np.float64), "empty"),
    (np.ones(3, np.complex64), "complex64"),
    (np.ones(3, np.int32), "int32"),
    (np.ones(3, bool), "bool"),
    (np.array(["1.5", "2"]), "str"),
    (np.zeros(3, [("a", "<f4"), ("b", "<i4")]), "structured"),
    (np.zeros(3, "V2"), "void"),
], ids=["empty", "zero-dim", "complex", "int", "bool", "unicode", "structured", "void"])
def test_npy_dtypes_that_are_skipped(tmp_path, arr, reason):
    np.save(tmp_path / "s.npy", arr)
    (source,) = load_path(str(tmp_path / "s.npy"))
    assert source.skipped and reason in source.skipped, source.skipped
    refused(tmp_path / "s.npy", "nothing to quantize", reason)


def test_object_npy_is_refused_without_unpickling(tmp_path):
    np.save(tmp_path / "o.npy", np.array([1, None], dtype=object), allow_pickle=True)
    refused(tmp_path / "o.npy", "Python objects")


# -- ml_dtypes .npy (papercut) ---------------------------------------------------------------------

def test_bfloat16_npy_written_by_ml_dtypes_loads_as_bfloat16(tmp_path):
    x = np.array([1.5, -2.0, 3.140625, 1e30], dtype=ml_dtypes.bfloat16)
    np.save(tmp_path / "b.npy", x)
    np.savez_compressed(tmp_path / "b.npz", w=x)
    for name in ("b.npy", "b.npz"):
        (source,) = load_path(str(tmp_path / name))
        assert source.dtype == "bfloat16"
        np.testing.assert_array_equal(source.array().astype(np.float32), x.astype(np.float32))
    doc = quantize_json(tmp_path / "b.npy", "--compare", "none")
    assert doc["tensors"][0]["dtype"] == "bfloat16"


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                                   ml_dtypes.float4_e2m1fn])
def test_one_byte_ml_dtypes_npy_is_skipped_with_a_way_out(tmp_path, dtype):
    np.save(tmp_path / "f8.npy", np.ones(4, dtype))
    refused(tmp_path / "f8.npy", "does not record which one", "astype(np.float32)")


# -- item 10: text inputs --------------------------------------------------------------------------

def test_text_symlink_to_dev_zero_and_fifo_are_refused(tmp_path):
    os.symlink("/dev/zero", tmp_path / "z.txt")
    refused(tmp_path / "z.txt", "not a regular file (a device)")
    os.mkfifo(tmp_path / "f.csv")
    refused(tmp_path / "f.csv", "not a regular file (a named pipe)")
    os.mkfifo(tmp_path / "f.npy")
    refused(tmp_path / "f.npy", "not a regular file")


def test_text_larger_than_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(textparse, "MAX_TEXT_BYTES", 1000)
    (tmp_path / "big.csv").write_text("1.0\n" * 300)
    refused(tmp_path / "big.csv", "more than", ".npy")
    assert_data_error(invoke("quantize", "-", input="1.0\n" * 300), "<stdin>", "more than")
    (tmp_path / "ok.csv").write_text("1.0\n" * 250)
    assert values(tmp_path / "ok.csv")[0].shape == (250,)


def test_undecodable_text_names_the_byte_offset(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"1 2\n3 \xff\n")
    refused(tmp_path / "b.txt", "not UTF-8", "0xff", "offset 6")


def test_bom_and_crlf_just_work(tmp_path):
    (tmp_path / "b.csv").write_bytes(b"\xef\xbb\xbf1,2\r\n3,4\r\n")
    (tmp_path / "b.json").write_bytes(b"\xef\xbb\xbf[[1, 2],\r\n [3, 4]]")
    for name in ("b.csv", "b.json"):
        np.testing.assert_array_equal(values(tmp_path / name)[0], [[1, 2], [3, 4]])


# -- item 17 and the number syntax ---------------------------------------------------------------

@pytest.mark.parametrize("text, fragments", [
    ("1,2,,3\n", ("line 1, field 3 is empty",)),
    ("1,2,3\n4,5,\n", ("line 2, field 3 is empty",)),
    ("1,2\n,\n", ("line 2, field 1 is empty",)),
    ("1 2 3\n4 5\n", ("line 2 has 2 numbers but line 1 has 3",)),
    ("# c\n1,2\n\n3\n", ("line 4 has 1 numbers but line 2 has 2",)),
    ("a,b\n1,2\n", ("line 1, field 1: 'a' is not a number", "header row")),
    ("1,١٢٣\n", ("field 2", "ASCII")),
    ("1,\uff11\n", ("field 2", "ASCII")),
    ("1_000 2\n", ("'1_000'", "underscores")),
    ("1\n0x1p3\n", ("line 2, field 1", "hexadecimal")),
    ("1 2 # note\n", ("'#'",)),
    ("1 2\x003\n", ("not a number",)),
])
def test_csv_text_that_is_refused(tmp_path, text, fragments):
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    refused(tmp_path / "t.csv", *fragments)


@pytest.mark.parametrize("text, fragments", [
    ("[true, false]", ("element [0] is true", "booleans")),
    ("[[1, 2], [3, false]]", ("element [1][1] is false",)),
    ('[1, "1.5"]', ("element [1] is the string '1.5'", "without quotes")),
    ('[1, {"a": 2}]', ("element [1] is an object",)),
    ("[[1, 2], [3]]", ("ragged", "[1] has 1 elements")),
    ("[[1, 2], 3]", ("element [1] is a number where an array of 2 belongs",)),
    ("[1, [2]]", ("element [1] is an array of 1, not a number",)),
    ("[1, null]", ("element [1] is null", "nan")),
    ('{"w": [1, 2]}', ("not an object",)),
    ("[]", ("no numbers",)),
    ("[[], []]", ("no numbers",)),
    ("[1, 2] 3", ("invalid JSON",)),
])
def test_json_that_is_refused(tmp_path, text, fragments):
    (tmp_path / "t.json").write_text(text)
    refused(tmp_path / "t.json", *fragments)


def test_non_finite_spellings_are_accepted(tmp_path):
    (tmp_path / "t.csv").write_text("nan, inf, -inf, Infinity, +NaN, -infinity, 1e-400\n")
    (tmp_path / "t.json").write_text('[NaN, Infinity, -Infinity, "nan", "-inf", "Infinity", 1]')
    got = values(tmp_path / "t.csv")[0]
    np.testing.assert_array_equal(got, [np.nan, np.inf, -np.inf, np.inf, np.nan, -np.inf, 0])
    got = values(tmp_path / "t.json")[0]
    np.testing.assert_array_equal(got, [np.nan, np.inf, -np.inf, np.nan, -np.inf, np.inf, 1])


def test_csv_shapes(tmp_path):
    (tmp_path / "m.csv").write_text("1, 2, 3\n4 5 6\n")
    (tmp_path / "v.csv").write_text("1\n2\n3\n")
    (tmp_path / "r.csv").write_text("1, 2 3,+4 .5\n")
    assert values(tmp_path / "m.csv")[0].shape == (2, 3)
    assert values(tmp_path / "v.csv")[0].shape == (3,)
    np.testing.assert_array_equal(values(tmp_path / "r.csv")[0], [1, 2, 3, 4, 0.5])


# -- safetensors -----------------------------------------------------------------------------------

F32 = np.arange(16, dtype=np.float32)


@pytest.mark.parametrize("entries, fragments", [
    ({"b": {"dtype": "F32", "shape": [8], "data_offsets": [32, 64]}}, ("overlap",)),
    ({"b": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, 64]}},
     ("wrong size",)),
    ({"b": {"dtype": "F32", "shape": [0, 2 ** 70], "data_offsets": [0, 0]}},
     ("corrupt .safetensors entry 'b'",)),
    ({"b": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, ("at most 64",)),
    ({"b": {"dtype": "F32", "shape": [16], "data_offsets": [2 ** 64, 2 ** 64 + 64]}},
     ("corrupt .safetensors entry",)),
    ({"b": {"dtype": "F32", "shape": [16], "data_offsets": [64, 0]}}, ("outside the file",)),
    ({"b": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, ("corrupt",)),
    ({"__metadata__": {"a": 1}}, ("__metadata__",)),
    ({"__metadata__": ["a"]}, ("__metadata__",)),
])
def test_safetensors_headers_that_are_refused(tmp_path, entries, fragments):
    path = write_safetensors(tmp_path / "m.safetensors", {"a": F32}, entries=entries)
    refused(path, *fragments)


def test_safetensors_duplicate_names(tmp_path):
    header = (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, '
              b'"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}')
    (tmp_path / "d.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                             + bytes(32))
    refused(tmp_path / "d.safetensors", "the name 'a' appears twice")


def test_safetensors_odd_but_valid_names_and_dtype_codes(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors",
                             {"": F32, "wéight·名": F32 * 2, "lower": F32},
                             entries={"lower": {"dtype": "f32", "shape": [16],
                                                "data_offsets": [128, 192]}})
    sources = {s.key: s for s in load_path(str(path))}
    np.testing.assert_array_equal(sources[""].array(), F32)
    np.testing.assert_array_equal(sources["wéight·名"].array(), F32 * 2)
    assert "'f32' is not supported" in sources["lower"].skipped


@pytest.mark.parametrize("cut", [0, 4, 8, 20, -4])
def test_safetensors_truncated_at_each_boundary(tmp_path, cut):
    path = write_safetensors(tmp_path / "m.safetensors", {"a": F32})
    raw = path.read_bytes()
    path.write_bytes(raw[:cut])
    refused(path, "m.safetensors")


# -- empty files, directories, paths -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors", ".pt", ".txt", ".csv",
                                    ".json"])
def test_empty_file_of_each_kind(tmp_path, suffix):
    if suffix == ".pt":
        pytest.importorskip("torch")
    (tmp_path / f"e{suffix}").write_bytes(b"")
    refused(tmp_path / f"e{suffix}", f"e{suffix}")
    assert_data_error(invoke("quantize", tmp_path / f"e{suffix}"), f"e{suffix}")


def test_directories_with_loops_and_a_directory_named_like_a_file(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    np.save(d / "w.npy", F32)
    os.symlink(d, d / "loop")  # a directory link: not followed by the walk
    (d / "x.npy").mkdir()
    np.save(d / "x.npy" / "inner.npy", F32 * 3)
    names = [s.source.rsplit("/", 1)[1] for s in load_inputs([str(d)])]
    assert names == ["w.npy", "inner.npy"]
    os.symlink("self.npy", d / "self.npy")
    refused(d, "self.npy", "cannot read")


def test_path_with_a_newline_gives_one_line(tmp_path):
    path = tmp_path / "a\nb.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00")
    message = refused(path, "a\\nb.npy", "truncated")
    assert message.startswith("'") or message.startswith('"')
    result = invoke("quantize", path)
    assert_data_error(result, "a\\nb.npy")


# -- .pt / .pth (papercut: unsafe files) -----------------------------------------------------------

class Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Custom:
    pass


def test_unsafe_pt_is_refused_with_our_message_and_nothing_runs(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"
    torch.save({"w": torch.ones(2), "boom": Boom(marker)}, tmp_path / "evil.pt")
    torch.save({"w": torch.ones(2), "c": Custom()}, tmp_path / "custom.pt")
    for name, named in (("evil.pt", "system"), ("custom.pt", "Custom")):
        message = refused(tmp_path / name, "refused", "nothing in the file was executed",
                          named, "safetensors")
        assert "two options" not in message and "\x1b" not in message
        assert_data_error(invoke("quantize", tmp_path / name), "nothing in the file")
    assert not marker.exists()


def test_pt_files_that_are_not_checkpoints(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(64)}, tmp_path / "good.pt")
    raw = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    refused(tmp_path / "cut.pt", "not a readable torch checkpoint", "zip")
    (tmp_path / "text.pt").write_text("hello world\n")
    refused(tmp_path / "text.pt", "neither a torch zip archive nor a pickle")
    (tmp_path / "proto4.pt").write_bytes(b"\x80\x04K\x05.")  # a pickled 5, protocol 4
    refused(tmp_path / "proto4.pt", "not a readable torch checkpoint", "magic number")
    torch.save({"step": 5, "lr": [0.1]}, tmp_path / "none.pt")
    refused(tmp_path / "none.pt", "hold no tensors")


def test_pt_holding_a_bare_tensor_a_list_or_itself(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save(torch.arange(6, dtype=torch.float32), tmp_path / "bare.pt")
    (source,) = load_path(str(tmp_path / "bare.pt"))
    assert source.key is None and source.name.endswith("bare.pt")
    np.testing.assert_array_equal(source.array(), np.arange(6))
    torch.save([torch.ones(2), 5, (torch.zeros(3),)], tmp_path / "list.pt")
    assert [s.key for s in load_path(str(tmp_path / "list.pt"))] == ["0", "2.0"]
    loop: list = [torch.ones(2)]
    loop.append(loop)
    torch.save(loop, tmp_path / "loop.pt")
    refused(tmp_path / "loop.pt", "nested more than 64 levels")


def test_a_file_that_shrinks_after_loading_is_a_data_error_when_opened(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(4096, np.float32))
    write_safetensors(tmp_path / "m.safetensors", {"a": np.ones(4096, np.float32)})
    for name in ("x.npy", "m.safetensors"):
        path = tmp_path / name
        (source,) = load_path(str(path))
        with open(path, "r+b") as handle:
            handle.truncate(1000)
        with pytest.raises(DataError, match="cannot map its data"):
            source.array()
