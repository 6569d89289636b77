"""Numbers from text: CSV / whitespace-separated lines and JSON arrays, read defensively.

Text inputs are for small tensors; every bound below is there so a hostile or mistaken
input (``/dev/zero``, a 10,000-level ``[[[...]]]``, a 5,000-digit number) ends in one
``DataError`` line instead of a traceback or a process that eats all memory:

- at most ``MAX_TEXT_BYTES`` are read (files and stdin alike; larger data belongs in .npy);
- the text must be UTF-8 (a leading BOM is dropped; CRLF line endings are fine);
- JSON may nest at most ``MAX_JSON_DEPTH`` levels, checked by a bracket scan before parsing.

What counts as a number is the same in CSV and JSON: ASCII decimal syntax
(``-1``, ``2.5``, ``.5``, ``3e-4``) and ``nan``, ``inf``, ``infinity`` in any case with an
optional sign (JSON spells them ``NaN``/``Infinity`` constants, or the strings ``"nan"``,
``"inf"``, ``"-inf"`` that fmt's own JSON output writes).  Python's ``float()`` would also take
``1_000``, Arabic-Indic or fullwidth digits and surrounding spaces; fmt refuses them, so a file
means the same here as in other tools.  Every number is converted to float64 with
round-to-nearest, as IEEE 754 and ``strtod`` do: a value beyond float64's range (``1e999``, a
5,000-digit integer) becomes ``inf`` with its sign, one below the smallest subnormal becomes
zero -- the same rule for decimals, integers, CSV and JSON (no integer is ever built, so
Python's int-string digit limit does not apply).
"""

from __future__ import annotations

import codecs
import io
import json
import re
from array import array

import numpy as np

from fmtcli.base.errors import DataError, shown

MAX_TEXT_BYTES = 16 * 1024 * 1024  # a few seconds of parsing at worst (one number a line)
MAX_JSON_DEPTH = 64

_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)",
                     re.IGNORECASE | re.ASCII)
# a JSON string (possessive: linear time even when unterminated), then runs of non-brackets
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\[\s\S])*+"?')
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")


def read_text(handle, source: str) -> str:
    """At most ``MAX_TEXT_BYTES`` of UTF-8 text from a binary ``handle``; ``source`` is the
    already quoted name used in messages."""
    data = handle.read(MAX_TEXT_BYTES + 1)
    if isinstance(data, str):  # a text-only stdin (no .buffer)
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > MAX_TEXT_BYTES:
        raise DataError(f"{source}: more than {MAX_TEXT_BYTES >> 20} MiB of text",
                        "text input is for small tensors: save larger ones as .npy")
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as error:
        offset = skip + error.start
        raise DataError(f"{source}: not UTF-8 text (byte 0x{data[offset]:02x} at offset "
                        f"{offset})") from None


def check_json_depth(text: str, source: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` arrays/objects, before ``json.loads`` would
    recurse into it.  Brackets inside strings do not count."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if len(brackets) <= limit:
        return
    raw = brackets.encode("ascii")
    depth = 0
    for start in range(0, len(raw), 1 << 20):
        chunk = np.frombuffer(raw, np.uint8, min(1 << 20, len(raw) - start), start)
        steps = np.where((chunk == ord("[")) | (chunk == ord("{")), 1, -1)
        levels = np.cumsum(steps) + depth
        if levels.max() > limit:
            raise DataError(f"{source}: JSON nested more than {limit} levels deep",
                            "a tensor needs one level per dimension")
        depth = int(levels[-1])


def load_json(text: str, corrupt: str, **options):
    """``json.loads`` for files fmt reads as structure (a safetensors header, a checkpoint
    index): nesting bounded before parsing, a name given twice in one object refused, every
    failure one ``DataError`` starting ``corrupt`` (e.g. "'x.json': corrupt index").
    ``options`` go to ``json.loads`` (``parse_int``)."""
    check_json_depth(text, corrupt)

    def unique(pairs):
        obj = {}
        for key, value in pairs:
            if key in obj:
                raise DataError(f"{corrupt} (the name {shown(key)} appears twice)")
            obj[key] = value
        return obj

    try:
        return json.loads(text, object_pairs_hook=unique, **options)
    except json.JSONDecodeError as error:
        raise DataError(f"{corrupt} ({error})") from None


def parse_text(text: str, source: str) -> np.ndarray:
    """Numbers from text (float64): a JSON array, or lines of numbers split by commas and/or
    whitespace.  Lines that all hold the same count (> 1) give a matrix; one line, or one
    number per line, gives a vector; anything else is an error naming the line."""
    stripped = text.strip()
    if not stripped:
        raise DataError(f"{source}: no numbers found")
    if stripped[0] in "[{":
        return _parse_json(stripped, source)
    return _parse_lines(stripped, source)


# -- JSON ------------------------------------------------------------------------------------------

def _constant(name: str) -> float:
    return float(name.lower().replace("infinity", "inf"))


def _parse_json(text: str, source: str) -> np.ndarray:
    check_json_depth(text, source)
    try:
        data = json.loads(text, parse_int=float, parse_float=float, parse_constant=_constant)
    except json.JSONDecodeError as error:
        raise DataError(f"{source}: invalid JSON ({error})") from None
    if not isinstance(data, list):
        raise DataError(f"{source}: JSON must be an array of numbers (nested arrays for a "
                        f"matrix), not {_kind(data)}")
    shape = []
    node = data
    while isinstance(node, list):
        shape.append(len(node))
        if not node:
            break
        node = node[0]
    _check_json(data, shape, "", source)
    if 0 in shape:
        raise DataError(f"{source}: no numbers found")
    return np.array(data, dtype=np.float64)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {_clip(value)}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return "a number"


def _clip(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _check_json(node: list, shape: list[int], path: str, source: str) -> None:
    """Every element at depth ``len(shape)`` a number, every list the length ``shape`` says;
    the strings "nan"/"inf"/"-inf" are replaced by their values in place."""
    if len(node) != shape[0]:
        raise DataError(f"{source}: ragged JSON array: {path or 'the top level'} has "
                        f"{len(node)} elements where the first has {shape[0]}")
    inner = shape[1:]
    for index, value in enumerate(node):
        where = f"{path}[{index}]"
        if inner:
            if not isinstance(value, list):
                raise DataError(f"{source}: ragged JSON array: element {where} is "
                                f"{_kind(value)} where an array of {inner[0]} belongs")
            _check_json(value, inner, where, source)
        elif isinstance(value, str) and _NUMBER.fullmatch(value) and value[-1:].isalpha():
            node[index] = _constant(value)  # "nan", "-inf": fmt's own JSON spelling
        elif type(value) is not float:
            hint = {"null": 'write "nan" or NaN for a missing value',
                    "true": "booleans are not numbers", "false": "booleans are not numbers"}
            kind = _kind(value)
            raise DataError(f"{source}: JSON element {where} is {kind}, not a number",
                            hint.get(kind, "write numbers without quotes"
                                     if isinstance(value, str) else None))


# -- CSV / whitespace ------------------------------------------------------------------------------

def _parse_lines(text: str, source: str) -> np.ndarray:
    values = array("d")
    width = first_line = lines = 0
    for number, line in enumerate(io.StringIO(text, newline=None), 1):
        tokens = line.replace(",", " ").split()
        if (not tokens and "," not in line) or (tokens and tokens[0].startswith("#")):
            continue
        if ("," in line and not all(f.strip() for f in line.split(","))) \
                or not all(map(_NUMBER.fullmatch, tokens)):
            _explain_line(line, number, source)
        values.extend(map(float, tokens))
        lines += 1
        if not width:
            width, first_line = len(tokens), number
        elif len(tokens) != width:
            raise DataError(f"{source}: line {number} has {len(tokens)} numbers but line "
                            f"{first_line} has {width}",
                            "every line must hold the same count, the rows of a matrix; "
                            "or put one number per line")
    if not values:
        raise DataError(f"{source}: no numbers found")
    arr = np.frombuffer(values, dtype=np.float64).copy()
    return arr.reshape(lines, width) if lines > 1 and width > 1 else arr


def _explain_line(line: str, number: int, source: str) -> None:
    """Raise the error for the first bad field of a line that failed the quick check."""
    field = 0
    for part in line.rstrip("\r\n").split(","):
        if not part.strip():
            raise DataError(f"{source}: line {number}, field {field + 1} is empty",
                            "write nan for a missing value")
        for token in part.split():
            field += 1
            if _NUMBER.fullmatch(token):
                continue
            if not token.isascii():
                why = "only ASCII digits are read"
            elif "_" in token:
                why = "underscores are not read in numbers"
            elif token.lower().lstrip("+-").startswith("0x"):
                why = "hexadecimal is not read: write the decimal value"
            elif number == 1:
                why = "a header row? fmt reads numbers only: remove it"
            else:
                why = None
            raise DataError(f"{source}: line {number}, field {field}: {_clip(token)} is not "
                            "a number", why)
    raise DataError(f"{source}: line {number} is not a list of numbers")
