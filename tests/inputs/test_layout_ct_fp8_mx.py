"""compressed-tensors' FP8 (float-/naive-quantized) and MX (mxfp8-quantized,
mxfp4-pack-quantized) checkpoints read by fmt as their dequantized values.

(1) Fixtures written here from the definition (compressed-tensors 0.20.1's
    ``compressors/naive_quantized``, ``mxfp8``, ``mxfp4``, ``mx_utils.py`` and
    ``quantization/utils/mxfp_utils.py``: tensor names, dtypes, shapes, the E8M0 bias 127,
    FP4 low nibble first), with no fmtcli code: fmt's values equal the exact float64
    decoding of the stored bytes rounded once to float32, ``fmt quantize`` and ``fmt
    compare`` in a fresh process read them as the original weight's name.
(2) The real library (skipped without it; run with /tmp/ctcheck/bin/python -m pytest):
    a Linear quantized by its own API, compressed by ``ModelCompressor`` and saved as
    ``save_pretrained`` saves it; fmt equals the library's ``CompressedTensorsDequantizer``
    bit for bit for MX; for FP8 the library returns bfloat16 (the scale's dtype), so fmt
    equals the exact decoding and the library is within bfloat16's rounding of it.
(3) Bad input: a packed tensor cut short, a scale grid of the wrong shape -- problems,
    one Error: line from ``fmt quantize``, never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import layout_fixtures as lf
import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_no_traceback, invoke, run_fmt, strict_loads
from oracle import write_safetensors

from fmtcli.inputs.layouts import read_config, scan
from fmtcli.inputs.tensors import load_path

E4M3 = ml_dtypes.float8_e4m3fn
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # E2M1 magnitudes by code (OCP MX)


# -- the definition, written out -----------------------------------------------------------

def weights(seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.standard_normal(shape[:-1] + (1,)))
    return (x * 0.02).astype(np.float32)


def fp8_scheme(w: np.ndarray, strategy: str, tile=(128, 128), group=64, scale_dtype=np.float32):
    """float-quantized FP8: weight_scale = amax / 448 per strategy (edge blocks partial),
    codes = e4m3(w / scale).  Returns (tensors, the scale expanded to w's shape)."""
    o, i = w.shape
    if strategy == "tensor":
        scale = np.array([np.abs(w).max() / 448], dtype=scale_dtype)
        full = np.full(w.shape, scale[0], dtype=np.float64)
    elif strategy == "channel":
        scale = (np.abs(w).max(axis=1, keepdims=True) / 448).astype(scale_dtype)
        full = np.repeat(scale.astype(np.float64), i, axis=1)
    elif strategy == "group":
        scale = (np.abs(w).reshape(o, i // group, group).max(-1) / 448).astype(scale_dtype)
        full = np.repeat(scale.astype(np.float64), group, axis=1)
    else:
        bh, bw = tile
        scale = np.zeros((-(-o // bh), -(-i // bw)), dtype=scale_dtype)
        for r in range(scale.shape[0]):
            for c in range(scale.shape[1]):
                block = w[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw]
                scale[r, c] = np.abs(block).max() / 448
        full = np.repeat(np.repeat(scale.astype(np.float64), bh, 0), bw, 1)[:o, :i]
    codes = np.clip(w / full, -448, 448).astype(E4M3)
    return {"weight": codes, "weight_scale": scale}, codes.astype(np.float64) * full


def mx_exponents(w: np.ndarray, offset: int) -> np.ndarray:
    """compressed-tensors' E8M0 bytes per 32 (mxfp_utils.generate_mx_scales): amax rounded
    up a power of two when its significand is >= 1.75, floor(log2) - offset, bias 127."""
    amax = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1, 32).max(-1)
    mantissa, exponent = np.frexp(amax)  # amax = mantissa * 2^exponent, mantissa in [0.5, 1)
    floor_log2 = exponent - 1 + (mantissa >= 0.875)
    return np.clip(127 + floor_log2 - offset, 0, 254).astype(np.uint8)


def mxfp8_scheme(w: np.ndarray):
    b = mx_exponents(w, 8)
    full = np.repeat(np.ldexp(1.0, b.astype(np.int64) - 127), 32, axis=1)
    codes = np.clip(w / full, -448, 448).astype(E4M3)
    return {"weight": codes, "weight_scale": b}, codes.astype(np.float64) * full


def fp4_codes(x: np.ndarray) -> np.ndarray:
    """The nearest E2M1 code (bit 3 the sign) of each value (clipped to 6)."""
    mag = np.argmin(np.abs(np.abs(x)[..., None] - FP4), axis=-1).astype(np.uint8)
    return mag | (np.signbit(x).astype(np.uint8) << 3)


def mxfp4_scheme(w: np.ndarray, low_first: bool = True):
    b = mx_exponents(w, 2)
    full = np.repeat(np.ldexp(1.0, b.astype(np.int64) - 127), 32, axis=1)
    codes = fp4_codes(w / full)
    first, second = codes[:, 0::2], codes[:, 1::2]
    packed = (first | second << 4) if low_first else (second | first << 4)
    values = FP4[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    return {"weight_packed": packed.astype(np.uint8), "weight_scale": b}, values * full


def weights_args(strategy: str, **extra) -> dict:
    return {"num_bits": extra.pop("num_bits", 8), "type": "float", "strategy": strategy,
            "symmetric": True, "dynamic": False, "group_size": None, **extra}


#: module -> (its config group's format, weights args, shape, writer)
MODULES = {
    "layers.0.fp8_tensor": ("float-quantized", weights_args("tensor"), (96, 128),
                            lambda w: fp8_scheme(w, "tensor")),
    "layers.0.fp8_channel": ("naive-quantized", weights_args("channel"), (96, 128),
                             lambda w: fp8_scheme(w, "channel", scale_dtype=ml_dtypes.bfloat16)),
    "layers.0.fp8_group": ("float-quantized", weights_args("group", group_size=64),
                           (64, 256), lambda w: fp8_scheme(w, "group")),
    "layers.0.fp8_block": ("float-quantized",
                           weights_args("block", block_structure=[128, 128]), (200, 320),
                           lambda w: fp8_scheme(w, "block")),
    "layers.0.mxfp8": ("mxfp8-quantized",
                       weights_args("group", group_size=32, scale_dtype="torch.uint8"),
                       (64, 256), mxfp8_scheme),
    "layers.0.mxfp4": ("mxfp4-pack-quantized",
                       weights_args("group", num_bits=4, group_size=32,
                                    scale_dtype="torch.uint8"), (64, 256), mxfp4_scheme),
}


def ct_config(modules) -> dict:
    """config.json as ModelCompressor.update_config writes it (the fields fmt reads)."""
    groups = {f"group_{n}": {"format": MODULES[m][0], "targets": [f"re:{m}$"],
                             "weights": MODULES[m][1], "input_activations": None}
              for n, m in enumerate(modules)}
    formats = {MODULES[m][0] for m in modules}
    return {"architectures": ["Toy"], "quantization_config": {
        "quant_method": "compressed-tensors", "quantization_status": "compressed",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "config_groups": groups, "ignore": ["lm_head"]}}


def write_folder(folder: Path, modules=tuple(MODULES), config: bool = True, edit=None):
    """The modules' tensors in model.safetensors (+ config.json); returns the original
    float32 weights and the exact decodings (float64) by weight name."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors, originals, exact = {}, {}, {}
    for n, module in enumerate(modules):
        w = weights(n, MODULES[module][2])
        stored, decoded = MODULES[module][3](w)
        tensors.update({f"{module}.{k}": v for k, v in stored.items()})
        originals[f"{module}.weight"], exact[f"{module}.weight"] = w, decoded
    tensors["lm_head.weight"] = weights(99, (8, 32))
    if edit is not None:
        edit(tensors)
    write_safetensors(folder / "model.safetensors", tensors)
    if config:
        (folder / "config.json").write_text(json.dumps(ct_config(modules)))
    return originals, exact


def as_float32(exact: np.ndarray) -> np.ndarray:
    return exact.astype(np.float32)


def dequantized_by_key(folder: Path) -> dict:
    return {s.key: s for s in load_path(str(folder))}


# -- (1) fixtures from the definition ------------------------------------------------------

@pytest.mark.parametrize("config", [True, False], ids=["config", "tensors-only"])
def test_every_scheme_reads_as_the_exact_decoding_of_its_bytes(tmp_path, config):
    _, exact = write_folder(tmp_path, config=config)
    with pytest.warns(Warning, match="already quantized"):
        found = dequantized_by_key(tmp_path)
    assert sorted(found) == sorted([*exact, "lm_head.weight"])
    for key, decoded in exact.items():
        source = found[key]
        assert source.quantized is not None and not source.quantized.problems, key
        mine = source.array()
        assert mine.dtype == np.float32 and mine.shape == decoded.shape
        assert np.array_equal(mine.view(np.uint32), as_float32(decoded).view(np.uint32)), key
    assert found["lm_head.weight"].quantized is None


def test_the_facts_and_groups_of_each_scheme(tmp_path):
    write_folder(tmp_path)
    sources = load_path(str(tmp_path), as_stored=True)
    result = scan(sources, read_config(str(tmp_path)))
    by_key = {q.key: q for q in result.quantized}
    want = {"fp8_tensor": ("compressed-tensors-fp8", "tensor", "float-quantized", 8.0),
            "fp8_channel": ("compressed-tensors-fp8", "row", "naive-quantized", 8.125),
            "fp8_group": ("compressed-tensors-fp8", "block:64", "float-quantized", 8.5),
            "fp8_block": ("compressed-tensors-fp8", "tile:128x128", "float-quantized",
                          8 + 32 / 128 ** 2),
            "mxfp8": ("compressed-tensors-mx", "block:32", "mxfp8-quantized", 8.25),
            "mxfp4": ("compressed-tensors-mx", "block:32", "mxfp4-pack-quantized", 4.25)}
    for name, (layout, group, scheme, bits) in want.items():
        q = by_key[f"layers.0.{name}.weight"]
        assert (q.layout, q.group.spelling) == (layout, group), name
        assert q.facts["config_scheme"] == scheme and q.facts["nominal_bits"] == bits
        assert q.facts["scale_direction"] == "dequantization (x = code * scale)"
        assert q.facts["scale_rule"]
    q = by_key["layers.0.mxfp4.weight"]
    assert q.facts["nibble_order"] == "low-first" and q.element == "float4_e2m1fn"
    assert q.shape == (64, 256) and q.parts["codes"].key == "layers.0.mxfp4.weight_packed"
    assert "- 2," in q.facts["scale_rule"] and "- 8," in by_key[
        "layers.0.mxfp8.weight"].facts["scale_rule"]
    assert q.scales_reader().dtype == np.float32 and q.scales_reader().shape == (64, 8)
    # the elements before scaling: FP4 values as packed, low nibble first
    packed = q.parts["codes"].stored()
    assert q.elements_reader(0, 1)[0, 0] == FP4[packed[0, 0] & 7] * (
        -1 if packed[0, 0] & 8 else 1)
    assert "lm_head.weight" in {s.key for s in result.plain}


def test_swapped_nibbles_decode_to_other_values(tmp_path):
    """A file packed high nibble first is read low-first, as the layout says: its values
    are not the original's (fmt audit's check looks for this)."""
    w = weights(3, (64, 256))
    stored, decoded = mxfp4_scheme(w, low_first=False)
    write_safetensors(tmp_path / "model.safetensors", {f"m.{k}": v for k, v in stored.items()})
    with pytest.warns(Warning):
        mine = dequantized_by_key(tmp_path)["m.weight"].array()
    assert not np.array_equal(mine, as_float32(decoded))


def test_an_asymmetric_fp8_weight_subtracts_its_zero_point(tmp_path):
    """weight_zero_point (float8_e4m3fn, the scale's shape): x = (code - zp) * scale
    (forward_helpers._dequantize)."""
    rng = np.random.default_rng(4)
    codes = (rng.standard_normal((32, 64)) * 40).astype(E4M3)
    zero = rng.integers(-8, 8, (32, 1)).astype(np.float32).astype(E4M3)
    scale = (rng.uniform(1, 2, (32, 1)) * 1e-3).astype(np.float32)
    write_safetensors(tmp_path / "model.safetensors", {
        "m.weight": codes, "m.weight_scale": scale, "m.weight_zero_point": zero})
    exact = (codes.astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
    sources = load_path(str(tmp_path), as_stored=True)
    (q,) = scan(sources).quantized
    assert q.facts["zero_point"] and q.parts["zero_point"].key == "m.weight_zero_point"
    assert np.array_equal(q.dequantize().view(np.uint32), as_float32(exact).view(np.uint32))


@pytest.mark.slow
def test_fmt_quantize_and_compare_in_a_fresh_process(tmp_path):
    originals, exact = write_folder(tmp_path / "ct")
    write_safetensors(tmp_path / "orig.safetensors", originals)
    write_safetensors(tmp_path / "exact.safetensors",
                      {k: as_float32(v) for k, v in exact.items()})
    done = run_fmt("quantize", tmp_path / "ct", "--key", "layers.*", "--json")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert b"already quantized" in done.stderr
    doc = strict_loads(done.stdout)
    reference = strict_loads(run_fmt("quantize", tmp_path / "exact.safetensors",
                                     "--json").stdout)
    assert [t["key"] for t in doc["tensors"]] == list(exact)
    for mine, theirs in zip(doc["tensors"], reference["tensors"]):
        assert mine["shape"] == theirs["shape"] and mine["dtype"] == "float32"
        assert mine["schemes"] == theirs["schemes"]  # the same values, the same statistics
    done = run_fmt("compare", tmp_path / "orig.safetensors", tmp_path / "ct", "--json")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    compared = {t["key"]: t for t in strict_loads(done.stdout)["tensors"]}
    assert sorted(compared) == sorted(originals)
    for key, w in originals.items():
        error = as_float32(exact[key]).astype(np.float64) - w
        sqnr = 10 * math.log10(float(np.sum(w.astype(np.float64) ** 2) / np.sum(error ** 2)))
        assert compared[key]["sqnr_db"] == pytest.approx(sqnr, rel=1e-9), key


# -- (3) bad input -------------------------------------------------------------------------

def _cut_packed(tensors):
    tensors["layers.0.mxfp4.weight_packed"] = tensors["layers.0.mxfp4.weight_packed"][:, :100]


def _cut_packed_rows(tensors):
    tensors["layers.0.mxfp4.weight_packed"] = tensors["layers.0.mxfp4.weight_packed"][:60]


def _half_mx_scales(tensors):
    tensors["layers.0.mxfp8.weight_scale"] = tensors["layers.0.mxfp8.weight_scale"][:, :4]


def _wrong_block_scales(tensors):
    tensors["layers.0.fp8_block.weight_scale"] = np.ones((3, 2), np.float32)


BAD = {"packed-columns-cut": ("mxfp4", _cut_packed, "200 FP4 values per row"),
       "packed-rows-cut": ("mxfp4", _cut_packed_rows, "[60, 8]"),
       "half-size-mx-scales": ("mxfp8", _half_mx_scales, "[64, 4], not [64, 8]"),
       "wrong-shape-block-scales": ("fp8_block", _wrong_block_scales, "[3, 2]")}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_shapes_are_problems_and_one_error_line(tmp_path, case):
    module, edit, fragment = BAD[case]
    write_folder(tmp_path, modules=(f"layers.0.{module}",), edit=edit)
    sources = load_path(str(tmp_path), as_stored=True)
    (q,) = scan(sources, read_config(str(tmp_path))).quantized
    assert len(q.problems) == 1 and fragment in q.problems[0], q.problems
    assert "\n" not in q.problems[0]
    one_error_line(invoke("quantize", tmp_path), f"layers.0.{module}", fragment)


def one_error_line(result, *fragments) -> str:
    """Exit 1, nothing on stdout, no traceback, one Error: line holding the fragments
    (the layout's Note: line before it)."""
    assert_no_traceback(result)
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.stdout)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Note: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: "), result.stderr
    assert all(fragment in errors[0] for fragment in fragments), (fragments, errors[0])
    return errors[0]


def test_a_truncated_file_is_one_error_line(tmp_path):
    write_folder(tmp_path, modules=("layers.0.mxfp4",))
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    assert_data_error(invoke("quantize", tmp_path), "model.safetensors")


HOSTILE_CONFIGS = [
    None, {"config_groups": 5}, {"config_groups": {"g": 5}},
    {"format": "float-quantized", "config_groups": {"g": {
        "weights": {"strategy": ["block"], "group_size": True, "block_structure": [0, -1]},
        "targets": [3, "re:("]}}},
    {"format": "mxfp8-quantized", "config_groups": {"g": {
        "format": {}, "weights": {"strategy": {}, "group_size": 16}, "targets": "re:.*"}}}]
HOSTILE_SHAPES = [((0, 32), (0, 1)), ((4, 0), (4, 0)), ((64, 64), ()), ((64, 64), (7, 7)),
                  ((2, 64, 64), (2, 64, 2)), ((64, 64), (64, 2, 1)), ((64, 1), (64, 1))]


def test_claiming_never_raises_whatever_the_shapes_and_config():
    """Odd shapes and configs are left unclaimed or claimed with problems; reading a
    group without problems works; nothing raises but a DataError on reading."""
    from fmtcli.base.errors import DataError
    from fmtcli.inputs.source import from_array

    claimed, refused = 0, 0
    for (shape, scale_shape), config in [(s, c) for s in HOSTILE_SHAPES
                                         for c in HOSTILE_CONFIGS]:
        for name, dtype, scale_dtype in (("weight", E4M3, np.float32),
                                         ("weight", E4M3, np.uint8),
                                         ("weight_packed", np.uint8, np.uint8)):
            tensors = {f"a.{name}": np.zeros(shape, dtype),
                       "a.weight_scale": np.ones(scale_shape, scale_dtype)}
            sources = [from_array("m.safetensors", key, arr, arr.shape, arr.dtype)
                       for key, arr in tensors.items()]
            for q in scan(sources, config).quantized:
                assert all("\n" not in p for p in q.problems)
                claimed += 1
                try:
                    q.dequantize()
                except DataError:
                    assert q.problems, (shape, scale_shape, config)
                    refused += 1
    assert claimed > refused > 0


@pytest.mark.parametrize("config", [True, False], ids=["config", "tensors-only"])
def test_mxfp6_is_recognised_and_refused_in_one_line(tmp_path, config):
    """mxfp6-pack-quantized (4 E2M3 codes in 3 bytes: [O, 3I/4] beside [O, I/32] scales)
    is not read as MXFP4: a problem, one Error: line."""
    rng = np.random.default_rng(2)
    write_safetensors(tmp_path / "model.safetensors", {
        "m.weight_packed": rng.integers(0, 256, (64, 192)).astype(np.uint8),
        "m.weight_scale": np.full((64, 8), 120, np.uint8)})
    if config:
        (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp6-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights_args(
                "group", num_bits=6, group_size=32, scale_dtype="torch.uint8")}}}}))
    sources = load_path(str(tmp_path), as_stored=True)
    (q,) = scan(sources, read_config(str(tmp_path))).quantized
    assert q.element == "float6_e2m3fn" and q.shape == (64, 256)
    assert q.problems == ["m.weight_packed is MXFP6 (mxfp6-pack-quantized: 4 E2M3 codes in "
                          "3 bytes), a layout fmt does not read"]
    one_error_line(invoke("quantize", tmp_path), "MXFP6")


def test_an_nvfp4_packed_weight_is_not_claimed_as_mx(tmp_path):
    """A weight_packed with a weight_global_scale is NVFP4's: left to its own reader."""
    w = weights(1, (64, 256))
    stored, _ = mxfp4_scheme(w)
    stored["weight_global_scale"] = np.array([1.0], np.float32)
    write_safetensors(tmp_path / "model.safetensors", {f"m.{k}": v for k, v in stored.items()})
    sources = load_path(str(tmp_path), as_stored=True)
    assert [q.layout for q in scan(sources).quantized
            if q.layout.startswith("compressed-tensors-mx")] == []


# -- (2) the real library: its own quantization, compression, saving and decompression ----

def _ct_folder(folder: Path, preset: str, shape, dtype_name: str,
               weights_only: bool = False) -> None:
    """A Linear ``proj`` quantized with compressed-tensors' preset scheme
    (``layout_fixtures.ct_library``: the scales by the library's calculate_qparams from the
    weight's min/max per strategy, compressed by ModelCompressor and saved as
    save_pretrained saves it).  ``weights_only``: the preset's weights without its input
    scheme (naive-quantized)."""
    pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    if lf.ct_library(folder, "proj", weights(7, shape), preset, dtype=dtype_name,
                     weights_only=weights_only) is None:
        pytest.skip(f"this compressed-tensors lacks the API or the {preset} preset the "
                    "writer drives")


def _library_decoding(folder: Path) -> np.ndarray:
    import torch
    from safetensors.torch import load_file

    try:
        from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
            CompressedTensorsDequantizer,
        )
    except ImportError as missing:
        pytest.skip(f"this compressed-tensors has no checkpoint dequantizer: {missing}")

    tensors = load_file(folder / "model.safetensors")
    dequantizer = CompressedTensorsDequantizer(str(folder), dtype=torch.float32)
    return dequantizer.process(tensors)["proj.weight"].numpy()


def _exact_fp8(folder: Path) -> np.ndarray:
    """The float64 decoding of an FP8 file's bytes: code * weight_scale per its tile."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    codes = tensors["proj.weight"].to(torch.float64).numpy()
    scale = tensors["proj.weight_scale"].to(torch.float64).numpy()
    o, i = codes.shape
    if scale.size == 1:
        return codes * scale.reshape(-1)[0]
    if scale.shape == (o, 1):
        return codes * scale
    assert scale.shape == (-(-o // 128), -(-i // 128))  # FP8_BLOCK: [128, 128]
    bh, bw = 128, 128
    return codes * np.repeat(np.repeat(scale, bh, 0), bw, 1)[:o, :i]


ORACLE = {"FP8": ("tensor", "bfloat16"), "FP8_DYNAMIC": ("row", "bfloat16"),
          "FP8_DYNAMIC-weights": ("row", "bfloat16"),  # naive-quantized
          "FP8_BLOCK": ("tile:128x128", "bfloat16"),
          "FP8_BLOCK-float32": ("tile:128x128", "float32"),
          "MXFP8": ("block:32", "bfloat16"), "MXFP4": ("block:32", "bfloat16"),
          "MXFP4-float32": ("block:32", "float32")}


@pytest.mark.slow
@pytest.mark.parametrize("case", ORACLE, ids=list(ORACLE))
def test_the_library_s_own_checkpoints_against_its_decompression(tmp_path, case):
    preset = case.partition("-")[0]
    group, dtype_name = ORACLE[case]
    folder = tmp_path / "ct"
    _ct_folder(folder, preset, (192, 320), dtype_name, case.endswith("-weights"))
    sources = load_path(str(folder), as_stored=True)
    (q,) = scan(sources, read_config(str(folder))).quantized
    assert q.key == "proj.weight" and q.group.spelling == group and not q.problems
    assert q.facts["config_scheme"] == json.loads((folder / "config.json").read_text())[
        "quantization_config"]["format"]
    if preset == "FP8":
        assert q.parts["input_scale"].key == "proj.input_scale"
    mine = q.dequantize()
    theirs = _library_decoding(folder)
    if preset.startswith("MX"):  # the library decodes exactly: bit for bit
        assert np.array_equal(mine.view(np.uint32), theirs.view(np.uint32))
        return
    exact = _exact_fp8(folder)
    assert np.array_equal(mine.view(np.uint32), exact.astype(np.float32).view(np.uint32))
    import torch

    rounded = torch.from_numpy(exact).to(getattr(torch, dtype_name)).float().numpy()
    assert np.array_equal(theirs, rounded)  # the library: the exact value in its dtype
    relative = np.abs(theirs - exact) / np.maximum(np.abs(exact), 1e-300)
    assert relative.max() <= (2.0 ** -8 if dtype_name == "bfloat16" else 2.0 ** -24)


@pytest.mark.slow
def test_the_library_s_mxfp6_is_recognised_and_refused(tmp_path):
    _ct_folder(tmp_path / "ct", "MXFP6A16", (64, 256), "bfloat16")
    sources = load_path(str(tmp_path / "ct"), as_stored=True)
    (q,) = scan(sources, read_config(str(tmp_path / "ct"))).quantized
    assert q.element == "float6_e2m3fn" and q.shape == (64, 256) and "MXFP6" in q.problems[0]
