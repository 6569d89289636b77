"""One file as input: the one table of which suffix is read by which loader, the file-name
rules of folders (Hugging Face weights and indexes), and the checks before any file is read.

Only regular files are read (a FIFO would block, ``/dev/zero`` never ends); symlinks are
followed to their target.  A directory or an index (``NAME.safetensors.index.json``) is
told apart here and read by ``checkpoints``; this module reads one file at a time.  Every
message quotes the path with ``shown()`` so it stays one line.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass

from fmtcli.base.errors import DataError, shown
from fmtcli.inputs import npyfile, textparse
from fmtcli.inputs.safetensorsfile import load_safetensors
from fmtcli.inputs.source import TensorSource, from_array
from fmtcli.inputs.torchfile import load_ckpt, load_torch


def _from_entries(path: str, entries: list[npyfile.Entry]) -> list[TensorSource]:
    return [TensorSource(path, e.key, e.shape, str(e.dtype), None, e.skipped) if e.skipped
            else from_array(path, e.key, e.opener, e.shape, e.dtype) for e in entries]


def _load_npy(path: str) -> list[TensorSource]:
    return _from_entries(path, npyfile.load_npy(path))


def _load_npz(path: str) -> list[TensorSource]:
    return _from_entries(path, npyfile.load_npz(path))


def load_text(path: str) -> list[TensorSource]:
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
    return [from_array(source, None, arr, arr.shape, arr.dtype)]


@dataclass(frozen=True)
class Kind:
    """How files of one suffix are read: the loader, and what a folder's walk does with
    them (``in_folders``: read wherever a folder holds one; ``text``: numbers, not read
    beside tensor files)."""

    loader: Callable[[str], list[TensorSource]]
    in_folders: bool = True
    text: bool = False


TABLE: dict[str, Kind] = {
    ".npy": Kind(_load_npy), ".npz": Kind(_load_npz), ".safetensors": Kind(load_safetensors),
    ".pt": Kind(load_torch), ".pth": Kind(load_torch),
    ".bin": Kind(load_torch, in_folders=False),  # a torch file only as FILE or HF weights
    ".ckpt": Kind(load_ckpt),  # Lightning / Stable Diffusion: the weights under state_dict
    ".txt": Kind(load_text, text=True), ".csv": Kind(load_text, text=True),
    ".json": Kind(load_text, text=True),
}
SUFFIXES = tuple(TABLE)
TENSOR_SUFFIXES = tuple(s for s, kind in TABLE.items() if kind.in_folders and not kind.text)
TEXT_SUFFIXES = tuple(s for s, kind in TABLE.items() if kind.text)
INDEX_SUFFIXES = {".safetensors.index.json": ".safetensors", ".bin.index.json": ".bin"}
#: The formats of a Hugging Face model folder, preferred first (as ``from_pretrained``).
HF_FORMATS = tuple(INDEX_SUFFIXES.values())

# save_pretrained's weight names: [prefix_]model[-00001-of-00002].{safetensors,bin}
_HF_WEIGHTS = re.compile(
    r"(?:(?:diffusion_)?pytorch_|adapter_)?model(?:-\d+-of-\d+)?\.(?:safetensors|bin)")


def suffix(name: str) -> str:
    """The lowercased suffix of a file name (``.npy``; '' for none)."""
    return os.path.splitext(name)[1].lower()


def index_kind(name: str) -> str | None:
    """The shard suffix of an index file's name, or None when it is not an index."""
    lower = name.lower()
    return next((kind for end, kind in INDEX_SUFFIXES.items() if lower.endswith(end)), None)


def is_hf_weights(name: str) -> bool:
    """Whether a file name is one ``save_pretrained`` gives weights (``model.safetensors``,
    ``pytorch_model-00001-of-00002.bin``...)."""
    return _HF_WEIGHTS.fullmatch(name) is not None


def is_tensor_file(name: str) -> bool:
    """Whether a folder's walk reads this file name as tensors (not text, not an index)."""
    return suffix(name) in TENSOR_SUFFIXES or is_hf_weights(name)


DIRECTORY, INDEX, FILE = "directory", "index", "file"
_NOT_REGULAR = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def kind_of(path: str) -> str:
    """``DIRECTORY``, ``INDEX`` (a sharded checkpoint's index) or ``FILE`` (a regular file
    of a suffix in ``TABLE``); anything else (missing, unreadable, an unknown suffix, a
    FIFO or device) is a DataError line."""
    where = shown(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{where}: no such file") from None
    except (OSError, ValueError) as error:  # ELOOP, EACCES, a NUL byte in the path
        raise DataError(f"{where}: cannot read ({getattr(error, 'strerror', None) or error})"
                        ) from None
    if stat.S_ISDIR(info.st_mode):
        return DIRECTORY
    if suffix(path) not in TABLE:
        raise DataError(f"{where}: unsupported file type {shown(suffix(path) or '(none)')}",
                        f"supported: {', '.join(SUFFIXES)}, or - for stdin")
    if not stat.S_ISREG(info.st_mode):
        kind = next((text for test, text in _NOT_REGULAR if test(info.st_mode)), "special")
        raise DataError(f"{where}: not a regular file ({kind})",
                        "to read a stream, pipe it to - (stdin)")
    return INDEX if index_kind(path) else FILE


def read_file(path: str) -> list[TensorSource]:
    """Every tensor of a file ``kind_of`` called a ``FILE``, by its suffix's loader."""
    return TABLE[suffix(path)].loader(path)


def load_file(path: str) -> list[TensorSource]:
    """Every tensor of one file of a folder or an index's shard: checked by ``kind_of``; a
    directory or an index there is refused (``checkpoints`` walks and reads those)."""
    kind = kind_of(path)
    if kind != FILE:
        raise DataError(f"{shown(path)}: {'a directory' if kind == DIRECTORY else 'an index'}"
                        ", not a tensor file")
    return read_file(path)
