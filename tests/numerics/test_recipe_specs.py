"""The MX and NVFP4 recipes against their specifications re-implemented here with ml_dtypes'
casts (OCP MX v1.0; NVFP4's two-level scales, unclamped as Transformer Engine has them), and
E8M0's ties, which go up as ml_dtypes rounds them (issue 9, item 5).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import source, stats

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize


def test_e8m0_nearest_even_ties_go_up_as_ml_dtypes():
    import ml_dtypes

    from fmtcli.numerics.rounding import round_to_format

    ties = np.ldexp(1.5, np.arange(-120, 120)).astype(np.float32)
    ours = round_to_format(ties, get_format("float8_e8m0fnu"))
    np.testing.assert_array_equal(ours, np.ldexp(1.0, np.arange(-119, 121)).astype(np.float32))
    np.testing.assert_array_equal(ours, ties.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    assert round_to_format(np.array([1.5, 3.0]), get_format("e7m0")).tolist() == [2.0, 4.0]


def run_npy(x, tmp_path, **kwargs) -> np.ndarray:
    out = str(tmp_path / "x.npy")
    quantize([source(x)], [build_scheme(**kwargs)], workers=1, out=out)
    return np.load(out)


def nvfp4_spec_reference(x: np.ndarray, clamp_scale: bool) -> np.ndarray:
    """NVFP4 from its definition with ml_dtypes casts: tensor scale g = 6 * 448 / amax,
    block decode scale d = e4m3(amax_b / 6 * g) (torchao: clamped up to 2**-6), elements
    e2m1(x * g / d) (saturating), back as e2m1 * d / g.  float32 throughout."""
    import ml_dtypes

    f32 = np.float32
    g = f32(f32(6 * 448) / np.abs(x).max())
    blocks = x.reshape(-1, 16)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = (amax / f32(6) * g).astype(ml_dtypes.float8_e4m3fn).astype(f32)
    if clamp_scale:
        d = np.maximum(d, f32(2.0 ** -6))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = g / d
        q = np.clip(blocks * scale, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(f32)
        out = np.where(d == 0, f32(0), q / scale)
    return out.reshape(x.shape)


def test_nvfp4_block_scales_may_be_subnormal_or_zero(tmp_path):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(16 * 64).astype(np.float32)
    x[:16] *= 1e5  # one loud block: the others get decode scales below 2**-6 (subnormal)
    x[-16:] *= 1e-6  # and one whose decode scale rounds to 0: it decodes to 0
    ours = run_npy(x, tmp_path, recipe="nvfp4")
    te = nvfp4_spec_reference(x, clamp_scale=False)
    np.testing.assert_array_equal(ours, te)
    assert np.all(ours[-16:] == 0)
    clamped = nvfp4_spec_reference(x, clamp_scale=True)
    assert not np.array_equal(ours, clamped)  # torchao's clamp gives other values


@pytest.mark.parametrize("recipe,fmt,emax", [("mxfp8", "float8_e4m3fn", 8),
                                             ("mxfp4", "float4_e2m1fn", 2),
                                             ("mxfp6", "float6_e3m2fn", 4)])
def test_mx_matches_the_ocp_spec_reimplemented(recipe, fmt, emax, tmp_path):
    """OCP MX v1.0: X = 2**(floor(log2 amax) - emax_elem) per 32 values, elements
    cast(x / X) saturating (ml_dtypes casts, clipped first)."""
    import ml_dtypes

    rng = np.random.default_rng(9)
    x = (rng.standard_normal(32 * 50) * np.repeat(2.0 ** rng.integers(-20, 20, 50), 32)
         ).astype(np.float32)
    kwargs = {"recipe": recipe} if fmt != "float6_e3m2fn" else {
        "recipe": "mxfp6", "format": get_format(fmt)}
    ours = run_npy(x, tmp_path, **kwargs)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True).astype(np.float64)
    X = np.ldexp(1.0, (np.floor(np.log2(amax)) - emax).astype(int))
    fmax = float(ml_dtypes.finfo(getattr(ml_dtypes, fmt)).max)
    q = np.clip(blocks / X, -fmax, fmax).astype(getattr(ml_dtypes, fmt)).astype(np.float64)
    np.testing.assert_array_equal(ours, (q * X).astype(np.float32).reshape(x.shape))


def test_nvfp4_on_subnormal_data_warns_nothing():
    import warnings

    x = np.full(33, 1e-42, np.float32)  # every block decodes to 0: scales inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = stats(x, recipe="nvfp4")
    assert d["flushed"] == 33 and d["nan_produced"] == 0
