"""fmtcli: explore the number formats of ML training and inference (library core).

Import from here in a notebook; the ``fmt`` command is a thin layer over these functions.
The names below load on first use (PEP 562), so ``import fmtcli`` -- and the command's
start-up -- costs nothing until a number is needed.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BadValueError": "errors", "DataError": "errors", "FmtError": "errors",
    "UnknownFormatError": "errors", "UsageError": "errors",
    "ARTICLE_FORMATS": "formats", "REGISTRY": "formats", "FormatSpec": "formats",
    "Specials": "formats", "get_format": "formats", "resolve_format": "formats",
    "OverflowPolicy": "rounding", "RoundingMode": "rounding", "all_values": "rounding",
    "decode": "rounding", "encode": "rounding", "round_to_format": "rounding",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def package_version() -> str:
    """The installed distribution's version (pyproject.toml is the one place it is
    written); "unknown" when run from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fmtcli")
    except PackageNotFoundError:
        return "unknown"


def __getattr__(name: str):
    if name == "__version__":
        return package_version()
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fmtcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
