"""Write quantization results to files, atomically and never over the user's data.

- ``.npy``: the dequantized values ``x_q`` (float32) of one tensor, written chunk by chunk
  into a memory-mapped temporary file.
- ``.npz`` / ``.safetensors``: for every tensor ``<key>.codes`` (the raw element codes,
  uint8 for formats of up to 8 bits) and ``<key>.scales`` (float32, one per tile, in the
  direction ``x_q = decode(codes) / scales``).  The .safetensors metadata records the format,
  scheme and tile of each tensor.

Every file is written to a temporary name in the target directory and renamed into place
when complete.  An existing file is replaced only with ``force``; an input is never a target.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile

import numpy as np

from .errors import DataError, UsageError
from .formats import FormatSpec
from .rounding import encode

OUT_SUFFIXES = (".npy", ".npz", ".safetensors")


def check_target(path: str, inputs: list[str], force: bool) -> str:
    """Validate an output path before any work: known suffix, not an input, no clobbering."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in OUT_SUFFIXES:
        raise UsageError(f"--out must end in {', '.join(OUT_SUFFIXES)}, got '{path}'")
    target = os.path.realpath(path)
    for item in inputs:
        if item != "-" and os.path.exists(item) and os.path.realpath(item) == target:
            raise UsageError(f"--out '{path}' is one of the inputs; refusing to overwrite it")
    if os.path.exists(path) and not force:
        raise UsageError(f"'{path}' exists", "pass --force to replace it")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"--out directory '{directory}' does not exist")
    return suffix


def _temporary(path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    handle, name = tempfile.mkstemp(prefix=".fmtcli-", suffix=os.path.splitext(path)[1],
                                    dir=directory)
    os.close(handle)
    return name


def _commit(temporary: str, path: str) -> None:
    """Give the file the mode a new file gets (mkstemp's is 0600), then rename into place."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(temporary, 0o666 & ~mask)
    os.replace(temporary, path)


def check_not_an_input(path: str, sources) -> None:
    """Refuse a target that is one of the tensors' files (e.g. found in an input folder)."""
    target = os.path.realpath(path)
    for source in sources:
        if os.path.exists(source.source) and os.path.realpath(source.source) == target:
            raise UsageError(f"--out '{path}' is one of the inputs; refusing to overwrite it")


def output_names(sources) -> list[str]:
    """A distinct name per tensor for the codes/scales file: its key, or its file's stem;
    names that repeat across inputs get the file's stem in front, then a counter."""
    def stem(source) -> str:
        return os.path.splitext(os.path.basename(source.source))[0] or "tensor"

    names = [source.key or stem(source) for source in sources]
    repeated = {name for name in names if names.count(name) > 1}
    names = [f"{stem(s)}.{n}" if n in repeated and s.key else n for s, n in zip(sources, names)]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}.{seen[name]}")
    return unique


def codes_of(values: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """Element codes of values already on the format's grid (ml_dtypes where it has it)."""
    dtype = spec.ml_dtype
    if dtype is None:
        return encode(values, spec)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dtype.itemsize]
    return np.ascontiguousarray(values).astype(dtype).view(width)


class NpyWriter:
    """Streams one tensor's dequantized values into a .npy (temporary until ``close``)."""

    def __init__(self, path: str, shape: tuple[int, ...]) -> None:
        self.path = path
        self.temporary = _temporary(path)
        self.array = np.lib.format.open_memmap(self.temporary, mode="w+", dtype=np.float32,
                                               shape=shape)
        self.matrix = self.array.reshape(-1, shape[-1] if shape else 1)

    def write(self, rows: slice, cols: slice, values: np.ndarray) -> None:
        self.matrix[rows, cols] = values

    def close(self) -> None:
        self.array.flush()
        del self.matrix, self.array
        _commit(self.temporary, self.path)

    def abort(self) -> None:
        if os.path.exists(self.temporary):
            os.unlink(self.temporary)


def write_codes(path: str, tensors: list[tuple[str, np.ndarray, np.ndarray, dict]]) -> None:
    """Write (key, codes, scales, description) per tensor to .npz or .safetensors."""
    arrays: dict[str, np.ndarray] = {}
    metadata: dict[str, str] = {"fmtcli": "x_q = decode(codes) / scales"}
    for key, codes, scales, description in tensors:
        arrays[f"{key}.codes"] = np.ascontiguousarray(codes)
        arrays[f"{key}.scales"] = np.ascontiguousarray(scales, dtype=np.float32)
        metadata[key] = json.dumps(description)
    temporary = _temporary(path)
    try:
        if path.lower().endswith(".npz"):
            with open(temporary, "wb") as handle:
                np.savez(handle, **arrays)
        else:
            _write_safetensors(temporary, arrays, metadata)
        _commit(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise DataError(f"cannot write '{path}' ({error.strerror or error})") from None


_ST_CODES = {np.dtype(np.uint8): "U8", np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32",
             np.dtype(np.uint64): "U64", np.dtype(np.float32): "F32"}


def _write_safetensors(path: str, arrays: dict[str, np.ndarray], metadata: dict) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for key, arr in arrays.items():
        header[key] = {"dtype": _ST_CODES[arr.dtype], "shape": list(arr.shape),
                       "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for arr in arrays.values():
            handle.write(arr.tobytes())
