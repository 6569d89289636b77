"""fmtcli: explore the number formats of ML training and inference (library core).

Import from here in a notebook; the ``fmt`` command is a thin layer over these functions.
The names below load on first use (PEP 562), so ``import fmtcli`` -- and the command's
start-up -- costs nothing until a number is needed.
"""

from __future__ import annotations

from fmtcli._moved import install as _install_moved_paths
from fmtcli.base.lazy import lazy_exports

_install_moved_paths()  # the flat layout's module paths (fmtcli.tensors...) still import

_EXPORTS = {
    **dict.fromkeys(["BadValueError", "DataError", "FmtError", "UnknownFormatError",
                     "UsageError"], "base.errors"),
    **dict.fromkeys(["ARTICLE_FORMATS", "REGISTRY", "FormatSpec", "Specials", "get_format",
                     "resolve_format"], "numerics.formats"),
    **dict.fromkeys(["OverflowPolicy", "RoundingMode", "all_values", "decode", "encode",
                     "round_to_format"], "numerics.rounding"),
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
