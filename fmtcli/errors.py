"""Exceptions raised by the fmtcli library.

The library never prints or exits; it raises these.  The CLI turns each into one line
``Error: <message>`` on stderr and the exit code carried by the class: 2 for a usage
mistake (unknown format, bad option value), 1 for a data problem (unreadable file, bad
tensor).
"""

from __future__ import annotations


class FmtError(Exception):
    """Base class of every error fmtcli raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion

    def __str__(self) -> str:
        if self.suggestion:
            return f"{self.message} ({self.suggestion})"
        return self.message


class UsageError(FmtError):
    """The user asked for something that does not exist or makes no sense (exit code 2)."""

    exit_code = 2


class UnknownFormatError(UsageError):
    """A format name that is neither registered, an alias, nor a valid custom ``eXmY``."""


class BadValueError(UsageError):
    """A literal on the command line that cannot be parsed as a number."""


class DataError(FmtError):
    """The input data is missing, unreadable or unusable (exit code 1)."""


def shown(path: object) -> str:
    """A path (or any user-given text) as it appears in a one-line message: quoted, with
    newlines, tabs and other control or unprintable characters escaped, so that a message
    naming ``'a\\nb.npy'`` stays on one line and says exactly which file it means."""
    text = str(path)
    if text.isprintable() and "'" not in text:
        return f"'{text}'"
    return repr(text)
