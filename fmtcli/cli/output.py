"""What the command line writes, and where: results on stdout, notes and errors on stderr.

Results (a rich table, or one JSON document with ``--json``) go to stdout through ``emit``;
``Note: ...`` lines, progress bars and the one ``Error: ...`` line go to stderr.  A stream
that cannot encode a character gets an ASCII look-alike; a reader that went away ends the
command quietly.
"""

from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager

import typer

from fmtcli.base.errors import DataError, Note, one_line


def show_tracebacks() -> bool:
    """FMT_TRACEBACK=1 (any value but '' and '0'): let internal errors raise."""
    return os.environ.get("FMT_TRACEBACK", "") not in ("", "0")


def error_line(message: object) -> None:
    typer.echo(f"Error: {one_line(message)}", err=True)


def note(message: str) -> None:
    """``Note: ...`` on stderr, for notes that are not results (user text in the message is
    shown as written: no rich markup is interpreted).  On a terminal the note is wrapped at
    word boundaries to its width, the lines after the first indented under the text; a
    file or a pipe gets it as one line."""
    from rich.text import Text

    console = stderr_console()
    text = one_line(message)
    if not console.is_terminal:
        console.print(Text.assemble(("Note:", "dim"), " ", text), soft_wrap=True)
        return
    lines = wrap_words(text, console.width - len(NOTE_INDENT), NOTE_INDENT)
    console.print(Text.assemble(("Note:", "dim"), " ", lines), soft_wrap=True)


NOTE_INDENT = " " * len("Note: ")


def wrap_words(text: str, width: int, indent: str) -> str:
    """``text`` broken at spaces into lines of at most ``width`` characters (a word longer
    than that, a path say, stays whole on its own line), the lines after the first starting
    with ``indent``."""
    import textwrap

    lines = textwrap.wrap(text, max(20, width), break_long_words=False,
                          break_on_hyphens=False)
    return ("\n" + indent).join(lines) or text


def warning_as_note(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of the CLI: a warning (a numpy RuntimeWarning that escaped
    its source, say) becomes one ``Note:`` line instead of two lines naming our source.
    fmtcli's own notes (every ``base.errors.Note``: ``checkpoints.CheckpointNote``, files
    of a model folder left unread; ``torchfile.TrainingStateNote``, what a ``.ckpt`` holds
    beside its weights; ``numerics.native.KernelNote``, a large input without the compiled
    kernel; ``streaming.stream.BlockNote``, blocks shorter than asked) are said as they
    are; other warnings name their category."""
    if issubclass(category, Note):
        note(str(message))
    else:
        note(f"{message} ({category.__name__})")


ASCII_LOOKALIKES = str.maketrans({"≈": "~", "█": "#", "→": "->", "…": "...",
                                  "−": "-", "·": ".", "▁": "_", "▂": "_", "▃": "-",
                                  "▄": "-", "▅": "=", "▆": "=", "▇": "#"})


class SafeStream:
    """A text stream that cannot raise UnicodeEncodeError: characters its encoding lacks
    become ASCII look-alikes (``≈`` -> ``~``, bars ``█`` -> ``#``), then ``?``.

    rich reads ``encoding`` through it and draws ASCII boxes itself on a non-UTF stream;
    this catches the characters of our own cells (PYTHONIOENCODING=ascii, a Latin-1 pipe)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        try:
            text.encode(self.encoding)
        except UnicodeEncodeError:
            text = text.translate(ASCII_LOOKALIKES)
            text = text.encode(self.encoding, "replace").decode(self.encoding)
        except LookupError:  # an encoding Python does not know: plain ASCII
            text = text.translate(ASCII_LOOKALIKES).encode("ascii", "replace").decode()
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, fileno: the stream's own
        return getattr(self.stream, name)


class TrimmedLines:
    """A text stream that drops the spaces at the end of every line (rich pads a table's
    lines, and its centred title, to the table's width): a table written to a file or a
    pipe has no trailing spaces.  Styles that close a line (``ESC[0m``) are kept; spaces
    at the end of one write wait for the next, which says whether a line ends there."""

    STYLE = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self, stream) -> None:
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        text = self.pending + text
        lines = text.split("\n")
        last = lines.pop()  # the part after the last newline: its end is not known yet
        core = self.tail_start(last)
        self.pending = last[core:]
        lines = [self.trim(line) for line in lines] + [last[:core]]
        self.stream.write("\n".join(lines))
        return len(text) - len(self.pending)

    def tail_start(self, line: str) -> int:
        """Where the run of spaces and style codes that ends ``line`` begins."""
        end = len(line)
        while end:
            if line[end - 1] == " ":
                end = len(line[:end].rstrip(" "))
            elif line[end - 1] == "m" and (start := line.rfind("\x1b[", 0, end)) >= 0 \
                    and self.STYLE.fullmatch(line, start, end):
                end = start
            else:
                break
        return end

    def trim(self, line: str) -> str:
        """A whole line without its trailing spaces (the style codes among them kept)."""
        if "\x1b" not in line:
            return line.rstrip(" ")
        end = self.tail_start(line)
        return line[:end] + "".join(self.STYLE.findall(line, end))

    def flush(self) -> None:
        self.stream.write(self.pending)  # spaces before a newline never come here: rich
        self.pending = ""  # writes a line and its end in one piece
        self.stream.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno: the stream's own
        return getattr(self.stream, name)


#: The width of results written to a file or a pipe (COLUMNS unset): the width the
#: documentation's examples are rendered at, and rich's own default.
PIPE_WIDTH = 80


def stdout_console():
    """Console for results; built per command so tests can pin the width (COLUMNS).  A
    terminal's width is its own; a file or a pipe gets ``PIPE_WIDTH`` (or COLUMNS), and
    every line as long as what it holds (no trailing spaces).  rich is imported here, not
    at start-up: --json runs never load it."""
    from rich.console import Console

    stream = TrimmedLines(SafeStream(sys.stdout))
    if os.environ.get("COLUMNS", "").isdigit():
        return Console(file=stream, width=max(20, int(os.environ["COLUMNS"])))
    console = Console(file=stream)
    if not console.is_terminal:
        console = Console(file=stream, width=PIPE_WIDTH)
    return console


def stderr_console():
    from rich.console import Console

    return Console(file=SafeStream(sys.stderr), highlight=False)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that what is left in its buffer cannot fail again when
    Python flushes it at exit ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


@contextmanager
def writing_results():
    """Write results to stdout, flushed before leaving.  A reader that went away (``fmt
    range | head -1``) ends the command quietly (BrokenPipeError, exit 1, as the group
    handles it); any other failed write (a full disk: ``> /dev/full``) is a data error
    of one line, not an internal one."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        raise
    except OSError as error:
        _discard_stdout()
        raise DataError("cannot write the results to standard output "
                        f"({error.strerror or error})") from None


def emit(result, json_out: bool, **view) -> None:
    """The one way every command prints its result: ``result.to_dict()`` as one JSON
    document, or the table ``render.render(result, **view)`` builds for its type (``view``:
    display options that change no number, e.g. the loss-scale histogram)."""
    with writing_results():
        if json_out:
            from fmtcli.render.jsonsafe import dumps

            typer.echo(dumps(result.to_dict()))
        else:
            from fmtcli.render import render

            stdout_console().print(render(result, **view))


def emit_csv(result) -> None:
    """A result as CSV on stdout (``csvout.to_csv``: a header row, one row per tensor and
    scheme), written as is: no rich console, no terminal width."""
    from fmtcli.render.csvout import to_csv

    with writing_results():
        SafeStream(sys.stdout).write(to_csv(result))


class StderrProgress:
    """A rich progress bar on stderr, shown only when stderr is a terminal: the bytes done
    of the whole input (as stored) and the tensor being read.

    It is shown from the first report when the work is known to be long (``LONG_BYTES`` of
    input or more), else once the work passes ``LATE_SECONDS``.  Its time left comes from
    the rate over the last ``RATE_SECONDS`` (rich's ``speed_estimate_period``), which the
    engine's reports keep steady (their units weigh each pass by its cost).

    ``progress(done, total)`` is the engine's byte count; ``tensor(name)`` names the tensor
    it starts (shown whole when it fits, else its tail: the part that tells layers apart)."""

    NAME_CELLS = 40
    LONG_BYTES = 64 << 20  # ~0.2 s of work or more on one core: a bar from the start
    LATE_SECONDS = 1.0
    RATE_SECONDS = 60.0

    def __init__(self, label: str) -> None:
        self.label = label
        self.start = time.monotonic()
        self.bar = None
        self.task = None
        self.name = ""
        self.enabled = sys.stderr.isatty()  # rich itself is imported only when needed

    def tensor(self, name: str) -> None:
        """The engine starts the tensor ``name``."""
        text = one_line(name, 240)
        if len(text) > self.NAME_CELLS:
            text = "..." + text[-(self.NAME_CELLS - 3):]
        self.name = text
        if self.bar is not None:
            self.bar.update(self.task, name=self.name)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not self.enabled or (total < self.LONG_BYTES
                                    and time.monotonic() - self.start < self.LATE_SECONDS):
                return
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                                DownloadColumn(), TimeRemainingColumn(),
                                TextColumn("{task.fields[name]}", markup=False),
                                console=stderr_console(), transient=True,
                                speed_estimate_period=self.RATE_SECONDS)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total, name=self.name)
        self.bar.update(self.task, completed=done, total=total, name=self.name)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
