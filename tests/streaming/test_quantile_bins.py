"""The exact histogram's bins near their edges (issue 9, item 4e): a relative error whose float32
value rounds up onto a bin edge is still counted in the bin below, so a reported median or p99
never lies above the true error by more than the bin's resolution, nor below it.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import stats

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity


def edge_crossers(n=2_000_000, seed=1) -> np.ndarray:
    """float32 values in [1, 256) whose E4M3 relative error, computed in float32, rounds up
    onto a bin edge although the true value lies below it."""
    from fmtcli.numerics.rounding import round_to_format

    spec = get_format("float8_e4m3fn")
    x = np.random.default_rng(seed).uniform(1, 256, n).astype(np.float32)
    q = round_to_format(x, spec, overflow="saturate")
    r32 = np.abs(q - x) / np.abs(x)
    true = np.abs(q.astype(np.float64) - x) / x.astype(np.float64)
    edge = (np.right_shift(r32.view(np.uint32), 16) << np.uint32(16)).view(np.float32)
    return x[(true < edge) & (r32 > 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantiles_never_breach_their_bin(dtype):
    crossers = edge_crossers()
    assert crossers.size >= 5
    for value in crossers[:5]:
        # the value many times, and 448 once: pow2-floor per tensor gives the scale 1
        x = np.full(101, value, dtype)
        x[0] = 448
        d = stats(x, per=Granularity.TENSOR, scale_rule=ScaleRule.POW2_FLOOR)
        from fmtcli.numerics.rounding import round_to_format

        xq = float(round_to_format(np.array([value], np.float64), get_format("float8_e4m3fn"))[0])
        true = abs(xq - float(value)) / float(value)
        for key in ("median_rel_error", "p99_rel_error"):
            reported = d[key]
            assert reported <= true < reported * (1 + d["rel_error_resolution"]), (
                value, key, reported, true)


def test_bin_keys_of_float64_data_near_edges_are_exact():
    from fractions import Fraction

    from fmtcli.streaming.metrics import _bin_keys

    rng = np.random.default_rng(4)
    edges = (rng.integers(0x3800, 0x3F80, 2000).astype(np.uint32) << np.uint32(16)).view(
        np.float32).astype(np.float64)
    x = rng.uniform(1, 2, edges.size)
    # x_q so that |x_q - x| / x is the edge, or the float64 just around it
    x_q = x * (1 + edges) * (1 + rng.integers(-3, 4, edges.size) * 2.0 ** -53)
    rel = np.abs(x_q - x) / np.abs(x)
    keys = _bin_keys(rel, x, x_q)
    for xv, qv, key in zip(x.tolist(), x_q.tolist(), keys.tolist()):
        true = abs(Fraction(qv) - Fraction(xv)) / Fraction(xv)
        low = Fraction(float(np.uint32(key << 16).view(np.float32)))
        high = Fraction(float(np.uint32((key + 1) << 16).view(np.float32)))
        assert low <= true < high
