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
exact; square roots to 256 bits) is the reference of each format's final error.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

from ..choices import RoundingMode
from ..errors import BadValueError, UsageError, shown
from ..formats import FormatSpec
from ..literals import parse_exact
from .ops import Arithmetic, Number, arithmetic_spec, format_label, sqrt_reference

#: The formats of ``fmt calc`` with no --format: the article's BF16/FP16/FP32, and float64.
DEFAULT_FORMATS = ("bfloat16", "float16", "float32", "float64")
MAX_LENGTH = 2000  # characters of an expression
MAX_OPERATIONS = 500  # operations and literals (each is a step of the trace)
MAX_DEPTH = 200  # nesting of the expression tree
MAX_POWER = 100_000  # |exponent| of a power
MAX_BITS = 400_000  # bits of an exact power's numerator or denominator
FUNCTIONS = {"fma": 3, "sqrt": 1}
SPECIAL_NAMES = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_HEX_FLOAT = re.compile(r"0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?[pP][+-]?[0-9]+")
HINT = ("numbers, 2^-9, + - * /, parentheses, fma(a, b, c), sqrt(x); e.g. "
        "'1 + 2^-9'")


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


# -- parsing ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Node:
    """The checked expression tree: ``op`` is "num" (``value`` exact), "neg", "+", "-",
    "*", "/", "fma" or "sqrt"; ``text`` the source of the node as the user wrote it."""

    op: str
    text: str
    args: tuple[_Node, ...] = ()
    value: Fraction | float | None = None


def _ascii_digits(text: str) -> str:
    """Other scripts' decimal digits as ASCII (as Python's float() reads them)."""
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c
                   for c in text)


def parse_expression(text: str) -> _Node:
    """Check ``text`` against the grammar and return its tree; UsageError (exit 2) for
    anything else: syntax errors, names other than inf/nan, calls other than fma/sqrt,
    attributes, subscripts, other operators, powers that are not number^integer, and
    expressions beyond the size limits."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty expression", HINT)
    if len(text) > MAX_LENGTH:
        raise UsageError(f"the expression has {len(text):,} characters: at most "
                         f"{MAX_LENGTH:,}")
    source = _ascii_digits(text.strip())
    hexes: dict[str, str] = {}

    def hex_name(match: re.Match) -> str:  # 0x1p-24 is not Python: a placeholder name
        name = f"__hex{len(hexes)}__"
        hexes[name] = match[0]
        return name

    source = _HEX_FLOAT.sub(hex_name, source)
    caret = "^" in source
    python = source.replace("^", "**")
    try:
        tree = ast.parse(python, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        detail = getattr(error, "msg", None) or type(error).__name__
        raise UsageError(f"cannot read {shown(text)} as an expression ({detail})",
                         HINT) from None
    counter = [0]

    def segment(node: ast.AST) -> str:
        piece = ast.get_source_segment(python, node) or ""
        for name, original in hexes.items():
            piece = piece.replace(name, original)
        return piece.replace("**", "^") if caret else piece

    def build(node: ast.AST, depth: int) -> _Node:
        if depth > MAX_DEPTH:
            raise UsageError(f"the expression nests more than {MAX_DEPTH} levels deep")
        counter[0] += 1
        if counter[0] > MAX_OPERATIONS:
            raise UsageError(f"the expression has more than {MAX_OPERATIONS} operations "
                             "and numbers")
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _Node("num", segment(node), value=_literal(segment(node)))
        if isinstance(node, ast.Name):
            if node.id in hexes:
                return _Node("num", hexes[node.id], value=_literal(hexes[node.id]))
            if node.id.lower() in SPECIAL_NAMES:
                return _Node("num", node.id, value=SPECIAL_NAMES[node.id.lower()])
            raise UsageError(f"unknown name {shown(node.id)} in the expression", HINT)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = build(node.operand, depth + 1)
            if isinstance(node.op, ast.UAdd):
                return inner
            if inner.op == "num":  # -3 is a number, not an operation
                value = inner.value
                negated = -0.0 if isinstance(value, Fraction) and value == 0 else -value
                return _Node("num", segment(node), value=negated)
            return _Node("neg", segment(node), (inner,))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return _Node("num", segment(node), value=_power(node, segment, hexes))
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return _Node(OPERATORS[type(node.op)], segment(node),
                         (build(node.left, depth + 1), build(node.right, depth + 1)))
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in FUNCTIONS:
                what = shown(name) if name else "this"
                raise UsageError(f"cannot call {what}: the functions are fma(a, b, c) and "
                                 "sqrt(x)")
            if node.keywords or len(node.args) != FUNCTIONS[name] or \
                    any(isinstance(a, ast.Starred) for a in node.args):
                raise UsageError(f"{name} takes {FUNCTIONS[name]} argument"
                                 f"{'s' if FUNCTIONS[name] > 1 else ''}: "
                                 f"{'fma(a, b, c)' if name == 'fma' else 'sqrt(x)'}")
            return _Node(name, segment(node), tuple(build(a, depth + 1) for a in node.args))
        raise UsageError(f"{shown(segment(node) or text)} is not part of the grammar", HINT)

    try:
        return build(tree.body, 0)
    except RecursionError:
        raise UsageError(f"the expression nests more than {MAX_DEPTH} levels deep") from None


def _literal(text: str) -> Fraction | float:
    """A number's exact value (the syntax of ``fmt underflow``; a BadValueError is a usage
    error, exit 2)."""
    try:
        return parse_exact(text)
    except BadValueError as error:
        raise UsageError(f"in the expression: {error}") from None


def _power(node: ast.BinOp, segment, hexes) -> Fraction | float:
    """number ^ integer, exactly (bounded: a power of thousands of digits is refused)."""
    base, exponent = node.left, node.right
    sign = 1
    while isinstance(exponent, ast.UnaryOp) and isinstance(exponent.op, (ast.USub, ast.UAdd)):
        sign = -sign if isinstance(exponent.op, ast.USub) else sign
        exponent = exponent.operand
    if not (isinstance(exponent, ast.Constant) and type(exponent.value) is int):
        raise UsageError(f"{shown(segment(node))}: a power is a number to an integer "
                         "exponent (e.g. 2^-9)", HINT)
    is_number = (isinstance(base, ast.Constant) and type(base.value) in (int, float)) or \
        (isinstance(base, ast.Name) and base.id in hexes)
    if not is_number:
        raise UsageError(f"{shown(segment(node))}: the base of a power is a number (e.g. "
                         "2^-9, 10^3); write other powers as products", HINT)
    value = _literal(hexes.get(getattr(base, "id", ""), None) or segment(base))
    power = sign * exponent.value
    if abs(power) > MAX_POWER:
        raise UsageError(f"{shown(segment(node))}: the exponent is beyond +-{MAX_POWER:,}")
    if isinstance(value, float):  # inf, nan
        return value ** power if value == value else value
    if value == 0:
        if power < 0:
            raise UsageError(f"{shown(segment(node))} divides by zero")
        return Fraction(1) if power == 0 else Fraction(0)
    bits = max(value.numerator.bit_length(), value.denominator.bit_length()) * abs(power)
    if bits > MAX_BITS:
        raise UsageError(f"{shown(segment(node))} is too large to compute exactly "
                         f"(~{bits:,} bits; at most {MAX_BITS:,})")
    return value ** power


# -- evaluation ------------------------------------------------------------------------

def _exact_value(node: _Node) -> Number:
    """The expression with no rounding at all (square roots to 256 bits); floats for
    inf/NaN/signed zeros as IEEE 754 would give them."""
    if node.op == "num":
        return node.value
    args = [_exact_value(a) for a in node.args]
    if any(isinstance(a, float) and not math.isfinite(a) for a in args) or \
            (node.op == "/" and args[1] == 0):
        return _float_op(node.op, [float(a) for a in args])
    if node.op == "neg":
        return -args[0]
    if node.op == "+":
        return Fraction(args[0]) + Fraction(args[1])
    if node.op == "-":
        return Fraction(args[0]) - Fraction(args[1])
    if node.op == "*":
        return Fraction(args[0]) * Fraction(args[1])
    if node.op == "/":
        return Fraction(args[0]) / Fraction(args[1])
    if node.op == "fma":
        return Fraction(args[0]) * Fraction(args[1]) + Fraction(args[2])
    if args[0] < 0:
        return math.nan
    return sqrt_reference(Fraction(args[0]))


def _float_op(op: str, args: list[float]) -> float:
    """IEEE 754's answer where an operand is inf or NaN, or a division by zero."""
    a = args[0]
    if op == "neg":
        return -a
    if op == "sqrt":
        return math.nan if a < 0 or math.isnan(a) else a
    b = args[1]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else \
                math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    return a * b + args[2]  # fma: Python gives inf * 0 = nan, inf - inf = nan


def _float(q: Number) -> float:
    """The float64 nearest a number (inf beyond float64's range)."""
    if isinstance(q, float):
        return q
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def exact_text(q: Number) -> str:
    """A number written exactly where that is short: a terminating decimal (denominator
    2^a 5^b) of at most 20 significant digits (1e-8, 0.1, 1.001953125), else a fraction of
    small terms (1/3), else approximately (≈ and 17 digits; ≈ 10^k beyond float64)."""
    if isinstance(q, float):
        if q == 0:
            return "-0" if math.copysign(1, q) < 0 else "0"
        return "nan" if math.isnan(q) else ("inf" if q > 0 else "-inf")
    if q == 0:
        return "0"
    n, d = q.numerator, q.denominator
    twos = (d & -d).bit_length() - 1
    rest = d >> twos
    fives = 0
    while rest % 5 == 0 and fives < 4000:
        rest //= 5
        fives += 1
    if rest == 1 and abs(n).bit_length() <= 4000:
        places = max(twos, fives)  # n / d = n * 10^places / d / 10^places, an integer
        units = abs(n) * 10 ** places // d
        digits = str(units).rstrip("0")
        if len(digits) <= 20:
            exponent = len(str(units)) - 1 - places  # of the leading digit
            return ("-" if n < 0 else "") + _decimal(digits, exponent)
    if d < 10**6 and abs(n) < 10**6:
        return f"{n}/{d}"
    value = _float(q)
    if math.isinf(value) or value == 0:
        exponent = math.log10(abs(n)) - math.log10(d)
        return f"{'-' if q < 0 else ''}≈ 10^{exponent:.2f}"
    return f"≈ {value:.17g}"


def _decimal(digits: str, exponent: int) -> str:
    """Significant ``digits`` (d.ddd) times 10**exponent: positional from 1e-7 to 1e21 (as
    Python's repr), scientific outside."""
    if -7 < exponent < 21:
        if exponent < 0:
            return "0." + "0" * (-exponent - 1) + digits
        whole = digits[:exponent + 1].ljust(exponent + 1, "0")
        frac = digits[exponent + 1:]
        return whole + ("." + frac if frac else "")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{exponent:+d}".replace("e+", "e")


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
    difference = Fraction(value) - Fraction(exact)
    error = _float(difference)
    if difference == 0:
        return 0.0, 0.0
    if exact == 0:
        return error, math.inf
    return error, _float(abs(difference) / abs(Fraction(exact)))


def _note(node: _Node, operands: list[float], exact: Number, value: float) -> str:
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


def _evaluate(node: _Node, arithmetic: Arithmetic, steps: list[CalcStep]) -> float:
    """The node's value in the format, steps appended in the order they are computed."""
    spec = arithmetic.spec
    if node.op == "num":
        value = arithmetic.store(node.value)
        exact = node.value
        if not (isinstance(exact, float) and (math.isnan(exact) and math.isnan(value)
                                              or exact == value)) and \
                not (isinstance(exact, Fraction) and math.isfinite(value)
                     and exact == Fraction(value)):
            steps.append(_step(node, "literal", exact, value, spec, [], arithmetic))
        return value
    operands = [_evaluate(a, arithmetic, steps) for a in node.args]
    if node.op == "neg":
        return -operands[0]  # exact: a sign flip
    method = {"+": arithmetic.add, "-": arithmetic.sub, "*": arithmetic.mul,
              "/": arithmetic.div, "fma": arithmetic.fma, "sqrt": arithmetic.sqrt}[node.op]
    exact, value = method(*operands)
    steps.append(_step(node, "operation", exact, value, spec, operands, arithmetic))
    return value


def _step(node: _Node, kind: str, exact: Number, value: float, spec: FormatSpec,
          operands: list[float], arithmetic: Arithmetic) -> CalcStep:
    error, rel = _error(value, exact)
    note = _note(node, operands, exact, value) if kind == "operation" else \
        _literal_note(exact, value)
    return CalcStep(expression=node.text, kind=kind, exact=_float(exact),
                    exact_text=exact_text(exact), value=value, error=error, rel_error=rel,
                    note=note)


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
    exact = _exact_value(tree)
    results = []
    for spec in specs:
        steps: list[CalcStep] = []
        value = _evaluate(tree, Arithmetic(spec, rounding, seed=seed), steps)
        error, rel = _error(value, exact)
        results.append(CalcFormat(
            format=format_label(spec), precision_bits=spec.mantissa_bits + 1, value=value,
            exact=_float(exact), error=error, rel_error=rel,
            absorbed=sum(s.note.endswith(" absorbed") for s in steps), steps=tuple(steps)))
    return CalcResult(expression=" ".join(expression.split()), rounding=rounding.value,
                      exact=_float(exact), exact_text=exact_text(exact),
                      results=tuple(results))
