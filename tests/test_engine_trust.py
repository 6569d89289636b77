"""Engine trust: the defects of issue 9 (wrong numbers reported silently), one test each."""

from __future__ import annotations

import numpy as np
import pytest

from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.rounding import RoundingMode
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize


def source(x, key=None, name="mem") -> TensorSource:
    x = np.asarray(x)
    return TensorSource(name, key, x.shape, str(x.dtype), lambda: x)


def stats(x, workers=1, **kwargs) -> dict:
    """The JSON statistics of one scheme on one in-memory tensor."""
    scheme = build_scheme(**kwargs)
    result = quantize([source(x)], [scheme], workers=workers)
    return result.tensors[0].schemes[0].to_dict()


def test_one_vocabulary_count_and_fraction():
    # a margin of -1 doubles the amax scale: 500 saturates, 1e-9 flushes, 0 is a zero input
    x = np.array([500.0, 1.0, 1e-9, 0.0], np.float32)
    d = stats(x, per=Granularity.TENSOR, scale_rule=ScaleRule.AMAX, margin=-1)
    assert d["saturated"] == 1 and d["saturated_fraction"] == 1 / 4
    assert d["flushed"] == 1 and d["flushed_fraction"] == 1 / 3
    for key in ("overflowed", "nan_produced"):
        assert d[key] == 0 and d[f"{key}_fraction"] == 0.0
    assert abs(d["mse"] - d["rmse"] ** 2) <= 1e-12 * d["mse"]


# -- item 1: every rounding mode stays in the format, whatever the chunk's peak ---------------

FORMATS_1 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float4_e2m1fn", "float6_e2m3fn",
             "float6_e3m2fn", "e4m5"]
MODES = ["nearest-even", "nearest-away", "toward-zero", "up", "down", "stochastic"]


def just_above_max_amaxes(spec, count=2, seed=0) -> list[float]:
    """float32 amaxes whose amax-rule scale puts fl32(amax * scale) one float32 ulp above
    max: max * (1 + 2**-23) (found by scanning random significands)."""
    rng = np.random.default_rng(seed)
    target = np.nextafter(np.float32(spec.max), np.float32(np.inf))
    a = rng.uniform(1, 2, 400_000).astype(np.float32)
    scale = np.float32(spec.max) / a
    found = a[a * scale == target]
    assert found.size >= count, spec.name
    return [float(v) for v in found[:count]]


def quantize_three_ways(x, tmp_path, **kwargs):
    """(statistics, .npy values, decoded .npz codes / scales, scales) of one scheme."""
    from fmtcli.numerics.rounding import decode

    scheme = build_scheme(**kwargs)
    stats_ = quantize([source(x)], [scheme], workers=1).tensors[0].schemes[0]
    npy, npz = str(tmp_path / "q.npy"), str(tmp_path / "q.npz")
    quantize([source(x)], [scheme], workers=1, out=npy)
    quantize([source(x)], [scheme], workers=1, out=npz)
    with np.load(npz) as archive:
        codes, scales = archive["mem.codes"], archive["mem.scales"]
    tile = scheme.tile_shape(1, x.size, 1)
    per_element = np.repeat(scales.reshape(-1), tile[1])[:x.size]
    grid = decode(codes, scheme.format)
    with np.errstate(all="ignore"):
        from_codes = (grid / per_element).astype(np.float32)
    return stats_, np.load(npy), grid, from_codes


@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS_1)
def test_directed_rounding_stays_in_range(fmt, mode, overflow, tmp_path):
    from fmtcli.numerics.rounding import round_unbounded

    spec = get_format(fmt)
    amaxes = just_above_max_amaxes(spec)
    x = np.zeros(512, np.float32)
    x[0], x[1], x[128] = amaxes[0], 1, 1  # the shape: a peak, and small values
    x[256], x[257] = -amaxes[1], -1  # the same below zero (down rounds -max*(1+u) past)
    x[384] = 3
    stats_, npy, grid, from_codes = quantize_three_ways(
        x, tmp_path, format=spec, block=128, rounding=mode, overflow=overflow)
    d = stats_.to_dict()
    finite = np.isfinite(grid)
    assert np.all(np.abs(grid[finite]) <= spec.max), (fmt, mode, overflow)
    np.testing.assert_array_equal(npy, from_codes)  # .npy and .npz agree, NaN included
    # the statistics describe that output
    nonfinite = int(np.count_nonzero(~np.isfinite(npy)))
    assert d["overflowed"] == nonfinite and d["nan_produced"] == np.isnan(npy).sum()
    if nonfinite == 0:
        assert d["max_abs_error"] == pytest.approx(float(np.max(np.abs(npy - x))), rel=1e-6)
    if mode != "stochastic":  # which values round past max is known: count them
        scale = np.float32(spec.max) / np.float32(np.abs(x[[0, 256]]))
        scaled = np.float32(x[[0, 256]]) * scale
        past = np.abs(round_unbounded(scaled, spec, RoundingMode(mode))) > spec.max
        assert d["saturated"] + d["overflowed"] == int(past.sum()), (fmt, mode, overflow)
        if overflow == "saturate" or not (spec.has_inf or spec.has_nan):
            assert d["overflowed"] == 0


@pytest.mark.parametrize("overflow", ["saturate", "ieee"])
@pytest.mark.parametrize("mode", MODES)
def test_mx_block_of_460_rounds_in_range(mode, overflow, tmp_path):
    """mx-floor gives a block of 460 and ones the scale 1: 460 lies above E4M3's 448."""
    x = np.ones(64, np.float32)
    x[0], x[32] = 460, -460
    stats_, npy, grid, from_codes = quantize_three_ways(
        x, tmp_path, block=32, scale_rule=ScaleRule.MX_FLOOR, rounding=mode, overflow=overflow)
    finite = np.isfinite(grid)
    assert np.all(np.abs(grid[finite]) <= 448)
    np.testing.assert_array_equal(npy, from_codes)
    d = stats_.to_dict()
    assert d["saturated"] + d["overflowed"] == (
        {"nearest-even": 0, "toward-zero": 0, "up": 1, "down": 1}.get(mode, d["saturated"]
                                                                      + d["overflowed"]))
    assert d["overflowed"] == int(np.count_nonzero(~np.isfinite(npy)))


# -- item 3: stochastic seeds give independent streams ----------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 7, 2**32, 2**63, 2**64 - 2])
def test_seed_streams_are_not_shifts_of_each_other(seed):
    import warnings

    from fmtcli.numerics.rounding import PositionalUniform

    n, reach = 4096, 1024
    index = np.arange(n + 2 * reach, dtype=np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no uint64 overflow warning for any seed
        a = PositionalUniform(seed, index).random(index.size)
        b = PositionalUniform(seed + 1, index[reach:reach + n]).random(n)
    # b equal to a shifted by any offset in -reach..reach: not one value in common
    windows = np.lib.stride_tricks.sliding_window_view(a, n)
    assert not np.any(windows == b[None, :])


def test_seed_stream_bits_look_uniform():
    from fmtcli.numerics.rounding import PositionalUniform

    n = 1 << 16
    for seed in (0, 1, 12345, 2**64 - 1):
        u = PositionalUniform(seed, np.arange(n, dtype=np.uint64)).random(n)
        assert 0 <= u.min() and u.max() < 1
        assert abs(u.mean() - 0.5) < 5 * (1 / 12 / n) ** 0.5
        counts = np.bincount((u * 16).astype(np.int64), minlength=16)
        chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
        assert chi2 < 45, (seed, chi2)  # 15 degrees of freedom: p ~ 1e-4
        # the low bits too (the top 53 bits make u: its 16th..20th bits)
        low = (u * 2**20).astype(np.int64) & 15
        chi2 = float(((np.bincount(low, minlength=16) - n / 16) ** 2 / (n / 16)).sum())
        assert chi2 < 45, (seed, chi2)


def stochastic_run(x, seed, tmp_path, **kwargs) -> np.ndarray:
    scheme = build_scheme(block=32, rounding="stochastic")
    out = str(tmp_path / f"s{seed}.npy")
    quantize([source(x)], [scheme], seed=seed, out=out, **kwargs)
    return np.load(out)


def test_neighbouring_seeds_round_independently(tmp_path):
    """Seed 1's rounding of element i was seed 0's of element i + 1."""
    x = np.full(4096, 1.0 + 2.0 ** -4, np.float32)  # halfway between 1 and 1.125 in E4M3
    x[::32] = 1.75  # each block's amax: scale 256, the ties stay ties
    up0 = stochastic_run(x, 0, tmp_path, workers=1) > 1.07
    up1 = stochastic_run(x, 1, tmp_path, workers=1) > 1.07
    pairs = (x[:-1] != 1.75) & (x[1:] != 1.75)  # element i and i + 1 both ties
    agree = np.mean(up1[:-1][pairs] == up0[1:][pairs])
    assert 0.4 < agree < 0.6  # independent: half agree (a shift would agree everywhere)
    assert 0.4 < up0[x != 1.75].mean() < 0.6


def test_stochastic_rounding_independent_of_chunks_and_workers(tmp_path):
    from cli_helpers import parallel_kwargs

    x = np.random.default_rng(3).standard_normal((64, 96)).astype(np.float32)
    runs = [stochastic_run(x, 2**64 - 1, tmp_path, chunk_elements=c, **parallel_kwargs(w))
            for c, w in ((1 << 18, 1), (96 * 4, 1), (96 * 3, 2))]
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


# -- item 4: backends saturate when the scheme says so; refusals come before torch ------------

def heavy(n=4096, seed=5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(
        -6, 6, n).astype(np.float32)
    x[::97] = 500  # mx-floor leaves 500 past E4M3's 448 in its block
    return x


@pytest.mark.parametrize("backend", ["ml_dtypes", "torch"])
def test_backend_saturates_like_the_engine(backend, tmp_path):
    if backend == "torch":
        pytest.importorskip("torch")
    x = heavy()
    runs = {}
    for name in ("numpy", backend):
        scheme = build_scheme(recipe="mxfp8", overflow="saturate")
        out = str(tmp_path / f"{name}.npy")
        result = quantize([source(x)], [scheme], backend=name, out=out, workers=1)
        runs[name] = (result.tensors[0].schemes[0].to_dict(), np.load(out))
    (ref, ref_q), (got, got_q) = runs["numpy"], runs[backend]
    assert np.isfinite(got_q).all()
    np.testing.assert_array_equal(got_q, ref_q)
    assert got["saturated"] == ref["saturated"] > 0
    assert got["nan_produced"] == got["overflowed"] == 0
    assert got["rmse"] == pytest.approx(ref["rmse"], rel=1e-12)


def test_backend_ieee_shows_the_backends_own_overflow():
    x = np.array([500, 1], np.float32)
    d = quantize([source(x)], [build_scheme(recipe="mxfp8", overflow="ieee")],
                 backend="ml_dtypes", workers=1).tensors[0].schemes[0].to_dict()
    assert d["nan_produced"] == 1 and d["overflowed"] == 1 and d["saturated"] == 0


def test_underflow_backend_saturates():
    from fmtcli.numerics.rounding import OverflowPolicy
    from fmtcli.underflow import underflow_table

    spec = get_format("float8_e4m3fn")
    for overflow, expected in ((OverflowPolicy.SATURATE, 448.0), (OverflowPolicy.IEEE, None)):
        row = underflow_table([500.0], [spec], overflow=overflow, backend="ml_dtypes").rows[0]
        if expected is None:
            assert np.isnan(row.plain.stored)
        else:
            assert row.plain.stored == expected


def test_backend_refusals_come_before_importing_torch():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        import numpy as np
        from fmtcli.numerics.backends import resolve
        from fmtcli.base.errors import UsageError
        from fmtcli.numerics.formats import get_format
        from fmtcli.quantize import quantize
        from fmtcli.numerics.schemes import build_scheme
        from fmtcli.inputs.tensors import TensorSource
        from fmtcli.underflow import underflow_table

        x = np.ones(4, np.float32)
        src = TensorSource("m", None, x.shape, "float32", lambda: x)
        e4m3 = get_format("float8_e4m3fn")
        attempts = [
            lambda: resolve("torch", "cpu", get_format("float4_e2m1fn")),
            lambda: resolve("torch", "cuda", get_format("float6_e3m2fn")),
            lambda: resolve("torch", "cpu", e4m3, rounding="stochastic"),
            lambda: quantize([src], [build_scheme(recipe="mxfp4")], backend="torch"),
            lambda: quantize([src], [build_scheme(rounding="up")], backend="torch"),
            lambda: underflow_table([1.0], [e4m3], rounding="down", backend="torch"),
        ]
        for attempt in attempts:
            try:
                attempt()
            except UsageError as error:
                print(error)
            else:
                raise SystemExit("not refused")
        assert "torch" not in sys.modules, "torch was imported"
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6
    assert "needs torch" not in done.stdout


# -- item 4b: inf/NaN results of finite inputs are unbounded errors ---------------------------

@pytest.mark.parametrize("recipe", ["mxfp8", "tensorwise"])
def test_ieee_never_reports_a_better_error_than_saturate(recipe):
    x = heavy()
    kwargs = dict(margin=-3) if recipe == "tensorwise" else {}
    d = {p: stats(x, recipe=recipe, overflow=p, **kwargs) for p in ("saturate", "ieee")}
    assert d["ieee"]["nan_produced"] > 0 and d["saturate"]["nan_produced"] == 0
    assert d["ieee"]["sqnr_db"] == -np.inf < d["saturate"]["sqnr_db"]
    assert d["ieee"]["rmse"] == d["ieee"]["mse"] == d["ieee"]["max_abs_error"] == np.inf
    assert np.isnan(d["ieee"]["bias"])
    assert np.isfinite(d["saturate"]["rmse"]) and np.isfinite(d["saturate"]["bias"])


def test_unbounded_errors_in_the_total_and_json():
    import json

    from fmtcli.render.jsonsafe import dumps  # the JSON writer of --json

    x = np.array([500.0, 1.0], np.float32)
    y = np.array([1.0, 2.0], np.float32)
    scheme = build_scheme(recipe="mxfp8", overflow="ieee")
    result = quantize([source(x, name="a"), source(y, name="b")], [scheme], workers=1)
    total = result.total[0].to_dict()
    assert total["rmse"] == np.inf and total["sqnr_db"] == -np.inf
    assert result.tensors[1].schemes[0].rmse < np.inf  # the clean tensor keeps its figures
    doc = json.loads(dumps(result.to_dict()))
    assert doc["total"][0]["rmse"] == "inf" and doc["total"][0]["sqnr_db"] == "-inf"


def test_inf_inputs_are_not_unbounded_errors():
    # amax rule: the inf block's scale is 0 and inf * 0 is NaN; a finite value sharing
    # that block would come out 0 / 0 = NaN too, which is an unbounded error
    x = np.array([np.inf, 1.0, 3.0, 5.0], np.float32)
    d = stats(x, block=1, overflow="ieee")
    assert d["nonfinite_inputs"] == 1 and d["nan_produced"] == 1
    assert d["rmse"] == 0 and d["sqnr_db"] == np.inf  # the finite inputs are exact
    d = stats(x, block=2, overflow="ieee")
    assert d["nan_produced"] == 2 and d["rmse"] == np.inf


def test_formats_without_zero_do_not_count_the_padding():
    x = np.array([1.0, 2.0, 4.0, 8.0], np.float32)  # blocks of 3: two padded elements
    d = stats(x, format=get_format("float8_e8m0fnu"), block=3, overflow="saturate")
    assert d["nan_produced"] == 0 and d["count"] == 4
    assert np.isfinite(d["rmse"])


# -- items 2, 4c, 14: one product rule; float64 data beyond float32; no RuntimeWarning --------

def test_float32_and_float64_files_of_the_same_values_agree():
    """[9, 0.375] in e2m1 per tensor: scale fl32(6/9); fl32(0.375 * scale) is 0.25, a tie
    that flushes; the float64 product 0.2500000075 rounds to 0.5."""
    kwargs = dict(format=get_format("float4_e2m1fn"), per=Granularity.TENSOR)
    f32 = stats(np.array([9.0, 0.375], np.float32), **kwargs)
    f64 = stats(np.array([9.0, 0.375], np.float64), **kwargs)
    assert f32["flushed"] == f64["flushed"] == 1 and f64["product"] == "float32"
    scheme = build_scheme(**kwargs)
    exact = [quantize([source(np.array([9.0, 0.375], dt))], [scheme], workers=1,
                      product="exact").tensors[0].schemes[0] for dt in (np.float32, np.float64)]
    assert exact[0].flushed == exact[1].flushed == 0 and exact[0].scheme.product.value == "exact"


def test_underflow_product_option():
    from fmtcli.underflow import underflow_table

    spec = get_format("float4_e2m1fn")
    scale = float(np.float32(6 / 9))
    fates = {p: underflow_table([0.375], [spec], scales=[scale], product=p).rows[0]
             for p in ("exact", "float32")}
    assert fates["exact"].scaled_store.stored == 0.5
    assert fates["float32"].scaled_store.stored == 0.0 and not fates["float32"].survives
    assert underflow_table([0.375], [spec], scales=[scale]).rows[0].scaled_store.stored == 0.5


BIG64 = np.array([1e300, -3e299, 5e299], np.float64)


@pytest.mark.parametrize("kwargs", [dict(per=Granularity.TENSOR), dict(block=2),
                                    dict(recipe="mxfp8"), dict(recipe="nvfp4"),
                                    dict(recipe="rowwise")], ids=str)
def test_float64_beyond_float32_range(kwargs):
    import warnings

    from fmtcli.base.errors import DataError

    scheme = build_scheme(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # none (overflow in maximum, ...)
        with pytest.raises(DataError, match=r"'big'.*beyond float32's range") as caught:
            quantize([source(BIG64, name="big")], [scheme], workers=1)
        assert "product='exact'" in str(caught.value)
        d = quantize([source(BIG64, name="big")], [scheme], workers=1,
                     product="exact").tensors[0].schemes[0].to_dict()
    for key in ("rmse", "sqnr_db", "max_abs_error", "bias", "median_rel_error", "p99_rel_error"):
        assert not np.isnan(d[key]), key
    assert d["nan_produced"] == 0 and d["overflowed"] == 0 and np.isfinite(d["rmse"])
    assert d["scales"]["min"] > 0


def test_exact_product_per_tensor_on_huge_data_is_accurate():
    d = quantize([source(BIG64)], [build_scheme(per=Granularity.TENSOR)], workers=1,
                 product="exact").tensors[0].schemes[0].to_dict()
    # scale 448 / 1e300: 5e299 -> 224 exactly, -3e299 -> -134.4 -> -128 in E4M3
    err = np.array([0.0, 3e299 - 128 / 4.48e-298, 0.0]) / 1e290  # scaled: no overflow
    assert d["rmse"] == pytest.approx(float(np.sqrt(np.mean(err ** 2))) * 1e290, rel=1e-9)
    assert d["sqnr_db"] == pytest.approx(
        10 * np.log10(np.sum((BIG64 / 1e290) ** 2) / np.sum(err ** 2)), rel=1e-9)
    assert d["saturated"] == 0


def test_cli_float64_beyond_float32_has_no_warning(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "big.npy"
    np.save(path, BIG64)
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "fmtcli",
                           "quantize", str(path), "--per", "tensor", "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "RuntimeWarning" not in done.stderr
    assert done.stderr.startswith("Error:") and len(done.stderr.strip().splitlines()) == 1


# -- item 4e: the quantile bin is exact near its edges ----------------------------------------

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


# -- item 5: conventions, and a cross-check against independent re-implementations -----------

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


TINY64 = np.array([1e-300, 2e-310, -3e-300], np.float64)


def test_exact_product_per_tensor_on_tiny_data_is_accurate():
    """float64 data near the bottom of float64: the squares of values and errors underflow
    a plain float64 sum (RMSE 0 and SQNR NaN before); they are summed scaled up."""
    from fractions import Fraction

    d = quantize([source(TINY64)], [build_scheme(per=Granularity.TENSOR)], workers=1,
                 product="exact").tensors[0].schemes[0].to_dict()
    x_q = np.array(quantize_values(TINY64))
    err = [Fraction(float(q)) - Fraction(float(v)) for q, v in zip(x_q, TINY64)]
    mse = sum(e * e for e in err) / 3
    power = sum(Fraction(float(v)) ** 2 for v in TINY64)
    assert float(err[0]) != 0.0  # something to measure
    rmse = np.sqrt(float(mse * 2 ** 1200)) * 2.0 ** -600  # mse itself underflows float64
    assert d["rmse"] == pytest.approx(rmse, rel=1e-9)
    assert d["sqnr_db"] == pytest.approx(10 * np.log10(float(power / sum(e * e for e in err))),
                                         rel=1e-9)
    assert d["max_abs_error"] == pytest.approx(max(abs(float(e)) for e in err), rel=1e-12)


def quantize_values(x):
    """The dequantized values of one tensor under per-tensor amax scaling, exact product, as
    ``--out x.npy`` would hold them (float64 here: the exact rule keeps float64)."""
    spec = get_format("float8_e4m3fn")
    amax = float(np.max(np.abs(x)))
    scale = spec.max / amax
    from fmtcli.numerics.rounding import round_to_format

    return round_to_format(x * scale, spec, overflow="saturate") / scale


def test_percentile_scale_of_an_all_zero_tensor_is_one():
    """An all-zero tensor's per-tensor percentile lies in the histogram's lowest bin: it is 0
    (scale 1, nothing to scale), not the bin's upper edge (scale ~3.4e38)."""
    d = stats(np.zeros(1000, np.float32), per=Granularity.TENSOR,
              scale_rule=ScaleRule.PERCENTILE, percentile=99.9)
    assert d["scales"]["min"] == d["scales"]["max"] == 1.0
    assert d["flushed"] == 0 and d["nan_produced"] == 0


def test_exact_product_outputs_keep_float64(tmp_path):
    """--product exact on float64 data far below float32's range: the .npy holds float64
    x_q and the .npz float64 scales, so both agree with the statistics (float32 files
    would hold zeros and a zero scale)."""
    from fmtcli.numerics.rounding import decode

    scheme = build_scheme(per=Granularity.TENSOR)
    npy, npz = str(tmp_path / "q.npy"), str(tmp_path / "q.npz")
    quantize([source(TINY64)], [scheme], workers=1, out=npy, product="exact")
    quantize([source(TINY64)], [scheme], workers=1, out=npz, product="exact")
    values = np.load(npy)
    assert values.dtype == np.float64
    np.testing.assert_array_equal(values, quantize_values(TINY64))
    with np.load(npz) as archive:
        codes, scales = archive["mem.codes"], archive["mem.scales"]
    assert scales.dtype == np.float64 and scales[0, 0] == 448 / 3e-300
    np.testing.assert_array_equal(decode(codes, get_format("float8_e4m3fn")) / scales[0, 0],
                                  values)
    # float32-representable scales stay float32
    quantize([source(TINY64 * 1e290)], [scheme], workers=1, out=str(tmp_path / "b.npz"),
             product="float32")
    with np.load(tmp_path / "b.npz") as archive:
        assert archive["mem.scales"].dtype == np.float32
