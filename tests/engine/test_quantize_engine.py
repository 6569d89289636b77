"""The chunked quantization engine (``fmtcli.quantize.quantize``), checked against an
independent brute-force reference (``oracle``), across chunkings and worker
counts, on special values, and -- in a subprocess under a memory cap -- for streaming.
"""

from __future__ import annotations

import glob
import math
import os
import resource
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest
from cli_helpers import parallel_kwargs
from oracle import (
    assert_matches_reference,
    assert_scales_match,
    heavy_tailed,
    ref_nvfp4,
    ref_quantize,
)

from fmtcli.base.errors import DataError
from fmtcli.inputs.tensors import TensorSource, load_inputs
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity, build_scheme
from fmtcli.quantize import quantize

BIG = 10 ** 9
T = Granularity.TENSOR

# (id, build_scheme kwargs, tile of the reference, format, rule)
SCHEMES = [
    ("per-tensor", dict(per=Granularity.TENSOR), (BIG, BIG), "float8_e4m3fn", "amax"),
    ("per-row", dict(per=Granularity.ROW), (1, BIG), "float8_e4m3fn", "amax"),
    ("per-column", dict(per=Granularity.COLUMN), (BIG, 1), "float8_e4m3fn", "amax"),
    ("block-128", dict(block=128), (1, 128), "float8_e4m3fn", "amax"),
    ("block-100-ragged", dict(block=100), (1, 100), "float8_e4m3fn", "amax"),
    ("block-32-axis0", dict(block=32, axis=0), (32, 1), "float8_e4m3fn", "amax"),
    ("tile-128x128", dict(tile="128x128"), (128, 128), "float8_e4m3fn", "amax"),
    ("tile-1x128", dict(tile="1x128"), (1, 128), "float8_e4m3fn", "amax"),
    ("tile-7x5", dict(tile="7x5"), (7, 5), "float8_e4m3fn", "amax"),
    ("mxfp8", dict(recipe="mxfp8"), (1, 32), "float8_e4m3fn", "mx-floor"),
    ("mxfp6", dict(recipe="mxfp6"), (1, 32), "float6_e2m3fn", "mx-floor"),
    ("mxfp4", dict(recipe="mxfp4"), (1, 32), "float4_e2m1fn", "mx-floor"),
    ("rowwise", dict(recipe="rowwise"), (1, BIG), "float8_e4m3fn", "pow2-floor"),
    ("e5m2-block-64", dict(block=64), (1, 64), "float8_e5m2", "amax"),
    ("margin-2", dict(block=64, margin=2), (1, 64), "float8_e4m3fn", "amax"),
    ("mx-rceil", dict(block=32, scale_rule=ScaleRule.MX_RCEIL), (1, 32), "float8_e4m3fn",
     "mx-rceil"),
]


def scheme_params(*names):
    """pytest params (named by id) of the SCHEMES listed, or all of them."""
    return [pytest.param(*case, id=case[0]) for case in SCHEMES if not names or case[0] in names]


def source(x, key=None, name="mem") -> TensorSource:
    x = np.asarray(x)
    return TensorSource(name, key, x.shape, str(x.dtype), lambda: x)


def scheme_of(kwargs, fmt):
    from fmtcli.numerics.formats import get_format

    if fmt != "float8_e4m3fn" and "recipe" not in kwargs:
        kwargs = dict(kwargs, format=get_format(fmt))
    return build_scheme(**kwargs)


def run(x, schemes, key=None, chunk=None, workers=1) -> list[dict]:
    kwargs = parallel_kwargs(workers)
    if chunk is not None:
        kwargs["chunk_elements"] = chunk
    result = quantize([source(x, key)], list(schemes), **kwargs)
    return result.to_dict()["tensors"][0]["schemes"]


def matrix_2d():
    rng = np.random.default_rng(11)
    x = heavy_tailed(rng, (300, 260))
    x[5, :128] = 0.0          # an all-zero block of 128 (and row segment)
    x[7:9, :] = 0.0           # all-zero rows
    x[:, 3] = 0.0             # an all-zero column
    x[10, 10] = -0.0
    return x


# -- every scheme against the brute-force reference -------------------------------------------

@pytest.mark.parametrize("name, kwargs, tile, fmt, rule", scheme_params())
def test_scheme_matches_reference_on_a_matrix(name, kwargs, tile, fmt, rule):
    x = matrix_2d()
    (stats,) = run(x, [scheme_of(kwargs, fmt)])
    xq, grid, saturated, overflowed = ref_quantize(x, tile, fmt, rule,
                                                   margin=kwargs.get("margin", 0))
    assert_matches_reference(stats, x, xq, saturated, overflowed, name)
    assert_scales_match(stats["scales"], grid, name)


@pytest.mark.parametrize("name, kwargs, tile, fmt, rule", scheme_params(
    "per-tensor", "per-column", "block-32-axis0", "tile-128x128", "block-100-ragged"))
def test_scheme_uses_the_matrix_view_of_a_3d_tensor(name, kwargs, tile, fmt, rule):
    x = heavy_tailed(np.random.default_rng(12), (3, 70, 130))
    (stats,) = run(x, [scheme_of(kwargs, fmt)])
    xq, grid, saturated, overflowed = ref_quantize(x, tile, fmt, rule)
    assert_matches_reference(stats, x, xq, saturated, overflowed, name)
    assert_scales_match(stats["scales"], grid, name)


def test_nvfp4_matches_reference_on_a_matrix():
    x = matrix_2d()
    (stats,) = run(x, [build_scheme(recipe="nvfp4")])
    xq, grid = ref_nvfp4(x)
    assert_matches_reference(stats, x, xq, what="nvfp4")
    assert_scales_match(stats["scales"], grid, "nvfp4")


def test_ragged_last_block_is_a_smaller_block():
    # 10 values in blocks of 4: the last block holds 2 values and gets its own amax
    x = np.array([1, 2, 3, 4, 100, 200, 300, 400, 0.001, 0.002], dtype=np.float32)
    (stats,) = run(x, [build_scheme(block=4)])
    assert stats["scales"]["count"] == 3
    assert stats["scales"]["max"] == np.float32(448 / np.float64(np.float32(0.002)))
    assert stats["flushed"] == 0
    xq, grid, _, _ = ref_quantize(x, (1, 4))
    assert_matches_reference(stats, x, xq, 0, 0, "ragged")


def test_one_dimensional_tensor_blocks_run_along_its_only_axis():
    x = heavy_tailed(np.random.default_rng(13), (1000,))
    (stats,) = run(x, [build_scheme(block=128)])
    assert stats["scales"]["count"] == 8
    xq, grid, sat, ov = ref_quantize(x, (1, 128))
    assert_matches_reference(stats, x, xq, sat, ov, "1-D block 128")


def test_axis_0_blocks_of_a_one_dimensional_tensor_run_along_it():
    x = heavy_tailed(np.random.default_rng(13), (1000,))
    (stats,) = run(x, [build_scheme(block=128, axis=0)])
    # axis 0 *is* the only axis: 8 blocks of 128 (the last one ragged), as with axis -1
    assert stats["scales"]["count"] == 8


def test_deepseek_uses_weight_tiles_only_for_2d_weights():
    rng = np.random.default_rng(14)
    w = heavy_tailed(rng, (300, 260))
    scheme = build_scheme(recipe="deepseek")
    for key, x, tile in [("layers.0.mlp.weight", w, (128, 128)),
                         ("layers.0.mlp.bias", w[0], (1, 128)),
                         ("activations", w, (1, 128)),
                         ("norm.weight", w[0], (1, 128))]:  # 1-D: not a weight matrix
        (stats,) = run(x, [scheme], key=key)
        assert stats["tile"] == list(tile), (key, stats["tile"])
        assert stats["recipe"] == "deepseek"
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, key)
        assert_scales_match(stats["scales"], grid, key)


# -- special values ---------------------------------------------------------------------------

def test_all_zero_tensor_is_defined():
    x = np.zeros((64, 256), dtype=np.float32)
    schemes = [build_scheme(per=T), build_scheme(block=128), build_scheme(recipe="mxfp8"),
               build_scheme(recipe="nvfp4"), build_scheme(per=Granularity.COLUMN)]
    for stats in run(x, schemes):
        assert stats["count"] == x.size and stats["nonzero"] == 0, stats["label"]
        assert stats["flushed"] == 0 and stats["flushed_fraction"] == 0.0
        assert stats["max_abs_error"] == 0.0 and stats["rmse"] == 0.0
        assert stats["nan_produced"] == 0 and stats["saturated"] == 0
        assert stats["scales"]["min"] == stats["scales"]["max"] == 1.0, stats["label"]


def test_all_zero_blocks_get_scale_one_and_no_error():
    x = np.ones((4, 256), dtype=np.float32)
    x[0, :128] = 0
    x[3, 128:] = 0
    (stats,) = run(x, [build_scheme(block=128)])
    assert stats["scales"]["count"] == 8
    assert stats["scales"]["min"] == 1.0 and stats["scales"]["max"] == 448.0
    assert stats["flushed"] == 0 and stats["max_abs_error"] == 0.0
    assert stats["zeros"] == 256 and stats["nonzero"] == 768


def special_values():
    x = heavy_tailed(np.random.default_rng(15), (16, 256), spread=1.0)
    x[0, 3] = np.nan
    x[1, 200] = np.inf
    x[2, 7] = -np.inf
    x[3, 0] = 1000.0  # mx-floor saturates this one
    return x


@pytest.mark.parametrize("name, kwargs, tile, fmt, rule", scheme_params(
    "per-tensor", "per-row", "block-128", "mxfp8", "mxfp4", "tile-7x5"))
def test_nan_and_inf_inputs_are_counted_not_fatal(name, kwargs, tile, fmt, rule):
    x = special_values()
    (stats,) = run(x, [scheme_of(kwargs, fmt)])
    assert stats["nonfinite_inputs"] == 3
    xq, grid, saturated, overflowed = ref_quantize(x, tile, fmt, rule)
    assert_matches_reference(stats, x, xq, saturated, overflowed, name)
    assert stats["nan_produced"] > 0  # a NaN or inf amax poisons its tile, as in torch
    assert stats["scales"]["nan"] == int(np.isnan(grid).sum())


def test_overflow_ieee_counts_overflowed_values_as_nan():
    x = special_values()
    x[0, 3] = 1.0  # keep only the infinities and the saturating 1000
    x[1, 200] = 2.0
    x[2, 7] = 3.0
    scheme = build_scheme(block=32, scale_rule=ScaleRule.MX_FLOOR, overflow="ieee")
    (stats,) = run(x, [scheme])
    xq, grid, saturated, overflowed = ref_quantize(x, (1, 32), rule="mx-floor", overflow="ieee")
    assert overflowed > 0 and saturated == 0
    assert_matches_reference(stats, x, xq, saturated, overflowed, "ieee")
    assert stats["nan_produced"] == overflowed
    (sat_stats,) = run(x, [build_scheme(block=32, scale_rule=ScaleRule.MX_FLOOR)])
    assert sat_stats["saturated"] == overflowed and sat_stats["overflowed"] == 0


def test_float16_bfloat16_and_float8_inputs_are_widened_exactly():
    import ml_dtypes

    base = heavy_tailed(np.random.default_rng(16), (64, 160), spread=1.0)
    for dtype in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2):
        x = base.astype(dtype)
        (stats,) = run(x, [build_scheme(block=32)])
        wide = x.astype(np.float32)
        xq, grid, sat, ov = ref_quantize(wide, (1, 32))
        assert_matches_reference(stats, wide, xq, sat, ov, str(np.dtype(dtype)))


# -- chunking and workers ----------------------------------------------------------------------

EXACT = ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "flushed_fraction",
         "saturated", "overflowed", "nan_produced", "max_abs_error", "median_rel_error",
         "p99_rel_error", "scales")
CLOSE = ("rmse", "sqnr_db")


def assert_same_statistics(a: dict, b: dict, what: str) -> None:
    for key in EXACT:
        assert a[key] == b[key], (what, a["label"], key, a[key], b[key])
    for key in CLOSE:
        assert math.isclose(float(a[key]), float(b[key]), rel_tol=1e-5), (what, key, a[key], b[key])
    tol = 1e-5 * max(float(a["rmse"]), 1e-30)
    assert abs(float(a["bias"]) - float(b["bias"])) <= tol, (what, a["bias"], b["bias"])


CHUNK_SCHEMES = [build_scheme(per=T), build_scheme(per=Granularity.COLUMN),
                 build_scheme(per=Granularity.ROW), build_scheme(block=128),
                 build_scheme(block=100), build_scheme(block=32, axis=0),
                 build_scheme(tile="128x128"), build_scheme(tile="3x40"),
                 build_scheme(recipe="mxfp8"), build_scheme(recipe="nvfp4"),
                 build_scheme(recipe="mxfp4")]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(700, 300), (60000,), (5, 9, 300)], ids=str)
def test_statistics_do_not_depend_on_chunking_or_workers(shape):
    x = heavy_tailed(np.random.default_rng(17), shape)
    x.reshape(-1)[::997] = 0.0
    whole = run(x, CHUNK_SCHEMES, chunk=1 << 30, workers=1)
    for chunk, workers in [(1024, 1), (1024, 2), (5000, 2)]:
        pieces = run(x, CHUNK_SCHEMES, chunk=chunk, workers=workers)
        for a, b in zip(whole, pieces):
            assert_same_statistics(a, b, f"{shape} chunk={chunk} workers={workers}")


def test_chunked_one_dimensional_tensor_matches_the_reference():
    # longer than a chunk: chunks run along its single row
    x = heavy_tailed(np.random.default_rng(18), (50_000,))
    schemes = [build_scheme(per=T), build_scheme(block=128), build_scheme(block=100)]
    got = run(x, schemes, chunk=1024, workers=2)
    for stats, tile in zip(got, [(1, BIG), (1, 128), (1, 100)]):
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, stats["label"])
        assert_scales_match(stats["scales"], grid, stats["label"])


def test_per_tensor_scheme_on_a_long_1d_tensor_works_in_chunk_sized_memory():
    # Regression guard: a tile spanning the whole row must not pad every chunk to the
    # whole row (work and memory quadratic in the length).
    n, chunk = 1 << 22, 1 << 15
    x = np.random.default_rng(19).standard_normal(n).astype(np.float32)
    scheme = build_scheme(per=T)
    run(x[:chunk * 2], [scheme], chunk=chunk, workers=1)  # warm caches
    tracemalloc.start()
    try:
        start = time.perf_counter()
        run(x, [scheme], chunk=chunk, workers=1)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 2, f"peak {peak / 2**20:.0f} MiB for a {x.nbytes / 2**20:.0f} MiB tensor"
    assert elapsed < 20


def test_npy_file_reads_the_same_as_memory(tmp_path):
    x = heavy_tailed(np.random.default_rng(20), (333, 200))
    np.save(tmp_path / "x.npy", x)
    (src,) = load_inputs([str(tmp_path / "x.npy")])
    assert isinstance(src.array(), np.memmap)
    schemes = [build_scheme(per=T), build_scheme(block=64)]
    from_file = quantize([src], schemes, chunk_elements=4096, **parallel_kwargs(2))
    from_file = from_file.to_dict()["tensors"][0]["schemes"]
    for a, b in zip(run(x, schemes), from_file):
        assert_same_statistics(a, b, "npy")


def test_several_tensors_give_a_consistent_total():
    rng = np.random.default_rng(21)
    xs = [heavy_tailed(rng, (50, 128)), heavy_tailed(rng, (300,)), heavy_tailed(rng, (7, 8, 9))]
    sources = [source(x, key=f"t{i}") for i, x in enumerate(xs)]
    result = quantize(sources, [build_scheme(per=T), build_scheme(block=32)],
                      **parallel_kwargs(2)).to_dict()
    assert len(result["tensors"]) == 3 and len(result["total"]) == 2
    for i, total in enumerate(result["total"]):
        parts = [t["schemes"][i] for t in result["tensors"]]
        assert total["count"] == sum(p["count"] for p in parts) == sum(x.size for x in xs)
        assert total["flushed"] == sum(p["flushed"] for p in parts)
        assert total["max_abs_error"] == max(p["max_abs_error"] for p in parts)
        mse = sum(p["rmse"] ** 2 * p["count"] for p in parts) / total["count"]
        assert math.isclose(total["rmse"], math.sqrt(mse), rel_tol=1e-9)
        assert total["scales"]["count"] == sum(p["scales"]["count"] for p in parts)
        # the total's quantiles come from the pooled errors
        x = np.concatenate([x.reshape(-1) for x in xs])
        xq = np.concatenate([
            ref_quantize(x_, (BIG, BIG) if i == 0 else (1, 32))[0].reshape(-1) for x_ in xs])
        assert_matches_reference(total, x, xq, what=f"total {i}")


def test_a_file_truncated_while_reading_is_a_data_error_and_leaves_no_output(tmp_path):
    x = np.random.default_rng(22).standard_normal((512, 256)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    sources = load_inputs([str(path)])
    with open(path, "r+b") as handle:  # shrink it after it was opened
        handle.truncate(os.path.getsize(path) // 2)
    out = tmp_path / "out.npy"
    with pytest.raises((DataError, OSError)):
        quantize(sources, [build_scheme(block=128)], chunk_elements=4096, out=str(out),
                 **parallel_kwargs(2))
    assert not out.exists()
    assert glob.glob(str(tmp_path / ".fmtcli-*")) == []


# -- streaming under a memory cap ----------------------------------------------------------

STREAM_ROWS, STREAM_COLS = 73_728, 1024  # 288 MiB of float32


def _run_capped(args, cap_bytes, timeout=120):
    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (cap_bytes, cap_bytes))

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          preexec_fn=limit, timeout=timeout)


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "big.npy"
    rng = np.random.default_rng(23)
    with open(path, "wb") as handle:  # written in pieces: this process never holds it all
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (STREAM_ROWS, STREAM_COLS)})
        for _ in range(0, STREAM_ROWS, 8192):
            handle.write(rng.standard_normal((8192, STREAM_COLS), dtype=np.float32).tobytes())
    yield path
    path.unlink()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA semantics are Linux's")
def test_STREAMING_a_checkpoint_larger_than_the_memory_cap(big_npy):
    """STREAMING: `fmt quantize` must read a large .npy chunk by chunk.

    RLIMIT_DATA (Linux >= 4.7) caps private writable memory -- heap, anonymous maps, thread
    stacks -- but not read-only file maps, so a memory-mapped input does not count and an
    in-memory copy of it does.  Cap: 200 MiB for a 288 MiB file.  The test first proves the
    cap bites (a bare import fits; reading the file whole does not) and then runs the
    command under it.
    """
    size = os.path.getsize(big_npy)
    cap = 200 << 20
    assert size > cap + (64 << 20)
    baseline = _run_capped(["-m", "fmtcli", "--version"], cap)
    assert baseline.returncode == 0, baseline.stderr
    whole = _run_capped(["-c", f"import numpy as np; a = np.fromfile({str(big_npy)!r}, "
                                "dtype=np.uint8); print(a.size)"], cap)
    assert whole.returncode != 0 and "MemoryError" in whole.stderr + whole.stdout, \
        "the cap does not stop a program that reads the file whole"
    start = time.monotonic()
    proc = _run_capped(["-m", "fmtcli", "quantize", str(big_npy), "--json", "--compare", "none"],
                       cap)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    doc = json.loads(proc.stdout)
    stats = doc["tensors"][0]["schemes"][0]
    assert stats["count"] == STREAM_ROWS * STREAM_COLS
    assert stats["scales"]["count"] == STREAM_ROWS * STREAM_COLS // 128
    assert 0.005 < stats["median_rel_error"] < 0.05
    assert elapsed < 60


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA semantics are Linux's")
def test_STREAMING_per_tensor_and_safetensors_under_the_cap(big_npy, tmp_path):
    """STREAMING: the default comparison (per-tensor needs a first amax pass) on a
    .safetensors copy of the same data, under the same cap."""
    path = tmp_path / "big.safetensors"
    header = {"w": {"dtype": "F32", "shape": [STREAM_ROWS, STREAM_COLS],
                    "data_offsets": [0, STREAM_ROWS * STREAM_COLS * 4]}}
    raw = __import__("json").dumps(header).encode()
    raw += b" " * ((-len(raw)) % 8)
    with open(big_npy, "rb") as src, open(path, "wb") as dst:
        np.lib.format.read_magic(src)
        np.lib.format.read_array_header_1_0(src)
        dst.write(len(raw).to_bytes(8, "little") + raw)
        while block := src.read(32 << 20):
            dst.write(block)
    proc = _run_capped(["-m", "fmtcli", "quantize", str(path), "--json"], 200 << 20)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    per_tensor, block = json.loads(proc.stdout)["tensors"][0]["schemes"]
    assert per_tensor["granularity"] == "tensor" and block["block"] == 128
    assert per_tensor["count"] == block["count"] == STREAM_ROWS * STREAM_COLS
    path.unlink()


def test_tiles_taller_than_the_tensor_span_all_its_rows():
    # rows <= tile rows: the tile spans every row (its amax needs the first pass)
    x = heavy_tailed(np.random.default_rng(24), (100, 300))
    cases = [("tile 128x128", build_scheme(tile="128x128"), (128, 128)),
             ("tile 256x7", build_scheme(tile="256x7"), (256, 7)),
             ("block 200 axis 0", build_scheme(block=200, axis=0), (200, 1))]
    got = run(x, [c[1] for c in cases], chunk=1024, workers=2)
    for (name, _, tile), stats in zip(cases, got):
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, name)
        assert_scales_match(stats["scales"], grid, name)


def test_nvfp4_with_nan_and_inf_matches_the_reference():
    x = special_values()
    (stats,) = run(x, [build_scheme(recipe="nvfp4")], chunk=1024, workers=2)
    xq, grid = ref_nvfp4(x)
    assert stats["nonfinite_inputs"] == 3
    assert_matches_reference(stats, x, xq, what="nvfp4 nan/inf")


@pytest.mark.parametrize("kwargs", [dict(per=T), dict(block=128), dict(recipe="nvfp4"),
                                    dict(block=128, scale_rule=ScaleRule.POW2_FLOOR)],
                         ids=["per-tensor", "block", "nvfp4", "pow2-floor"])
def test_tiny_but_normal_values_get_a_finite_scale(kwargs):
    import warnings

    x = (np.random.default_rng(25).standard_normal((4, 256)) * 1e-37).astype(np.float32)
    assert np.abs(x[x != 0]).min() < 1e-38 < 1e-37 < np.abs(x).max()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning either
        (stats,) = run(x, [build_scheme(**kwargs)])
    assert math.isfinite(float(stats["scales"]["max"])), stats["scales"]
    assert stats["saturated"] == 0
    # no worse than the same data at an ordinary size (NVFP4 flushes ~7% of Gaussian data
    # anyway: values below 1/24 of their block's amax)
    (normal,) = run(x * np.float32(1e37), [build_scheme(**kwargs)])
    assert stats["flushed_fraction"] <= normal["flushed_fraction"] + 0.01, (
        stats["flushed_fraction"], normal["flushed_fraction"])


# -- memory of the first pass ------------------------------------------------------------------

RSS_SCRIPT = textwrap.dedent("""
    import runpy, sys
    sys.argv = ["fmtcli", *sys.argv[1:]]
    try:
        runpy.run_module("fmtcli", run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    else:
        code = 0
    # VmHWM: this process image's peak resident memory (ru_maxrss would carry the peak of
    # the parent that forked it over exec)
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print("MAXRSS_KB", peak, file=sys.stderr)
    sys.exit(code)
""")


def _max_rss_kb(args) -> int:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, *args], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])


@pytest.fixture(scope="module")
def wide_npy(tmp_path_factory):
    # 64 rows of 262144: every chunk is one row (the last dimension is a whole chunk)
    path = tmp_path_factory.mktemp("wide") / "wide.npy"
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (64, 1 << 18)})
        rng = np.random.default_rng(26)
        for _ in range(8):
            handle.write(rng.standard_normal((8, 1 << 18), dtype=np.float32).tobytes())
    yield path
    path.unlink()


def _assert_memory_does_not_grow_with_the_tensor(path, args):
    size_kb = os.path.getsize(path) // 1024
    # a bare start of the engine: the built-in example (1025 values) through the same code
    baseline = _max_rss_kb(["quantize", *args, "--compare", "none", "--json"])
    used = _max_rss_kb(["quantize", str(path), *args, "--compare", "none", "--json"])
    assert used - baseline < size_kb // 2, \
        f"{' '.join(args)}: {used - baseline} KiB above a bare start for a {size_kb} KiB tensor"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("args", [("--per", "row"), ("--per", "tensor"), ("--block", "128")],
                         ids=lambda a: "-".join(a))
def test_STREAMING_wide_matrix_memory(wide_npy, args):
    _assert_memory_does_not_grow_with_the_tensor(wide_npy, args)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_STREAMING_wide_matrix_memory_per_column(wide_npy):
    _assert_memory_does_not_grow_with_the_tensor(wide_npy, ("--per", "column"))
