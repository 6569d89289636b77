"""Read torch checkpoints (.pt/.pth/.bin; .ckpt training checkpoints) without running anything
in them.

``torch.load(weights_only=True)`` (memory-mapped for torch's zip format): nothing is
unpickled beyond tensors and plain containers; a file that needs arbitrary objects is
refused with our own one-line message (nothing in it runs).  Nested dicts/lists/tuples
become dotted keys (bounded depth); bfloat16 is viewed as its bit patterns
(``storage.BFLOAT16_BITS``: no ml_dtypes) and the float8 types, not cast, as their ml_dtypes
twins; a tensor numpy cannot hold is skipped with the reason.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Iterator

import numpy as np

from fmtcli.base.errors import DataError, Note, UsageError, shown
from fmtcli.inputs.source import TensorSource, from_array
from fmtcli.inputs.storage import stored_dtype

_TORCH_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu")


def _torch_to_numpy(tensor) -> np.ndarray | None:
    """The tensor's data as fmtcli stores it (``storage.stored_dtype``: bfloat16 as its
    bits, float8 as ml_dtypes' types, imported then), or None where numpy cannot hold it."""
    import torch

    mapping = {torch.bfloat16: (torch.int16, "bfloat16")}
    for name in _TORCH_FLOAT8:
        if hasattr(torch, name):
            mapping[getattr(torch, name)] = (torch.uint8, name)
    try:  # sparse, quantized, meta tensors and dtypes numpy lacks have no array
        tensor = tensor.detach().cpu()
        if tensor.dtype in mapping:
            carrier, target = mapping[tensor.dtype]
            return tensor.contiguous().view(carrier).numpy().view(stored_dtype(target))
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


def _torch_failure(where: str, head: bytes, error: Exception, hint: str = _UNSAFE_HINT
                   ) -> DataError:
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
                         hint)
    if head[:4] == b"PK\x03\x04":
        reason = "a damaged or truncated torch zip archive"
    else:
        first = re.sub(r"\x1b\[[0-9;]*m|[^ -~]", "", text.strip().split("\n")[0])[:100]
        reason = f"{type(error).__name__}{': ' + first if first else ''}"
    return DataError(f"{where}: not a readable torch checkpoint ({reason})")


def _load_state(path: str, hint: str = _UNSAFE_HINT):
    """The object ``torch.load(weights_only=True)`` gives for ``path`` (memory-mapped for
    torch's zip format), torch's own warnings kept off stderr; every failure one line."""
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
            return torch.load(path, map_location="cpu", weights_only=True,
                              mmap=head == b"PK\x03\x04")
    except Exception as error:  # torch raises many types for corrupt or unsafe files
        raise _torch_failure(where, head, error, hint) from None


def _sources(path: str, state) -> list[TensorSource]:
    """A TensorSource per tensor of ``state`` (one bare tensor, or nested containers'
    tensors under their dotted keys); other leaves (ints, strings) are not tensors."""
    import torch

    bare = isinstance(state, torch.Tensor)
    sources = []
    for key, value in [(None, state)] if bare else _flatten_state(state, shown(path)):
        if not isinstance(value, torch.Tensor):
            continue
        arr = _torch_to_numpy(value)
        if arr is None:
            sources.append(TensorSource(path, key, tuple(value.shape), str(value.dtype)[6:], None,
                                        f"dtype {value.dtype} has no numpy equivalent"))
            continue
        sources.append(from_array(path, key, arr, arr.shape, arr.dtype))
    return sources


def load_torch(path: str) -> list[TensorSource]:
    """Tensors of a .pt/.pth/.bin file (a state dict, nested dicts/lists, or one bare tensor;
    ``pytorch_model.bin`` is a state dict in torch's zip format), loaded with
    ``torch.load(weights_only=True)``: nothing is unpickled beyond tensors and plain
    containers; torch's own warnings are kept off stderr."""
    return _sources(path, _load_state(path))


class TrainingStateNote(Note):
    """What a training checkpoint (``.ckpt``) holds beside its weights and was not read
    (optimizer states, schedulers, counters): a note for the user, not an error."""


_CKPT_HINT = ("if you trust the file, save its weights alone: torch.save(torch.load(PATH, "
              "weights_only=False)['state_dict'], 'weights.pt'), or with safetensors")


def load_ckpt(path: str) -> list[TensorSource]:
    """Weights of a PyTorch Lightning / Stable Diffusion checkpoint (``NAME.ckpt``, a
    torch.save file: ``{"state_dict": {...}, "epoch", "global_step", "optimizer_states",
    "lr_schedulers", "hyper_parameters"...}``), loaded with ``torch.load(weights_only=True)``.
    Only the tensors under ``state_dict`` are read, under their keys in the file
    (``state_dict.model.w``, as the same file read as ``.pt`` names them); the other
    top-level entries (Adam's ``exp_avg``/``exp_avg_sq``, counters) are named in one
    ``TrainingStateNote``.  A file without a ``state_dict`` dict is read as ``.pt`` is."""
    state = _load_state(path, _CKPT_HINT)
    if not (isinstance(state, dict) and isinstance(state.get("state_dict"), dict)):
        return _sources(path, state)
    import torch

    left = []  # (no tensors, name): the entries that hold tensors said first
    for key, value in state.items():
        if key != "state_dict":
            count = sum(isinstance(leaf, torch.Tensor)
                        for _, leaf in _flatten_state(value, shown(path)))
            left.append((count == 0, shown(str(key)) + (
                f" ({count} tensor{'s' * (count != 1)})" if count else "")))
    if left:
        names = [name for _, name in sorted(left, key=lambda entry: entry[0])]
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        warnings.warn(f"{shown(path)}: a training checkpoint: read the weights under "
                      f"state_dict; not read: {', '.join(names[:10])}{more} (the same file "
                      "named .pt reads every tensor)", TrainingStateNote, stacklevel=2)
    return _sources(path, {"state_dict": state["state_dict"]})
