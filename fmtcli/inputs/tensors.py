"""Load the tensors users bring: the one entry for a FILE argument (a file, a folder, an
index, or ``-`` for stdin), the ``--key`` filter, and the names of the Python API.

``load_path`` tells a directory or an index from a file (``files.kind_of``, where the one
suffix table is) and hands it to ``checkpoints`` (folders, Hugging Face model folders,
sharded checkpoints by their index) or to the file's loader (``npyfile``,
``safetensorsfile``, ``torchfile``, ``textparse``).  Every loader yields ``TensorSource``
objects (``source``) that open their data lazily: ``.npy``, uncompressed ``.npz`` members
and ``.safetensors`` tensors are memory-mapped (read-only), so a checkpoint larger than
memory streams chunk by chunk.  Nothing is ever unpickled: ``np.load(allow_pickle=False)``,
``torch.load(weights_only=True)``.

Tensors that are not real floating point (int64 position ids, bool masks, complex) are
reported with a ``skipped`` reason instead of failing the run; ``load_inputs`` fails, in the
words of the command that called it (``purpose``), only when nothing is left to use.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator

from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.inputs import checkpoints, files
from fmtcli.inputs.checkpoints import config_folder as config_folder  # re-exported
from fmtcli.inputs.files import SUFFIXES  # noqa: F401  (re-exported)
from fmtcli.inputs.source import (  # noqa: F401  (re-exported: the Python API's names)
    EXAMPLE_SEED,
    TensorInfo,
    TensorSource,
    example_tensor,
    skipped_records,
)
from fmtcli.inputs.storage import (  # noqa: F401  (re-exported: tensors.numpy_dtype ...)
    FLOAT_KINDS,
    dtype_name,
    numpy_dtype,
    safetensors_dtypes,
    unusable_reason,
)


def load_path(path: str, as_stored: bool = False) -> list[TensorSource]:
    """Every tensor of one path: a file of a known type, a directory, an index of a
    sharded checkpoint, or ``-`` (stdin).

    The tensors of an already-quantized layout (``inputs.layouts``: DeepSeek FP8,
    compressed-tensors, ModelOpt NVFP4, gpt-oss MXFP4, fmt's own ``--out``...) come as
    their dequantized float32 tensors, their scales folded in (a ``LayoutNote`` says so);
    ``as_stored`` gives every stored tensor as it is.

    Only regular files are read (a FIFO would block, ``/dev/zero`` never ends); symlinks are
    followed to their target, but a directory's walk does not enter linked directories.
    """
    if path == "-":
        return files.load_text("-")
    kind = files.kind_of(path)
    if kind == files.DIRECTORY:  # a model folder, or the tensor files it holds
        sources = checkpoints.load_directory(path)
    elif kind == files.INDEX:  # a sharded checkpoint, by its index
        sources = checkpoints.load_index(path)[0]
    else:
        sources = files.read_file(path)
    if as_stored or not any(s.key is not None for s in sources):
        return sources
    from fmtcli.inputs import layouts

    return layouts.dequantized(sources, layouts.read_config(config_folder(path)))


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
            raise DataError("no tensor matches " + Param("key", pattern),
                            f"available: {listing}" if keys else "these inputs have no keys")
        chosen.extend(s for s in matched if s not in chosen)
    return chosen


def _load_all(paths: list[str], as_stored: bool) -> list[TensorSource]:
    """Every path's tensors, the files of one folder given one by one (the shards of a
    checkpoint) offered to the layout readers together (a weight in one shard, its scales
    in the next), with the folder's ``config.json``; one ``LayoutNote`` for the run."""
    if as_stored or len(paths) < 2:
        return [s for path in paths for s in load_path(path, as_stored)]
    groups: dict = {}
    for path in paths:
        plain = path != "-" and files.kind_of(path) not in (files.DIRECTORY, files.INDEX)
        folder = config_folder(path) if plain else None
        groups.setdefault(folder if plain else (path,), []).append(path)
    from fmtcli.inputs import layouts

    sources = []
    for folder, group in groups.items():
        stored = [s for path in group for s in load_path(path, as_stored=True)]
        if not any(s.key is not None for s in stored):
            sources += stored
            continue
        where = folder if isinstance(folder, str) else config_folder(group[0])
        sources += layouts.dequantized(stored, layouts.read_config(where), note=False)
    _layout_note([s for s in sources if s.quantized is not None], paths)
    return sources


def _layout_note(quantized: list[TensorSource], paths: list[str]) -> None:
    """The one note of a run whose inputs hold quantized layouts (as ``layouts.dequantized``
    says it for one input)."""
    if not quantized:
        return
    import warnings

    from fmtcli.inputs.layouts.base import LayoutNote

    names = sorted({s.quantized.layout for s in quantized})
    many = len(quantized) != 1
    inputs = f"{len(paths):,} inputs"
    warnings.warn(f"{len(quantized):,} tensor{'s' if many else ''} of {inputs} "
                  f"{'are' if many else 'is'} already quantized ({', '.join(names)}): read "
                  f"as {'their' if many else 'its'} dequantized float32 values (fmt audit "
                  "checks the layout)", LayoutNote, stacklevel=3)


def load_inputs(paths: list[str], keys: list[str] | None = None,
                purpose: str = "to quantize", as_stored: bool = False
                ) -> list[TensorSource]:
    """All tensors of all paths (in order), filtered by ``keys``; fails if none is usable,
    saying ``nothing {purpose}`` (the calling command's words: "to quantize", "to multiply",
    "to sum"...).  Standard input (``-``) can be read once.  ``as_stored``: as
    ``load_path``'s."""
    if paths.count("-") > 1:
        raise UsageError("'-' (standard input) is given more than once; it can be read once")
    sources = _load_all(paths, as_stored)
    if not sources:
        raise DataError(f"nothing {purpose} ({', '.join(shown(p) for p in paths[:5])} "
                        "hold no tensors)")
    sources = select_keys(sources, keys or [])
    if not any(s.skipped is None for s in sources):
        reasons = "; ".join(f"{shown(s.name)}: {s.skipped}" for s in sources[:5])
        raise DataError(f"nothing {purpose} ({reasons})")
    return sources
