"""fmtcli: explore the number formats of ML training and inference (library core).

Import from here in a notebook; the ``fmt`` command is a thin layer over these functions.
"""

from .errors import BadValueError, DataError, FmtError, UnknownFormatError, UsageError
from .formats import ARTICLE_FORMATS, REGISTRY, FormatSpec, Specials, get_format, resolve_format
from .rounding import OverflowPolicy, RoundingMode, all_values, decode, encode, round_to_format

__version__ = "0.1.0"

__all__ = [
    "ARTICLE_FORMATS", "REGISTRY", "BadValueError", "DataError", "FmtError", "FormatSpec",
    "OverflowPolicy", "RoundingMode", "Specials", "UnknownFormatError", "UsageError",
    "all_values", "decode", "encode", "get_format", "resolve_format", "round_to_format",
]
