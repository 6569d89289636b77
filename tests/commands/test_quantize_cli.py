"""``fmt quantize`` through the command line (typer's CliRunner, stdout and stderr apart).

Figures are checked against ``oracle`` (numpy + ml_dtypes brute force) and the
article's example, never against fmtcli's own library output alone.
"""

from __future__ import annotations

import glob
import json
import math
import os
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_no_traceback,
    assert_usage_error,
    invoke,
    only_scheme,
    parallel_option,
    quantize_json,
    strict_loads,
)
from oracle import (
    REL_RES,
    assert_matches_reference,
    assert_scales_match,
    heavy_tailed,
    read_safetensors,
    ref_nvfp4,
    ref_quantize,
    write_safetensors,
)

from fmtcli.inputs.tensors import example_tensor
from fmtcli.numerics.schemes import RECIPES

BIG = 10 ** 9
STAT_KEYS = {"granularity", "block", "scale_rule", "flushed_fraction", "median_rel_error",
             "p99_rel_error", "max_abs_error", "rmse", "sqnr_db", "saturated", "count",
             "nonzero", "flushed", "overflowed", "nan_produced", "bias", "scales"}
SCALE_KEYS = {"min", "max", "distinct", "count"}
RECIPE_ORDER = ["tensorwise", "rowwise", "deepseek", "mxfp8", "mxfp6", "mxfp4", "nvfp4"]
# recipe -> (reference tile for a 2-D tensor without a 'weight' key, format, rule)
RECIPE_REF = {
    "tensorwise": ((BIG, BIG), "float8_e4m3fn", "amax"),
    "rowwise": ((1, BIG), "float8_e4m3fn", "pow2-floor"),
    "deepseek": ((1, 128), "float8_e4m3fn", "amax"),
    "mxfp8": ((1, 32), "float8_e4m3fn", "mx-floor"),
    "mxfp6": ((1, 32), "float6_e2m3fn", "mx-floor"),
    "mxfp4": ((1, 32), "float4_e2m1fn", "mx-floor"),
}


@pytest.fixture
def matrix(tmp_path) -> tuple[Path, np.ndarray]:
    x = heavy_tailed(np.random.default_rng(31), (200, 300))
    x[4, :128] = 0.0
    path = tmp_path / "m.npy"
    np.save(path, x)
    return path, x


def temp_leftovers(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), ".fmtcli-*"))


# -- the article's example --------------------------------------------------------------------

def test_article_example_without_a_file():
    doc = quantize_json()
    (tensor,) = doc["tensors"]
    assert tensor["shape"] == [1025] and tensor["source"] == "<built-in example>"
    per_tensor, block = tensor["schemes"]
    assert per_tensor["granularity"] == "tensor" and per_tensor["label"] == "per-tensor"
    assert block["granularity"] == "block" and block["block"] == 128
    assert per_tensor["format"] == block["format"] == "float8_e4m3fn"
    # "per-tensor E4M3 flushes about 16% ... median relative error about 14%"
    assert 0.15 <= per_tensor["flushed_fraction"] <= 0.17
    assert 0.13 <= per_tensor["median_rel_error"] <= 0.15
    # "blocks of 128 bring the median to about 2%"
    assert 0.015 <= block["median_rel_error"] <= 0.03
    assert block["flushed_fraction"] < per_tensor["flushed_fraction"] / 4
    # and both agree with the reference on the very data
    x = example_tensor().array()
    assert x.size == 1025 and x[0] == 100.0
    for stats, tile in [(per_tensor, (1, BIG)), (block, (1, 128))]:
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, stats["label"])
        assert_scales_match(stats["scales"], grid, stats["label"])


def test_article_example_table():
    result = invoke("quantize")
    assert_no_traceback(result)
    assert result.exit_code == 0
    out = result.stdout
    for text in ("per-tensor", "block 128", "flushed", "median rel error", "float8_e4m3fn",
                 "16%", "14.1%", "2.11%"):
        assert text in out, text
    assert result.stderr == ""


# -- JSON ---------------------------------------------------------------------------------------

def test_json_statistics_keys_for_every_scheme(matrix):
    path, x = matrix
    doc = quantize_json(path, "--compare", "all")
    assert {"format", "schemes", "tensors", "total"} <= doc.keys()
    for stats in doc["tensors"][0]["schemes"]:
        assert STAT_KEYS <= stats.keys(), STAT_KEYS - stats.keys()
        assert SCALE_KEYS <= stats["scales"].keys()
        assert stats["rel_error_resolution"] == REL_RES
        assert stats["count"] == x.size


def test_json_is_strict_even_with_nan_and_inf_statistics(tmp_path):
    x = np.zeros((4, 64), np.float32)  # all zero: median and sqnr undefined
    np.save(tmp_path / "z.npy", x)
    y = np.ones((4, 64), np.float32)
    y[0, 0], y[1, 1] = np.nan, np.inf
    np.save(tmp_path / "n.npy", y)
    for name in ("z.npy", "n.npy"):
        result = invoke("quantize", tmp_path / name, "--json", "--compare", "all")
        assert result.exit_code == 0, result.stderr
        assert "NaN" not in result.stdout and "Infinity" not in result.stdout
        strict_loads(result.stdout)  # fails on NaN / Infinity literals


def test_all_zero_tensor_via_cli(tmp_path):
    np.save(tmp_path / "z.npy", np.zeros((8, 256), np.float32))
    for stats in quantize_json(tmp_path / "z.npy", "--compare", "all")["tensors"][0]["schemes"]:
        assert stats["flushed"] == 0 and stats["max_abs_error"] == 0.0 and stats["rmse"] == 0.0
        assert stats["scales"]["min"] == stats["scales"]["max"] == 1.0, stats["label"]


def test_nan_and_inf_in_the_data_are_counted(tmp_path):
    x = heavy_tailed(np.random.default_rng(32), (8, 256), spread=1.0)
    x[0, 0], x[3, 5], x[6, 255] = np.nan, np.inf, -np.inf
    np.save(tmp_path / "x.npy", x)
    doc = quantize_json(tmp_path / "x.npy")
    for stats, tile in zip(doc["tensors"][0]["schemes"], [(BIG, BIG), (1, 128)]):
        assert stats["nonfinite_inputs"] == 3
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, stats["label"])
        assert stats["nan_produced"] == ref_nan(x, xq)


def ref_nan(x, xq):
    return int(np.count_nonzero(np.isnan(xq) & ~np.isnan(x)))


def test_inf_in_the_data_leaks_no_python_warning(tmp_path):
    # regression: amax scale 0 for a block holding inf (inf * 0) used to warn on stderr
    x = np.ones((4, 256), np.float32)
    x[1, 5] = np.inf
    np.save(tmp_path / "x.npy", x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # one worker: the work runs in this process, where warnings can be seen
        result = invoke("quantize", tmp_path / "x.npy", "--json", parallel_option(), "1")
    assert result.exit_code == 0
    assert "Warning" not in result.stderr, result.stderr
    leaked = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
              if "fmtcli" in str(w.filename)]
    assert leaked == []


# -- schemes through the CLI -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, tile, granularity", [
    (("--per", "tensor"), (BIG, BIG), "tensor"),
    (("--per", "row"), (1, BIG), "row"),
    (("--per", "column"), (BIG, 1), "column"),
    (("--block", "128"), (1, 128), "block"),
    (("--block", "77"), (1, 77), "block"),
    (("--block", "16", "--axis", "0"), (16, 1), "block"),
    (("--block", "30", "--axis", "0"), (30, 1), "block"),
    (("--tile", "128x128"), (128, 128), "tile"),
    (("--tile", "1x128"), (1, 128), "tile"),
    (("--tile", "64X50"), (64, 50), "tile"),
], ids=lambda v: "_".join(v) if isinstance(v, tuple) and isinstance(v[0], str) else None)
def test_cli_scheme_matches_reference(matrix, args, tile, granularity):
    path, x = matrix
    stats = only_scheme(quantize_json(path, *args, "--compare", "none"))
    assert stats["granularity"] == granularity
    if granularity == "block":
        assert stats["block"] == int(args[1])
        assert stats["axis"] == (0 if "--axis" in args else -1)
    if granularity == "tile":
        assert stats["tile"] == list(tile)
    xq, grid, sat, ov = ref_quantize(x, tile)
    assert_matches_reference(stats, x, xq, sat, ov, " ".join(args))
    assert_scales_match(stats["scales"], grid, " ".join(args))


def test_default_compare_is_per_tensor_beside_the_chosen_scheme(matrix):
    path, _ = matrix
    doc = quantize_json(path, "--block", "64")
    labels = [s["label"] for s in doc["tensors"][0]["schemes"]]
    assert labels == ["per-tensor", "block 64"]
    assert [s["label"] for s in doc["schemes"]] == labels
    assert len(quantize_json(path, "--block", "64", "--compare", "none")["schemes"]) == 1
    # per-tensor alone is not listed twice
    assert [s["label"] for s in quantize_json(path, "--per", "tensor")["schemes"]] == ["per-tensor"]


def test_compare_all_gives_every_recipe_in_one_run(matrix):
    path, x = matrix
    doc = quantize_json(path, "--compare", "all")
    schemes = doc["tensors"][0]["schemes"]
    assert [s["recipe"] for s in schemes] == RECIPE_ORDER
    assert list(RECIPES) == RECIPE_ORDER
    for stats in schemes:
        if stats["recipe"] == "nvfp4":
            xq, grid = ref_nvfp4(x)
            sat = ov = None
        else:
            tile, fmt, rule = RECIPE_REF[stats["recipe"]]
            xq, grid, sat, ov = ref_quantize(x, tile, fmt, rule)
        assert_matches_reference(stats, x, xq, sat, ov, stats["recipe"])
        assert_scales_match(stats["scales"], grid, stats["recipe"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe, fmt, granularity, block, rule, scale_format", [
    ("tensorwise", "float8_e4m3fn", "tensor", None, "amax", "float32"),
    ("rowwise", "float8_e4m3fn", "row", None, "pow2-floor", "float32"),
    ("deepseek", "float8_e4m3fn", "tile", None, "amax", "float32"),
    ("mxfp8", "float8_e4m3fn", "block", 32, "mx-floor", "e8m0"),
    ("mxfp6", "float6_e2m3fn", "block", 32, "mx-floor", "e8m0"),
    ("mxfp4", "float4_e2m1fn", "block", 32, "mx-floor", "e8m0"),
    ("nvfp4", "float4_e2m1fn", "block", 16, "amax", "e4m3+fp32"),
])
def test_recipe_names_what_it_used(matrix, recipe, fmt, granularity, block, rule, scale_format):
    path, _ = matrix
    doc = quantize_json(path, "--recipe", recipe, "--compare", "none")
    stats = only_scheme(doc)
    assert (stats["recipe"], stats["format"], stats["granularity"], stats["block"],
            stats["scale_rule"], stats["scale_format"]) == \
        (recipe, fmt, granularity, block, rule, scale_format)
    assert stats["label"].startswith(f"{recipe}: ")
    assert doc["format"] == fmt


def test_recipe_and_explicit_options_compose(matrix):
    path, x = matrix
    stats = only_scheme(quantize_json(path, "--recipe", "mxfp8", "--block", "64",
                                      "--compare", "none"))
    assert (stats["recipe"], stats["block"], stats["scale_rule"], stats["scale_format"],
            stats["format"]) == ("mxfp8", 64, "mx-floor", "e8m0", "float8_e4m3fn")
    assert stats["label"] == "mxfp8: block 64"
    xq, grid, sat, ov = ref_quantize(x, (1, 64), rule="mx-floor")
    assert_matches_reference(stats, x, xq, sat, ov, "mxfp8 block 64")
    assert_scales_match(stats["scales"], grid)

    stats = only_scheme(quantize_json(path, "--recipe", "mxfp8", "--scale-rule", "amax",
                                      "--compare", "none"))
    assert (stats["scale_rule"], stats["scale_format"], stats["block"]) == ("amax", "float32", 32)

    stats = only_scheme(quantize_json(path, "--recipe", "mxfp4", "--format", "e2m3",
                                      "--compare", "none"))
    assert stats["format"] == "float6_e2m3fn" and stats["recipe"] == "mxfp4"

    stats = only_scheme(quantize_json(path, "--recipe", "deepseek", "--tile", "32x32",
                                      "--compare", "none"))
    assert stats["tile"] == [32, 32] and stats["weight_tile"] is None


def test_deepseek_weight_and_activation_tiles_in_a_checkpoint(tmp_path):
    rng = np.random.default_rng(33)
    tensors = {"model.layers.0.mlp.weight": heavy_tailed(rng, (300, 260)),
               "model.layers.0.mlp.bias": heavy_tailed(rng, (260,)),
               "hidden_states": heavy_tailed(rng, (40, 260))}
    path = write_safetensors(tmp_path / "ckpt.safetensors", tensors)
    doc = quantize_json(path, "--recipe", "deepseek", "--compare", "none")
    assert [t["key"] for t in doc["tensors"]] == list(tensors)
    expected = {"model.layers.0.mlp.weight": (128, 128), "model.layers.0.mlp.bias": (1, 128),
                "hidden_states": (1, 128)}
    for tensor in doc["tensors"]:
        (stats,) = tensor["schemes"]
        tile = expected[tensor["key"]]
        assert stats["tile"] == list(tile), tensor["key"]
        x = tensors[tensor["key"]]
        xq, grid, sat, ov = ref_quantize(x, tile)
        assert_matches_reference(stats, x, xq, sat, ov, tensor["key"])
        assert_scales_match(stats["scales"], grid, tensor["key"])
    assert doc["total"][0]["count"] == sum(x.size for x in tensors.values())


# -- usage errors ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (("--format", "fp9000"), "fp9000"),
    (("--recipe", "mxfp9"), "mxfp9"),
    (("--tile", "128"), "--tile"),
    (("--tile", "0x128"), "--tile"),
    (("--tile", "axb"), "--tile"),
    (("--block", "64", "--tile", "1x64"), "alternatives"),
    (("--per", "tensor", "--block", "64"), "alternatives"),
    (("--per", "block"), "--per"),
    (("--block", "0"), "--block"),
    (("--axis", "1"), "--axis"),
    (("--compare", "some"), "compare"),
    (("--scale-rule", "median"), "scale-rule"),
    (("--chunk", "10"), "chunk"),
    (("--recipe", "nvfp4", "--scale-rule", "pow2-floor"), "amax"),
    (("--key", "w"), "--key"),
])
def test_usage_errors_exit_2(args, fragment):
    result = invoke("quantize", *args)
    assert_usage_error(result, fragment)


def test_out_with_compare_all_is_a_usage_error(matrix, tmp_path):
    path, _ = matrix
    result = invoke("quantize", path, "--compare", "all", "--out", tmp_path / "o.npz")
    assert_usage_error(result, "--compare all")
    assert not (tmp_path / "o.npz").exists()


# -- output: table, stdout vs stderr -----------------------------------------------------------------

def test_table_names_each_scheme_and_flushed(matrix):
    path, _ = matrix
    result = invoke("quantize", path, "--block", "64")
    assert result.exit_code == 0, result.stderr
    for text in ("per-tensor", "block 64", "flushed", "median rel error", "SQNR", "saturated"):
        assert text in result.stdout, text
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_table_of_several_tensors_has_a_row_per_tensor_and_a_total(tmp_path):
    rng = np.random.default_rng(34)
    np.savez(tmp_path / "ck.npz", alpha=heavy_tailed(rng, (16, 64)),
             beta=heavy_tailed(rng, (32,)), ids=np.arange(5))
    result = invoke("quantize", tmp_path / "ck.npz", "--compare", "all")
    assert result.exit_code == 0, result.stderr
    for text in ("alpha", "beta", "total", "flushed", *RECIPE_ORDER):
        assert text in result.stdout, text
    # a skipped tensor is listed once, on stderr
    assert "ids" in result.stderr and "skipped" in result.stderr
    assert "skipped" not in result.stdout and "ids" not in result.stdout


def test_stdout_holds_only_results_and_notes_go_to_stderr(tmp_path):
    rng = np.random.default_rng(35)
    path = write_safetensors(tmp_path / "m.safetensors",
                             {"w": heavy_tailed(rng, (8, 128)), "position_ids": np.arange(8)})
    result = invoke("quantize", path, "--json")  # (rows of 128: no note of short blocks)
    assert result.exit_code == 0
    doc = strict_loads(result.stdout)  # nothing but the document on stdout
    skipped = [t for t in doc["tensors"] if t["skipped"]]
    assert [t["key"] for t in skipped] == ["position_ids"]
    assert "int64" in skipped[0]["skipped"]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "position_ids" in lines[0] and "skipped" in lines[0]
    assert "Note" not in result.stdout


# -- chunking through the CLI -------------------------------------------------------------------------

def test_chunk_and_workers_options_do_not_change_the_statistics(matrix):
    path, _ = matrix
    option = parallel_option()
    base = quantize_json(path, "--per", "column", option, "1")
    for extra in (("--chunk", "1024", option, "1"), ("--chunk", "1024", option, "2")):
        other = quantize_json(path, "--per", "column", *extra)
        for a, b in zip(base["tensors"][0]["schemes"], other["tensors"][0]["schemes"]):
            for key in ("count", "flushed", "saturated", "max_abs_error", "median_rel_error",
                        "p99_rel_error", "scales", "nan_produced"):
                assert a[key] == b[key], (extra, key)
            assert math.isclose(a["rmse"], b["rmse"], rel_tol=1e-5)
            assert math.isclose(a["sqnr_db"], b["sqnr_db"], rel_tol=1e-5)


# -- --out -------------------------------------------------------------------------------------------

def test_out_npy_holds_the_dequantized_values(matrix, tmp_path):
    path, x = matrix
    out = tmp_path / "xq.npy"
    doc = quantize_json(path, "--block", "64", "--out", out)
    assert doc["output"]["path"] == str(out) and doc["output"]["scheme"] == "block 64"
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == x.shape
    xq, _, _, _ = ref_quantize(x, (1, 64))
    np.testing.assert_array_equal(got, xq)
    assert temp_leftovers(tmp_path) == []


def test_out_npy_of_a_3d_tensor_per_tensor(tmp_path):
    x = heavy_tailed(np.random.default_rng(36), (3, 40, 50))
    np.save(tmp_path / "x.npy", x)
    quantize_json(tmp_path / "x.npy", "--per", "tensor", "--out", tmp_path / "xq.npy",
                  "--chunk", "1024")
    np.testing.assert_array_equal(np.load(tmp_path / "xq.npy"), ref_quantize(x, (BIG, BIG))[0])


def decode_codes(codes, scales, tile, dtype=ml_dtypes.float8_e4m3fn):
    """x_q = decode(codes) / scale of the codes' tile (tiles of the matrix view)."""
    shape = codes.shape
    m = codes.reshape(-1, shape[-1]) if codes.ndim else codes.reshape(1, 1)
    rows, cols = m.shape
    tr, tc = min(tile[0], rows), min(tile[1], cols)
    s = np.repeat(np.repeat(scales, tr, axis=0), tc, axis=1)[:rows, :cols]
    values = m.view(dtype).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (values / s).reshape(shape)


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.parametrize("args, tile", [
    (("--block", "64"), (1, 64)),
    (("--tile", "128x128"), (128, 128)),
    (("--per", "column"), (BIG, 1)),
    (("--per", "tensor"), (BIG, BIG)),
    (("--block", "16", "--axis", "0"), (16, 1)),
], ids=lambda v: "_".join(v) if isinstance(v, tuple) and isinstance(v[0], str) else None)
def test_out_codes_and_scales_decode_to_the_dequantized_values(matrix, tmp_path, suffix, args, tile):
    path, x = matrix
    out = tmp_path / f"codes{suffix}"
    doc = quantize_json(path, *args, "--out", out, "--chunk", "4096")
    assert doc["output"]["content"] == "codes and scales"
    if suffix == ".npz":
        with np.load(out) as z:
            arrays = {k: z[k] for k in z.files}
        metadata = json.loads(arrays.pop("__metadata__").tobytes())  # the header's JSON
    else:
        arrays, metadata = read_safetensors(out)
    name = path.stem  # a keyless input's entries are named after its file
    assert set(arrays) == {f"{name}.codes", f"{name}.scales"}
    codes, scales = arrays[f"{name}.codes"], arrays[f"{name}.scales"]
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert scales.dtype == np.float32
    xq, grid, _, _ = ref_quantize(x, tile)
    np.testing.assert_array_equal(scales.reshape(grid.shape), grid)
    np.testing.assert_array_equal(decode_codes(codes, scales.reshape(grid.shape), tile), xq)
    if metadata is not None:
        assert metadata["fmtcli"] == "x_q = decode(codes) / scales"
        description = json.loads(metadata[name])
        assert description["shape"] == list(x.shape)
        assert description["scheme"]["granularity"] == doc["tensors"][0]["schemes"][-1]["granularity"]
        assert description["tile"] == [min(tile[0], x.shape[0]), min(tile[1], x.shape[1])]
    assert temp_leftovers(tmp_path) == []


def test_out_codes_of_fp4_and_nvfp4_decode(tmp_path):
    x = heavy_tailed(np.random.default_rng(37), (64, 96), spread=1.5)
    np.save(tmp_path / "x.npy", x)
    for recipe in ("mxfp4", "nvfp4"):
        out = tmp_path / f"{recipe}.npz"
        quantize_json(tmp_path / "x.npy", "--recipe", recipe, "--out", out)
        with np.load(out) as z:
            codes, scales = z["x.codes"], z["x.scales"]
        assert codes.dtype == np.uint8 and int(codes.max()) < 16
        if recipe == "mxfp4":
            xq, grid, _, _ = ref_quantize(x, (1, 32), "float4_e2m1fn", "mx-floor")
            tile = (1, 32)
        else:
            xq, grid = ref_nvfp4(x)
            tile = (1, 16)
        np.testing.assert_array_equal(scales.reshape(grid.shape), grid)
        got = decode_codes(codes, scales.reshape(grid.shape), tile, ml_dtypes.float4_e2m1fn)
        np.testing.assert_array_equal(got, xq)


def test_out_codes_of_a_checkpoint_one_entry_per_tensor(tmp_path):
    rng = np.random.default_rng(38)
    tensors = {"a.weight": heavy_tailed(rng, (20, 64)), "b": heavy_tailed(rng, (100,)),
               "ids": np.arange(3)}
    path = write_safetensors(tmp_path / "ck.safetensors", tensors)
    out = tmp_path / "q.safetensors"
    quantize_json(path, "--block", "32", "--out", out)
    arrays, metadata = read_safetensors(out)
    assert set(arrays) == {"a.weight.codes", "a.weight.scales", "b.codes", "b.scales"}
    for key in ("a.weight", "b"):
        xq, grid, _, _ = ref_quantize(tensors[key], (1, 32))
        got = decode_codes(arrays[f"{key}.codes"], arrays[f"{key}.scales"].reshape(grid.shape),
                           (1, 32))
        np.testing.assert_array_equal(got, xq)
        assert key in metadata


def test_out_codes_keep_every_tensor_of_several_npy_inputs(tmp_path):
    rng = np.random.default_rng(39)
    np.save(tmp_path / "a.npy", heavy_tailed(rng, (4, 64)))
    np.save(tmp_path / "b.npy", heavy_tailed(rng, (4, 64)))
    out = tmp_path / "q.npz"
    doc = quantize_json(tmp_path / "a.npy", tmp_path / "b.npy", "--out", out)
    assert len(doc["tensors"]) == 2
    with np.load(out) as z:
        # codes and scales of both tensors, and the metadata member
        assert sorted(z.files) == ["__metadata__", "a.codes", "a.scales", "b.codes",
                                   "b.scales"], z.files


@pytest.mark.slow
def test_out_refuses_to_overwrite_without_force(matrix, tmp_path):
    path, x = matrix
    for suffix in (".npy", ".npz", ".safetensors"):
        out = tmp_path / f"existing{suffix}"
        out.write_bytes(b"precious")
        before = out.stat().st_mtime_ns
        result = invoke("quantize", path, "--out", out)
        assert_usage_error(result, "--force")
        assert out.read_bytes() == b"precious" and out.stat().st_mtime_ns == before
        quantize_json(path, "--out", out, "--force")
        assert out.read_bytes() != b"precious"
    np.testing.assert_array_equal(np.load(tmp_path / "existing.npy"), ref_quantize(x, (1, 128))[0])
    assert temp_leftovers(tmp_path) == []


def test_out_refuses_to_write_onto_an_input(matrix, tmp_path):
    path, x = matrix
    original = path.read_bytes()
    for extra in ((), ("--force",)):
        result = invoke("quantize", path, "--out", path, *extra)
        assert_usage_error(result, "input")
        assert path.read_bytes() == original
    link = tmp_path / "alias.npy"
    link.symlink_to(path)
    assert_usage_error(invoke("quantize", link, "--out", path, "--force"), "input")
    assert path.read_bytes() == original
    assert temp_leftovers(tmp_path) == []


def test_out_refuses_to_write_onto_a_file_of_an_input_directory(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", np.ones((4, 64), np.float32))
    original = (data / "x.npy").read_bytes()
    result = invoke("quantize", data, "--out", data / "x.npy", "--force")
    assert (data / "x.npy").read_bytes() == original
    assert_usage_error(result)


def test_out_bad_suffix_and_missing_directory(matrix, tmp_path):
    path, _ = matrix
    assert_usage_error(invoke("quantize", path, "--out", tmp_path / "q.bin"), "--out")
    assert_usage_error(invoke("quantize", path, "--out", tmp_path / "nowhere" / "q.npy"))
    assert not (tmp_path / "q.bin").exists()
    assert temp_leftovers(tmp_path) == []


def test_out_npy_needs_exactly_one_tensor(tmp_path):
    np.savez(tmp_path / "two.npz", a=np.ones((4, 4), np.float32), b=np.ones(8, np.float32))
    result = invoke("quantize", tmp_path / "two.npz", "--out", tmp_path / "q.npy")
    assert_usage_error(result, ".npy")
    assert not (tmp_path / "q.npy").exists()
    assert temp_leftovers(tmp_path) == []


def test_out_file_permissions_follow_the_umask(matrix, tmp_path):
    path, _ = matrix
    old = os.umask(0o022)
    try:
        for suffix in (".npy", ".npz", ".safetensors"):
            quantize_json(path, "--out", tmp_path / f"q{suffix}")
    finally:
        os.umask(old)
    modes = {suffix: (tmp_path / f"q{suffix}").stat().st_mode & 0o777
             for suffix in (".npy", ".npz", ".safetensors")}
    assert modes == dict.fromkeys(modes, 0o644), {k: oct(v) for k, v in modes.items()}


# -- stochastic rounding ---------------------------------------------------------------------------

def test_stochastic_rounding_is_seeded_and_independent_of_workers(matrix):
    path, _ = matrix
    option = parallel_option()
    runs = [only_scheme(quantize_json(path, "--rounding", "stochastic", "--compare", "none",
                                      "--seed", seed, option, workers))
            for seed, workers in (("1", "1"), ("1", "2"), ("2", "2"))]
    for key in ("rmse", "max_abs_error", "flushed", "bias"):
        assert runs[0][key] == runs[1][key], key
    assert (runs[0]["rmse"], runs[0]["bias"]) != (runs[2]["rmse"], runs[2]["bias"])
    nearest = only_scheme(quantize_json(path, "--compare", "none"))
    assert runs[0]["rmse"] > nearest["rmse"]  # stochastic rounding adds variance


def test_stochastic_rounding_does_not_depend_on_the_chunk_size(matrix):
    path, _ = matrix
    a = only_scheme(quantize_json(path, "--rounding", "stochastic", "--compare", "none"))
    b = only_scheme(quantize_json(path, "--rounding", "stochastic", "--compare", "none",
                                  "--chunk", "1024"))
    assert a["max_abs_error"] == b["max_abs_error"]
    assert a["flushed"] == b["flushed"]
    assert math.isclose(a["rmse"], b["rmse"], rel_tol=1e-5)


def test_scales_cell_without_a_distinct_count():
    """The CUDA path does not count distinct scales: the table says how many scales and
    their range, and no distinct figure (it once crashed formatting None)."""
    from fmtcli.engine.results import ScaleStats
    from fmtcli.render.quantize_cells import scales_text

    base = {"count": 4096, "min": 0.5, "max": 8.0, "nan": 0}
    uncounted = scales_text(ScaleStats(**base, distinct=None, distinct_more_than=None))
    assert "4,096 scales" in uncounted and "distinct" not in uncounted
    assert "7 distinct" in scales_text(ScaleStats(**base, distinct=7, distinct_more_than=None))
    capped = scales_text(ScaleStats(**base, distinct=None, distinct_more_than=65536))
    assert ">65,536 distinct" in capped
