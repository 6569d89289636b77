"""The ``fmt`` Typer application: how every command ends, as the user sees it.

Results go to stdout; notes and warnings to stderr.  A library FmtError becomes one line
``Error: ...`` on stderr with exit code 1 (data) or 2 (usage), never a traceback.  Any other
exception is a bug: one line ``Error: internal error: ...`` and exit code 70, or the full
traceback with ``FMT_TRACEBACK=1`` in the environment.  A Python warning (e.g. a numpy
RuntimeWarning) becomes one line ``Note: ...`` on stderr.  The commands register themselves
on ``app`` from their own modules (``range``, ``quantize``, ...: see ``fmtcli/cli/__init__.py``).
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
import warnings
from typing import Annotated, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from fmtcli.base.errors import FmtError, one_line, shown
from fmtcli.cli.options import as_options
from fmtcli.cli.output import (
    _discard_stdout,
    error_line,
    show_tracebacks,
    warning_as_note,
    writing_results,
)

INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug in fmtcli
#: the base class of the parser's errors: ``typer.TyperException`` from typer 0.27.3 on, the
#: vendored Click's ``ClickException`` before (found through BadParameter, which both export)
PARSER_ERROR = next(c for c in typer.BadParameter.__mro__
                    if c.__name__ in ("TyperException", "ClickException"))


class OneLineErrors(TyperGroup):
    """Every way a command ends, as the user sees it.

    - a parser usage error or a FmtError: one line ``Error: ...`` on stderr, exit 2 or 1;
    - plain ``fmt``: the help on stdout, exit 0 (as git and gh);
    - Ctrl-C: ``Aborted.``, exit 130;
    - any other exception (a bug): one line ``Error: internal error: <type>: <message>``,
      exit 70; with FMT_TRACEBACK=1 it is raised (the test suite sets it).
    Python warnings are printed as ``Note:`` lines while a command runs.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        with warnings.catch_warnings():
            warnings.showwarning = warning_as_note
            code = self._run(args, prog_name, complete_var, **extra)
        if code == 130:  # typer turns KeyboardInterrupt into exit code 130
            typer.echo("Aborted.", err=True)
        sys.exit(code)

    def _run(self, args, prog_name, complete_var, **extra) -> int:
        if sys.stdout is None:  # started with stdout closed (fmt ... >&-): Python sets None
            # Refused before any work: results could not be printed, and the first file
            # opened would otherwise take descriptor 1.
            error_line("standard output is closed: nothing could be printed (redirect it "
                       "to a file or to /dev/null)")
            return 1
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            return code if isinstance(code, int) else 0
        except FmtError as error:
            error_line(as_options(error))
            return error.exit_code
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            return 1
        except BrokenPipeError:  # the reader of stdout went away (fmt ... | head): quietly
            _discard_stdout()
            return 1
        except PARSER_ERROR as error:  # the parser's usage errors
            ctx = getattr(error, "ctx", None)
            if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
                try:
                    with writing_results():
                        typer.echo(ctx.get_help())  # plain 'fmt': the help, on stdout
                except FmtError as failed:
                    error_line(failed)
                    return failed.exit_code
                return 0
            command = ctx.command_path if ctx is not None else "fmt"
            error_line(f"{usage_message(error, ctx)} (see '{command} --help')")
            return getattr(error, "exit_code", 2)
        except MemoryError:
            if show_tracebacks():
                raise
            error_line("out of memory: the input or the options need more memory than this "
                       "process may have (try a smaller --chunk, fewer --workers or fewer "
                       "values)")
            return 1
        except OSError as error:  # the system refused a read or write (--help > /dev/full)
            if show_tracebacks():
                raise
            _discard_stdout()
            where = f" ({shown(error.filename)})" if error.filename else ""
            error_line(f"{error.strerror or error}{where}")
            return 1
        except Exception as error:
            if show_tracebacks():
                raise
            error_line(f"internal error: {type(error).__name__}: {error} (please report it; "
                       "FMT_TRACEBACK=1 shows the traceback)")
            return INTERNAL_ERROR


def usage_message(error, ctx) -> str:
    """The parser's message of a usage error, with ``unknown_option``'s advice where the
    error is an unknown option."""
    option = getattr(error, "option_name", None)
    if not hasattr(error, "possibilities") or option is None or ctx is None:
        # not an unknown option; a huge value echoed back (--seq 1000...0) is cut to its
        # head and tail, as errors.shown cuts user text
        return _LONG_WORD.sub(_cut_word, error.format_message())
    return unknown_option(option, error.message, ctx)


_LONG_WORD = re.compile(r"\S{81,}")


def _cut_word(match) -> str:
    word = match[0]
    return f"{word[:40]}...[{len(word) - 60:,} characters]...{word[-20:]}"


def unknown_option(option: str, message: str, ctx) -> str:
    """``message`` (no such option) with the closest option the command has (``--fromat``:
    did you mean --format?), or saying that the name is one of its arguments (``fmt range
    --format fp8``: FORMAT is an argument here)."""
    params = [p for p in ctx.command.get_params(ctx) if not getattr(p, "hidden", False)]
    names = {name[2:]: name for p in params if not isinstance(p, TyperArgument)
             for name in (*p.opts, *p.secondary_opts) if name.startswith("--")}
    bare = option[2:] if option.startswith("--") else ""
    close = difflib.get_close_matches(bare, names, n=1, cutoff=0.7) if len(bare) <= 64 else []
    if close:
        return f"{message}; did you mean {names[close[0]]}?"
    for p in params:
        metavar = p.metavar or (p.name or "").upper()
        if isinstance(p, TyperArgument) and bare.lower() in (metavar.lower(), metavar.lower() +
                                                            "s", (p.name or "").lower()):
            return f"{message}; {metavar} is an argument here, given without {option}"
    return message


class UsageWithEllipsis(TyperCommand):
    """The command class of every fmt command: its usage errors and its help.

    - usage lines that mark repeatable arguments: ``fmt underflow [OPTIONS] VALUE...``,
      ``fmt quantize [OPTIONS] [FILE]...`` (typer writes ``{VALUE}`` and ``[FILE]``);
    - plain metavars for numbers (``--seed N``, where click writes ``<int range>``; the
      range itself is in the help's brackets);
    - every usage error names this command (its hint is ``fmt quantize --help``, also for
      the errors click raises without a context, such as an option missing its value);
    - extra arguments say what the command takes (``fmt calc 1 + 2``: quote the
      expression as one argument)."""

    # click's type names: "integer", "integer range" in the typer 0.26 vendoring, "int"... later
    PLAIN_METAVARS = {"int": "N", "int range": "N", "integer": "N", "integer range": "N",
                      "float": "X", "float range": "X"}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None and not isinstance(param, TyperArgument) \
                    and not getattr(param, "is_flag", False):
                param.metavar = self.PLAIN_METAVARS.get(param.type.name)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        allow_extra = ctx.allow_extra_args
        ctx.allow_extra_args = True  # extra arguments are refused below, in our words
        try:
            rest = super().parse_args(ctx, args)
        except PARSER_ERROR as error:
            if getattr(error, "ctx", False) is None:  # click raised it without a context
                error.ctx = error.cmd = ctx
            raise
        finally:
            ctx.allow_extra_args = allow_extra
        if ctx.resilient_parsing:
            return rest
        if ctx.ignore_unknown_options:  # arguments may start with '-' (-5): not with '--x'
            for param in self.get_params(ctx):
                value = ctx.params.get(param.name) if isinstance(param, TyperArgument) else None
                for text in [value] if isinstance(value, str) else value or ():
                    if isinstance(text, str) and text.startswith("--") and text[2:3].isalpha():
                        ctx.fail(unknown_option(text, f"No such option: {one_line(text, 200)}",
                                                ctx))
        if rest and not allow_extra:
            ctx.fail(self.extra_arguments(ctx, rest))
        return rest

    def extra_arguments(self, ctx, extra: list[str]) -> str:
        """What the command takes, when it got more arguments than that."""
        arguments = [p for p in self.get_params(ctx) if isinstance(p, TyperArgument)]
        shown_extra = one_line(shlex.join(extra), 200)
        if not arguments:
            return f"{ctx.command_path} takes no arguments, got {shown_extra}"
        names = " ".join(p.metavar or (p.name or "").upper() for p in arguments)
        if len(arguments) == 1 and arguments[0].nargs == 1:
            given = ctx.params.get(arguments[0].name)
            whole = shlex.quote(" ".join(map(str, ([] if given is None else [given]) + extra)))
            return (f"{ctx.command_path} takes one {names}, got {len(extra) + 1} arguments: "
                    f"quote it as one argument, {ctx.command_path} {one_line(whole, 200)}")
        return f"{ctx.command_path} takes {names}; unexpected extra argument(s): {shown_extra}"

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not isinstance(param, TyperArgument):
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            name = param.metavar or (param.name or "").upper()
            piece = name if param.required else f"[{name}]"
            pieces.append(piece + ("..." if param.nargs != 1 else ""))
        return pieces


class FmtTyper(typer.Typer):
    """A Typer app whose commands are all ``UsageWithEllipsis`` commands (their usage
    errors, metavars and usage lines), whether or not a command names the class."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or UsageWithEllipsis, **kwargs)


app = FmtTyper(
    cls=OneLineErrors,
    rich_markup_mode=None,
    name="fmt",
    help="Explore the number formats of ML training and inference: FP32, FP16, BF16, FP8 "
         "(E4M3 fn/fnuz, E5M2), MX FP6/FP4/E8M0 and any custom eXmY.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_callback(value: bool) -> None:
    if value:
        from fmtcli import package_version

        with writing_results():
            typer.echo(f"fmtcli {package_version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[Optional[bool], typer.Option(
        "--version", callback=version_callback, is_eager=True, help="Show the version.")] = None,
) -> None:
    """fmt: what does this value become in each format, and what range does a format cover?"""


def command_name(info) -> str:
    """A registered command's name, as typer derives it."""
    return info.name or info.callback.__name__.replace("_", "-")


def main(prog_name: str | None = None) -> None:
    """Console-script entry point (``prog_name``: the name usage lines show; the script's
    own by default).

    ``fmt COMMAND ...`` builds the parser of that one command: typer would build every
    command's from its signature (evaluating each option's annotations) on every run, ~30 ms
    of the start-up of any command.  Anything else (``fmt``, ``fmt --help``, a mistyped
    command) gets the whole group.
    """
    prog = prog_name or (os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fmt")
    every = app.registered_commands
    asked = [info for info in every if sys.argv[1:2] == [command_name(info)]]
    try:
        if asked:
            app.registered_commands = asked
        app(prog_name=prog)
    finally:
        app.registered_commands = every
