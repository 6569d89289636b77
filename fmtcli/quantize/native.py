"""The compiled chunk kernel (``_native.c``), where it was built, and the switch to turn it off.

``setup.py`` builds it as an optional extension: an install without a C compiler goes on
without it, and the engine then runs its numpy formulation alone.  The two give the same
statistics to the bit (``tests/test_native.py``); the compiled one does the common case
(float32 chunk, nearest-even magic-number rounding, every scaled value within the format's
range) in one pass per chunk instead of about fifteen.

``FMTCLI_KERNEL=numpy`` in the environment turns it off (benchmarks and tests compare the
two paths in one run).
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

try:
    from . import _native as _compiled
except ImportError:  # not built: no compiler at install time, or a source checkout
    _compiled = None

ENV = "FMTCLI_KERNEL"

#: what a chunk buffer may hold, by dtype name: the ``kind`` codes of ``_native.c``
#: (bfloat16 and float16 are read as stored and widened inside the kernel's passes)
KINDS = {"float32": 0, "bfloat16": 1, "float16": 2}
_KIND_OF: dict[np.dtype, int | None] = {}  # by dtype: a dtype's name costs ~5 us a lookup


def module() -> ModuleType | None:
    """The compiled kernel, or None where it is absent or ``FMTCLI_KERNEL=numpy``."""
    if os.environ.get(ENV, "").strip().lower() == "numpy":
        return None
    return _compiled


def built() -> bool:
    """Whether the compiled kernel is installed (whatever ``FMTCLI_KERNEL`` says)."""
    return _compiled is not None


def kind_of(dtype) -> int | None:
    """The kernel's ``kind`` code of a chunk dtype, or None where it does not read it."""
    dtype = np.dtype(dtype)
    if dtype not in _KIND_OF:  # (bfloat16 is ml_dtypes': no dtype object until it loads)
        # the kernel reads the machine's byte order only: a big-endian float16 chunk ('>f2',
        # named float16 too) is widened by numpy, which honours its byte order
        _KIND_OF[dtype] = KINDS.get(dtype.name) if dtype.isnative else None
    return _KIND_OF[dtype]


def reads_as_stored(dtype) -> bool:
    """Whether the kernel is on and reads chunks of ``dtype`` (bfloat16, float16) without a
    widened float32 copy."""
    return module() is not None and kind_of(dtype) in (KINDS["bfloat16"], KINDS["float16"])


def values(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` as the kernel's functions take it: (buffer, kind) -- float32 itself, or the bit
    patterns of a bfloat16/float16 array (a uint16 view, no copy)."""
    kind = kind_of(x.dtype)
    return (x if kind == 0 else x.view(np.uint16)), kind
