"""The width of ``x * scale`` (``--product float32`` or ``exact``; issue 9, items 2, 4c and 14):
float32 and float64 files of the same values agree, float64 data beyond float32's range is a
data error that names ``product='exact'``, and the exact product's statistics and ``--out``
files are accurate at the extremes of float64 (no RuntimeWarning on the way).
"""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, strict_loads
from engine_helpers import source, stats

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize

# -- on the command line ----------------------------------------------------------------------

@pytest.mark.parametrize("product, flushed", [("float32", 1), ("exact", 0)])
def test_quantize_product_option(tmp_path, product, flushed):
    (tmp_path / "t.csv").write_text("9.0\n0.375\n")
    result = invoke("quantize", tmp_path / "t.csv", "--format", "e2m1", "--per", "tensor",
                    "--product", product, "--json")
    assert result.exit_code == 0, result.stderr
    stats = strict_loads(result.stdout)["tensors"][0]["schemes"][0]
    assert stats["product"] == product and stats["flushed"] == flushed


@pytest.mark.parametrize("command", [["underflow", "1"], ["quantize"], ["scale-search"]])
def test_product_takes_float32_or_exact(command):
    assert "--product" in assert_usage_error(invoke(*command, "--product", "float16"))
    result = invoke(*command, "--product", "exact", "--json")
    assert result.exit_code == 0, result.stderr
    strict_loads(result.stdout)


@pytest.mark.slow
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


# -- float32 and float64 data -----------------------------------------------------------------

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


# -- the exact product at float64's extremes --------------------------------------------------

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
