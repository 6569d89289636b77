"""``fmt dot`` and ``fmtcli.arithmetic.dot``: the FP8 GEMM with a limited accumulator.

The yardstick is computed here, independently of the library: the tensor-core accumulator
model written out with ``fractions.Fraction`` one output at a time (alignment to the
largest exponent, cut to B fraction bits, exact sum, normalisation), ml_dtypes' own FP8
cast for the quantization, numpy's float16 for an ordinary FP16 accumulator, and the error
figures from their definitions."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_fits,
    assert_usage_error,
    cuda_available,
    invoke,
    json_of,
    succeeds,
)

from fmtcli.arithmetic import dot as D
from fmtcli.arithmetic import gemm as G
from fmtcli.base.choices import AccumulationRounding
from fmtcli.base.errors import UsageError
from fmtcli.numerics.formats import get_format

E4M3 = get_format("float8_e4m3fn")
TZ, RNE = AccumulationRounding.TOWARD_ZERO, AccumulationRounding.NEAREST_EVEN


# -- the independent reference -------------------------------------------------------------

def floor_log2(x: Fraction) -> int:
    """floor(log2 |x|) of a nonzero Fraction, exactly."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def cut(x: Fraction, quantum: Fraction, rounding) -> Fraction:
    """x to a multiple of quantum: toward zero, or nearest with ties to even."""
    units = x / quantum
    whole = math.trunc(units) if rounding is TZ else round(units)  # round(): half to even
    return whole * quantum


def reference_output(a_codes, b_codes, factor_of, bits, rounding, promote, group) -> float:
    """One output of the model (module docstring of arithmetic.dot, items 3-4): a_codes and
    b_codes the K codes of its row and column; factor_of(k0) the float32 dequantization
    factor of the interval that starts at k0."""
    k = len(a_codes)
    interval = promote or k
    out = np.float32(0)
    for start in range(0, k, interval):
        acc = Fraction(0)
        for g0 in range(start, min(start + interval, k), group):
            g1 = min(g0 + group, start + interval, k)
            terms = [Fraction(float(a_codes[i])) * Fraction(float(b_codes[i]))
                     for i in range(g0, g1)]
            nonzero = [abs(t) for t in terms + [acc] if t]
            if not nonzero:
                continue
            quantum = Fraction(2) ** (floor_log2(max(nonzero)) - bits)
            total = sum(cut(t, quantum, rounding) for t in terms) + cut(acc, quantum, rounding)
            acc = cut(total, Fraction(2) ** (floor_log2(total) - bits), rounding) if total else \
                Fraction(0)
        out = np.float32(out + np.float32(float(acc)) * factor_of(start))
    return float(out)


def random_operands(m=3, n=4, k=70, seed=1):
    return D.random_operands(m, n, k, seed)


# -- quantization --------------------------------------------------------------------------

@pytest.mark.parametrize("granularity", ["tensor", "row", "block:16"])
def test_codes_are_ml_dtypes_casts_of_the_scaled_inputs(granularity):
    a, b = random_operands(5, 6, 40)
    kind, block = D.parse_granularity(granularity)
    qa, qb = D.quantize_operands(a, b, E4M3, kind, block)
    for x, q, tiles in ((a, qa, {"tensor": (5, 40), "row": (1, 40), "block": (1, 16)}),
                        (b, qb, {"tensor": (40, 6), "row": (40, 1), "block": (16, 16)})):
        rows, cols = tiles[kind]
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                r0, c0 = i // rows * rows, j // cols * cols
                amax = np.float32(np.abs(x[r0:r0 + rows, c0:c0 + cols]).max())
                scale = np.float32(448.0) / amax
                want = np.clip(np.float32(x[i, j]) * scale, -448, 448).astype(
                    ml_dtypes.float8_e4m3fn).astype(np.float64)
                assert q.codes[i, j] == want
                assert q.values[i, j] == want * np.float64(np.float32(1) / scale)


def test_wide_formats_are_cast_without_a_scale():
    """FP16/BF16 operands are cast as they are (scaling them to their max would overflow
    the products): codes equal ml_dtypes' bfloat16 of the float32 inputs."""
    a, b = random_operands(4, 5, 64)
    qa, qb = D.quantize_operands(a, b, get_format("bf16"), "tensor", None)
    np.testing.assert_array_equal(
        qa.codes, a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32))
    assert qa.dequant.ravel().tolist() == [1.0] and qb.dequant.ravel().tolist() == [1.0]
    r = D.analyse_dot(get_format("bf16"), m=8, n=8, k=256)
    assert r.settings.scaled is False
    assert 0 < r.vs_quantized.rel_fro_error < 0.01
    assert D.analyse_dot(E4M3, m=8, n=8, k=64).settings.scaled is True


# -- the accumulator against the Fraction reference ----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("rounding", [TZ, RNE])
@pytest.mark.parametrize("bits,promote,group", [(3, None, 1), (5, 32, 8), (13, None, 32),
                                                (8, 16, 5), (13, 64, 32)])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_aligned_model_matches_fraction_reference(rounding, bits, promote, group, granularity):
    a, b = random_operands()
    kind, block = D.parse_granularity(granularity)
    qa, qb = D.quantize_operands(a, b, E4M3, kind, block)
    c = D.emulate_gemm(qa, qb, kind, block, bits=bits, rounding=rounding,
                       promote_every=promote, group=group)
    for i in range(3):
        for j in range(4):
            da = qa.dequant[0, 0] if kind == "tensor" else qa.dequant[i, 0]
            db = qb.dequant[0, 0] if kind == "tensor" else qb.dequant[0, j]
            want = reference_output(qa.codes[i], qb.codes[:, j],
                                    lambda k0, da=da, db=db: np.float32(da * db), bits, rounding,
                                    promote, group)
            assert c[i, j] == want, (i, j, c[i, j], want)


def test_block_scales_match_fraction_reference():
    a, b = random_operands(3, 20, 64)
    qa, qb = D.quantize_operands(a, b, E4M3, "block", 16)
    c = D.emulate_gemm(qa, qb, "block", 16, bits=6, promote_every=8, group=4)
    for i in range(3):
        for j in (0, 7, 16, 19):
            want = reference_output(
                qa.codes[i], qb.codes[:, j],
                lambda k0, i=i, j=j: np.float32(qa.dequant[i, k0 // 16]
                                                * qb.dequant[k0 // 16, j // 16]),
                6, TZ, 8, 4)
            assert c[i, j] == want


@pytest.mark.parametrize("granularity,promote", [("tensor", None), ("row", 48),
                                                  ("block:16", 16)])
@pytest.mark.parametrize("accumulator", [None, "bf16"])
def test_tiles_give_the_whole_matrix_s_outputs_bit_for_bit(monkeypatch, granularity, promote,
                                                          accumulator):
    """The emulation runs tile by tile (a tile's products within TILE_BYTES): tiles of a
    few rows and columns -- block scales cut across them -- give the outputs of one tile
    over the whole matrix, bit for bit."""
    a, b = random_operands(29, 45, 96)
    kind, block = D.parse_granularity(granularity)
    qa, qb = D.quantize_operands(a, b, E4M3, kind, block)
    acc = None if accumulator is None else get_format(accumulator)
    whole = D.emulate_gemm(qa, qb, kind, block, accumulator=acc, promote_every=promote)
    monkeypatch.setattr(G, "TILE_BYTES", 32 * 4 * 7)  # tiles of 7 columns, one row
    assert G.tiles(29, 45, 32, 4) == (1, 7)
    tiled = D.emulate_gemm(qa, qb, kind, block, accumulator=acc, promote_every=promote)
    assert np.array_equal(whole, tiled)
    monkeypatch.setattr(G, "TILE_BYTES", 32 * 4 * 45 * 5)  # five whole rows a tile
    assert G.tiles(29, 45, 32, 4) == (5, 45)
    assert np.array_equal(whole, D.emulate_gemm(qa, qb, kind, block, accumulator=acc,
                                                promote_every=promote))


@pytest.mark.parametrize("args,fragment", [
    (["--m", "4096", "--n", "4096", "--k", "128"], None),  # the largest M x N: allowed
    (["--m", "1", "--n", "16384", "--k", "8192"], "GiB"),
    (["--m", "1", "--n", "1", "--k", "100000000"], "GiB"),
    (["--m", "1", "--n", "1", "--k", "10000000"], "steps"),
    (["--m", "64", "--n", "64", "--k", "262144", "--promote-every", "1"], "--promote-every 1"),
])
def test_memory_and_loop_limits_are_checked_before_any_work(args, fragment):
    """--m 4096 --n 4096 --k 32 needed 7.1 GB at once; now the tiles keep it near 1 GB,
    and shapes whose estimate passes 3 GiB, or whose loop passes MAX_STEPS, are refused
    with the estimate, at once."""
    m, n, k = (int(args[i]) for i in (1, 3, 5))
    assert (D.memory_needed(m, n, k) <= D.MAX_MEMORY) is (fragment != "GiB")
    if fragment is None:
        D.check_size(m, n, k)
        return
    start = time.perf_counter()
    assert_usage_error(invoke("dot", *args), fragment, "at most")
    assert time.perf_counter() - start < 5


def test_a_block_larger_than_the_matrix_is_the_whole_matrix():
    """block:1048576 padded B to 2^20 x 2^20 values (out of memory); a tile beyond the
    matrix is all of it, so it equals block:64 on these 8 x 64 and 64 x 8 operands."""
    huge = json_of("dot", "--m", "8", "--n", "8", "--k", "64", "--scale-granularity",
                   "block:1048576")
    small = json_of("dot", "--m", "8", "--n", "8", "--k", "64", "--scale-granularity",
                    "block:64")
    assert huge["emulated"] == small["emulated"] and huge["quantization"] == \
        small["quantization"]


def test_files_too_large_for_memory_are_refused_by_their_shapes(tmp_path):
    """A and B of 1 x 50,000,000 and 50,000,000 x 1 (sparse files): refused from the
    headers, before reading 400 MB."""
    for name, shape in (("a.npy", (1, 50_000_000)), ("b.npy", (50_000_000, 1))):
        np.lib.format.open_memmap(tmp_path / name, mode="w+", dtype=np.float32, shape=shape)
    start = time.perf_counter()
    assert_usage_error(invoke("dot", tmp_path / "a.npy", tmp_path / "b.npy"), "GiB")
    assert time.perf_counter() - start < 5


def test_cancellation_and_zero_sums_are_exact():
    """Terms that cancel leave an exact zero, and a sum below the grid is not lost when it
    is the largest term (the alignment is to the largest exponent present)."""
    acc = np.array([[0.0, 1.0]])
    products = np.array([[[3.0, 2.0 ** -20]], [[-3.0, 2.0 ** -20]]]).transpose(1, 0, 2)
    out = D.aligned_step(acc, products, 4, TZ)
    assert out[0, 0] == 0.0
    assert out[0, 1] == 1.0  # 1 + 2 * 2**-20 cut to 4 fraction bits
    small = D.aligned_step(np.zeros((1, 1)), np.array([[[2.0 ** -20]]]), 4, TZ)
    assert small[0, 0] == 2.0 ** -20


def test_float16_accumulator_is_numpy_float16_per_step():
    """FP4 operands (codes up to 6: sums stay below FP16's max; E4M3 codes reach 448, and
    448**2 alone overflows FP16, which the next test shows)."""
    a, b = random_operands(2, 3, 96)
    qa, qb = D.quantize_operands(a, b, get_format("float4_e2m1fn"), "tensor", None)
    c = D.emulate_gemm(qa, qb, "tensor", None, bits=None, accumulator=get_format("float16"),
                       rounding=RNE, group=8)
    factor = np.float32(qa.dequant[0, 0] * qb.dequant[0, 0])
    for i in range(2):
        for j in range(3):
            acc = np.float16(0)
            for g0 in range(0, 96, 8):
                exact = sum(Fraction(float(qa.codes[i, t])) * Fraction(float(qb.codes[t, j]))
                            for t in range(g0, g0 + 8))
                acc = np.float16(Fraction(float(acc)) + exact)  # float() exact: dyadic
            assert c[i, j] == np.float32(np.float32(0) + np.float32(acc) * factor)


def test_float16_accumulator_overflows_on_e4m3_codes():
    """Nearest-even overflows to inf; toward-zero (IEEE) stops at 65504 instead."""
    fp16 = get_format("float16")
    r = D.analyse_dot(E4M3, m=8, n=8, k=512, accumulator=fp16, rounding=RNE)
    assert r.vs_quantized.rel_fro_error == math.inf
    r = D.analyse_dot(E4M3, m=8, n=8, k=512, accumulator=fp16, rounding=TZ)
    assert 0.5 < r.vs_quantized.rel_fro_error < 1


def test_wide_accumulator_leaves_only_the_float32_output():
    a, b = random_operands(16, 16, 1024)
    qa, qb = D.quantize_operands(a, b, E4M3, "tensor", None)
    ref = D.exact_products(qa, qb)
    c = D.emulate_gemm(qa, qb, "tensor", None, bits=40)
    assert D.error_figures(c, ref).rel_fro_error < 2e-7


# -- the errors ----------------------------------------------------------------------------

def test_error_figures_are_their_definitions():
    r = np.array([[1.0, -2.0], [4.0, 0.5]])
    c = np.array([[1.1, -2.0], [3.9, 0.0]])
    e = D.error_figures(c, r)
    assert e.max_rel_error == pytest.approx(0.5 / 4.0)
    assert e.rel_fro_error == pytest.approx(math.sqrt(0.01 + 0.01 + 0.25) / math.sqrt(21.25))
    xy = 1.1 + 4.0 + 3.9 * 4.0
    assert e.calc_diff == pytest.approx(1 - 2 * xy / (np.sum(c * c) + 21.25))
    zero = D.error_figures(np.zeros((2, 2)), np.zeros((2, 2)))
    assert (zero.max_rel_error, zero.rel_fro_error, zero.calc_diff) == (0.0, 0.0, 0.0)
    overflowed = D.error_figures(np.array([[np.inf]]), np.array([[1.0]]))
    assert overflowed.max_rel_error == math.inf


# -- DeepSeek-V3 §3.3.2 --------------------------------------------------------------------

def test_deepseek_ordering_promotion_and_width():
    """K = 4096: promotion every 128 lowers the error of a 13-bit accumulator many times;
    fewer bits, more error; nearest-even loses less than truncation."""
    a, b = random_operands(32, 32, 4096, seed=0)
    qa, qb = D.quantize_operands(a, b, E4M3, "tensor", None)
    ref = D.exact_products(qa, qb)

    def err(**kw):
        return D.error_figures(D.emulate_gemm(qa, qb, "tensor", None, **kw), ref)

    plain, promoted = err(bits=13), err(bits=13, promote_every=128)
    assert promoted.max_rel_error * 5 < plain.max_rel_error
    assert promoted.calc_diff < plain.calc_diff
    widths = [err(bits=b).rel_fro_error for b in (10, 13, 16)]
    assert widths[0] > widths[1] > widths[2]
    assert err(bits=13, rounding=RNE).rel_fro_error < plain.rel_fro_error


def test_analyse_dot_result_and_json_keys():
    r = D.analyse_dot(E4M3, m=16, n=16, k=256, promote_every=128, seed=3)
    d = r.to_dict()
    assert set(d) == {"settings", "quantization", "emulated", "gpu"}
    for figures in (d["quantization"], d["emulated"]["vs_quantized"],
                    d["emulated"]["vs_unquantized"]):
        assert set(figures) == {"max_rel_error", "rel_fro_error", "calc_diff"}
    assert d["settings"]["accumulator_bits"] == 13 and d["settings"]["promote_every"] == 128
    with pytest.raises(UsageError):
        D.analyse_dot(E4M3, m=16, n=16, k=256, accumulator_bits=10,
                      accumulator=get_format("bf16"))
    with pytest.raises(UsageError):
        D.analyse_dot(get_format("e8m0"), m=4, n=4, k=4)


# -- the command line ----------------------------------------------------------------------

def test_cli_json_matches_the_library():
    doc = json_of("dot", "--m", "16", "--n", "32", "--k", "512", "--promote-every", "128",
                  "--scale-granularity", "row", "--accumulation-rounding", "nearest-even",
                  "--seed", "4")
    lib = D.analyse_dot(E4M3, m=16, n=32, k=512, granularity="row", rounding=RNE,
                        promote_every=128, seed=4).to_dict()
    assert doc == lib
    assert doc["settings"]["scale_granularity"] == "row"


def test_cli_other_accumulator_and_format(tmp_path):
    doc = json_of("dot", "--m", "16", "--n", "16", "--k", "256", "--accumulator", "bf16",
                  "--format", "e5m2")
    assert doc["settings"]["accumulator_format"] == "bfloat16"
    assert doc["settings"]["accumulator_bits"] is None
    assert doc["settings"]["format"] == "float8_e5m2"
    fp16 = json_of("dot", "--m", "16", "--n", "16", "--k", "256", "--accumulator", "fp16",
                   "--format", "fp4", "--seed", "1")
    assert 0 < fp16["emulated"]["vs_quantized"]["rel_fro_error"] < 0.01


def test_cli_files(tmp_path):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 64)), rng.standard_normal((64, 32))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    doc = json_of("dot", tmp_path / "a.npy", tmp_path / "b.npy")
    assert (doc["settings"]["m"], doc["settings"]["n"], doc["settings"]["k"]) == (16, 32, 64)
    assert doc["settings"]["seed"] is None
    lib = D.analyse_dot(E4M3, operands=(a, b))
    assert doc["emulated"] == lib.to_dict()["emulated"]
    np.save(tmp_path / "bad.npy", rng.standard_normal((63, 32)))
    assert_data_error(invoke("dot", tmp_path / "a.npy", tmp_path / "bad.npy"), "K")
    assert_usage_error(invoke("dot", tmp_path / "a.npy", tmp_path / "b.npy", "--k", "8"),
                       "--k")
    np.savez(tmp_path / "abc.npz", c=np.ones(3), b=b, a=a)  # by name, not by order
    assert json_of("dot", tmp_path / "abc.npz")["emulated"] == doc["emulated"]
    assert_data_error(invoke("dot", tmp_path / "a.npy"), "holds 1 usable")
    nan = b.copy()
    nan[3, 4] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    assert_data_error(invoke("dot", tmp_path / "a.npy", tmp_path / "nan.npy"), "NaN")


@pytest.mark.slow
@pytest.mark.parametrize("args,fragment", [
    (["--accumulator-bits", "10", "--accumulator", "bf16"], "alternatives"),
    (["--scale-granularity", "tile"], "block:BS"),
    (["--scale-granularity", "block:128", "--k", "512"], "--promote-every 128"),
    (["--scale-granularity", "block:128", "--promote-every", "96", "--k", "512"], "divide"),
    (["--accumulator-bits", "0"], "--accumulator-bits"),
    (["--accumulator", "e8m0"], "scale format"),
    (["--scale-granularity", ""], "--scale-granularity"),
    (["--format", "nope"], "nope"),
    (["--m", "100000", "--n", "100000"], "outputs"),
    (["--device", "gpu"], "--device"),
])
def test_usage_errors(args, fragment):
    assert_usage_error(invoke("dot", "--m", "8", "--n", "8", "--k", "64", *args)
                       if "--m" not in args else invoke("dot", *args), fragment)


def test_device_cuda_without_cuda_is_one_line():
    if cuda_available():
        pytest.skip("a CUDA GPU is here")
    line = assert_usage_error(invoke("dot", "--device", "cuda", "--m", "16"), "CUDA")
    assert "--device cuda" in line


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", [
    ["--promote-every", "128"],
    ["--scale-granularity", "block:128", "--promote-every", "128", "--accumulator", "bf16"],
], ids=["promoted", "block-bf16"])
def test_tables_fit(width, args):
    args = ["dot", "--m", "32", "--n", "32", "--k", "512", *args]
    out = succeeds(*args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    doc = json_of(*args)
    assert f"{doc['emulated']['vs_quantized']['calc_diff']:.3g}" in out


# -- CUDA ----------------------------------------------------------------------------------


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a CUDA GPU")
def test_scaled_mm_on_cuda():
    """The real FP8 GEMM: both runs present; where they ran, their error against float64
    of the quantized inputs is that of an accumulator of limited precision (not zero, not
    the quantization's), and with FP32 promotion the emulation's 13-bit model is close."""
    doc = json_of("dot", "--device", "cuda", "--m", "128", "--n", "128", "--k", "4096")
    runs = {r["fast_accum"]: r for r in doc["gpu"]["runs"]}
    assert set(runs) == {False, True}
    assert doc["gpu"]["device"]
    for run in runs.values():
        if not run["available"]:
            assert run["reason"]
            continue
        assert 0 < run["vs_quantized"]["rel_fro_error"] < 0.01
        assert run["vs_unquantized"]["rel_fro_error"] == pytest.approx(
            doc["quantization"]["rel_fro_error"], rel=0.05)
        assert 0 <= run["identical_to_emulated"] <= 1
