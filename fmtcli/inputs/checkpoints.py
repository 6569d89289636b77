"""Directories as inputs: a Hugging Face model folder read as one checkpoint, any other
folder as the tensor files it holds.

The rules, folder by folder of the walk (linked directories are not entered):

- **A Hugging Face model folder** holds an index (``model.safetensors.index.json``,
  ``pytorch_model.bin.index.json``, or any ``NAME.safetensors.index.json`` /
  ``NAME.bin.index.json``) or weights named the way ``save_pretrained`` names them
  (``model.safetensors``, ``model-00001-of-00002.safetensors``, ``pytorch_model.bin``,
  ``diffusion_pytorch_model.safetensors``, ``adapter_model.bin``...).  It is read as one
  checkpoint: with an index, its tensors in the index's ``weight_map`` order, each shard
  opened (and its header read) once; without one, the weight files in name order.
  Safetensors win over ``.bin`` when both are there (the same weights in two formats, as
  ``from_pretrained`` prefers them too).  Every other tensor file of that folder (the
  ``.bin`` twin, ``optimizer.pt``, ``rng_state.pth``, ``training_args.bin``) is left unread
  and named in one ``CheckpointNote`` warning (the command line shows it as a ``Note:``).
- **Any other folder** gives all its tensor files (``.npy .npz .safetensors .pt .pth .ckpt``)
  in name order.  A ``.bin`` there is not read: only Hugging Face weights or an explicit
  FILE argument make ``.bin`` a torch checkpoint.
- **Text is not a tensor beside tensors**: when the directory given (its whole tree) holds
  any tensor file, its ``.json``/``.txt``/``.csv`` files (``config.json``,
  ``tokenizer.json``, ``vocab.txt``) are not read.  A directory of text/CSV/JSON files only
  is read as numbers, as each file given alone would be.

Index checks (each one ``DataError`` line naming the index): the JSON (bounded nesting, no
duplicate names), ``weight_map`` an object of tensor name -> shard file name; a shard name
with a path separator or ``..`` (outside the folder), a shard of the other format, a missing
shard, and a tensor the index names but its shard lacks are errors.  A tensor a shard holds
but the index does not name is kept as a *skipped* tensor (the index is what
``from_pretrained`` loads, so it is listed, not quantized).
"""

from __future__ import annotations

import os
import warnings

from fmtcli.base.errors import DataError, Note, shown
from fmtcli.inputs import textparse
from fmtcli.inputs.files import (
    HF_FORMATS,
    TENSOR_SUFFIXES,
    TEXT_SUFFIXES,
    index_kind,
    is_hf_weights,
    is_tensor_file,
    load_file,
    suffix,
)
from fmtcli.inputs.source import TensorSource

MAX_INDEX_BYTES = 64 * 1024 * 1024  # a million tensor names; real indexes are < 1 MiB


class CheckpointNote(Note):
    """Files of a model folder that were not read (a ``.bin`` twin of the safetensors,
    optimizer state...): a note for the user, not an error."""


def _listing(names: list[str], limit: int = 4) -> str:
    """Up to ``limit`` quoted file names, and how many more."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown(name) for name in names[:limit]) + more


def load_directory(path: str) -> list[TensorSource]:
    """Every tensor of a directory given as FILE, by the rules of this module's docstring."""
    folders = [(root, sorted(files)) for root, dirs, files in os.walk(path)
               for _ in [dirs.sort()]]
    has_tensors = any(is_tensor_file(name) or index_kind(name)
                      for _, files in folders for name in files)
    found = []
    for root, files in folders:
        if any(index_kind(name) or is_hf_weights(name) for name in files):
            found.extend(_load_model_folder(root, files))
            continue
        for name in files:
            kind = suffix(name)
            if kind in TENSOR_SUFFIXES or (kind in TEXT_SUFFIXES and not has_tensors):
                found.extend(load_file(os.path.join(root, name)))
    if not found:
        looked = TENSOR_SUFFIXES + ("Hugging Face weights",) + (
            () if has_tensors else TEXT_SUFFIXES)
        raise DataError(f"{shown(path)}: no tensor files in this directory "
                        f"(looked for {', '.join(looked)})")
    return found


def _load_model_folder(root: str, files: list[str]) -> list[TensorSource]:
    """One Hugging Face model folder: the safetensors checkpoint (indexed or not), else the
    .bin one; the folder's other tensor files are named in a ``CheckpointNote``."""
    for kind in HF_FORMATS:
        indexes = [name for name in files if index_kind(name) == kind]
        weights = [name for name in files if is_hf_weights(name) and suffix(name) == kind]
        if not (indexes or weights):
            continue
        found, used = [], set(indexes)
        for index in indexes:
            sources, shards = load_index(os.path.join(root, index))
            found.extend(sources)
            used.update(shards)
        if not indexes:
            for name in weights:
                found.extend(load_file(os.path.join(root, name)))
            used.update(weights)
        left = [name for name in files if name not in used
                and (is_tensor_file(name) or index_kind(name))]
        if left:
            warnings.warn(f"{shown(root)}: read as one Hugging Face checkpoint "
                          f"({_listing(indexes or weights)}); not read: {_listing(left)} "
                          "(give a file as FILE to read it)", CheckpointNote, stacklevel=2)
        return found
    raise AssertionError("a model folder holds an index or weights")  # pragma: no cover


def read_index(path: str) -> dict[str, str]:
    """The ``weight_map`` of a Hugging Face index file (tensor name -> shard file name, in
    the file's order), checked: JSON object, bounded nesting, no duplicate names, strings
    only, shard names plain file names of the index's format beside it."""
    where = shown(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_INDEX_BYTES + 1)
    except OSError as error:
        raise DataError(f"{where}: cannot read ({error.strerror or error})") from None
    if len(raw) > MAX_INDEX_BYTES:
        raise DataError(f"{where}: index larger than {MAX_INDEX_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{where}: corrupt index (not UTF-8 text)") from None
    document = textparse.load_json(text, f"{where}: corrupt index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(shard, str) for shard in weight_map.values()):
        raise DataError(f"{where}: corrupt index (no \"weight_map\" object of tensor names "
                        "to shard file names)")
    if not weight_map:
        raise DataError(f"{where}: the index names no tensors")
    kind = index_kind(os.path.basename(path))
    for name, shard in weight_map.items():
        if (not shard or shard in (".", "..") or "/" in shard or "\\" in shard
                or "\0" in shard):
            raise DataError(f"{where}: refused: tensor {shown(name)} is in shard "
                            f"{shown(shard)}, outside the index's directory (shards are "
                            "file names beside the index)")
        if suffix(shard) != kind:
            raise DataError(f"{where}: shard {shown(shard)} of tensor {shown(name)} is not "
                            f"a {kind} file")
    return weight_map


def load_index(path: str) -> tuple[list[TensorSource], list[str]]:
    """The tensors of an indexed (sharded) checkpoint in the index's order, and its shard
    file names.  Each shard is opened once; tensors a shard holds that the index does not
    name come after, as skipped."""
    weight_map = read_index(path)
    folder, index_name = os.path.split(path)
    shards = list(dict.fromkeys(weight_map.values()))
    held = {}
    for shard in shards:
        shard_path = os.path.join(folder, shard)
        if not os.path.isfile(shard_path):  # missing, a directory, or a broken link
            count = sum(1 for s in weight_map.values() if s == shard)
            raise DataError(f"{shown(path)}: shard {shown(shard)} is missing or not a file "
                            f"(the index puts {count:,} tensor{'s' if count > 1 else ''} "
                            "in it)")
        held[shard] = {source.key: source for source in load_file(shard_path)}
    found = []
    for name, shard in weight_map.items():
        source = held[shard].pop(name, None)
        if source is None:
            raise DataError(f"{shown(path)}: tensor {shown(name)} is not in its shard "
                            f"{shown(shard)} (incomplete or mismatched checkpoint)")
        found.append(source)
    for shard in shards:
        found.extend(TensorSource(s.source, s.key, s.shape, s.dtype, None,
                                          f"not named in {index_name}")
                     for s in held[shard].values())
    return found, shards


# -- a tensor's name among many: its key, or its file and key where keys repeat ------------

def repeated_keys(tensors) -> set[str]:
    """The keys that more than one of ``tensors`` (``TensorSource`` or ``TensorInfo``) has:
    the same name in two files of a folder (``a.pt`` and ``b.pt`` each holding ``w``)."""
    seen: set[str] = set()
    repeated: set[str] = set()
    for t in tensors:
        if t.key is not None:
            (repeated if t.key in seen else seen).add(t.key)
    return repeated


def file_in(source: str, folder: str | None = None) -> str:
    """The file of a tensor as its name shows it: relative to ``folder`` (with ``/``
    separators), or the path as loaded where it is not under ``folder`` (or no folder)."""
    if folder:
        try:
            relative = os.path.relpath(source, folder)
        except ValueError:  # another drive
            relative = os.pardir
        if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
            source = relative
    return source.replace(os.sep, "/")


def folder_of(path: str) -> str:
    """The folder the names of a path's tensors are relative to: the path itself for a
    directory, else the folder its file is in."""
    return path if os.path.isdir(path) else os.path.dirname(path)


def config_folder(path: str) -> str | None:
    """The folder whose ``config.json`` describes ``path``: a directory itself, else the
    folder its file (or index) is in, ``.`` for a bare file name; None for stdin (``-``).
    The one answer for every reader of a checkpoint's config (``tensors.load_path``,
    ``tensors.load_inputs``, the ModelOpt reader's hf_quant_config.json, ``fmt audit``)."""
    if path == "-":
        return None
    return folder_of(path) or "."


def common_folder(tensors) -> str | None:
    """The deepest folder that holds every tensor's file (None where they share none)."""
    try:
        folder = os.path.commonpath([os.path.dirname(t.source) for t in tensors])
    except ValueError:  # absolute and relative paths mixed, or no tensors
        return None
    return folder or None


def tensor_names(tensors, root: str | None = None, repeated: set[str] | None = None
                 ) -> list[str]:
    """Each tensor's name among ``tensors``, as results match and tables show it: its key
    where the key is unique; ``file:key`` for a key in ``repeated`` (by default the keys
    that repeat among ``tensors``: a tensor's identity in a folder is its file and its
    name), and the file alone for a tensor without a key (a ``.npy``).  Files are
    relative to ``folder_of(root)``, the path the user gave; without a ``root``, those of
    repeated keys are relative to the folder that holds them all, and a file without a
    key is its path as loaded."""
    tensors = list(tensors)
    repeated = repeated_keys(tensors) if repeated is None else repeated
    root = None if root is None else folder_of(root)
    folder = root if root is not None else common_folder(
        [t for t in tensors if t.key in repeated])
    return [file_in(t.source, root) if t.key is None else
            f"{file_in(t.source, folder)}:{t.key}" if t.key in repeated else t.key
            for t in tensors]


def shared_prefix(names) -> str:
    """The dotted prefix that every one of ``names`` begins with (LigandMPNN's
    ``model_state_dict.``, a line of every row at 80 columns), ending in a ``.``, shorter
    than each name and not followed by a layer index (``layers.`` of ``layers.0.w`` stays,
    so rows still say what they are copies of): tables cut it and say it once above; JSON
    keeps full names.  '' for fewer than two names or a name that is None (a tensor
    without a key)."""
    names = list(names)
    if len(names) < 2 or any(name is None for name in names):
        return ""
    parts = os.path.commonprefix(names).split(".")[:-1]  # whole dotted parts only
    while parts and any(_is_index(name.split(".")[len(parts)]) for name in names
                        if name.count(".") >= len(parts)):
        parts.pop()
    prefix = "".join(part + "." for part in parts)
    return prefix if all(len(name) > len(prefix) for name in names) else ""


def _is_index(part: str) -> bool:
    return part == "*" or part.isdigit()


def without_prefix(name: str, key: str | None, prefix: str) -> str:
    """``name`` (a tensor's key, or ``file:key``) with ``prefix`` cut from its key."""
    if not prefix or key is None or not key.startswith(prefix) or not name.endswith(key):
        return name
    return name[:len(name) - len(key)] + key[len(prefix):]
