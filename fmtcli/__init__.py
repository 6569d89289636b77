"""fmtcli: explore the number formats of ML training and inference (library core).

Import from here in a notebook; the ``fmt`` command is a thin layer over these functions.
The names below load on first use (PEP 562), so ``import fmtcli`` -- and the command's
start-up -- costs nothing until a number is needed.
"""

from __future__ import annotations

from .lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(),
                                   {"__version__": package_version})
