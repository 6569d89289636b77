"""``fmt calc``: a small arithmetic expression evaluated in each format, every operation
rounded once (``ops.Arithmetic``), step by step.

The article: "1 + 2^-9 is exactly 1 in BF16" -- BF16 keeps 8 significant bits, so 2^-9 is
below half the spacing of the numbers near 1 (2^-7) and the sum rounds back to 1, where
FP16 (11 bits) and FP32 (24) hold 1.001953125 exactly.  ``calculate("1 + 2^-9",
["bf16", "fp16", "fp32"])`` shows exactly that: each step's exact value, the rounded
result, the error, and a note where a term was absorbed (the sum equals the other operand
although the term was not zero).

The grammar (parsed with Python's ``ast``, never evaluated by Python): numbers in any syntax
``fmt underflow`` reads (``1e-8``, ``0.001``, ``0x1p-24``, ``inf``, ``nan``, ``1_000``,
other scripts' decimal digits), powers ``2^-9`` / ``2**-9`` (a number to an integer power:
a literal, exact), ``+ - * /``, parentheses, unary minus, ``fma(a, b, c)`` (a * b + c,
one rounding) and ``sqrt(x)``.  Each literal is first stored in the format (rounded, a step
when that changes it); each operation then takes the stored operands, computes the exact
result and rounds it once.  The expression's exact value (every literal and operation
exact; square roots to 256 bits) is the reference of each format's final error
(``expression``: the grammar, the tree, the exact value and the estimate of its cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from fmtcli.arithmetic.expression import Node, check_cost, computed, exact_value, parse_expression
from fmtcli.arithmetic.ops import Arithmetic
from fmtcli.arithmetic.ratio import Ratio, ratio_text, relative
from fmtcli.base.choices import RoundingMode
from fmtcli.base.errors import UsageError
from fmtcli.numerics.format_names import arithmetic_spec, format_label
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.tapered import check_one_precision

Number = Ratio | Fraction | float

#: The formats of ``fmt calc`` with no --format: the article's BF16/FP16/FP32, and float64.
DEFAULT_FORMATS = ("bfloat16", "float16", "float32", "float64")
#: Steps traced in all formats together (formats x numbers and operations): the table of
#: 4,000 rows takes seconds to lay out; 8 formats of the longest expression.
MAX_ROWS = 4_000


@dataclass(frozen=True)
class CalcStep:
    """One step in one format: ``expression`` (its text), ``kind`` ("literal": a number
    stored in the format; "operation"), the exact result of the operation on the stored
    operands (``exact``, nearest float64; ``exact_text``: written exactly where short),
    the rounded ``value``, ``error = value - exact`` (float64 of the exact difference),
    ``rel_error`` = |error| / |exact|, and ``note`` ("T absorbed" where the sum lost its
    term T, "exact", "rounded", "overflow", "underflow to 0", "invalid", "division by
    zero", or "")."""

    expression: str
    kind: str
    exact: float
    exact_text: str
    value: float
    error: float
    rel_error: float
    note: str

    def to_dict(self) -> dict:
        return {"expression": self.expression, "kind": self.kind, "exact": self.exact,
                "exact_text": self.exact_text, "value": self.value, "error": self.error,
                "rel_error": self.rel_error, "note": self.note}


@dataclass(frozen=True)
class CalcFormat:
    """The expression in one format: the final rounded ``value``, the expression's
    ``exact`` value (no rounding anywhere), ``error = value - exact`` and ``rel_error``,
    ``absorbed`` (how many additions lost a nonzero term), and the ``steps``."""

    format: str
    precision_bits: int
    value: float
    exact: float
    error: float
    rel_error: float
    absorbed: int
    steps: tuple[CalcStep, ...]

    def to_dict(self) -> dict:
        return {"format": self.format, "precision_bits": self.precision_bits,
                "value": self.value, "exact": self.exact, "error": self.error,
                "rel_error": self.rel_error, "absorbed": self.absorbed,
                "steps": [s.to_dict() for s in self.steps]}


@dataclass(frozen=True)
class CalcResult:
    """``fmt calc``: the expression as given, the rounding mode, its exact value
    (``exact``: nearest float64; ``exact_text``) and one ``CalcFormat`` per format."""

    expression: str
    rounding: str
    exact: float
    exact_text: str
    results: tuple[CalcFormat, ...]

    def to_dict(self) -> dict:
        return {"expression": self.expression, "rounding": self.rounding,
                "exact": self.exact, "exact_text": self.exact_text,
                "results": [r.to_dict() for r in self.results]}


# -- evaluation ------------------------------------------------------------------------

def _count(node: Node) -> int:
    """Numbers and operations of the tree (a step each, at most)."""
    return 1 + sum(_count(a) for a in node.args)


def _float(q: Number) -> float:
    """The float64 nearest a number (inf beyond float64's range)."""
    if isinstance(q, float):
        return q
    return float(Ratio.of(q))


def exact_text(q: Number) -> str:
    """A number written exactly where that is short: a terminating decimal of at most 20
    significant digits (1e-8, 0.1, 1.001953125), else a fraction of small terms (1/3),
    else approximately (``≈`` and 17 digits; beyond float64 ``2^-13000`` where that is
    exact, else ``≈ 1.0144e-3914``): ``ratio.ratio_text``, bounded for any size."""
    if isinstance(q, float):
        if q == 0:
            return "-0" if math.copysign(1, q) < 0 else "0"
        return "nan" if math.isnan(q) else ("inf" if q > 0 else "-inf")
    return ratio_text(Ratio.of(q))


def _error(value: float, exact: Number) -> tuple[float, float]:
    """(value - exact, |value - exact| / |exact|) as floats; inf/NaN where they are."""
    if math.isnan(value) or (isinstance(exact, float) and math.isnan(exact)):
        return math.nan, math.nan
    if math.isinf(value) or (isinstance(exact, float) and math.isinf(exact)):
        if isinstance(exact, float) and value == exact:
            return 0.0, 0.0
        if math.isinf(value):  # an overflow: inf - (any finite or opposite inf) = value
            return value, math.inf
        return -exact, math.inf  # a finite value of an infinite exact: x - inf = -inf
    exact = Ratio.of(exact)
    difference = Ratio.of(value) - exact  # linear time: value is a float
    if difference.n == 0:
        return 0.0, 0.0
    if exact.n == 0:
        return float(difference), math.inf
    return float(difference), float(relative(difference, exact))


def _note(node: Node, operands: list[float], exact: Number, value: float) -> str:
    """What happened in an operation: invalid (NaN from numbers), overflow, underflow to
    0, exact, or "TERM absorbed" where a sum came out equal to one of its terms
    although the other was not zero (the article's 1 + 2^-9 = 1 in BF16)."""
    if isinstance(exact, float) and math.isnan(exact):
        return "invalid"
    if not math.isfinite(value) and not (isinstance(exact, float) and math.isinf(exact)):
        return "overflow"
    if value == 0 and exact != 0:
        return "underflow to 0"
    if node.op == "/" and operands[1] == 0:
        return "division by zero"
    if exact == value or (isinstance(exact, Fraction) and math.isfinite(value)
                          and exact == Fraction(value)):
        return "exact"
    if node.op in ("+", "-") and math.isfinite(value):
        a, b = operands
        if b != 0 and value == a:
            return f"{node.args[1].text} absorbed"
        if a != 0 and value == (-b if node.op == "-" else b):
            return f"{node.args[0].text} absorbed"
    if node.op == "fma" and math.isfinite(value):
        a, b, c = operands
        if c != 0 and math.isfinite(a * b) and Fraction(value) == Fraction(a) * Fraction(b):
            return f"{node.args[2].text} absorbed"
        if a * b != 0 and value == c:
            return f"{node.args[0].text} * {node.args[1].text} absorbed"
    return ""


def _evaluate(node: Node, arithmetic: Arithmetic, steps: list[CalcStep],
              texts: dict[int, str]) -> float:
    """The node's value in the format, steps appended in the order they are computed
    (``texts``: the literals' exact texts, written once for all formats)."""
    spec = arithmetic.spec
    if node.op == "num":
        value = arithmetic.store(node.value)
        exact = node.value
        if not (isinstance(exact, float) and (math.isnan(exact) and math.isnan(value)
                                              or exact == value)) and \
                not (isinstance(exact, Ratio) and math.isfinite(value) and exact == value):
            if id(node) not in texts:
                texts[id(node)] = exact_text(exact)
            steps.append(_step(node, "literal", exact, value, spec, [], texts[id(node)]))
        return value
    operands = [_evaluate(a, arithmetic, steps, texts) for a in node.args]
    if node.op == "neg":
        return -operands[0]  # exact: a sign flip
    method = {"+": arithmetic.add, "-": arithmetic.sub, "*": arithmetic.mul,
              "/": arithmetic.div, "fma": arithmetic.fma, "sqrt": arithmetic.sqrt}[node.op]
    exact, value = method(*operands)
    steps.append(_step(node, "operation", exact, value, spec, operands, exact_text(exact)))
    return value


def _step(node: Node, kind: str, exact: Number, value: float, spec: FormatSpec,
          operands: list[float], text: str) -> CalcStep:
    error, rel = _error(value, exact)
    note = _note(node, operands, exact, value) if kind == "operation" else \
        _literal_note(exact, value)
    return CalcStep(expression=node.text, kind=kind, exact=_float(exact), exact_text=text,
                    value=value, error=error, rel_error=rel, note=note)


def _literal_note(exact: Number, value: float) -> str:
    if isinstance(exact, float):
        return "invalid" if math.isnan(value) else ""
    if math.isnan(value) or math.isinf(value):
        return "overflow"
    if value == 0 and exact != 0:
        return "underflow to 0"
    return "rounded"


def calculate(expression: str, formats=DEFAULT_FORMATS,
              rounding: RoundingMode | str = RoundingMode.NEAREST_EVEN,
              seed: int = 0) -> CalcResult:
    """Evaluate ``expression`` in each of ``formats`` (names or FormatSpecs; float64 is
    e11m52), every literal stored and every operation rounded once by ``rounding``
    (``seed``: stochastic rounding's generator).  UsageError for a bad expression."""
    try:
        rounding = RoundingMode(rounding)
    except ValueError as error:
        raise UsageError(str(error)) from None
    tree = parse_expression(expression)
    specs = [arithmetic_spec(f)[0] if isinstance(f, str) else f for f in formats]
    if not specs:
        raise UsageError("no formats given", "e.g. formats=['bf16', 'fp16', 'fp32']")
    for spec in specs:  # the round-once engine rounds at one precision (no HiFloat8)
        check_one_precision(spec, "fmt calc")
    rows = len(specs) * _count(tree)
    if rows > MAX_ROWS:
        raise UsageError(f"{len(specs)} formats x {_count(tree)} numbers and operations = "
                         f"{rows:,} steps to trace (at most {MAX_ROWS:,}): fewer formats or "
                         "a shorter expression")
    check_cost(tree)
    tree = computed(tree)
    exact = exact_value(tree)
    results = []
    texts: dict[int, str] = {}
    for spec in specs:
        steps: list[CalcStep] = []
        value = _evaluate(tree, Arithmetic(spec, rounding, seed=seed), steps, texts)
        error, rel = _error(value, exact)
        results.append(CalcFormat(
            format=format_label(spec), precision_bits=spec.mantissa_bits + 1, value=value,
            exact=_float(exact), error=error, rel_error=rel,
            absorbed=sum(s.note.endswith(" absorbed") for s in steps), steps=tuple(steps)))
    return CalcResult(expression=" ".join(expression.split()), rounding=rounding.value,
                      exact=_float(exact), exact_text=exact_text(exact),
                      results=tuple(results))
