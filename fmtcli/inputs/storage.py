"""The numpy dtypes of the storage types fmtcli reads (``base.dtypes.TABLE``), by name and by
safetensors code, and whether a tensor of a dtype can be quantized.

ml_dtypes is imported only for the narrow floats numpy lacks.
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.dtypes import FLOAT_NAMES, SAFETENSORS_NAMES

FLOAT_KINDS = FLOAT_NAMES  # the real floating-point types (dtypes.TABLE)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a storage type's name (ml_dtypes for the narrow floats)."""
    if name in ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8",
                "bool"):
        return np.dtype(name)  # numpy's own: ml_dtypes (5 ms to import) is not needed
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else name)


_SAFETENSORS_DTYPES: dict[str, np.dtype] = {}


def safetensors_dtypes() -> dict[str, np.dtype]:
    """numpy dtypes by safetensors code (built on first use: it imports ml_dtypes)."""
    if not _SAFETENSORS_DTYPES:
        _SAFETENSORS_DTYPES.update({code: numpy_dtype(name)
                                    for code, name in SAFETENSORS_NAMES.items()})
    return _SAFETENSORS_DTYPES


def dtype_name(dtype: np.dtype) -> str:
    """The storage type's name of a numpy dtype (``np.dtype(...).name``)."""
    return np.dtype(dtype).name


def unusable_reason(dtype: np.dtype, size: int) -> str | None:
    """Why a tensor of this dtype and size (elements) cannot be quantized, or None if it can."""
    name = dtype_name(dtype)
    if name not in FLOAT_KINDS:
        return f"dtype {name} is not a real floating-point type"
    if size == 0:
        return "empty"
    return None
