"""Exceptions raised by the fmtcli library.

The library never prints or exits; it raises these.  The CLI turns each into one line
``Error: <message>`` on stderr and the exit code carried by the class: 2 for a usage
mistake (unknown format, bad option value), 1 for a data problem (unreadable file, bad
tensor).
"""

from __future__ import annotations


class Note(UserWarning):
    """A note of fmtcli's own for the user (a folder's files not read, blocks shorter than
    asked, the kernel absent): the command line prints it on stderr as ``Note: ...``; it is
    not an error.  Tests that turn warnings into errors leave these alone."""


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


SHOWN_LIMIT = 240  # characters of user text kept in a message (head and tail)


def one_line(text: object, limit: int = 2000) -> str:
    """``text`` as one line of a message: newlines, tabs and other control or unprintable
    characters escaped as Python writes them (``\\n``, ``\\x1b``), and text longer than
    ``limit`` characters cut in the middle (``...``), so a 100 kB argument quoted in an error
    does not flood the terminal."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        keep = max(8, limit // 2 - 10)
        text = f"{text[:keep]} ...[{len(text) - 2 * keep:,} characters]... {text[-keep:]}"
    return text


def shown(path: object) -> str:
    """A path (or any user-given text) as it appears in a one-line message: quoted, with
    newlines, tabs and other control or unprintable characters escaped, so that a message
    naming ``'a\\nb.npy'`` stays on one line and says exactly which file it means.  Text
    longer than SHOWN_LIMIT characters keeps its head and tail around a count of what was
    left out."""
    text = str(path)
    if len(text) > SHOWN_LIMIT:
        return shown(text[:SHOWN_LIMIT // 2]).rstrip("'\"") + \
            f" ...[{len(text) - SHOWN_LIMIT // 2 - SHOWN_LIMIT // 4:,} characters]... " + \
            shown(text[-(SHOWN_LIMIT // 4):]).lstrip("'\"")
    if text.isprintable() and "'" not in text:
        return f"'{text}'"
    return repr(text)
