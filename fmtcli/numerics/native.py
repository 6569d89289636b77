"""The compiled chunk kernel (``_native.c``), where it was built, and the switch to turn it off.

``setup.py`` builds it as an optional extension: an install without a C compiler goes on
without it, and the engine then runs its numpy formulation alone.  The two give the same
statistics (``tests/engine/test_native.py``): to the bit with numpy 2.3 and later, whose sums of a
contiguous array are the kernel's pairwise tree; numpy 1.26 to 2.2 sums in blocks of 8192
values added in order, so there sums of more than 8192 values (MSE, SQNR, bias) differ in
their last digits and all else is identical.  The compiled one does the common case
(float32 chunk, nearest-even magic-number rounding, every scaled value within the format's
range) in one pass per chunk instead of about fifteen.

``FMTCLI_KERNEL=numpy`` in the environment turns it off (benchmarks and tests compare the
two paths in one run).  ``status()`` says which of these holds (``fmt check-backends`` shows
it), and ``note_if_absent`` says once per process, as a warning, that a large input runs
without the kernel because it was not built.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from fmtcli.base.dtypes import bits_of
from fmtcli.base.errors import Note

try:
    from fmtcli.numerics import _native as _compiled
except ImportError:  # not built: no compiler at install time, or a source checkout
    _compiled = None

ENV = "FMTCLI_KERNEL"

#: what a chunk buffer may hold: the ``kind`` codes of ``_native.c`` (bfloat16 and float16
#: are read as stored and widened inside the kernel's passes)
KINDS = {"float32": 0, "bfloat16": 1, "float16": 2}
#: inputs of more bytes than this (as stored) get ``note_if_absent``'s note
NOTE_BYTES = 64 << 20
#: by (dtype, ``bits_of`` tag): a dtype's name costs ~5 us a lookup, and a tagged dtype is
#: equal to (and hashes as) the plain uint16 it tags
_KIND_OF: dict[tuple[np.dtype, str | None], int | None] = {}
_NOTED = False


def module() -> ModuleType | None:
    """The compiled kernel, or None where it is absent or ``FMTCLI_KERNEL=numpy``."""
    if os.environ.get(ENV, "").strip().lower() == "numpy":
        return None
    return _compiled


def built() -> bool:
    """Whether the compiled kernel is installed (whatever ``FMTCLI_KERNEL`` says)."""
    return _compiled is not None


def kind_of(dtype) -> int | None:
    """The kernel's ``kind`` code of a chunk dtype, or None where it does not read it.

    Decided by what the dtype is, not by its name: numpy's own float32 and float16 type
    objects, ml_dtypes' ``bfloat16`` type (2 bytes), or 2-byte unsigned words tagged as
    bfloat16's bit patterns (``dtypes.bits_of``: how the loaders read bfloat16), in the
    machine's byte order (the kernel reads native words; a big-endian '>f2' chunk is
    widened by numpy, which honours its byte order).  ml_dtypes is not imported here: a
    dtype can only be its bfloat16 once it is loaded (its import costs 1.4-2.6 s from
    release 0.7.0)."""
    dtype = np.dtype(dtype)
    key = (dtype, bits_of(dtype))
    if key not in _KIND_OF:
        _KIND_OF[key] = _kind(dtype)
    return _KIND_OF[key]


def _kind(dtype: np.dtype) -> int | None:
    if not dtype.isnative:
        return None
    if dtype.type is np.float32:
        return KINDS["float32"]
    if dtype.type is np.float16:
        return KINDS["float16"]
    if dtype.type is np.uint16 and bits_of(dtype) == "bfloat16":
        return KINDS["bfloat16"]
    ml_dtypes = sys.modules.get("ml_dtypes")
    if (ml_dtypes is not None and dtype.itemsize == 2
            and dtype.type is getattr(ml_dtypes, "bfloat16", None)):
        return KINDS["bfloat16"]
    return None


def reads_as_stored(dtype) -> bool:
    """Whether the kernel is on and reads chunks of ``dtype`` (bfloat16, float16) without a
    widened float32 copy."""
    return module() is not None and kind_of(dtype) in (KINDS["bfloat16"], KINDS["float16"])


def values(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` as the kernel's functions take it: (buffer, kind) -- float32 itself, or the bit
    patterns of a bfloat16/float16 array (a uint16 view, no copy; bfloat16 read as its bits
    is one already)."""
    kind = kind_of(x.dtype)
    return (x if kind == 0 else x.view(np.uint16)), kind


@dataclass(frozen=True)
class KernelStatus:
    """Whether the compiled kernel was built, what ``FMTCLI_KERNEL`` says, and so whether the
    engine uses it."""

    built: bool
    setting: str | None  # FMTCLI_KERNEL as set, or None
    on: bool

    @property
    def text(self) -> str:
        setting = "unset" if self.setting is None else f"={self.setting}"
        if self.on:
            return f"built, in use (FMTCLI_KERNEL {setting})"
        if self.built:
            return f"built, turned off (FMTCLI_KERNEL {setting}): numpy does the work"
        return ("not built (no C compiler at install time?): numpy does the work, about 2x "
                "slower; reinstall with a C compiler to build it")

    def to_dict(self) -> dict:
        return {"built": self.built, "fmtcli_kernel": self.setting, "on": self.on}


def status() -> KernelStatus:
    """The kernel's ``KernelStatus`` now."""
    return KernelStatus(built(), os.environ.get(ENV), module() is not None)


class KernelNote(Note):
    """fmtcli's own note that the compiled kernel is absent (said as it is, once)."""


def note_if_absent(nbytes: int) -> None:
    """Warn (``KernelNote``, once per process) that ``nbytes`` of input, past ``NOTE_BYTES``,
    are about to be quantized by numpy alone because the compiled kernel was not built.
    Nothing when it is built, or turned off on purpose with ``FMTCLI_KERNEL=numpy``."""
    global _NOTED
    if _NOTED or built() or nbytes <= NOTE_BYTES:
        return
    _NOTED = True
    warnings.warn(f"the compiled kernel is not built (no C compiler at install time?): "
                  f"{nbytes / 2**20:,.0f} MiB of values run on numpy alone, about 2x slower; "
                  "reinstall fmtcli with a C compiler to build it", KernelNote, stacklevel=2)
