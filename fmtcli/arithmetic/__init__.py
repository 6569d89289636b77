"""Arithmetic in a format, the article's second lesson: every operation computed exactly
and rounded once, in a chosen format and rounding mode.

- ``ops`` -- the round-once engine: a rational rounded to any format by any mode
  (``round_rational``), and ``Arithmetic``: +, -, *, /, fma and sqrt IEEE 754 style;
- ``pairs`` -- the same rounding in float arithmetic, of a float64 (``round_float``) or of
  an exact sum held as a TwoSum pair, scalar and numpy: the additions of ``fmt sum``
  (its exact reference: ``numerics.exactsum``, an integer count of 2^-1074);
- ``calc`` -- ``fmt calc``: a small expression evaluated step by step in each format, each
  step's exact value, rounded value and error, and where a term was absorbed;
  ``expression`` its grammar, exact value and the estimate of that value's cost;
  ``ratio`` exact rationals without gcds (n / d * 2^e) and their bounded text;
- ``summation`` -- ``fmt sum``: values added with the running sum held in each accumulator
  format, in a chosen order, against the exact sum; where the sum stalls; and the weight
  update of mixed-precision training with and without an FP32 master copy; ``sum_inputs``
  its values (a file, random draws, a constant) and orders; ``sum_orders`` the additions
  in each order;
- ``dot`` -- ``fmt dot``: an FP8 GEMM with a limited-precision accumulator and FP32
  promotion (DeepSeek-V3 §3.3.2) against float64; ``dot_cuda`` the real one on a GPU
  (``torch._scaled_mm``).

The names below load on first use (PEP 562), so importing one module of this package does
not import the others.
"""

from __future__ import annotations

from fmtcli.base.lazy import lazy_exports

_EXPORTS = {
    "Arithmetic": "ops", "round_rational": "ops", "round_float": "pairs",
    "float_rounder": "pairs", "arithmetic_spec": "ops", "arithmetic_specs": "ops",
    "CalcResult": "calc", "CalcFormat": "calc", "CalcStep": "calc", "calculate": "calc",
    "parse_expression": "calc",
    "SumResult": "summation", "AccumulatorResult": "summation", "sum_values": "summation",
    "weight_update": "summation", "sum_inputs": "sum_inputs", "WeightUpdate": "summation",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
