"""Load the tensors users bring: .npy .npz .safetensors .pt/.pth, text/CSV/JSON, stdin.

Every loader yields ``TensorSource`` objects that open their data lazily: ``.npy``,
uncompressed ``.npz`` members and ``.safetensors`` tensors are memory-mapped (read-only), so
a checkpoint larger than memory streams chunk by chunk.  Nothing is ever unpickled:
``np.load(allow_pickle=False)``, ``torch.load(weights_only=True)``; the safetensors reader
checks every offset against the file's size before mapping anything.

Tensors that are not real floating point (int64 position ids, bool masks, complex) are
reported with a ``skipped`` reason instead of failing the run.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import os
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .errors import DataError, UsageError

SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth", ".txt", ".csv", ".json")
FLOAT_KINDS = {"float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2",
               "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn",
               "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3", "float8_e3m4",
               "float8_e4m3b11fnuz"}

_SAFETENSORS_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8), "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_SAFETENSORS_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass
class TensorSource:
    """One tensor of one input: where it is, what it holds, and how to open it."""

    source: str
    key: str | None
    shape: tuple[int, ...]
    dtype: str
    opener: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    skipped: str | None = None

    @property
    def name(self) -> str:
        return self.source if self.key is None else f"{self.source}:{self.key}"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def array(self) -> np.ndarray:
        """The data (a read-only memory map where the file allows it)."""
        if self.opener is None:
            raise DataError(f"{self.name}: {self.skipped or 'no data'}")
        return self.opener()

    def to_dict(self) -> dict:
        return {"source": self.source, "key": self.key, "shape": list(self.shape),
                "dtype": self.dtype}


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def unusable_reason(dtype: np.dtype, size: int) -> str | None:
    """Why a tensor of this dtype and size cannot be quantized, or None if it can."""
    name = dtype_name(dtype)
    if name not in FLOAT_KINDS:
        return f"dtype {name} is not a real floating-point type"
    if size == 0:
        return "empty"
    return None


def _from_array(source: str, key: str | None, arr_or_opener, shape, dtype) -> TensorSource:
    opener = arr_or_opener if callable(arr_or_opener) else (lambda a=arr_or_opener: a)
    reason = unusable_reason(dtype, math.prod(shape))
    return TensorSource(source, key, tuple(int(s) for s in shape), dtype_name(dtype),
                        None if reason else opener, reason)


# -- formats -------------------------------------------------------------------------------

def _load_npy(path: str) -> list[TensorSource]:
    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or error})") from None
    if magic != b"\x93NUMPY":
        raise DataError(f"{path}: not a .npy file (it does not start with numpy's magic bytes)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        text = str(error)
        if "pickle" in text or "object" in text.lower():
            text = "it holds Python objects, which fmtcli never unpickles"
        elif "larger than" in text or "length" in text:
            text = "truncated: shorter than its header says"
        raise DataError(f"{path}: not a readable .npy file ({text})") from None
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or error})") from None
    return [_from_array(path, None, arr, arr.shape, arr.dtype)]


def _npz_member_memmap(path: str, info: zipfile.ZipInfo) -> Callable[[], np.ndarray] | None:
    """A memory map of an uncompressed .npz member, or None when it is compressed."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise DataError(f"{path}: corrupt .npz member {info.filename}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        handle.seek(start)
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        offset = handle.tell()
    if dtype.hasobject:
        raise DataError(f"{path}: member {info.filename} holds Python objects (not loaded: "
                        "fmtcli never unpickles)")
    order = "F" if fortran else "C"
    if offset + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
        raise DataError(f"{path}: member {info.filename} is truncated")
    return shape, dtype, (lambda: np.memmap(path, dtype=dtype, mode="r", offset=offset,
                                            shape=shape, order=order))


def _load_npz(path: str) -> list[TensorSource]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from None
    sources = []
    with archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            key = info.filename[:-4]
            try:
                mapped = _npz_member_memmap(path, info)
            except ValueError as error:
                raise DataError(f"{path}: corrupt member {key} ({error})") from None
            if mapped is not None:
                shape, dtype, opener = mapped
            else:  # compressed: the member must be read whole
                with archive.open(info) as member:
                    try:
                        arr = np.lib.format.read_array(io.BytesIO(member.read()),
                                                       allow_pickle=False)
                    except ValueError as error:
                        raise DataError(f"{path}: cannot read member {key} ({error})") from None
                shape, dtype, opener = arr.shape, arr.dtype, arr
            sources.append(_from_array(path, key, opener, shape, dtype))
    return sources


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """The parsed JSON header of a .safetensors file and the offset where its data starts.

    Checks the header length, the JSON, every dtype, shape and offset against the file size.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise DataError(f"{path}: truncated .safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER, size - 8):
            raise DataError(f"{path}: corrupt .safetensors header (length {length} "
                            f"in a file of {size} bytes)")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: corrupt .safetensors header ({error})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: corrupt .safetensors header (not a JSON object)")
    data_start = 8 + length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError):
            raise DataError(f"{path}: corrupt .safetensors entry '{name}'") from None
        if not (isinstance(dtype_code, str) and isinstance(shape, list)
                and all(_is_count(d) for d in shape) and isinstance(offsets, list)
                and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise DataError(f"{path}: corrupt .safetensors entry '{name}' (dtype must be a "
                            "string, shape and data_offsets lists of non-negative integers)")
        begin, end = offsets
        shape = tuple(shape)
        if dtype_code not in _SAFETENSORS_DTYPES:
            entry["_skip"] = f"safetensors dtype {dtype_code} is not supported"
            continue
        itemsize = _SAFETENSORS_DTYPES[dtype_code].itemsize
        if (begin < 0 or end < begin or data_start + end > size
                or end - begin != math.prod(shape) * itemsize):
            raise DataError(f"{path}: tensor '{name}' points outside the file or has the "
                            "wrong size (truncated or corrupt file)")
    return header, data_start


def _load_safetensors(path: str) -> list[TensorSource]:
    header, data_start = read_safetensors_header(path)
    sources = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = tuple(int(s) for s in entry["shape"])
        if "_skip" in entry:
            sources.append(TensorSource(path, name, shape, entry["dtype"], None, entry["_skip"]))
            continue
        dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        offset = data_start + int(entry["data_offsets"][0])

        def opener(dtype=dtype, offset=offset, shape=shape):
            if math.prod(shape) == 0:
                return np.zeros(shape, dtype)
            return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)

        sources.append(_from_array(path, name, opener, shape, dtype))
    return sources


def _torch_to_numpy(tensor) -> np.ndarray | None:
    import torch

    mapping = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu"):
        if hasattr(torch, name):
            mapping[getattr(torch, name)] = (torch.uint8, getattr(ml_dtypes, name))
    tensor = tensor.detach().cpu()
    if tensor.dtype in mapping:
        carrier, target = mapping[tensor.dtype]
        return tensor.contiguous().view(carrier).numpy().view(target)
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):
        return None


def _flatten_state(obj, prefix: str = "") -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten_state(value, f"{prefix}{key}.")
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _flatten_state(value, f"{prefix}{index}.")
    else:
        yield prefix[:-1], obj


def _load_torch(path: str) -> list[TensorSource]:
    try:
        import torch
    except ImportError:
        raise UsageError(f"{path}: reading .pt/.pth needs torch",
                         "pip install 'fmtcli[torch]'") from None
    try:  # memory-mapped where the file allows it (the zip format of torch >= 1.6)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many types for corrupt or unsafe files
            text = str(error).strip()
            message = text.splitlines()[0] if text else type(error).__name__
            raise DataError(f"{path}: cannot load as a torch state dict ({message})") from None
    sources = []
    for key, value in _flatten_state(state):
        if not isinstance(value, torch.Tensor):
            continue
        arr = _torch_to_numpy(value)
        if arr is None:
            sources.append(TensorSource(path, key, tuple(value.shape), str(value.dtype)[6:], None,
                                        f"dtype {value.dtype} has no numpy equivalent"))
            continue
        sources.append(_from_array(path, key, arr, arr.shape, arr.dtype))
    return sources


def _json_constant(name: str) -> float:
    return float(name.lower().replace("infinity", "inf"))


def _holds_none(data) -> bool:
    if data is None:
        return True
    if isinstance(data, list):
        return any(_holds_none(item) for item in data)
    return False


def parse_text(text: str, source: str) -> np.ndarray:
    """Numbers from text: a JSON (nested) array, or numbers split by commas/whitespace.

    Lines with the same number (> 1) of fields give a 2-D array; otherwise 1-D.
    """
    stripped = text.strip()
    if not stripped:
        raise DataError(f"{source}: no numbers found")
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped, parse_constant=_json_constant)
        except json.JSONDecodeError as error:
            raise DataError(f"{source}: invalid JSON ({error})") from None
        if _holds_none(data):
            raise DataError(f"{source}: JSON null is not a number",
                            'write "nan" or NaN for a missing value')
        try:
            arr = np.asarray(data, dtype=np.float64)
        except (TypeError, ValueError):
            raise DataError(f"{source}: JSON must be a (rectangular) array of numbers") from None
        return arr
    rows = []
    for number, line in enumerate(stripped.splitlines(), 1):
        fields = line.replace(",", " ").split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            rows.append([float(f) for f in fields])
        except ValueError as error:
            raise DataError(f"{source}: line {number}: {error}") from None
    if not rows:
        raise DataError(f"{source}: no numbers found")
    widths = {len(r) for r in rows}
    if len(widths) == 1 and len(rows) > 1 and rows and len(rows[0]) > 1:
        return np.asarray(rows, dtype=np.float64)
    return np.asarray([v for r in rows for v in r], dtype=np.float64)


def _load_text(path: str) -> list[TensorSource]:
    if path == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"{path}: cannot read as text ({error})") from None
        source = path
    arr = parse_text(text, source)
    return [_from_array(source, None, arr, arr.shape, arr.dtype)]


_LOADERS = {".npy": _load_npy, ".npz": _load_npz, ".safetensors": _load_safetensors,
            ".pt": _load_torch, ".pth": _load_torch, ".txt": _load_text, ".csv": _load_text,
            ".json": _load_text}


def load_path(path: str) -> list[TensorSource]:
    """Every tensor of one path: a file of a known type, a directory, or ``-`` (stdin)."""
    if path == "-":
        return _load_text("-")
    if os.path.isdir(path):
        found = []
        for root, _, files in sorted(os.walk(path)):
            for name in sorted(files):
                if os.path.splitext(name)[1].lower() in SUFFIXES:
                    found.extend(load_path(os.path.join(root, name)))
        if not found:
            raise DataError(f"{path}: no tensor files in this directory "
                            f"(looked for {', '.join(SUFFIXES)})")
        return found
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _LOADERS:
        raise DataError(f"{path}: unsupported file type '{suffix or '(none)'}'",
                        f"supported: {', '.join(SUFFIXES)}, or - for stdin")
    return _LOADERS[suffix](path)


def select_keys(sources: list[TensorSource], patterns: list[str]) -> list[TensorSource]:
    """Keep tensors whose key matches a name or glob; an unmatched pattern is an error."""
    if not patterns:
        return sources
    chosen = []
    for pattern in patterns:
        matched = [s for s in sources
                   if s.key is not None
                   and (s.key == pattern or fnmatch.fnmatchcase(s.key, pattern))]
        if not matched:
            keys = [s.key for s in sources if s.key is not None]
            shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
            raise DataError(f"no tensor matches --key '{pattern}'",
                            f"available: {shown}" if keys else "these inputs have no keys")
        chosen.extend(s for s in matched if s not in chosen)
    return chosen


def load_inputs(paths: list[str], keys: list[str] | None = None) -> list[TensorSource]:
    """All tensors of all paths (in order), filtered by ``keys``; fails if none is usable."""
    sources = [s for path in paths for s in load_path(path)]
    sources = select_keys(sources, keys or [])
    if not any(s.skipped is None for s in sources):
        reasons = "; ".join(f"{s.name}: {s.skipped}" for s in sources[:5])
        raise DataError(f"nothing to quantize ({reasons})")
    return sources


EXAMPLE_SEED = 181


def example_tensor(seed: int = EXAMPLE_SEED) -> TensorSource:
    """The article's outlier example: 1024 values of typical size 0.001 plus one of 100.

    The small values are N(0, 0.001**2) draws (float32), the outlier of 100 sits at index 0.
    The default seed is a draw on which the article's figures come out as it states them:
    per-tensor E4M3 flushes 16% of the values with a median relative error of 14%;
    blocks of 128 bring the median to about 2%.
    """
    rng = np.random.default_rng(seed)
    small = (rng.standard_normal(1024) * 0.001).astype(np.float32)
    data = np.concatenate([np.array([100.0], dtype=np.float32), small])
    return TensorSource("<built-in example>", None, data.shape, "float32", lambda: data)
