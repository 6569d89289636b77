"""The expression of ``fmt calc``: its grammar (checked with Python's ``ast``, never
evaluated by Python), the tree (``Node``), the cost of its exact value estimated before
it is computed (``check_cost``), and the exact value itself (``exact_value``: integers
only, ``ratio.Ratio``; square roots to ``ops.REFERENCE_BITS`` bits).

Powers are kept as parsed (``Power``) until the estimate has passed: 0.7^99999 is two
products of 300,000 bits, and 200 of them fit in the 2,000 characters of an expression.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from dataclasses import dataclass, replace

from fmtcli.arithmetic.ops import REFERENCE_BITS
from fmtcli.arithmetic.ratio import Ratio, sqrt_ratio, work
from fmtcli.base.errors import BadValueError, UsageError, shown
from fmtcli.numerics.literals import parse_exact

MAX_LENGTH = 2000  # characters of an expression
MAX_OPERATIONS = 500  # operations and literals (each is a step of the trace)
MAX_DEPTH = 200  # nesting of the expression tree
MAX_POWER = 100_000  # |exponent| of a power
MAX_BITS = 400_000  # bits of an exact power's numerator or denominator (odd parts)
MAX_EXACT_BITS = 8_000_000  # bits of any exact value of the expression (an estimate)
MAX_WORK = 2e10  # bit operations of the exact value's products (an estimate: ~2 s)
FUNCTIONS = {"fma": 3, "sqrt": 1}
SPECIAL_NAMES = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_HEX_FLOAT = re.compile(r"0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?[pP][+-]?[0-9]+")
HINT = ("numbers, 2^-9, + - * /, parentheses, fma(a, b, c), sqrt(x); e.g. "
        "'1 + 2^-9'")


# -- parsing ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """The checked expression tree: ``op`` is "num" (``value`` exact), "neg", "+", "-",
    "*", "/", "fma" or "sqrt"; ``text`` the source of the node as the user wrote it."""

    op: str
    text: str
    args: tuple[Node, ...] = ()
    value: Ratio | Power | float | None = None


def _ascii_digits(text: str) -> str:
    """Other scripts' decimal digits as ASCII (as Python's float() reads them)."""
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c
                   for c in text)


def parse_expression(text: str) -> Node:
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

    def build(node: ast.AST, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise UsageError(f"the expression nests more than {MAX_DEPTH} levels deep")
        counter[0] += 1
        if counter[0] > MAX_OPERATIONS:
            raise UsageError(f"the expression has more than {MAX_OPERATIONS} operations "
                             "and numbers")
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Node("num", segment(node), value=_literal(segment(node)))
        if isinstance(node, ast.Name):
            if node.id in hexes:
                return Node("num", hexes[node.id], value=_literal(hexes[node.id]))
            if node.id.lower() in SPECIAL_NAMES:
                return Node("num", node.id, value=SPECIAL_NAMES[node.id.lower()])
            raise UsageError(f"unknown name {shown(node.id)} in the expression", HINT)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = build(node.operand, depth + 1)
            if isinstance(node.op, ast.UAdd):
                return inner
            if inner.op == "num":  # -3 is a number, not an operation
                value = inner.value
                negated = -0.0 if isinstance(value, Ratio) and value.n == 0 else -value
                return Node("num", segment(node), value=negated)
            return Node("neg", segment(node), (inner,))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return Node("num", segment(node), value=_power(node, segment, hexes))
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return Node(OPERATORS[type(node.op)], segment(node),
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
            return Node(name, segment(node), tuple(build(a, depth + 1) for a in node.args))
        raise UsageError(f"{shown(segment(node) or text)} is not part of the grammar", HINT)

    try:
        return build(tree.body, 0)
    except RecursionError:
        raise UsageError(f"the expression nests more than {MAX_DEPTH} levels deep") from None


def _literal(text: str) -> Ratio | float:
    """A number's exact value (the syntax of ``fmt underflow``; a BadValueError is a usage
    error, exit 2): a Ratio, or a float for inf and NaN."""
    try:
        value = parse_exact(text)
    except BadValueError as error:
        raise UsageError(f"in the expression: {error}") from None
    return value if isinstance(value, float) else Ratio.of(value)


def _power(node: ast.BinOp, segment, hexes) -> Ratio | float:
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
    if value.n == 0:
        if power < 0:
            raise UsageError(f"{shown(segment(node))} divides by zero")
        return Ratio(1) if power == 0 else Ratio(0)
    bits = max(value.n.bit_length(), value.d.bit_length()) * abs(power)
    if bits > MAX_BITS:
        raise UsageError(f"{shown(segment(node))} is too large to compute exactly "
                         f"(~{bits:,} bits; at most {MAX_BITS:,})")
    return Power(value, power)


@dataclass(frozen=True)
class Power:
    """``base ^ exponent`` (negated with ``negative``) as parsed: computed only once the
    whole expression's cost is known (``check_cost``, then ``_computed``)."""

    base: Ratio
    exponent: int
    negative: bool = False

    def __neg__(self) -> Power:
        return Power(self.base, self.exponent, not self.negative)

    def sizes(self) -> tuple[int, int, int]:
        """Bits of the power's numerator and denominator (odd parts, upper bounds) and
        its power of two."""
        n, d = self.base.n.bit_length(), self.base.d.bit_length()
        p = abs(self.exponent)
        n, d = (n * p, d * p) if self.exponent >= 0 else (d * p, n * p)
        return n, d, self.base.e * self.exponent

    def value(self) -> Ratio:
        power = self.base ** self.exponent
        return -power if self.negative else power


def computed(node: Node) -> Node:
    """The tree with every Power computed."""
    if node.op == "num":
        return replace(node, value=node.value.value()) if isinstance(node.value, Power) \
            else node
    return replace(node, args=tuple(computed(a) for a in node.args))


# -- the cost of the exact value, before it is computed ---------------------------------

def check_cost(tree: Node) -> None:
    """Refuse (UsageError) an expression whose exact value would take too long: the bits
    of every exact intermediate (numerator and denominator, with the shifts that align
    sums) and the bit operations of their products (``ratio.work``), estimated from the
    literals' sizes as upper bounds, against MAX_EXACT_BITS and MAX_WORK."""
    total = [0.0]
    largest = [0]

    def size(node: Node):  # (numerator bits, denominator bits, power of two) or None
        if node.op == "num":
            v = node.value
            if isinstance(v, Power):  # its own products: about two of its size
                n, d, e = v.sizes()
                total[0] += 2 * (work(n, n) + work(d, d))
                return _grown(largest, (n, d, e))
            return None if isinstance(v, float) else (v.n.bit_length(), v.d.bit_length(), v.e)
        args = [size(a) for a in node.args]
        if any(a is None for a in args):
            return None  # inf or NaN: IEEE's float answer, no exact value to compute
        if node.op == "neg":
            return args[0]
        if node.op == "sqrt":
            n, d, e = args[0]
            root = (n + d + 1) // 2 + REFERENCE_BITS + 2
            total[0] += 4 * work(n + d + 2 * REFERENCE_BITS, n + d + 2 * REFERENCE_BITS)
            return _grown(largest, (root, d, e // 2 - REFERENCE_BITS))
        if node.op in ("*", "fma"):
            (na, da, ea), (nb, db, eb) = args[:2]
            total[0] += work(na, nb) + work(da, db)
            product = _grown(largest, (na + nb, da + db, ea + eb))
            if node.op == "*":
                return product
            args = [product, args[2]]
        if node.op == "/":
            (na, da, ea), (nb, db, eb) = args
            total[0] += work(na, db) + work(da, nb)
            return _grown(largest, (na + db, da + nb, ea - eb))
        (na, da, ea), (nb, db, eb) = args  # + - and fma's sum
        e = min(ea, eb)
        if da <= 1 and db <= 1:
            return _grown(largest, (max(na + ea - e, nb + eb - e) + 1, 1, e))
        total[0] += work(na, db) + work(nb, da) + work(da, db)
        return _grown(largest, (max(na + db + ea - e, nb + da + eb - e) + 1, da + db, e))

    size(tree)
    if largest[0] > MAX_EXACT_BITS:
        raise UsageError(f"the expression's exact value needs ~{largest[0]:,} bits (at most "
                         f"{MAX_EXACT_BITS:,}): use smaller powers or fewer of them")
    if total[0] > MAX_WORK:
        raise UsageError(f"the expression's exact value needs ~{total[0]:.1e} bit operations "
                         f"(at most {MAX_WORK:.0e}, a few seconds): use smaller powers or "
                         "fewer of them")


def _grown(largest: list[int], sized: tuple[int, int, int]) -> tuple[int, int, int]:
    largest[0] = max(largest[0], sized[0] + sized[1])
    return sized


# -- the exact value ------------------------------------------------------------------

def exact_value(node: Node) -> Ratio | float:
    """The expression with no rounding at all (square roots to 256 bits); floats for
    inf/NaN/signed zeros as IEEE 754 would give them."""
    if node.op == "num":
        return node.value
    args = [exact_value(a) for a in node.args]
    if any(isinstance(a, float) and not math.isfinite(a) for a in args) or \
            (node.op == "/" and args[1] == 0):
        return _float_op(node.op, [float(a) for a in args])
    if node.op == "neg":
        return -args[0]
    a, b, *c = [Ratio.of(x) for x in args] + ([None] if len(args) == 1 else [])
    if node.op == "+":
        return a + b
    if node.op == "-":
        return a - b
    if node.op == "*":
        return a * b
    if node.op == "/":
        return a / b
    if node.op == "fma":
        return a * b + c[0]
    if a.n < 0:
        return math.nan
    return sqrt_ratio(a, REFERENCE_BITS)


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
