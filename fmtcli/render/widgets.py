"""Pieces every table shares: names as the user's data chose them (escaped, cut, wrapped at
dots), the style of a value's fate, shapes, the line that says a shared prefix is left out,
and the sparkline of a histogram of scale exponents.
"""

from __future__ import annotations

import math

from rich.cells import cell_len
from rich.measure import Measurement
from rich.text import Text

from fmtcli.base.errors import one_line
from fmtcli.numerics.fates import Fate


class DottedName:
    """A long name (a checkpoint key) that wraps only after its dots (or spaces): parts
    longer than the width are folded."""

    def __init__(self, name: str, style: str = "") -> None:
        self.name = name
        self.style = style
        parts = name.replace(".", ".\n").replace(" ", " \n").split("\n")
        self.parts = [p for p in parts if p]

    def lines(self, width: int) -> list[str]:
        out: list[str] = []
        for part in self.parts:
            while cell_len(part) > width:  # fold a part with no dot to break at
                out.append(part[:width])
                part = part[width:]
            if out and cell_len(out[-1]) + cell_len(part) <= width and out[-1][-1] in ". ":
                out[-1] += part
            else:
                out.append(part)
        return out

    def __rich_measure__(self, console, options) -> Measurement:
        longest = max((cell_len(p) for p in self.parts), default=0)
        return Measurement(min(longest, 16), cell_len(self.name))

    def __rich_console__(self, console, options):
        lines = [line.rstrip() for line in self.lines(max(1, options.max_width))]
        yield Text("\n".join(lines), style=self.style)


FATE_STYLE = {
    Fate.EXACT: "green", Fate.ROUNDED: "default", Fate.SUBNORMAL: "yellow",
    Fate.FLUSHED: "bold red", Fate.OVERFLOW: "bold red", Fate.SATURATED: "magenta",
    Fate.INVALID: "bold red",
}


def fate_text(fate: Fate) -> Text:
    return Text(fate.value, style=FATE_STYLE[fate])


def user_text(text: object) -> str:
    """A name the user's data chose (a file path, a checkpoint key) as a table shows it:
    control characters, newlines and bidi overrides escaped (no terminal escape, no broken
    line), and more than 240 characters cut in the middle with a count.  Pass it to rich
    inside a ``Text`` so that brackets are not read as markup."""
    return one_line(text, 240)


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def prefix_note(prefix: str) -> Text:
    """The line above a table whose names are shown without their shared ``prefix``."""
    return Text(f"Names below are under {user_text(prefix)}\n")


SPARK = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # eight heights, lowest first


def sparkline(histogram: dict[int, int], width: int = 32) -> str:
    """A histogram over consecutive integers (scale exponents) as one line of bars, one
    character per exponent from the lowest to the highest (several per character past
    ``width``); ``.`` where none fall."""
    if not histogram:
        return ""
    low, high = min(histogram), max(histogram)
    per = -(-(high - low + 1) // width)
    counts = [sum(histogram.get(e, 0) for e in range(start, start + per))
              for start in range(low, high + 1, per)]
    peak = max(counts)
    return "".join(SPARK[max(0, math.ceil(len(SPARK) * n / peak) - 1)] if n else "."
                   for n in counts)


def exponents_text(histogram: dict[int, int] | None, width: int = 32) -> str:
    """'11..16 ▃█▅▁' (floor(log2) of the scales, their sparkline), '7' for one exponent,
    '-' where unknown."""
    if not histogram:
        return "-"
    low, high = min(histogram), max(histogram)
    if low == high:
        return f"{low}"
    return f"{low}..{high} {sparkline(histogram, width)}"
