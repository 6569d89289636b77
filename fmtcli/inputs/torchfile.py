"""Read torch checkpoints (.pt/.pth/.bin) without running anything in them.

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

from fmtcli.base.errors import DataError, UsageError, shown
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


def load_torch(path: str) -> list[TensorSource]:
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
        sources.append(from_array(path, key, arr, arr.shape, arr.dtype))
    return sources
