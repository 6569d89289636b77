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

try:
    from . import _native as _compiled
except ImportError:  # not built: no compiler at install time, or a source checkout
    _compiled = None

ENV = "FMTCLI_KERNEL"


def module() -> ModuleType | None:
    """The compiled kernel, or None where it is absent or ``FMTCLI_KERNEL=numpy``."""
    if os.environ.get(ENV, "").strip().lower() == "numpy":
        return None
    return _compiled


def built() -> bool:
    """Whether the compiled kernel is installed (whatever ``FMTCLI_KERNEL`` says)."""
    return _compiled is not None
