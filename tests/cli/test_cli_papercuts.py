"""Issue 22's papercuts of the command line, as a new user meets them: what the parser says
about a recipe given as a format, a mistyped option, an unquoted expression, an option
without its value; the metavars of --help; the workers a machine can run; what tables and
notes look like in a file, a pipe and a terminal; shell completion."""

from __future__ import annotations

import os
import re

import pytest
import typer
from cli_helpers import assert_usage_error, invoke, run_fmt_each
from typer.core import TyperArgument

from fmtcli.base.choices import RECIPE_NAMES
from fmtcli.cli import app


def commands() -> dict:
    """Every command's click command, by name (the whole group, as ``fmt --help`` builds)."""
    return dict(typer.main.get_command(app).commands)


def value_options(command) -> list[str]:
    """The long names of a command's options that take a value."""
    return [name for p in command.params if not isinstance(p, TyperArgument)
            and not p.is_flag and not p.hidden for name in p.opts if name.startswith("--")]


# -- a recipe is not a format ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_a_recipe_given_as_a_format_names_the_recipe_option(recipe):
    line = assert_usage_error(invoke("quantize", "--format", recipe), "unknown format",
                              f"{recipe} is a recipe", f"--recipe {recipe}")
    assert "did you mean" not in line


@pytest.mark.slow
@pytest.mark.parametrize("args", [["range", "MXFP8"], ["underflow", "1", "--format", "nvfp4"],
                                  ["calc", "1+1", "--format", "fp16,mxfp4"],
                                  ["scale-search", "--format", "mxfp6"],
                                  ["check-backends", "nvfp4"]])
def test_every_command_s_format_says_so_through_the_shared_parser(args):
    assert_usage_error(invoke(*args), "is a recipe, not a format", "--recipe ")


def test_the_library_says_it_with_the_parameter_s_name():
    from fmtcli.base.errors import UnknownFormatError
    from fmtcli.numerics.formats import get_format

    with pytest.raises(UnknownFormatError, match=r"recipe='nvfp4'"):
        get_format("nvfp4")


# -- option typos ------------------------------------------------------------------------

def typo(option: str) -> str:
    """``--format`` -> ``--fromat``: two letters of the name swapped."""
    name = option[2:]
    i = 1 if len(name) > 2 else 0
    return "--" + name[:i] + name[i + 1] + name[i] + name[i + 2:]


WITH_VALUES = sorted(name for name, command in commands().items() if value_options(command))


def test_every_command_has_fmt_s_command_class():
    from fmtcli.cli.app import UsageWithEllipsis

    assert all(isinstance(c, UsageWithEllipsis) for c in commands().values())
    assert len(WITH_VALUES) >= len(commands()) - 1  # range: flags and arguments only


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_VALUES)
def test_a_mistyped_option_of_every_command_suggests_the_right_one(name):
    option = [o for o in value_options(commands()[name]) if len(o) >= 7][0]
    line = assert_usage_error(invoke(name, typo(option), "1"), f"No such option: {typo(option)}",
                              f"did you mean {option}?", f"(see 'fmt {name} --help')")
    assert "Possible options" not in line


def test_the_group_s_options_too():
    assert_usage_error(invoke("--verison"), "did you mean --version?", "(see 'fmt --help')")


def test_an_option_that_resembles_nothing_gets_no_guess():
    line = assert_usage_error(invoke("kv", "--foo"), "No such option: --foo")
    assert "did you mean" not in line


def test_a_format_option_where_formats_are_arguments_says_so():
    assert_usage_error(invoke("range", "--format", "fp8"),
                       "FORMAT is an argument here, given without --format")


@pytest.mark.parametrize("args", [["calc", "--fromat", "bf16", "1+1"],
                                  ["underflow", "-5", "--fromat", "e4m3"]])
def test_commands_whose_arguments_may_be_negative_suggest_too(args):
    assert_usage_error(invoke(*args), "No such option: --fromat; did you mean --format?")


# -- arguments ---------------------------------------------------------------------------

def test_an_unquoted_expression_is_told_to_be_quoted():
    assert_usage_error(invoke("calc", "1", "+", "2^-9"), "fmt calc takes one EXPR",
                       "got 3 arguments", "quote it", "fmt calc '1 + 2^-9'")


def test_extra_arguments_say_what_the_command_takes():
    assert_usage_error(invoke("compare", "a.npy", "b.npy", "c.npy"), "fmt compare takes REF TEST",
                       "extra argument(s): c.npy")


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_VALUES)
def test_an_option_without_its_value_points_to_the_command_s_help(name):
    option = value_options(commands()[name])[-1]
    assert_usage_error(invoke(name, option), f"'{option}' requires an argument",
                       f"(see 'fmt {name} --help')")


# -- help --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(commands()))
def test_help_shows_no_click_type_names_as_metavars(name):
    out = invoke(name, "--help").stdout
    assert not re.search(r"<(int|float|text|integer)( range)?>", out), out


def test_a_number_s_plain_metavar_is_n_and_its_range_stays_in_brackets():
    out = invoke("quantize", "--help").stdout
    for option in ("--seed", "--margin", "--chunk", "--axis"):
        assert re.search(rf"^  {option} N  ", out, re.M), option
    assert re.search(r"--margin N [^[]*\[0<=x<=64\]", out)


# -- workers -----------------------------------------------------------------------------

@pytest.mark.slow
def test_workers_are_bounded_by_the_cores_available(tmp_path):
    from fmtcli.base.choices import cores_available

    cores = cores_available()
    for name in ("quantize", "scale-search", "loss-scale", "compare"):
        assert_usage_error(invoke(name, "--workers", str(cores + 1)),
                           f"--workers {cores + 1}: give 1 to {cores}", "cores available")
        assert_usage_error(invoke(name, "--workers", "1024"), f"give 1 to {cores}")
    assert invoke("quantize", "--workers", str(cores), "--json").exit_code == 0


def test_cores_available_is_the_affinity_mask():
    from fmtcli.base.choices import cores_available
    from fmtcli.streaming.parallel import MAX_DEFAULT_WORKERS, default_workers

    if hasattr(os, "sched_getaffinity"):
        assert cores_available() == len(os.sched_getaffinity(0))
    assert default_workers() == min(MAX_DEFAULT_WORKERS, cores_available())


def test_dask_local_workers_are_bounded_by_the_cores_available(tmp_path):
    from fmtcli.base.choices import cores_available
    from fmtcli.base.errors import UsageError
    from fmtcli.quantize.distributed import parse_address

    cores = cores_available()
    assert parse_address(f"local:{cores}") == ("local", cores)
    with pytest.raises(UsageError, match=rf"1 <= N <= {cores} \(the cores available"):
        parse_address("local:1024")
    pytest.importorskip("distributed")
    import numpy as np

    np.save(tmp_path / "x.npy", np.ones(8, np.float32))
    assert_usage_error(invoke("quantize", tmp_path / "x.npy", "--dask", f"local:{cores + 1}"),
                       f"1 <= N <= {cores}")


# -- tables in a file or a pipe ----------------------------------------------------------

PIPED = [["range"], ["quantize"], ["underflow", "1e-8", "3e5"]]


@pytest.mark.slow
def test_a_table_in_a_pipe_has_no_trailing_spaces_and_the_docs_width():
    """``fmt ARGS``'s stdout through a pipe, as ``fmt ... | less`` gets it: COLUMNS unset,
    then COLUMNS=80 (as the documentation shows it); one interpreter, each run in a child
    forked from it (cli_helpers.run_fmt_each)."""
    runs = [*((args, {}) for args in PIPED), *((args, {"COLUMNS": "80"}) for args in PIPED)]
    outs = piped(runs)
    for args, out, documented in zip(PIPED, outs, outs[len(PIPED):]):
        assert [line for line in out.splitlines() if line != line.rstrip()] == [], args
        assert max(map(len, out.splitlines())) <= 80, args
        assert out == documented, args


def piped(runs: list) -> list[str]:
    """The stdout of each (arguments, environment) of ``runs`` through a pipe, COLUMNS unset
    unless the run's environment sets it; each run must succeed."""
    ran = run_fmt_each(runs, env={"COLUMNS": None})
    assert [code for code, _, _ in ran] == [0] * len(runs), [e[-500:] for _, _, e in ran]
    return [out.decode() for _, out, _ in ran]


def test_columns_still_sets_the_width_of_a_pipe():
    out, = piped([(["range"], {"COLUMNS": "200"})])
    assert 80 < max(map(len, out.splitlines())) <= 200
    assert [line for line in out.splitlines() if line != line.rstrip()] == []


def test_trimming_keeps_styles_and_waits_for_a_line_s_end():
    import io

    from fmtcli.cli.output import TrimmedLines

    sink = io.StringIO()
    stream = TrimmedLines(sink)
    for piece in ["a  ", "  \x1b[2m ", "\x1b[0m  \nb   c  ", "\n", "  \x1b[1mx\x1b[0m \n", "end  "]:
        stream.write(piece)
    stream.flush()
    assert sink.getvalue() == "a\x1b[2m\x1b[0m\nb   c\n  \x1b[1mx\x1b[0m\nend  "


# -- shell completion --------------------------------------------------------------------

def complete(words: str) -> list[str]:
    """What bash completion offers for the command line ``words`` (the cursor after its
    last word), from the real program as the completion script calls it."""
    import subprocess
    import sys

    parts = words.split(" ")
    env = dict(os.environ, COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1),
               _FMT_COMPLETE="complete_bash")
    proc = subprocess.run([sys.executable, "-c", "import sys; from fmtcli.cli import main; "
                           "sys.argv = ['fmt']; main('fmt')"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_script_of_each_shell(shell, monkeypatch):
    # typer's switch for naming the shell instead of detecting it (the test's parent
    # process is no shell); read when the parser is built, before CliRunner's env applies
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = invoke("--show-completion", shell)
    assert result.exit_code == 0, result.stderr
    assert "_FMT_COMPLETE" in result.stdout and f"complete_{shell}" in result.stdout


def test_the_help_offers_completion():
    out = invoke("--help").stdout
    assert "--install-completion" in out and "--show-completion" in out


@pytest.mark.slow
def test_completion_offers_commands_options_and_choices():
    assert complete("fmt qu") == ["quantize"]
    assert "--format" in complete("fmt quantize --fo")
    assert complete("fmt quantize -r ") == ["nearest-even", "nearest-away", "toward-zero",
                                            "up", "down", "stochastic"]


def test_a_huge_value_echoed_by_the_parser_is_cut_to_its_head_and_tail():
    """``--seq`` followed by 400 zeros: one usage line naming the range, not the 401 digits."""
    huge = "1" + "0" * 400
    result = invoke("attention", "--io", "--seq", huge)
    line = assert_usage_error(result, "--seq", "1<=x<=16777216", "characters]")
    assert huge not in line and len(line) < 240, line


def test_tensors_skipped_for_one_reason_are_one_note(tmp_path):
    """A CNN's six int64 num_batches_tracked: one note naming three of them and the count,
    not six lines; a tensor skipped for a reason of its own keeps its own note."""
    import numpy as np
    from oracle import write_safetensors

    tensors = {f"bn{i}.num_batches_tracked": np.array([7], np.int64) for i in range(6)}
    tensors["mask"] = np.zeros(4, np.uint8)
    tensors["w"] = np.linspace(-1, 1, 256, dtype=np.float32)
    path = write_safetensors(tmp_path / "cnn.safetensors", tensors)
    result = invoke("quantize", path, "--json")
    assert result.exit_code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("Note: skipped")]
    assert len(notes) == 2, notes
    grouped = next(line for line in notes if "6 tensors" in line)
    assert "(int64)" in grouped and "bn0.num_batches_tracked" in grouped
    assert "bn3." not in grouped and "and 3 more (--json lists them)" in grouped
    assert any("mask" in line and "uint8" in line for line in notes)
