"""Names of a package that load on first use (PEP 562), so that importing a package -- and
the command's start-up -- costs nothing until a name is needed.

A package lists ``_EXPORTS`` (name -> its module, relative) and binds
``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())``: the first lookup of
a name imports its module and keeps the value in the package's namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict,
                 extra: dict[str, Callable[[], object]] | None = None
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``exports`` maps a name to the module
    (relative to ``package``) that defines it; ``extra`` maps a name to a function computed
    on every lookup (``fmtcli.__version__``)."""
    extra = extra or {}

    def __getattr__(name: str):
        if name in extra:
            return extra[name]()
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports) | set(extra))

    return __getattr__, __dir__
