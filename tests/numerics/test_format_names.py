"""``fmtcli.numerics.format_names``: float64 by its names and the one format-list parser,
shared by the commands that take formats (the command line's ``--format`` lists, ``fmt
calc``, ``fmt sum``, ``fmt softmax``)."""

from __future__ import annotations

import pytest

from fmtcli.base.errors import UsageError
from fmtcli.numerics.format_names import (
    FLOAT64_NAMES,
    arithmetic_spec,
    format_label,
    is_float64,
    parse_formats,
)
from fmtcli.numerics.formats import get_format, resolve_format


@pytest.mark.parametrize("name", FLOAT64_NAMES + (" Double ", "FP64"))
def test_every_float64_name_is_e11m52_shown_as_float64(name):
    spec, note = arithmetic_spec(name)
    assert (spec.exponent_bits, spec.mantissa_bits, spec.bias) == (11, 52, 1023)
    assert note is None and is_float64(spec) and format_label(spec) == "float64"


def test_other_names_resolve_as_formats_does():
    assert arithmetic_spec("bf16") == resolve_format("bf16")
    assert arithmetic_spec("e4m3") == resolve_format("e4m3")  # with its note
    assert not is_float64(get_format("fp32")) and format_label(get_format("fp32")) == "float32"


def test_float64_names_only_where_asked():
    with pytest.raises(UsageError):
        parse_formats(["float64"], example="e.g. x")
    specs, _ = parse_formats(["bf16,float64", "double"], example="e.g. x", float64=True)
    assert [format_label(s) for s in specs] == ["bfloat16", "float64"]


def test_lists_keep_order_and_drop_duplicates():
    specs, notes = parse_formats(["fp16, bf16", "float16,e4m3fn"], example="e.g. x")
    assert [s.name for s in specs] == ["float16", "bfloat16", "float8_e4m3fn"]
    assert notes == []


def test_the_default_only_when_no_names_are_given():
    assert parse_formats(None, ("fp16",), example="e.g. x")[0] == [get_format("fp16")]
    assert parse_formats([], ("fp16",), example="e.g. x")[0] == [get_format("fp16")]
    assert parse_formats(["bf16"], ("fp16",), example="e.g. x")[0] == [get_format("bf16")]


@pytest.mark.parametrize("names", [[""], ["e4m3fn,"], ["fp16", " , bf16"]])
def test_an_empty_name_is_refused_with_the_callers_example(names):
    with pytest.raises(UsageError, match="empty format name") as caught:
        parse_formats(names, ("fp16",), example="e.g. --format fp16")
    assert caught.value.suggestion == "e.g. --format fp16"


def test_no_formats_at_all_is_refused():
    with pytest.raises(UsageError, match="no formats given"):
        parse_formats([], (), example="e.g. bf16")


def test_notes_are_returned_and_passed_on_as_found():
    """An ambiguous name's note goes to ``on_note`` at once, so a note printed before a
    later name's error still shows (the command line's order)."""
    heard = []
    with pytest.raises(UsageError):
        parse_formats(["e4m3", ""], example="e.g. x", on_note=heard.append)
    assert len(heard) == 1 and "e4m3" in heard[0]
    specs, notes = parse_formats(["e4m3"], example="e.g. x", on_note=heard.append)
    assert notes == heard[1:] == [resolve_format("e4m3")[1]] and specs == [resolve_format("e4m3")[0]]


def test_the_command_line_and_the_arithmetic_commands_parse_alike():
    from fmtcli.arithmetic.ops import arithmetic_specs
    from fmtcli.cli.options import resolve_formats

    names = ["bf16,fp16", "e4m3fn", "fp16"]
    assert resolve_formats(names, ()) == arithmetic_specs(names)[0]
