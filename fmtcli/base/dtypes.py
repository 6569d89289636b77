"""The data types a tensor may be stored in: one table, and the views each module needs.

One row per storage type that fmtcli reads or writes, by its numpy / ml_dtypes name: whether
it is a real floating-point type (quantizable), its safetensors code, whether torch has an
eager dtype of that name that fmtcli casts to, and its code as an input of the fused CUDA
kernel.  Plain data, no imports: ``tensors``, ``backends``, ``quantize.writers`` and
``quantize.cuda_kernel`` derive their lists from it, so a new type is added in one place.
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


TABLE = (
    StorageType("float64", True, "F64"),
    StorageType("float32", True, "F32", torch=True, kernel=0),
    StorageType("float16", True, "F16", torch=True, kernel=2),
    StorageType("bfloat16", True, "BF16", torch=True, kernel=1),
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
    StorageType("int64", False, "I64"),
    StorageType("int32", False, "I32"),
    StorageType("int16", False, "I16"),
    StorageType("int8", False, "I8"),
    StorageType("uint64", False, "U64"),
    StorageType("uint32", False, "U32"),
    StorageType("uint16", False, "U16"),
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
