"""The numpy dtypes of the storage types fmtcli reads (``base.dtypes.TABLE``), by name and by
safetensors code, and whether a tensor of a dtype can be quantized.

Two views of a type.  ``numpy_dtype`` is the dtype of its *values*: numpy's own, or
ml_dtypes' for the narrow floats (imported then).  ``stored_dtype`` is what a loader maps a
file's bytes as: the same, except bfloat16, which is read as its bit patterns
(``BFLOAT16_BITS``: uint16 words tagged ``bfloat16`` in the dtype's metadata), because
``import ml_dtypes`` costs 1.4-2.6 s from release 0.7.0 (numpy's ``PyUFunc_AddLoop`` at its
module init; 0.02-0.05 s for 0.6.0).  The compiled kernel reads those bits as bfloat16,
``streaming.stream.widen`` makes them float32 exactly with a 16-bit shift, and
``as_values`` turns them into ml_dtypes' bfloat16 (importing it) for the commands that want
values, not chunks.  ml_dtypes is imported only where a narrow float is read (float8,
float6, float4), a bfloat16 array is asked for as values, or a value is *cast* to one.
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.dtypes import BITS_KEY, FLOAT_NAMES, ITEMSIZES, SAFETENSORS_NAMES, bits_of

FLOAT_KINDS = FLOAT_NAMES  # the real floating-point types (dtypes.TABLE)

#: bfloat16 as stored: its bit patterns as uint16 words, tagged (``dtypes.bits_of``).
BFLOAT16_BITS = np.dtype(np.uint16, metadata={BITS_KEY: "bfloat16"})

_NUMPY_NAMES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64",
                "uint32", "uint16", "uint8", "bool")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a storage type's values, by name (ml_dtypes for the narrow floats
    and bfloat16: imported then)."""
    if name in _NUMPY_NAMES:
        return np.dtype(name)  # numpy's own: ml_dtypes is not needed
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else name)


def stored_dtype(name: str) -> np.dtype:
    """The dtype a loader maps a storage type's bytes as: ``BFLOAT16_BITS`` for bfloat16
    (no ml_dtypes), else ``numpy_dtype(name)``."""
    return BFLOAT16_BITS if name == "bfloat16" else numpy_dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of a storage type as stored (no dtype built, nothing imported);
    a type fmt does not read (complex, strings, dates: a skipped tensor's) by numpy's
    name (``str96``: 96 bits), 0 where that says nothing."""
    if name in ITEMSIZES:
        return ITEMSIZES[name]
    try:
        return np.dtype(name).itemsize
    except TypeError:
        bits = name.lstrip("abcdefghijklmnopqrstuvwxyz")
        return int(bits) // 8 if bits.isdigit() and len(bits) < 12 else 0


_SAFETENSORS_DTYPES: dict[str, np.dtype] = {}


def safetensors_dtypes() -> dict[str, np.dtype]:
    """numpy dtypes of the values by safetensors code (built on first use: it imports
    ml_dtypes; the reader itself takes ``stored_dtype`` of ``SAFETENSORS_NAMES``)."""
    if not _SAFETENSORS_DTYPES:
        _SAFETENSORS_DTYPES.update({code: numpy_dtype(name)
                                    for code, name in SAFETENSORS_NAMES.items()})
    return _SAFETENSORS_DTYPES


def as_values(array: np.ndarray) -> np.ndarray:
    """``array`` with bfloat16 bit patterns (``BFLOAT16_BITS``, either byte order) viewed as
    ml_dtypes' bfloat16 in the same byte order (a view, no copy; imports ml_dtypes); any
    other array as it is."""
    if bits_of(array.dtype) != "bfloat16":
        return array
    import ml_dtypes

    return array.view(np.dtype(ml_dtypes.bfloat16).newbyteorder(array.dtype.byteorder))


def dtype_name(dtype: np.dtype) -> str:
    """The storage type's name of a numpy dtype (``np.dtype(...).name``; ``bfloat16`` for
    its bit patterns, ``BFLOAT16_BITS``)."""
    dtype = np.dtype(dtype)
    return bits_of(dtype) or dtype.name


def unusable_reason(dtype: np.dtype, size: int) -> str | None:
    """Why a tensor of this dtype and size (elements) cannot be quantized, or None if it can."""
    name = dtype_name(dtype)
    if name not in FLOAT_KINDS:
        return f"dtype {name} is not a real floating-point type"
    if size == 0:
        return "empty"
    return None
