"""The data types a tensor may be stored in: one table, and the views each module needs.

One row per storage type that fmtcli reads or writes, by its numpy / ml_dtypes name: whether
it is a real floating-point type (quantizable), its safetensors code, whether torch has an
eager dtype of that name that fmtcli casts to, and its code as an input of the fused CUDA
kernel.  Plain data, no imports: ``inputs.storage``, ``backends``, ``engine.writers`` and
``engine.cuda_kernel`` derive their lists from it, so a new type is added in one place.

bfloat16 is read from files as its bit patterns: uint16 words whose numpy dtype carries the
metadata ``{BITS_KEY: "bfloat16"}`` (``inputs.storage.BFLOAT16_BITS``), so that reading it
needs no ``import ml_dtypes`` (1.4-2.6 s from release 0.7.0).  ``bits_of`` reads the tag
from any dtype without importing numpy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StorageType:
    name: str  # numpy / ml_dtypes name (np.dtype(...).name)
    floating: bool  # a real floating-point type: fmt quantizes it
    safetensors: str | None = None  # its code in a safetensors header
    torch: bool = False  # torch has ``torch.<name>``, a cast target of the torch backend
    kernel: int | None = None  # its code as an input of the fused CUDA kernel
    itemsize: int = 1  # bytes per element as stored (1 for the narrow floats numpy lacks)


TABLE = (
    StorageType("float64", True, "F64", itemsize=8),
    StorageType("float32", True, "F32", torch=True, kernel=0, itemsize=4),
    StorageType("float16", True, "F16", torch=True, kernel=2, itemsize=2),
    StorageType("bfloat16", True, "BF16", torch=True, kernel=1, itemsize=2),
    StorageType("float8_e4m3fn", True, "F8_E4M3", torch=True),
    StorageType("float8_e5m2", True, "F8_E5M2", torch=True),
    StorageType("float8_e4m3fnuz", True, torch=True),
    StorageType("float8_e5m2fnuz", True, torch=True),
    StorageType("float8_e8m0fnu", True, "F8_E8M0", torch=True),
    StorageType("float8_e4m3", True),
    StorageType("float8_e3m4", True),
    StorageType("float8_e4m3b11fnuz", True),
    StorageType("float6_e2m3fn", True),
    StorageType("float6_e3m2fn", True),
    StorageType("float4_e2m1fn", True),
    StorageType("int64", False, "I64", itemsize=8),
    StorageType("int32", False, "I32", itemsize=4),
    StorageType("int16", False, "I16", itemsize=2),
    StorageType("int8", False, "I8"),
    StorageType("uint64", False, "U64", itemsize=8),
    StorageType("uint32", False, "U32", itemsize=4),
    StorageType("uint16", False, "U16", itemsize=2),
    StorageType("uint8", False, "U8"),
    StorageType("bool", False, "BOOL"),
)

#: Names of the real floating-point types (a tensor of any other type is skipped).
FLOAT_NAMES = frozenset(t.name for t in TABLE if t.floating)
#: Formats the torch backend casts to (torch's eager dtypes of the same name).
TORCH_NAMES = tuple(t.name for t in TABLE if t.torch)
#: safetensors code -> name, and back.
SAFETENSORS_NAMES = {t.safetensors: t.name for t in TABLE if t.safetensors}
SAFETENSORS_CODES = {t.name: t.safetensors for t in TABLE if t.safetensors}
#: The fused CUDA kernel's input types: name -> code.
KERNEL_CODES = {t.name: t.kernel for t in TABLE if t.kernel is not None}
#: Bytes per element as stored, by name (no dtype built, so no ml_dtypes imported).
ITEMSIZES = {t.name: t.itemsize for t in TABLE}

#: The key of the numpy dtype metadata that says whose bit patterns unsigned words hold.
BITS_KEY = "fmtcli.bits_of"


def bits_of(dtype) -> str | None:
    """The storage type whose bit patterns a tagged dtype holds (``"bfloat16"`` for
    ``inputs.storage.BFLOAT16_BITS``, in either byte order), else None (any other dtype,
    ml_dtypes' own bfloat16 included)."""
    metadata = getattr(dtype, "metadata", None)
    return metadata.get(BITS_KEY) if metadata else None
