"""``fmt attention`` and ``fmtcli.attention``'s accuracy, IO model and timing.

The yardstick is computed here, independently of the library: attention written out head
by head in float64 (``naive_attention``), FP8 quantization by ml_dtypes' own cast, the
Hadamard matrix by Sylvester's construction, and the IO figures by hand from the formulas
of Dao et al. 2022 (Theorem 2, Algorithms 0, 1, 3, 4)."""

from __future__ import annotations

import math

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

from fmtcli.attention import accuracy as A
from fmtcli.attention.io_model import io_model
from fmtcli.base.choices import Granularity
from fmtcli.numerics.formats import get_format

E4M3 = get_format("float8_e4m3fn")
F32 = get_format("float32")


def naive_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(d)) v per (batch, head), float64, one query row at a time."""
    b, h, n, d = q.shape
    out = np.zeros((b, h, n, v.shape[-1]))
    for i in range(b):
        for j in range(h):
            for r in range(n):
                s = np.array([np.dot(q[i, j, r], k[i, j, c]) for c in range(k.shape[2])])
                s = s / math.sqrt(d)
                if causal:
                    s[r + 1:] = -np.inf
                w = np.exp(s - s.max())
                out[i, j, r] = (w / w.sum()) @ v[i, j]
    return out


def small(seed=3, b=1, h=2, n=48, d=16, outliers=0.0):
    return A.random_qkv(b, h, n, d, seed, outliers)


# -- the methods against the independent reference -----------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_exact_attention(causal):
    q, k, v = small()
    np.testing.assert_allclose(A.reference_attention(q, k, v, causal),
                               naive_attention(q, k, v, causal), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_k", [1, 5, 16, 48, 64])
def test_float32_methods_agree_with_exact_attention_to_float_rounding(causal, block_k):
    """The article: block by block, the online softmax gives ordinary attention to within
    float rounding (blocks that do not divide the sequence included)."""
    q, k, v = small()
    ref = naive_attention(q, k, v, causal)
    qq, kq, vq = A.quantize_inputs(q, k, v, F32, Granularity.BLOCK, 8, block_k)
    flash = A.flash_attention(qq, kq, vq, F32, block_k, causal)
    std = A.standard_attention(qq, kq, vq, F32, Granularity.BLOCK, 8, block_k, causal)
    np.testing.assert_allclose(flash, ref, atol=2e-6)
    np.testing.assert_allclose(std, ref, atol=2e-6)


def test_error_figures_are_those_of_the_definitions():
    q, k, v = small()
    ref = naive_attention(q, k, v)
    rows = A.attention_accuracy(q, k, v, get_format("bfloat16"), block_q=16, block_k=16)
    assert [r.method for r in rows] == ["standard", "flash"]
    qq, kq, vq = A.quantize_inputs(q, k, v, get_format("bfloat16"), Granularity.BLOCK, 16, 16)
    out = A.flash_attention(qq, kq, vq, get_format("bfloat16"), 16).astype(np.float64)
    err = out - ref
    assert rows[1].rmse == pytest.approx(np.sqrt(np.mean(err ** 2)), rel=1e-12)
    assert rows[1].max_abs_error == pytest.approx(np.abs(err).max(), rel=1e-12)
    rel = np.linalg.norm(err, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert rows[1].max_rel_error == pytest.approx(rel.max(), rel=1e-12)
    # bfloat16's output alone is off by up to 2**-9 relative: the figures say so
    assert 1e-4 < rows[1].rmse < 1e-2 and rows[1].max_rel_error < 2e-2


def test_fp16_errors_lie_between_fp32_and_bf16():
    q, k, v = small()
    rmse = {f: A.attention_accuracy(q, k, v, get_format(f), block_q=16, block_k=16)[1].rmse
            for f in ("float32", "float16", "bfloat16", "float8_e4m3fn")}
    assert rmse["float32"] < 1e-6 < rmse["float16"] < rmse["bfloat16"] < rmse["float8_e4m3fn"]


# -- FP8 emulation -------------------------------------------------------------------------

def ml_dtypes_scaled(x, rows=None):
    """x_q = cast(x * s) / s with s = 448 / amax (float32 arithmetic), by ml_dtypes, per
    tensor (rows None) or per block of ``rows`` rows of each (batch, head)."""
    x = x.astype(np.float32)
    if rows is None:
        s = np.float32(448) / np.float32(np.abs(x).max())
        return np.clip(x * s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / s
    out = np.empty_like(x)
    for start in range(0, x.shape[-2], rows):
        blk = x[..., start:start + rows, :]
        s = np.float32(448) / np.abs(blk).max(axis=(-2, -1), keepdims=True).astype(np.float32)
        out[..., start:start + rows, :] = (np.clip(blk * s, -448, 448).astype(
            ml_dtypes.float8_e4m3fn).astype(np.float32) / s)
    return out


@pytest.mark.parametrize("granularity", [Granularity.TENSOR, Granularity.BLOCK])
def test_fp8_inputs_are_scaled_as_ml_dtypes_casts_them(granularity):
    q, k, v = small(outliers=0.01)
    qq, kq, vq = A.quantize_inputs(q, k, v, E4M3, granularity, 8, 16)
    rows = (None, None) if granularity is Granularity.TENSOR else (8, 16)
    np.testing.assert_array_equal(qq, ml_dtypes_scaled(q, rows[0]))
    np.testing.assert_array_equal(kq, ml_dtypes_scaled(k, rows[1]))
    np.testing.assert_array_equal(vq, ml_dtypes_scaled(v, rows[1]))


def test_flash_fp8_casts_p_before_p_v():
    """With FP32 inputs, the FP8 flash run differs from exact attention only by P~ cast to
    FP8 with the static scale 448 (P~ <= 1): an independent emulation with ml_dtypes, one
    key block."""
    q, k, v = small(n=32)
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    got = A.flash_attention(q32, k32, v32, E4M3, block_k=32)
    s = (q32 @ k32.transpose(0, 1, 3, 2)) * np.float32(1 / math.sqrt(16))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p8 = (p * np.float32(448)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / 448
    want = (p8 @ v32) / p.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hadamard_is_sylvester_s_matrix_and_keeps_q_k_t():
    d = 16
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.kron(h, np.array([[1.0, 1.0], [1.0, -1.0]]))
    x = np.random.default_rng(1).standard_normal((3, 5, d))
    np.testing.assert_allclose(A.walsh_hadamard(x), x @ h, atol=1e-12)
    q, k, _ = small(d=d)
    q2, k2 = A.random_orthogonal_hadamard(q, k, seed=7)
    np.testing.assert_allclose(q2 @ np.swapaxes(k2, -1, -2), q @ np.swapaxes(k, -1, -2),
                               atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(q2, axis=-1), np.linalg.norm(q, axis=-1))
    assert not np.allclose(np.abs(q2), np.abs(q))


def test_fa3_setup_orders_per_tensor_block_and_hadamard():
    """Shah et al. 2024 (FlashAttention-3) §4.3: N(0, 1) + N(0, 100) Bernoulli(0.001); FP8
    with per-tensor scales is worst, per-block better, incoherent processing best."""
    q, k, v = A.random_qkv(1, 4, 512, 64, seed=0, outliers=0.001)
    ref = A.reference_attention(q, k, v)

    def rmse(granularity, hadamard):
        rows = A.attention_accuracy(q, k, v, E4M3, granularity, 64, 64, hadamard=hadamard,
                                    reference=ref)
        return {r.method: r.rmse for r in rows}

    tensor, block = rmse(Granularity.TENSOR, False), rmse(Granularity.BLOCK, False)
    both = rmse(Granularity.BLOCK, True)
    for method in ("standard", "flash"):
        assert tensor[method] > block[method] > both[method]
        assert tensor[method] / both[method] > 1.3
    outliers = A.random_qkv(1, 1, 1000, 64, seed=0, outliers=0.001)[0]
    assert 20 < np.count_nonzero(np.abs(outliers) > 6) < 120  # ~0.1% large entries


# -- the IO model --------------------------------------------------------------------------

def test_io_model_of_gpt2_medium_by_hand():
    """Fig. 2's shape (seq 1024, d 64, 16 heads, batch 64, fp16), M = 192 KiB = 98,304
    fp16 elements: B_c = ceil(98304 / 256) = 384, B_r = min(384, 64) = 64, T_c = 3."""
    m = io_model(64, 16, 1024, 64, element_bits=16)
    n, d, pairs = 1024, 64, 64 * 16
    assert (m.block_q, m.block_k, m.sram_bytes) == (64, 384, 196608)
    assert m.standard_bytes == (4 * n * d + 4 * n * n) * 2 * pairs == 9_126_805_504
    flash = n * d + 2 * n + 2 * n * d + 3 * (3 * n * d + 4 * n)
    assert m.flash_bytes == flash * 2 * pairs == 1_639_972_864
    assert m.standard_bytes_fwd_bwd == (11 * n * n + 12 * n * d) * 2 * pairs
    assert m.flash_bytes_fwd_bwd == (flash + n * d + 6 * n * d + 3 * (5 * n * d + 2 * n)) \
        * 2 * pairs
    assert m.standard_flops == (4 * n * n * d + 5 * n * n) * pairs
    assert m.is_paper_shape and "paper_fig2" in m.to_dict()
    # forward + backward within 5% of the paper's 4.4 GB for FlashAttention
    assert m.flash_bytes_fwd_bwd == pytest.approx(4.4e9, rel=0.05)
    assert m.flash_flops_fwd_bwd / m.standard_flops_fwd_bwd == pytest.approx(75.2 / 66.6,
                                                                             rel=0.05)


def test_flash_traffic_falls_as_sram_grows_and_standard_s_does_not():
    """Theorem 2: Theta(N^2 d^2 / M) against Theta(N d + N^2)."""
    small_m, large_m = (io_model(1, 1, 8192, 64, 16, sram) for sram in (32768, 262144))
    assert small_m.standard_bytes == large_m.standard_bytes
    assert small_m.block_k == 64 and large_m.block_k == 512
    ratio = small_m.flash_bytes / large_m.flash_bytes
    assert 6 < ratio < 8  # the T_c term shrinks 8x; the 3 N d read once stays


# -- the command line ----------------------------------------------------------------------

def test_json_document():
    doc = json_of("attention", "--seq", "64", "--heads", "2", "--dim", "16",
                  "--format", "e4m3fn", "--hadamard", "--outliers", "0.01",
                  "--scale-granularity", "tensor", "--block-q", "16", "--block-k", "32")
    assert [r["method"] for r in doc["accuracy"]] == ["standard", "flash"]
    for row in doc["accuracy"]:
        assert set(row) == {"method", "format", "rmse", "max_abs_error", "max_rel_error"}
        assert row["format"] == "float8_e4m3fn" and 0 < row["rmse"] < 0.1
    assert {"standard_bytes", "flash_bytes", "standard_flops", "flash_flops", "sram_bytes",
            "block_q", "block_k"} <= set(doc["io"])
    assert (doc["io"]["block_q"], doc["io"]["block_k"]) == (16, 32)
    assert doc["settings"]["hadamard"] and doc["settings"]["scale_granularity"] == "tensor"
    assert "timing" not in doc


def test_io_alone_answers_for_gpt2_medium_without_tensors():
    doc = json_of("attention", "--io", "--batch", "64", "--heads", "16", "--seq", "1024")
    assert "accuracy" not in doc and doc["io"]["flash_bytes"] == 1_639_972_864
    assert doc["io"]["paper_fig2"]["flash_bytes"] == 4.4e9
    big = json_of("attention", "--io", "--seq", "1000000", "--sram", "232448")
    assert big["io"]["sram_bytes"] == 232448


HUGE = "1" + "0" * 400


@pytest.mark.slow
@pytest.mark.parametrize(("option", "limit"), [
    ("--batch", "1048576"), ("--heads", "65536"), ("--seq", "16777216"), ("--dim", "65536"),
    ("--block-q", "16777216"), ("--block-k", "16777216"), ("--sram", "1099511627776")])
def test_every_size_option_is_bounded(option, limit):
    """Issue 22 item 16: --seq 1 followed by 400 zeros was an internal error (a float
    division of the IO model); every size option now has a range, and the library refuses
    the same sizes."""
    assert_usage_error(invoke("attention", "--io", option, HUGE), f"'{option}'",
                       f"1<=x<={limit}")
    room = ["--sram", "1099511627776"] if option == "--dim" else []  # 4 d elements of SRAM
    doc = json_of("attention", "--io", option, limit, *room)
    assert doc["io"]["flash_bytes"] > 0


def test_the_io_model_refuses_sizes_beyond_its_limits_and_prints_the_largest():
    from fmtcli.base.errors import UsageError

    with pytest.raises(UsageError, match="seq=a 401-digit number must be from 1 to 16,777,216"):
        io_model(1, 1, int(HUGE), 64)
    with pytest.raises(UsageError, match="block_k=0 must be from 1"):
        io_model(1, 1, 64, 64, block_k=0)
    largest = ["--io", "--batch", "1048576", "--heads", "65536", "--seq", "16777216",
               "--dim", "65536", "--block-k", "1", "--sram", "1099511627776"]
    for width in (80, 120):
        assert_fits(succeeds("attention", *largest, env={"COLUMNS": str(width)}).stdout, width)
    doc = json_of("attention", *largest)
    n, d, pairs = 1 << 24, 1 << 16, 1 << 36  # Algorithm 0's count, exact integers
    assert doc["io"]["standard_bytes"] == (4 * n * d + 4 * n * n) * pairs * 2


def _files(tmp_path, q, k, v):
    for name, x in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", x)
    return [tmp_path / f"{name}.npy" for name in "qkv"]


@pytest.mark.slow
def test_finite_inputs_never_give_nan_figures(tmp_path):
    """Issue 22 item 11: float64 inputs of 1e300 gave RMSE "nan" (exit 0) with five numpy
    RuntimeWarning notes.  What cannot be computed is refused in one DataError line naming
    the input and what overflowed, before any work; nothing else reaches stderr."""
    x = np.full((4, 8), 1e300)
    result = assert_data_error(invoke("attention", *_files(tmp_path, x, x, x)),
                               "q.npy) holds 1e+300 at [0, 0, 0, 0]", "float32's range")
    assert "Warning" not in result and "Note" not in result
    big = np.full((4, 8), 1e5)  # fine in float32, beyond float16's 65504 (cast, no scale)
    assert_data_error(invoke("attention", *_files(tmp_path, big / 1e5, big / 1e5, big)),
                      "v.npy) holds 100000", "beyond float16's range (max 65504)")
    # inputs that float16 holds, scores Q K^T / sqrt(d) of 300 * 300 * 8 / sqrt(8) it does not
    q = np.full((4, 8), 300.0)
    assert_data_error(invoke("attention", *_files(tmp_path, q, q, q)),
                      "the scores Q K^T / sqrt(d) reach 2.55e+05", "standard attention "
                      "stores S")
    # FP8 keeps its softmax in float16 for standard attention: the same limit
    assert_data_error(invoke("attention", *_files(tmp_path, q, q, q), "--format", "e4m3fn"),
                      "beyond float16's range")
    # float32 inputs near its max: Q K^T overflows float32 itself
    q = np.full((4, 8), 1e20)
    assert_data_error(invoke("attention", *_files(tmp_path, q, q, q), "--format", "float32"),
                      "beyond float32's range", "before the 1/sqrt(d)")
    # the outliers of random inputs beyond a narrow custom format's max (e3m6: 15.9)
    assert_data_error(invoke("attention", "--seq", "64", "--heads", "1", "--format", "e3m6",
                             "--outliers", "0.05"), "(random)", "e3m6's range")


def test_a_float32_accumulator_that_overflows_is_refused():
    """The blockwise method's acc sums P~ V over the keys before dividing by l (<= N_k):
    V near float32's max with equal scores overflows it; the library refuses, naming it."""
    from fmtcli.base.errors import DataError

    q = np.zeros((1, 1, 64, 8))
    v = np.full((1, 1, 64, 8), 3e38)
    with pytest.raises(DataError, match="blockwise attention's float32 accumulator"):
        A.attention_accuracy(q, q, v, F32, block_q=8, block_k=64)


@pytest.mark.slow
def test_tiny_and_zero_inputs_give_finite_figures(tmp_path):
    for x in (np.zeros((6, 8)), np.full((6, 8), 1e-300), np.full((6, 8), 1e-40)):
        for fmt in ("float16", "e4m3fn", "float32"):
            doc = json_of("attention", *_files(tmp_path, x, x, x), "--format", fmt)
            for row in doc["accuracy"]:
                assert all(isinstance(row[key], float) and math.isfinite(row[key])
                           for key in ("rmse", "max_abs_error", "max_rel_error")), (fmt, row)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragments"), [
    (["--seq", "4096", "--dim", "16384", "--heads", "1"],
     ["would hold about 4.8 GiB", "limit of 3 GiB", "--io"]),
    (["--seq", "2048", "--dim", "8192", "--heads", "2"],
     ["would take about", "683 key blocks of 3", "limit of 60 s", "larger --block-k"]),
    (["--seq", "8192", "--heads", "16", "--dim", "16"],
     ["would take about", "1,073,741,824 scores", "limit of 60 s"]),
    (["--batch", "64", "--heads", "16", "--seq", "1024"], ["GiB", "limit of 3 GiB"]),
    (["--seq", "16384", "--heads", "1"], ["GiB"]),
])
def test_shapes_that_would_not_finish_are_refused_with_the_estimate(args, fragments):
    """Issue 22 item 17: --seq 4096 --dim 16384 --heads 1 (2**26 elements of Q, within the
    old limits) ran 142 s, then out of memory: Algorithm 1's B_c for d = 16384 is 2 keys,
    2,048 passes over Q and O.  The time and memory are estimated first (attention.budget)
    and a run beyond a minute on two cores or 3 GiB is refused, saying both."""
    assert_usage_error(invoke("attention", *args), *fragments)
    assert succeeds("attention", "--io", *args).stdout


def test_files_too_large_to_hold_are_refused_before_they_are_read(tmp_path):
    """Q, K, V files are read as float64: files of 3 x 2**26 elements (float16 on disk,
    sparse) would hold 4.5 GiB before the shape's estimate; refused from their headers."""
    path = tmp_path / "x.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(16, 4096, 1024))
    assert_usage_error(invoke("attention", path, path, path), "201,326,592 elements",
                       "limit of 3 GiB")


@pytest.mark.slow
def test_the_estimate_is_near_what_a_run_takes():
    """The estimate's memory against the peak of a real run in a fresh process (a 1x1x2048x64
    float16 run: one head's 4M scores), within a factor of two either way."""
    import os
    import subprocess
    import sys

    from fmtcli.attention.budget import estimate

    code = ("import re; from fmtcli.attention.report import analyse_attention;"
            "from fmtcli.numerics.formats import get_format;"
            "analyse_attention(get_format('float16'), batch=1, heads=1, seq=2048, dim=64);"
            "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])")
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak is read from /proc (Linux)")
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec)
    peak = 1024 * int(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, check=True, timeout=300).stdout)
    guess = estimate(1, 1, 2048, 2048, 64, get_format("float16"), 384).bytes
    assert 0.5 < guess / peak < 2, (guess, peak)


@pytest.mark.slow
def test_inputs_from_files(tmp_path):
    q, k, v = small(b=1, h=2, n=24, d=8)
    for name, x in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", x[0].astype(np.float32))
    doc = json_of("attention", tmp_path / "q.npy", tmp_path / "k.npy", tmp_path / "v.npy",
                  "--format", "float32")
    assert (doc["settings"]["heads"], doc["settings"]["seq"], doc["settings"]["dim"]) == \
        (2, 24, 8)
    assert doc["accuracy"][1]["max_abs_error"] < 1e-6
    from safetensors.numpy import save_file

    save_file({"value": v[0, 0].astype(np.float32), "query": q[0, 0].astype(np.float32),
               "key": k[0, 0].astype(np.float32)}, str(tmp_path / "qkv.safetensors"))
    doc = json_of("attention", tmp_path / "qkv.safetensors", "--format", "float32")
    assert doc["accuracy"][0]["max_abs_error"] < 1e-6  # q, k, v found by name
    np.save(tmp_path / "short.npy", k[0, :, :20].astype(np.float32))
    assert_data_error(invoke("attention", tmp_path / "q.npy", tmp_path / "short.npy",
                             tmp_path / "v.npy"), "K and V differ in shape")
    assert_data_error(invoke("attention", tmp_path / "q.npy", tmp_path / "k.npy"),
                      "three tensors")
    assert_usage_error(invoke("attention", tmp_path / "q.npy", tmp_path / "k.npy",
                              tmp_path / "v.npy", "--seq", "8"), "--seq")


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--hadamard", "--dim", "48"], "--hadamard needs --dim a power of two, got 48"),
    (["--format", "fp7"], "unknown format"),
    (["--format", "fp16,bf16"], "one format"),
    (["--format", "e8m0"], "--format float8_e8m0fnu is a scale format"),
    (["--seq", "0"], "--seq"),
    (["--outliers", "2"], "--outliers"),
    (["--outliers", "nan", "--io"], "--outliers nan is a fraction"),
    (["--scale-granularity", "row"], "--scale-granularity"),
    (["--sram", "100"], "--sram 100"),
    (["--device", "cpu", "--time"], "--time"),
    (["--io", "--time"], "--io"),
    (["--seq", "100000", "--heads", "64"], "--io"),
])
def test_usage_errors(args, fragment):
    assert_usage_error(invoke("attention", *args), fragment)


def test_time_without_cuda_is_one_line():
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is here")
    except ImportError:
        pass
    line = assert_usage_error(invoke("attention", "--time", "--seq", "32"), "CUDA")
    assert "--device cuda" in line or "torch" in line


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", [
    ["--seq", "128", "--heads", "2", "--format", "e4m3fn", "--hadamard", "--outliers", "0.01"],
    ["--io", "--batch", "64", "--heads", "16", "--seq", "1024"],
    ["--seq", "64", "--heads", "1", "--causal", "--format", "bf16"],
], ids=["fp8", "io-gpt2", "causal"])
def test_tables_fit(width, args):
    out = succeeds("attention", *args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    assert "IO model" in out
    if "--io" not in args:
        doc = json_of("attention", *args)
        for row in doc["accuracy"]:
            assert f"{row['rmse']:.3g}" in out


# -- CUDA ----------------------------------------------------------------------------------


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a CUDA GPU")
def test_sdpa_backends_on_cuda():
    doc = json_of("attention", "--time", "--seq", "512", "--heads", "4", "--format", "float16")
    rows = {r["backend"]: r for r in doc["timing"]}
    assert {"math", "flash", "efficient"} <= set(rows)
    assert doc["settings"]["gpu"]
    for row in rows.values():
        if row["available"]:
            assert row["ms"] > 0 and row["peak_bytes"] >= 0
            assert row["rmse"] < 1e-3  # fp16 attention of N(0, 1) inputs
    assert rows["math"]["available"]
    if rows["flash"]["available"]:  # the fused kernel never holds S: far less memory
        assert rows["flash"]["peak_bytes"] < rows["math"]["peak_bytes"]


@pytest.mark.parametrize("width", [80, 120])
def test_timing_table_fits_without_a_gpu(width):
    """The GPU section as it renders on a GPU machine (figures of an H200 run), a backend
    that could not run included: it fits the width uncut."""
    import io as text_io

    from rich.console import Console

    from fmtcli.attention.report import AttentionResult, AttentionSettings
    from fmtcli.attention.timing import TimingRow
    from fmtcli.render import render

    rows = (TimingRow("math", "float16", True, None, 19.978, 6.9, 10_800_000_000, 4.82e-5,
                      0.00195, 0.00141),
            TimingRow("flash", "float16", True, None, 0.702, 195.8, 138_000_000, 5.16e-5,
                      0.00195, 0.00141),
            TimingRow("cudnn", "float16", False, "Memory efficient kernel not used because: "
                      "a very long reason from torch " * 4))
    settings = AttentionSettings(64, 16, 1024, 1024, 64, True, "float16", "block", False, 0.0,
                                 0, device="cuda", gpu="NVIDIA H200")
    result = AttentionResult(settings, io_model(64, 16, 1024, 64), (), rows)
    out = text_io.StringIO()
    Console(file=out, width=width).print(render(result))
    text = out.getvalue()
    assert_fits(text, width)
    assert "19.978" in text and "not available" in text
