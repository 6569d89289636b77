"""Read .safetensors files without trusting a byte of them.

The header (an 8-byte little-endian length, then JSON) is bounded (``MAX_HEADER`` bytes)
and checked before anything is mapped: the JSON's nesting and duplicate names, every
dtype, shape and offset against the file's size, and that no two tensors share bytes.
Each tensor is then a read-only memory map of its bytes, opened lazily; bfloat16 as its bit
patterns (``storage.stored_dtype``), so that a bfloat16 checkpoint is read without
importing ml_dtypes (float8 tensors import it).
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np

from fmtcli.base.dtypes import SAFETENSORS_NAMES
from fmtcli.base.errors import DataError, shown
from fmtcli.inputs import npyfile, textparse
from fmtcli.inputs.source import TensorSource, from_array
from fmtcli.inputs.storage import itemsize, stored_dtype

MAX_HEADER = 100 * 1024 * 1024  # bytes of JSON header (real ones are a few KiB to MiBs)


def _is_count(value) -> bool:
    return type(value) is int and 0 <= value < 2 ** 63


def _header_json(raw: bytes, where: str):
    """The header's JSON: nesting bounded before parsing, duplicate names refused, integers
    longer than 20 digits (beyond any offset) kept as floats so no check accepts them."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{where}: corrupt .safetensors header (not UTF-8 at byte "
                        f"{8 + error.start})") from None
    return textparse.load_json(text, f"{where}: corrupt .safetensors header",
                               parse_int=lambda s: int(s) if len(s) <= 20 else float(s))


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """The parsed JSON header of a .safetensors file and the offset where its data starts.

    Checks the header length, the JSON (nesting, duplicate names), ``__metadata__`` (an
    object of strings, as the format says), every dtype, shape and offset against the file
    size, and that no two tensors share bytes.
    """
    where = shown(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise DataError(f"{where}: truncated .safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(MAX_HEADER, size - 8):
                raise DataError(f"{where}: corrupt .safetensors header (length {length} "
                                f"in a file of {size} bytes)")
            raw = handle.read(length)
    except OSError as error:
        raise DataError(f"{where}: cannot read ({error.strerror or error})") from None
    header = _header_json(raw, where)
    if not isinstance(header, dict):
        raise DataError(f"{where}: corrupt .safetensors header (not a JSON object)")
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise DataError(f"{where}: corrupt .safetensors header (__metadata__ must map "
                        "names to strings)")
    data_start = 8 + length
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError):
            raise DataError(f"{where}: corrupt .safetensors entry {shown(name)}") from None
        if not (isinstance(dtype_code, str) and isinstance(shape, list)
                and len(shape) <= npyfile.MAX_DIMS and all(_is_count(d) for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets)):
            raise DataError(f"{where}: corrupt .safetensors entry {shown(name)} (dtype must "
                            "be a string, shape (at most 64 dimensions) and data_offsets "
                            "lists of non-negative integers)")
        begin, end = offsets
        if end < begin or data_start + end > size:
            raise DataError(f"{where}: tensor {shown(name)} points outside the file "
                            "(truncated or corrupt file)")
        spans.append((begin, end, name))
        if dtype_code not in SAFETENSORS_NAMES:
            entry["_skip"] = f"safetensors dtype {shown(dtype_code)} is not supported"
        elif end - begin != (need := math.prod(shape)
                             * itemsize(SAFETENSORS_NAMES[dtype_code])):
            raise DataError(f"{where}: tensor {shown(name)} has the wrong size (its shape "
                            f"and dtype need {need:,} bytes, its offsets span "
                            f"{end - begin:,}; corrupt file)")
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise DataError(f"{where}: tensors {shown(first)} and {shown(second)} overlap "
                            "(corrupt file)")
    return header, data_start


def read_metadata(path: str) -> dict[str, str]:
    """A .safetensors file's ``__metadata__`` (names -> strings; {} where it has none), from
    the header as ``read_safetensors_header`` bounds and checks it (``MAX_HEADER`` bytes)."""
    return dict(read_safetensors_header(path)[0].get("__metadata__", {}))


def load_safetensors(path: str) -> list[TensorSource]:
    """Every tensor of a .safetensors file, each memory-mapped (read-only) when opened;
    dtypes fmtcli does not read are skipped with the reason."""
    header, data_start = read_safetensors_header(path)
    sources = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = tuple(entry["shape"])
        if "_skip" in entry:
            sources.append(TensorSource(path, name, shape, entry["dtype"], None, entry["_skip"]))
            continue
        dtype = stored_dtype(SAFETENSORS_NAMES[entry["dtype"]])  # bfloat16: its bits
        offset = data_start + entry["data_offsets"][0]

        def opener(dtype=dtype, offset=offset, shape=shape):
            if math.prod(shape) == 0:
                return np.zeros(shape, dtype)
            return npyfile.memory_map(path, dtype, offset, shape)

        sources.append(from_array(path, name, opener, shape, dtype))
    return sources
