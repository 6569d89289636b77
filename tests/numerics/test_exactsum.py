"""``fmtcli.numerics.exactsum``: the one home of exact sums of float64 values -- as an
integer count of 2^-1074 (``fmt sum``'s reference) and as longdouble column sums by
TwoSum (``fmt softmax``'s reference) -- checked against ``fractions.Fraction``."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from fmtcli.numerics import exactsum


def frac(x) -> Fraction:
    """A numpy float (float64 or longdouble) exactly."""
    return Fraction(*x.as_integer_ratio())


def exact(values) -> Fraction:
    return sum((frac(np.float64(v)) for v in values), Fraction(0))


@pytest.mark.parametrize("values", [
    [0.1, 0.2, 0.3],
    [1e308, 1e308, -1e308],  # a partial sum past float64's max: math.fsum overflows
    [5e-324, -5e-324, 5e-324, 2.2250738585072014e-308],  # subnormals
    [1.0, 2.0 ** -60, -1.0],
    [0.0, -0.0],
])
def test_exact_units_is_the_exact_sum(values):
    units = exactsum.exact_units(np.array(values))
    assert Fraction(units, exactsum.SCALE) == exact(values)


@pytest.mark.slow
def test_exact_units_of_many_values_across_passes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=300_000) * 2.0 ** rng.integers(-40, 40, 300_000)  # two passes
    assert Fraction(exactsum.exact_units(x), exactsum.SCALE) == exact(x)


def test_to_float_and_difference():
    big = exactsum.exact_units(np.array([1e308, 1e308]))
    assert exactsum.to_float(big) == math.inf and exactsum.to_float(-big) == -math.inf
    units = exactsum.exact_units(np.array([0.1, 0.2]))
    assert exactsum.to_float(units) == float(exact([0.1, 0.2]))
    error, rel = exactsum.difference(0.1 + 0.2, units)
    assert Fraction(error) == Fraction(0.1 + 0.2) - exact([0.1, 0.2])
    assert rel == abs(error) / float(exact([0.1, 0.2]))
    assert exactsum.units_text(big) == "≈ 2.0000000000000000e+308"


def test_column_sums_are_exact_to_longdouble():
    """Each column's sum of longdouble products is within longdouble's rounding of the
    exact sum of those products, at any magnitude."""
    rng = np.random.default_rng(1)
    columns = rng.normal(size=(1000, 3)) * np.array([1.0, 1e300, 1e-300])
    weights = rng.random(1000)
    sums, exponents = exactsum.column_sums(weights, columns)
    for c in range(3):
        products = np.longdouble(1) * weights.astype(np.longdouble) \
            * columns[:, c].astype(np.longdouble)
        true = sum((frac(p) for p in products), Fraction(0))
        size = sum((abs(frac(p)) for p in products), Fraction(0))
        got = frac(sums[c]) * Fraction(2) ** int(exponents[c])
        assert abs(got - true) <= size * Fraction(2) ** -60


def test_column_sums_past_float64s_range_are_scaled_not_inf():
    columns = np.full((4, 1), 1e308)
    sums, exponents = exactsum.column_sums(np.ones(4), columns)
    assert exponents[0] > 0 and np.isfinite(sums[0])
    assert frac(sums[0]) * Fraction(2) ** int(exponents[0]) == 4 * Fraction(1e308)


def test_two_sum_tree_recovers_every_rounding_error():
    x = np.array([[1.0], [2.0 ** -70], [-1.0], [3.0 * 2.0 ** -80], [5.0]])
    high, low = exactsum.two_sum_tree(x)
    assert frac(high[0]) + frac(low[0]) == exact(x[:, 0])
