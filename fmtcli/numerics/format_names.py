"""Format names as the commands take them: float64 by its own names, and lists of formats.

``formats.resolve_format`` knows the registry's formats and custom ``eXmY`` ones.  The
commands that do arithmetic in a format (``fmt calc``, ``fmt sum``, ``fmt softmax``) also
take float64 -- by any of ``FLOAT64_NAMES``, as the custom format e11m52, whose values are
exactly float64's -- and show it as ``float64`` (``format_label``).  ``parse_formats`` turns
repeatable, comma-separated format options into specs, for every command that takes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fmtcli.base.errors import UsageError, shown
from fmtcli.numerics.formats import FormatSpec, Specials, resolve_format
from fmtcli.numerics.tapered import check_one_precision

#: Names of float64 (case and surrounding spaces aside).
FLOAT64_NAMES = ("float64", "fp64", "f64", "double", "torch.float64")


def arithmetic_spec(name: str) -> tuple[FormatSpec, str | None]:
    """The spec of a format name and its note (``formats.resolve_format``), with float64
    (fp64, double) as e11m52: arithmetic may be done in float64 here.  A tapered format
    (HiFloat8) is refused: this arithmetic rounds at one precision."""
    if name.strip().lower() in FLOAT64_NAMES:
        return resolve_format("e11m52")[0], None
    spec, note = resolve_format(name)
    check_one_precision(spec, "arithmetic in a format (fmt calc, sum, softmax)")
    return spec, note


def is_float64(spec: FormatSpec) -> bool:
    """Whether ``spec`` is float64 itself (11 exponent bits of bias 1023, 52 mantissa bits,
    IEEE specials, signed, with subnormals), under any name."""
    return (spec.exponent_bits, spec.mantissa_bits, spec.bias) == (11, 52, 1023) \
        and spec.signed and spec.subnormals and spec.specials is Specials.IEEE


def format_label(spec: FormatSpec) -> str:
    """The name results show: float64 for e11m52."""
    return "float64" if is_float64(spec) else spec.name


def parse_formats(names: Iterable[str] | None, default: tuple[str, ...] = (), *,
                  example: str, float64: bool = False,
                  on_note: Callable[[str], None] | None = None
                  ) -> tuple[list[FormatSpec], list[str]]:
    """Specs for format names (each may be a comma list; ``default`` when none are given;
    duplicates dropped, order kept) and the notes of ambiguous names, each also passed to
    ``on_note`` as it is found.  ``float64``: float64's names are taken too
    (``arithmetic_spec``).  An empty name ('', 'e4m3,') or none at all is a UsageError
    whose hint is ``example``, never a silent default."""
    resolve = arithmetic_spec if float64 else resolve_format
    specs: list[FormatSpec] = []
    notes: list[str] = []
    for name in names or default:
        parts = [part.strip() for part in name.split(",")]
        if not all(parts):
            raise UsageError(f"empty format name in {shown(name)}", example)
        for part in parts:
            spec, note = resolve(part)
            if note:
                notes.append(note)
                if on_note is not None:
                    on_note(note)
            if spec not in specs:
                specs.append(spec)
    if not specs:
        raise UsageError("no formats given", example)
    return specs, notes
