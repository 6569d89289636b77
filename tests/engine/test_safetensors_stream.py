"""The one safetensors writer (``engine.writers``): ``SafetensorsStream`` writes the header
first, from names, dtype codes and shapes, then each tensor's bytes as it is made;
``write_safetensors`` (whole arrays) and ``stream_safetensors`` (made one at a time) go
through it into a temporary that is renamed when complete and removed on any failure.

References: ``tests/oracle.write_safetensors`` (an independent writer of the format: the
8-byte little-endian length, the JSON header padded with spaces to 8 bytes, the raw
little-endian bytes) for the bytes, and the ``safetensors`` package for the reading.
"""

from __future__ import annotations

import glob
import os

import ml_dtypes
import numpy as np
import pytest
from oracle import write_safetensors as reference_write

from fmtcli.engine import writers
from fmtcli.engine.writers import (
    SafetensorsStream,
    safetensors_header,
    stream_safetensors,
    write_safetensors,
)

RNG = np.random.default_rng(5)
ARRAYS = {"w": RNG.standard_normal((7, 9)).astype(np.float32),
          "h": RNG.standard_normal(13).astype(ml_dtypes.bfloat16),
          "c": RNG.integers(0, 255, (3, 5), dtype=np.uint8),
          "e": np.zeros((0, 4), np.float32),
          "s": np.array(2.5, np.float64),
          "f8": RNG.standard_normal((2, 8)).astype(ml_dtypes.float8_e4m3fn),
          "i": np.arange(6, dtype=np.int64)}


def leftovers(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), ".fmtcli-*"))


@pytest.mark.parametrize("metadata", [None, {"format": "pt", "note": "é"}])
def test_write_safetensors_gives_the_reference_bytes(tmp_path, metadata):
    arrays = {k: v for k, v in ARRAYS.items() if v.ndim}  # the reference makes a scalar 1-D
    write_safetensors(str(tmp_path / "a.safetensors"), arrays, metadata)
    reference_write(tmp_path / "b.safetensors", arrays, metadata or None)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_streamed_tensors_give_the_same_bytes_and_safetensors_reads_them(tmp_path):
    safe_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {k: v for k, v in ARRAYS.items() if v.dtype.kind in "fiu"}
    entries = [(k, {"float32": "F32", "uint8": "U8", "int64": "I64", "float64": "F64"}[
        v.dtype.name], v.shape) for k, v in arrays.items()]
    made = []

    def tensors():
        for key, value in arrays.items():
            made.append(key)  # made one at a time, after the header is written
            yield key, value

    stream_safetensors(str(tmp_path / "s.safetensors"), entries, tensors(), {"a": "b"})
    write_safetensors(str(tmp_path / "w.safetensors"), arrays, {"a": "b"})
    assert made == list(arrays)
    assert (tmp_path / "s.safetensors").read_bytes() == (tmp_path / "w.safetensors").read_bytes()
    back = safe_numpy.load_file(str(tmp_path / "s.safetensors"))
    for key, value in arrays.items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value)


def test_pieces_and_byte_order_do_not_change_the_bytes(tmp_path, monkeypatch):
    x = RNG.standard_normal((33, 17)).astype(np.float32)
    write_safetensors(str(tmp_path / "one.safetensors"), {"x": x})
    monkeypatch.setattr(writers, "COPY_BYTES", 40)  # 10 floats a piece
    write_safetensors(str(tmp_path / "big_endian.safetensors"), {"x": x.astype(">f4")})
    assert ((tmp_path / "one.safetensors").read_bytes()
            == (tmp_path / "big_endian.safetensors").read_bytes())


def test_the_header_is_written_before_any_data(tmp_path):
    entries = [("a", "F32", (2, 3)), ("b", "U8", (5,))]
    with open(tmp_path / "f", "wb") as handle:
        stream = SafetensorsStream(handle, entries)
        assert handle.tell() == len(safetensors_header(entries)) and handle.tell() % 8 == 0
        stream.write("a", np.ones((2, 3), np.float32))
        stream.write("b", np.ones(5, np.uint8))
        stream.close()


@pytest.mark.parametrize("wrong", [("b", np.ones((2, 3), np.float32)),
                                   ("a", np.ones((3, 2), np.float32)),
                                   ("a", np.ones((2, 3), np.float64))])
def test_a_tensor_that_is_not_the_next_entry_is_refused_and_nothing_is_left(tmp_path, wrong):
    entries = [("a", "F32", (2, 3)), ("b", "U8", (5,))]
    with pytest.raises(RuntimeError, match="where the header has 'a'"):
        stream_safetensors(str(tmp_path / "x.safetensors"), entries, iter([wrong]))
    assert leftovers(tmp_path) == [] and not (tmp_path / "x.safetensors").exists()


def test_missing_tensors_and_a_failure_midway_leave_nothing(tmp_path):
    entries = [("a", "F32", (2,)), ("b", "F32", (2,))]
    with pytest.raises(RuntimeError, match="1 of 2 tensors not written"):
        stream_safetensors(str(tmp_path / "x.safetensors"), entries,
                           iter([("a", np.ones(2, np.float32))]))

    def failing():
        yield "a", np.ones(2, np.float32)
        raise OSError(28, "No space left on device")

    with pytest.raises(writers.DataError, match="No space left on device"):
        stream_safetensors(str(tmp_path / "x.safetensors"), entries, failing())
    assert leftovers(tmp_path) == [] and not (tmp_path / "x.safetensors").exists()
