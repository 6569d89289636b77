"""What `saturated` and `above_max` count, at the edge of every format's range.

Two counters (issue 22, item 9): ``above_max`` counts the values whose scaled magnitude
|x * scale| exceeds the format's max (what a clip-then-cast recipe clamps, torchao's
``to_fp8_saturated``); ``saturated`` the values whose rounding lies past max and that came
out as +-max (the clip changed them: in E4M3 nearest-even, |x * scale| > 464).  Each is
checked here against an independent computation in exact rational arithmetic on the
format's top binade (nothing from fmtcli's rounding), for every rounding mode and both
overflow policies, on the numpy path, the compiled kernel and torch's cast, per value
(fixed scale 1) and per block (MX power-of-two scales, one edge value a block).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cli_helpers import json_of

from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize

# name -> (max, exponent of max's binade, mantissa bits, has inf, has NaN)
FORMATS = {
    "float8_e4m3fn": (448.0, 8, 3, False, True),
    "float8_e4m3fnuz": (240.0, 7, 3, False, True),
    "float8_e5m2": (57344.0, 15, 2, True, True),
    "float6_e2m3fn": (7.5, 2, 3, False, False),
    "float6_e3m2fn": (28.0, 4, 2, False, False),
    "float4_e2m1fn": (6.0, 2, 1, False, False),
}
MODES = ["nearest-even", "nearest-away", "toward-zero", "up", "down"]


def edge_values(name: str) -> np.ndarray:
    """Scaled values at the top edge: max, the float32 just above it, 448.5-like points a
    quarter-ulp above, just below / at / just above the midpoint to the next grid point,
    and three quarters of the way there (all inside max's binade), with their negatives."""
    fmax, e, m, _, _ = FORMATS[name]
    ulp = 2.0 ** (e - m)
    mid = fmax + ulp / 2
    f32 = np.float32
    points = [f32(fmax), np.nextafter(f32(fmax), f32(np.inf)), f32(fmax + ulp / 64),
              f32(fmax + ulp / 4), np.nextafter(f32(mid), f32(0)), f32(mid),
              np.nextafter(f32(mid), f32(np.inf)), f32(fmax + 3 * ulp / 4)]
    if name == "float8_e4m3fn":  # the issue's own: 448, 448.5, 463.99, 464, 465
        points += [f32(448.5), f32(463.99), f32(464), f32(465)]
    top = np.array(points, np.float32)
    assert np.all(top < 2.0 ** (e + 1)) and np.all(top >= fmax)
    return np.concatenate([top, -top])


def rounds_past_max(value: float, name: str, mode: str) -> bool:
    """Whether ``value`` (in max's binade) rounds past max under ``mode``: exact rationals
    on the grid of spacing 2**(e - m), no float arithmetic."""
    fmax, e, m, _, _ = FORMATS[name]
    q = Fraction(value) / Fraction(2) ** (e - m)
    if mode == "nearest-even":
        n = round(q)  # Fraction rounds half to even
    elif mode == "nearest-away":
        n = math.floor(abs(q) + Fraction(1, 2)) * (1 if q > 0 else -1)
    elif mode == "toward-zero":
        n = math.trunc(q)
    elif mode == "up":
        n = math.ceil(q)
    else:
        n = math.floor(q)
    return abs(n * Fraction(2) ** (e - m)) > Fraction(fmax)


def expected(values: np.ndarray, name: str, mode: str, overflow: str) -> dict:
    """above_max, saturated and overflowed of ``values`` as the definitions say."""
    fmax, _, _, has_inf, has_nan = FORMATS[name]
    above = int(np.count_nonzero(np.abs(values) > fmax))
    saturated = overflowed = 0
    for v in values.tolist():
        if not rounds_past_max(v, name, mode):
            continue
        # IEEE 754 overflow: toward zero, and toward the other infinity, stop at max
        stops = (mode == "toward-zero" or (mode == "up" and v < 0)
                 or (mode == "down" and v > 0))
        if overflow == "saturate" or stops or not (has_inf or has_nan):
            saturated += 1
        else:
            overflowed += 1
    return {"above_max": above, "saturated": saturated, "overflowed": overflowed}


def run(values: np.ndarray, scheme, backend: str = "numpy"):
    source = TensorSource("edge", None, values.shape, str(values.dtype), lambda: values)
    return quantize([source], [scheme], workers=1, backend=backend).tensors[0].schemes[0]


def blocks_of(values: np.ndarray, name: str) -> np.ndarray:
    """Each value in a block of 4 of its own, divided by 2**e so that the block's MX
    (mx-floor) scale is 2**e and the scaled value is the value again; the other three
    are far inside the range."""
    _, e, _, _, _ = FORMATS[name]
    block = np.empty((values.size, 4), np.float32)
    block[:, 0] = values
    block[:, 1:] = values[:, None] * np.float32(0.25)
    return (block * np.float32(2.0 ** -e)).reshape(-1)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["numpy", "native"])
@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(FORMATS))
def test_counts_at_the_edge_per_value(name, mode, overflow, kernel, monkeypatch):
    """One scale (fixed at 1): every edge value counted as the definitions say."""
    if kernel == "numpy":
        monkeypatch.setenv("FMTCLI_KERNEL", "numpy")
    values = edge_values(name)
    scheme = build_scheme(format=get_format(name), per=Granularity.TENSOR, scale_rule=ScaleRule.FIXED,
                          fixed_scale=1.0, rounding=mode, overflow=overflow)
    stats = run(values, scheme)
    want = expected(values, name, mode, overflow)
    assert {k: getattr(stats, k) for k in want} == want
    assert stats.above_max >= stats.saturated + stats.overflowed


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["numpy", "native"])
@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(FORMATS))
def test_counts_at_the_edge_per_block(name, mode, overflow, kernel, monkeypatch):
    """Blocks with their own scales (the compiled kernel's path for nearest-even): the
    same counts, and the blocks that saturate are the blocks whose edge value does."""
    if kernel == "numpy":
        monkeypatch.setenv("FMTCLI_KERNEL", "numpy")
    values = edge_values(name)
    scheme = build_scheme(format=get_format(name), block=4, scale_rule=ScaleRule.MX_FLOOR,
                          rounding=mode, overflow=overflow)
    stats = run(blocks_of(values, name), scheme)
    want = expected(values, name, mode, overflow)
    assert {k: getattr(stats, k) for k in want} == want
    assert stats.blocks.count == values.size
    assert stats.blocks.saturating == want["saturated"]


def test_e4m3_figures_the_issue_names():
    """448 is max; 448.5, 463.99 and 464 lie above it and round to 448 (464 is the tie,
    and 448's mantissa is even); 465 rounds to 480, past max, and is clipped."""
    values = np.float32([448, 448.5, 463.99, 464, 465])
    scheme = build_scheme(format=get_format("float8_e4m3fn"), per=Granularity.TENSOR,
                          scale_rule=ScaleRule.FIXED, fixed_scale=1.0)
    stats = run(values, scheme)
    assert (stats.above_max, stats.saturated, stats.overflowed) == (4, 1, 0)
    up = build_scheme(format=get_format("float8_e4m3fn"), per=Granularity.TENSOR,
                      scale_rule=ScaleRule.FIXED, fixed_scale=1.0, rounding="up")
    stats = run(np.float32([448.5, -448.5]), up)  # 448.5 rounds up to 480: clipped
    assert (stats.above_max, stats.saturated) == (2, 1)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"])
def test_torch_cast_counts_alike(name):
    """torch's cast (nearest-even, clamped first under saturate) counts as the engine."""
    pytest.importorskip("torch")
    values = edge_values(name)
    for overflow in ("saturate", "ieee"):
        scheme = build_scheme(format=get_format(name), per=Granularity.TENSOR,
                              scale_rule=ScaleRule.FIXED, fixed_scale=1.0, overflow=overflow)
        stats = run(values, scheme, backend="torch")
        want = expected(values, name, "nearest-even", overflow)
        if overflow == "ieee":  # torch 2.12+ saturates some casts itself: finite is max
            assert stats.saturated + stats.overflowed == want["saturated"] + want["overflowed"]
            assert stats.above_max == want["above_max"]
        else:
            assert {k: getattr(stats, k) for k in want} == want


def test_cli_json_and_table_show_both_counters(tmp_path):
    """--json carries above_max and its fraction beside saturated; the table a row."""
    path = tmp_path / "edge.npy"
    np.save(path, np.float32([1.0, 448.5, 465, 1000]))
    doc = json_of("quantize", path, "--per", "tensor", "--scale-rule", "fixed",
                  "--fixed-scale", "1")
    (stats,) = doc["tensors"][0]["schemes"]
    assert (stats["above_max"], stats["saturated"]) == (3, 2)
    assert stats["above_max_fraction"] == 0.75
