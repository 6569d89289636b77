"""Exceptions raised by the fmtcli library.

The library never prints or exits; it raises these.  The CLI turns each into one line
``Error: <message>`` on stderr and the exit code carried by the class: 2 for a usage
mistake (unknown format, bad option value), 1 for a data problem (unreadable file, bad
tensor).  An error names the library parameters it is about as ``Param``s in its
message (``block=0: a block size must be >= 1``), so that the CLI can say them as its
options (``--block 0: ...``) without reading the text.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class Note(UserWarning):
    """A note of fmtcli's own for the user (a folder's files not read, blocks shorter than
    asked, the kernel absent): the command line prints it on stderr as ``Note: ...``; it is
    not an error.  Tests that turn warnings into errors leave these alone."""


class Param:
    """A library parameter an error is about: its keyword ``name`` (``block``), its
    ``value`` (0), and ``text``, the value as the message writes it: a string or a str
    Enum quoted as ``shown`` quotes it (``'a b.txt'``), anything else ``str()``; or given
    (a str, or a function of the value such as ``repr``).

    The library's wording says it ``name=text`` (``block=0``); the command line says it as
    the option that sets it (``--block 0``: ``fmtcli.cli.options.as_options``).  Joined to
    text with ``+`` it makes a ``Message``."""

    __slots__ = ("name", "value", "text")

    def __init__(self, name: str, value: object,
                 text: str | Callable[[object], str] | None = None) -> None:
        self.name = name
        self.value = value
        if text is None:
            text = value_text
        self.text = text if isinstance(text, str) else text(value)

    def __str__(self) -> str:
        return f"{self.name}={self.text}"

    def __repr__(self) -> str:
        return f"Param({self.name!r}, {self.value!r}, {self.text!r})"

    def __add__(self, other: str | Param | Message) -> Message:
        return Message((self,)) + other

    def __radd__(self, other: str) -> Message:
        return Message.of(other) + Message((self,))

    def __reduce__(self):
        return Param, (self.name, self.value, self.text)


def value_text(value: object) -> str:
    """A parameter's value as a message writes it: text (an Enum: its value) quoted as
    ``shown`` quotes it, anything else as ``str()`` (``0``, ``True``, ``0.5``)."""
    if isinstance(value, Enum):
        value = value.value
    return shown(value) if isinstance(value, str) else str(value)


class Message(tuple):
    """A message as pieces of text and the ``Param``s it is about, in order:
    ``Param("block", 0) + ": a block size must be >= 1"``.

    ``str()`` is the library's wording (``block=0: a block size must be >= 1``); ``say``
    writes each parameter its own way instead (the command line: ``--block 0: ...``)."""

    @classmethod
    def of(cls, text: str | Param | Message) -> Message:
        """``text`` as a Message (a str: one piece of text, no parameter)."""
        if isinstance(text, Message):
            return text
        if isinstance(text, Param):
            return cls((text,))
        text = str(text)
        return cls((text,)) if text else cls()

    def __add__(self, other: str | Param | Message) -> Message:
        return Message(tuple(self) + tuple(Message.of(other)))

    def __radd__(self, other: str) -> Message:
        return Message(tuple(Message.of(other)) + tuple(self))

    def __str__(self) -> str:
        return self.say(str)

    def say(self, param: Callable[[Param], str]) -> str:
        """The text, each parameter written as ``param(p)``."""
        return "".join(param(p) if isinstance(p, Param) else p for p in self)

    def params(self) -> list[Param]:
        return [p for p in self if isinstance(p, Param)]

    @classmethod
    def joined(cls, parts: list[str | Param | Message], separator: str) -> Message:
        """The parts one after another, ``separator`` between them (as ``str.join``)."""
        message = cls()
        for i, part in enumerate(parts):
            message = message + (separator if i else "") + part
        return message


class FmtError(Exception):
    """Base class of every error fmtcli raises on purpose.

    ``message`` and ``suggestion`` are text, or a ``Message`` naming the parameters they are
    about (``Param("block", 0) + ": a block size must be >= 1"``).  ``str()`` is the
    library's wording (``block=0: ... (suggestion)``); ``params`` maps each parameter named
    to its value, and ``say`` writes the parameters another way (the command line's options).
    """

    exit_code = 1

    def __init__(self, message: str | Param | Message,
                 suggestion: str | Param | Message | None = None) -> None:
        self.parts = Message.of(message)
        self.suggestion_parts = None if suggestion is None else Message.of(suggestion)
        self.message = str(self.parts)
        self.suggestion = None if suggestion is None else str(self.suggestion_parts)
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.say(str)

    def say(self, param: Callable[[Param], str]) -> str:
        """The message and its suggestion (in parentheses), each parameter written as
        ``param(p)`` (``str``: the library's ``name=value``)."""
        text = self.parts.say(param)
        if self.suggestion:
            return f"{text} ({self.suggestion_parts.say(param)})"
        return text

    @property
    def params(self) -> dict[str, object]:
        """The parameters the error is about, name -> value (the first, where one is named
        twice)."""
        found: dict[str, object] = {}
        for p in self.parts.params() + (self.suggestion_parts or Message()).params():
            found.setdefault(p.name, p.value)
        return found

    def __reduce__(self):  # pickled whole (worker processes, Dask): parameters and suggestion
        return type(self), (self.parts, self.suggestion_parts)


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
