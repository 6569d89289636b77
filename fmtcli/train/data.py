"""The text ``fmt train`` learns: bytes, a vocabulary of 256, seeded random batches.

The default corpus is on every machine with Python: the bytes of the standard library's
own ``.py`` files (``sysconfig.get_paths()["stdlib"]``, installed packages under
``site-packages`` / ``dist-packages`` left out), in sorted path order, up to
``DEFAULT_BYTES``.  It is the same on every run of one Python installation (another Python
version gives another text).  ``--data FILE`` trains on that file's bytes instead.

The last tenth of the bytes (at least ``seq + 1``) is the validation split; the rest is
for training.  A batch is ``batch`` windows of ``seq + 1`` bytes at offsets drawn by a
``numpy`` generator seeded with the run's seed: inputs are the first ``seq``, targets the
last ``seq`` (the next byte of each).  The same seed gives the same batches.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fmtcli.base.errors import DataError, Param, shown

#: The most bytes of the standard library read for the default corpus.
DEFAULT_BYTES = 4 << 20
#: The most bytes of a ``--data`` file read.
MAX_FILE_BYTES = 256 << 20
#: The share of the bytes held out for validation.
VALIDATION_SHARE = 0.1
SKIPPED_FOLDERS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    """The training and validation bytes (uint8 arrays) and where they came from."""

    name: str
    train: np.ndarray
    validation: np.ndarray

    @property
    def size(self) -> int:
        return int(self.train.size + self.validation.size)


@functools.lru_cache(maxsize=2)
def stdlib_bytes(limit: int = DEFAULT_BYTES) -> tuple[str, bytes]:
    """The standard library's .py files, sorted by path, concatenated up to ``limit`` bytes
    (read once a process: the walk takes a second or more)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py")
                   if not SKIPPED_FOLDERS.intersection(p.relative_to(root).parts))
    pieces, total = [], 0
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        pieces.append(data[:limit - total])
        total += len(pieces[-1])
        if total >= limit:
            break
    return f"<Python {sysconfig.get_python_version()} standard library, {root}>", b"".join(pieces)


def file_bytes(path: str) -> bytes:
    """The bytes of ``path`` (at most ``MAX_FILE_BYTES``); a one-line DataError otherwise."""
    if os.path.isdir(path):
        raise DataError(Param("data", path) + " is a directory", "name a text file")
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_FILE_BYTES)
    except OSError as error:
        raise DataError(f"cannot read {shown(path)} ({error.strerror or error})") from None


def needed_bytes(seq: int) -> int:
    """The fewest bytes that hold one training window and one validation window."""
    return 2 * (seq + 1)


def load_corpus(path: str | None, seq: int) -> Corpus:
    """The corpus for windows of ``seq`` tokens: ``path``'s bytes, or the standard library's."""
    if path is None:
        name, raw = stdlib_bytes()
    else:
        name, raw = path, file_bytes(path)
    if len(raw) < needed_bytes(seq):
        where = "the standard library's .py files hold" if path is None else f"{shown(path)} holds"
        raise DataError(f"{where} {len(raw)} bytes, too few for one batch: windows of "
                        + Param("seq", seq) + f" need at least {needed_bytes(seq)} bytes "
                        f"(seq + 1 to train on and as many to validate)",
                        "give a longer file or a smaller seq")
    data = np.frombuffer(raw, dtype=np.uint8)
    held = max(seq + 1, int(len(data) * VALIDATION_SHARE))
    return Corpus(name, data[:-held], data[-held:])


class Batches:
    """Seeded random windows of one split: ``next()`` gives (inputs, targets) as int64
    arrays of shape (batch, seq)."""

    def __init__(self, data: np.ndarray, batch: int, seq: int, seed: int) -> None:
        self.data, self.batch, self.seq = data, batch, seq
        self.rng = np.random.default_rng(seed)
        self.offsets = np.arange(seq + 1)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, self.data.size - self.seq, size=self.batch)
        windows = self.data[starts[:, None] + self.offsets].astype(np.int64)
        return windows[:, :-1], windows[:, 1:]
