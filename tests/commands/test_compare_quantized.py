"""``fmt compare ORIGINAL QUANTIZED`` (a verdict per tensor beside fmt's own quantization),
the raw-codes note, and ``fmt quantize QUANTIZED`` (each tensor's layout, one note a run).

The DeepSeek-V3 FP8 fixture is written here from its definition (DeepSeek-V3
``README_WEIGHTS.md``, as ``fmtcli/inputs/layouts/deepseek_fp8.py`` cites it): the weight
float8_e4m3fn, ``weight_scale_inv`` float32 = amax / 448 of each 128 x 128 block (the edge
blocks partial), codes = E4M3(x / scale_inv), ``config.json`` naming fp8 with
``weight_block_size`` [128, 128].  The broken copy stores one weight's scales at half their
value (the codes as quantized).  fmt's own quantization is checked against a numpy oracle
of the same scheme (s = 448 / amax per tile, x_q = E4M3(x * s) / s, ml_dtypes' cast).
The NVFP4 folders are ``tests/layout_fixtures.py``'s (ModelOpt's definition).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_fits,
    invoke,
    json_of,
    run_fmt,
    strict_loads,
    succeeds,
)

from fmtcli.engine.writers import write_safetensors

DOWN, UP, NORM = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight",
                  "model.norm.weight")
CONFIG = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                  "weight_block_size": [128, 128],
                                  "activation_scheme": "dynamic"}}
E4M3 = ml_dtypes.float8_e4m3fn


def deepseek_fp8(weight: np.ndarray, scale_factor: float = 1.0):
    """(codes float8_e4m3fn, weight_scale_inv float32 per 128 x 128 block, times
    ``scale_factor`` after the codes were made)."""
    rows, cols = weight.shape
    grid = np.zeros((-(-rows // 128), -(-cols // 128)), np.float32)
    codes = np.zeros(weight.shape, E4M3)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            block = weight[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            grid[i, j] = np.float32(np.abs(block).max() / np.float32(448))
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (block / grid[i, j]).astype(E4M3)
    return codes, (grid * np.float32(scale_factor)).astype(np.float32)


def own_sqnr_oracle(weight: np.ndarray) -> float:
    """fmt's own scheme by hand: s = 448 / amax per 128 x 128 tile (float32), E4M3(x * s) / s."""
    x = weight.astype(np.float32)
    q = np.empty_like(x)
    for i in range(0, x.shape[0], 128):
        for j in range(0, x.shape[1], 128):
            block = x[i:i + 128, j:j + 128]
            s = np.float32(448) / np.abs(block).max()
            q[i:i + 128, j:j + 128] = (block * s).astype(E4M3).astype(np.float32) / s
    x64, e = x.astype(np.float64), q.astype(np.float64) - x
    return 10 * math.log10(float(np.dot(x64.ravel(), x64.ravel())) / float(np.dot(e.ravel(),
                                                                               e.ravel())))


def write_folder(folder, tensors: dict, config: dict | None = CONFIG) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(str(folder / "model.safetensors"), tensors)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cq")
    rng = np.random.default_rng(24)
    weights = {DOWN: (rng.standard_normal((200, 320)) * 0.02).astype(np.float32),
               UP: (rng.standard_normal((128, 256)) * 0.02).astype(np.float32),
               NORM: (1 + 0.1 * rng.standard_normal(256)).astype(np.float32)}
    write_folder(root / "orig", weights, None)
    write_folder(root / "orig-bf16", {k: v.astype(ml_dtypes.bfloat16)
                                      for k, v in weights.items()}, None)
    healthy, broken, raw = {}, {}, {}
    for key, w in weights.items():
        if w.ndim == 1:
            healthy[key] = broken[key] = raw[key] = w
            continue
        codes, grid = deepseek_fp8(w)
        healthy[key], healthy[key + "_scale_inv"] = codes, grid
        broken[key], broken[key + "_scale_inv"] = codes, grid / 2 if key == DOWN else grid
        raw[key] = codes
    write_folder(root / "fp8", healthy)
    write_folder(root / "half", broken)
    write_safetensors(str(root / "raw.safetensors"), raw)
    # two shards: DOWN's codes in the first, its scales in the second
    shards = root / "sharded"
    shards.mkdir()
    first = [DOWN, UP + "_scale_inv"]
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    write_safetensors(str(shards / names[0]), {k: healthy[k] for k in first})
    write_safetensors(str(shards / names[1]), {k: v for k, v in healthy.items()
                                               if k not in first})
    weight_map = {k: names[0] if k in first else names[1] for k in healthy}
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}))
    (shards / "config.json").write_text(json.dumps(CONFIG))
    return SimpleNamespace(root=root, weights=weights, **{
        name: root / name for name in ("orig", "fp8", "half", "sharded")},
        bf16=root / "orig-bf16", raw=root / "raw.safetensors",
        shard_files=[shards / n for n in names])


def fresh_json(*args) -> tuple[dict, str]:
    """``fmt ARGS --json`` in a fresh process: (the document, stderr)."""
    done = run_fmt(*args, "--json")
    assert done.returncode == 0, done.stderr.decode()
    return strict_loads(done.stdout.decode()), done.stderr.decode()


def by_key(doc: dict) -> dict:
    return {t["key"]: t for t in doc["tensors"]}


# -- fmt compare ---------------------------------------------------------------------------

def test_healthy_export_is_ok_beside_fmts_own(files):
    doc, err = fresh_json("compare", files.orig, files.fp8)
    tensors = by_key(doc)
    for key in (DOWN, UP):
        t = tensors[key]
        assert t["layout"] == "deepseek-fp8" and t["verdict"] == "ok" and t["reasons"] == []
        assert t["fmt_scheme"] == "float8_e4m3fn tile 128x128"
        assert t["fmt_sqnr_db"] == pytest.approx(own_sqnr_oracle(files.weights[key]),
                                                 abs=1e-5)
        assert abs(t["sqnr_db"] - t["fmt_sqnr_db"]) < 0.5  # the same rule, its rounding
    norm = tensors[NORM]
    assert norm["layout"] is None and norm["fmt_sqnr_db"] is None and norm["verdict"] == "ok"
    assert doc["flagged"] == 0 and all(r["flagged"] == 0 for r in doc["roles"])
    assert err.count("already quantized") == 1 and "raw codes" not in err


def test_half_size_scales_are_flagged(files):
    doc, _ = fresh_json("compare", files.orig, files.half)
    down, up = by_key(doc)[DOWN], by_key(doc)[UP]
    assert down["sqnr_db"] == pytest.approx(20 * math.log10(2), abs=0.05)  # every value / 2
    assert down["cosine"] > 0.999  # the cosine cannot see a scale: the SQNR gap does
    assert down["fmt_sqnr_db"] == pytest.approx(own_sqnr_oracle(files.weights[DOWN]), abs=1e-5)
    assert down["verdict"] == "flag"
    assert any("below fmt's own" in r for r in down["reasons"]), down["reasons"]
    assert up["verdict"] == "ok" and doc["flagged"] == 1
    role = next(r for r in doc["roles"] if "down_proj" in r["pattern"])
    assert role["flagged"] == 1 and role["fmt_sqnr_db"] == pytest.approx(down["fmt_sqnr_db"])


@pytest.mark.parametrize("width", [80, 120])
def test_judged_table_fits(files, width):
    out = succeeds("compare", files.orig, files.half, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    for text in ("fmt dB", "verdict", "deepseek-fp8", "FLAG", "Flagged (1 of 3 tensors)",
                 "below fmt's own"):
        assert text in out, (text, out)


def test_one_tensor_shows_fmts_own_and_the_verdict(files):
    out = succeeds("compare", files.orig, files.half, "--key", DOWN,
                   env={"COLUMNS": "80"}).stdout
    assert_fits(out, 80)
    assert "fmt's own SQNR (dB)" in out and "deepseek-fp8" in out and "FLAG" in out
    assert "flagged: SQNR" in out


def test_bfloat16_original_needs_no_any_dtype(files):
    doc = json_of("compare", files.bf16, files.fp8, "--key", "*proj*")
    t = by_key(doc)[DOWN]
    assert (t["ref_dtype"], t["test_dtype"]) == ("bfloat16", "float32")
    assert t["verdict"] == "ok" and t["fmt_sqnr_db"] > 25


def test_csv_has_the_verdict_columns(files):
    out = succeeds("compare", files.orig, files.half, "--csv").stdout.splitlines()
    header = out[0].split(",")
    assert header[-4:] == ["layout", "fmt_scheme", "fmt_sqnr_db", "verdict"]
    rows = {line.split(",")[0]: line.split(",") for line in out[1:]}
    assert rows[DOWN][-1] == "flag" and rows[UP][-1] == "ok" and rows[NORM][-4] == ""


def test_plain_compare_has_no_verdict(files):
    doc = json_of("compare", files.orig, files.orig)
    assert doc["flagged"] is None and doc["fmt_sqnr_db"] is None
    assert all(t["verdict"] is None and t["layout"] is None for t in doc["tensors"])
    out = succeeds("compare", files.orig, files.orig).stdout
    assert "fmt dB" not in out and "differ" in out


def test_nvfp4_exports(tmp_path):
    layout_fixtures = pytest.importorskip("layout_fixtures")
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    write_folder(tmp_path / "orig", {DOWN: w}, None)
    verdicts = {}
    for name, options in (("ok", {}), ("half", {"half_scales": True}),
                          ("swapped", {"swapped_nibbles": True})):
        layout_fixtures.nvfp4_modelopt(tmp_path / name, w, **options)
        t = by_key(json_of("compare", tmp_path / "orig", tmp_path / name))[DOWN]
        assert t["layout"] == "modelopt-nvfp4" and t["fmt_scheme"] == "nvfp4: block 16"
        verdicts[name] = t
    assert verdicts["ok"]["verdict"] == "ok"
    assert abs(verdicts["ok"]["sqnr_db"] - verdicts["ok"]["fmt_sqnr_db"]) < 0.5
    assert verdicts["half"]["verdict"] == "flag"
    assert verdicts["swapped"]["verdict"] == "flag"
    assert any(r.startswith("cosine") for r in verdicts["swapped"]["reasons"])


def test_raw_codes_get_one_note(files):
    done = run_fmt("compare", files.orig / "model.safetensors", files.raw, "--any-dtype",
                   "--json")
    assert done.returncode == 0
    err = done.stderr.decode()
    notes = [line for line in err.splitlines() if "raw codes" in line]
    assert len(notes) == 1, err
    assert "float8_e4m3fn and float32" in notes[0] and "fmt audit" in notes[0]
    doc = strict_loads(done.stdout.decode())
    assert doc["flagged"] is None and by_key(doc)[DOWN]["sqnr_db"] < 0
    assert "raw codes" not in invoke("compare", files.orig, files.fp8).stderr


# -- the rules ------------------------------------------------------------------------------

def test_judge_rules():
    from fmtcli.compare import compare_arrays
    from fmtcli.compare.verdict import judge

    base = compare_arrays(np.ones(8), np.ones(8) * 1.01).total
    assert judge(replace(base, sqnr_db=30.0, cosine=0.999), 31.0) == ("ok", ())
    assert judge(replace(base, sqnr_db=30.0, cosine=0.999), 35.9)[0] == "ok"
    assert judge(replace(base, sqnr_db=30.0, cosine=0.999), 36.1)[0] == "flag"
    assert judge(replace(base, sqnr_db=40.0, cosine=0.999), 20.0)[0] == "ok"  # better
    verdict, reasons = judge(replace(base, sqnr_db=30.0, cosine=0.98), None)
    assert verdict == "flag" and reasons == ("cosine 0.9800 < 0.99",)
    # fmt's own at 25 dB reaches a cosine of 1 / sqrt(1 + 10**-2.5) = 0.99842...
    verdict, reasons = judge(replace(base, sqnr_db=22.0, cosine=0.98), 25.0)
    assert verdict == "flag" and reasons == ("cosine 0.9800 < 0.99 (fmt's own reaches "
                                             "0.9984)",)
    # a format too coarse for the values: fmt's own at 15 dB reaches 0.984 only
    assert judge(replace(base, sqnr_db=14.0, cosine=0.98), 15.0) == ("ok", ())
    assert judge(replace(base, sqnr_db=-math.inf, cosine=math.nan), 20.0)[0] == "flag"
    assert judge(replace(base, sqnr_db=math.nan, cosine=math.nan), None) == ("ok", ())


def test_own_scheme_of_each_layout_kind():
    from fmtcli.compare.verdict import own_scheme
    from fmtcli.numerics.granularity import ScaleGroup

    def q(element, scale_dtype, group):
        return SimpleNamespace(element=element, scale_dtype=scale_dtype, group=group)

    tile = own_scheme(q("float8_e4m3fn", "float32", ScaleGroup("tile", tile=(128, 128))))
    assert (tile.label, tile.scale_rule.value, tile.format.name) == (
        "tile 128x128", "amax", "float8_e4m3fn")
    assert own_scheme(q("float4_e2m1fn", "float8_e4m3fn", ScaleGroup("block", 16))
                      ).recipe == "nvfp4"
    mx = own_scheme(q("float4_e2m1fn", "e8m0", ScaleGroup("block", 32)))
    assert (mx.recipe, mx.scale_rule.value) == ("mxfp4", "mx-floor")
    assert own_scheme(q("float8_e4m3fn", "e8m0", ScaleGroup("block", 32))).recipe == "mxfp8"
    ue8m0 = own_scheme(q("float8_e4m3fn", "e8m0", ScaleGroup("tile", tile=(128, 128))))
    assert ue8m0.scale_rule.value == "pow2-floor"
    row = own_scheme(q("float8_e4m3fn", "float32", ScaleGroup("row")))
    assert row.granularity.value == "row"
    assert own_scheme(q("int4", "float32", ScaleGroup("block", 128))) is None


# -- fmt quantize QUANTIZED -----------------------------------------------------------------

def test_quantize_json_names_the_layout(files):
    doc, err = fresh_json("quantize", files.fp8)
    layouts = {t["key"]: t["layout"] for t in doc["tensors"]}
    assert layouts == {DOWN: "deepseek-fp8", UP: "deepseek-fp8", NORM: None}
    assert err.count("already quantized") == 1


@pytest.mark.parametrize("given", ["folder", "index", "shards"])
def test_sharded_checkpoint_one_note(files, given):
    paths = {"folder": [files.sharded],
             "index": [files.sharded / "model.safetensors.index.json"],
             "shards": files.shard_files}[given]
    result = succeeds("quantize", *paths, "--json")
    doc, err = strict_loads(result.stdout), result.stderr
    layouts = {t["key"]: t["layout"] for t in doc["tensors"]}
    assert layouts == {DOWN: "deepseek-fp8", UP: "deepseek-fp8", NORM: None}, layouts
    assert err.count("already quantized") == 1, err


def test_dask_refuses_a_dequantized_tensor(files):
    pytest.importorskip("distributed")
    result = invoke("quantize", files.fp8, "--dask", "local:1")
    assert result.exit_code == 2 and result.stdout == "", result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "already-quantized" in errors[0] and "deepseek-fp8" in errors[0]
    assert "Traceback" not in result.stderr


def test_other_commands_read_the_dequantized_values(files):
    fp8 = files.fp8
    for args in (("scale-search", fp8), ("loss-scale", fp8), ("quantize", fp8, "--recipe",
                                                               "nvfp4")):
        succeeds(*args)
    single = files.root / "single"
    codes, grid = deepseek_fp8(files.weights[UP])
    write_folder(single, {"x.weight": codes, "x.weight_scale_inv": grid})
    doc = json_of("sum", single / "model.safetensors")  # the dequantized values, summed
    values = codes.astype(np.float32) * np.repeat(np.repeat(grid, 128, 0), 128, 1)
    assert doc["exact"] == math.fsum(values.astype(np.float64).ravel())


def test_whole_array_of_a_dequantized_source(files):
    """What the fused CUDA path reads (``engine.cuda.quantize_on_gpu``: ``source.array()``,
    the whole tensor): the dequantized float32 values, as the chunks give them."""
    from fmtcli.engine.cuda import route
    from fmtcli.inputs.layouts.base import LayoutNote
    from fmtcli.inputs.tensors import load_path
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.streaming.stream import ChunkReader

    with pytest.warns(LayoutNote):
        source = next(s for s in load_path(str(files.fp8)) if s.key == DOWN)
    whole = np.ascontiguousarray(source.array())
    assert whole.dtype == np.float32 and whole.shape == (200, 320)
    reader = ChunkReader(source)
    assert np.array_equal(reader.read(slice(0, 200), slice(0, 320)), whole)
    codes, grid = deepseek_fp8(files.weights[DOWN])
    scales = np.repeat(np.repeat(grid, 128, 0), 128, 1)[:200, :320]
    assert np.array_equal(whole, codes.astype(np.float32) * scales)
    casts, fast = route(source, [build_scheme()], "numpy", "cpu", False)
    assert fast == [False]


def test_a_scale_grid_of_the_wrong_shape_is_one_error_line(files, tmp_path):
    codes, grid = deepseek_fp8(files.weights[DOWN])
    write_folder(tmp_path / "q", {DOWN: codes, DOWN + "_scale_inv": grid[:1]})
    result = invoke("compare", files.orig, tmp_path / "q", "--key", DOWN)
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "_scale_inv has shape [1, 3], not [2, 3]" in errors[0]


def test_summary_by_role_with_verdicts(tmp_path):
    rng = np.random.default_rng(9)
    weights = {f"model.layers.{i}.mlp.{p}.weight": (rng.standard_normal((128, 128)) * 0.02
                                                   ).astype(np.float32)
               for i in range(5) for p in ("up_proj", "down_proj")}
    write_folder(tmp_path / "orig", weights, None)
    stored = {}
    for key, w in weights.items():
        codes, grid = deepseek_fp8(w, 0.5 if key == "model.layers.3.mlp.down_proj.weight"
                                   else 1.0)
        stored[key], stored[key + "_scale_inv"] = codes, grid
    write_folder(tmp_path / "fp8", stored)
    doc = json_of("compare", tmp_path / "orig", tmp_path / "fp8")
    roles = {r["pattern"]: r for r in doc["roles"]}
    assert roles["model.layers.*.mlp.down_proj.weight"]["flagged"] == 1
    assert roles["model.layers.*.mlp.up_proj.weight"]["flagged"] == 0
    assert doc["flagged"] == 1
    for width in (80, 120):
        out = succeeds("compare", tmp_path / "orig", tmp_path / "fp8",
                       env={"COLUMNS": str(width)}).stdout
        assert_fits(out, width)
        assert "1 FLAG" in out and "Flagged (1 of 10 tensors)" in out
