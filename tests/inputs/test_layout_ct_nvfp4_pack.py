"""compressed-tensors' nvfp4-pack-quantized and pack-quantized checkpoints read as their
dequantized values (inputs.layouts.ct_nvfp4, inputs.layouts.ct_pack).

Two kinds of fixture:

- written here from the definition (compressed-tensors 0.20.1 compressors/nvfp4/helpers.py
  and compressors/pack_quantized/helpers.py, as docs/layouts/ct_nvfp4_pack.md states it:
  FP4 E2M1 nibbles low first; int fields offset by 2^(bits-1) in one little-endian bit
  stream per row; x = (q - zp) * scale [/ global]), with the exact float64 decoding as the
  oracle: fmt's float32 values are that decoding rounded once;
- written by compressed-tensors itself (skipped where it is not installed: run them with
  /tmp/ctcheck/bin/python -m pytest), compressed and saved the way the library saves
  (ModelCompressor.compress_model, the model's state dict as safetensors, update_config),
  with the library's own decompression as the oracle: bit for bit where it decodes
  exactly (pack-quantized with float32 scales); else fmt equals the exact decoding and the
  library's bfloat16 output is within its rounding (2^-8 relative).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_no_traceback, invoke, run_fmt, strict_loads
from oracle import write_safetensors

from fmtcli.inputs import layouts
from fmtcli.inputs.tensors import load_path

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # OCP MX v1.0 FP4 magnitudes
BF16_ROUNDING = 2.0 ** -8  # bfloat16's largest relative rounding error (8 significant bits)


# -- writing checkpoints from the definition -----------------------------------------------

def fp4_decoded(codes: np.ndarray) -> np.ndarray:
    """float64 values of 4-bit E2M1 codes (bit 3 the sign)."""
    return np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]


def nvfp4_tensors(rng, rows=8, cols=64, group=16, gs=448.0 * 6 / 3.7, module="m.proj"):
    """An NVFP4 module's tensors and the exact float64 decoding of them."""
    codes = rng.integers(0, 16, (rows, cols)).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scale = (2.0 ** rng.uniform(-6, 8, (rows, -(-cols // group)))).astype(
        ml_dtypes.float8_e4m3fn)
    glob = np.array([gs], dtype=np.float32)
    per = np.repeat(scale.astype(np.float64), group, axis=1)[:, :cols]
    exact = fp4_decoded(codes) * per / float(glob[0])
    return {f"{module}.weight_packed": packed, f"{module}.weight_scale": scale,
            f"{module}.weight_global_scale": glob}, exact


def pack_rows(q: np.ndarray, bits: int, per_word: int | None = None) -> np.ndarray:
    """int32 words of signed ints q (rows, n): offset to unsigned, one bit stream per row
    (``per_word``: the older packing, that many values per word, none straddling)."""
    out = []
    for row in (q.astype(np.int64) + (1 << (bits - 1))):
        stream, words = 0, []
        if per_word is None:
            for i, v in enumerate(row):
                stream |= int(v) << (i * bits)
            count = -(-len(row) * bits // 32)
        else:
            for i, v in enumerate(row):
                stream |= int(v) << ((i // per_word) * 32 + (i % per_word) * bits)
            count = -(-len(row) // per_word)
        words = [(stream >> (32 * k)) & 0xFFFFFFFF for k in range(count)]
        out.append(words)
    return np.array(out, dtype=np.uint32).view(np.int32)


def pack_tensors(rng, bits=4, rows=8, cols=256, group=128, asym=False, scale_dtype=np.float32,
                 module="m.proj", per_word=None):
    """A pack-quantized module's tensors and their exact float64 decoding."""
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = rng.integers(low, high + 1, (rows, cols))
    n = -(-cols // group)
    scale = (rng.uniform(0.5, 2.0, (rows, n)) * 0.01).astype(scale_dtype)
    tensors = {f"{module}.weight_packed": pack_rows(q, bits, per_word),
               f"{module}.weight_scale": scale,
               f"{module}.weight_shape": np.array([rows, cols], dtype=np.int64)}
    zero = np.zeros((rows, n), dtype=np.int64)
    if asym:
        zero = rng.integers(low, high + 1, (rows, n))
        tensors[f"{module}.weight_zero_point"] = np.ascontiguousarray(
            pack_rows(zero.T, bits).T)  # packed along the rows
    col = np.arange(cols) // group
    exact = (q - zero[:, col]) * scale.astype(np.float64)[:, col]
    return tensors, exact


def ct_config(fmt: str, **weights) -> dict:
    return {"quantization_config": {
        "quant_method": "compressed-tensors", "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt,
                                      "weights": weights}}}}


def write_checkpoint(folder, tensors: dict, config: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def scanned(folder):
    return layouts.scan(load_path(str(folder), as_stored=True),
                        layouts.read_config(str(folder))).quantized


def one_error_line(result, fragment: str = "") -> str:
    """Exit 1, nothing on stdout, no traceback, and besides the ``Note:`` lines (the
    layout's note, a block's note) exactly one ``Error:`` line, holding ``fragment``."""
    assert_no_traceback(result)
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.stderr)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("Note: ")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# -- NVFP4 from the definition -------------------------------------------------------------

@pytest.mark.parametrize("config", [True, False])
def test_nvfp4_equals_the_exact_decoding(tmp_path, config):
    tensors, exact = nvfp4_tensors(np.random.default_rng(1))
    cfg = ct_config("nvfp4-pack-quantized", num_bits=4, type="float", group_size=16,
                    strategy="tensor_group") if config else None
    (q,) = scanned(write_checkpoint(tmp_path, tensors, cfg))
    assert (q.layout, q.key, q.shape, q.element) == ("compressed-tensors-nvfp4",
                                                     "m.proj.weight", (8, 64), "float4_e2m1fn")
    assert q.problems == []
    assert same_bits(q.dequantize(), exact.astype(np.float32))
    assert same_bits(q.read(slice(3, 5), slice(0, 64)), exact[3:5].astype(np.float32))
    assert same_bits(q.elements_reader(0, 8), fp4_decoded(
        np.stack([tensors["m.proj.weight_packed"] & 15, tensors["m.proj.weight_packed"] >> 4],
                 axis=-1).reshape(8, 64)).astype(np.float32))
    scales = tensors["m.proj.weight_scale"].astype(np.float32)
    assert same_bits(q.scales_reader(), scales)
    facts = q.facts
    assert facts["global_scale_convention"] == "compressed-tensors"
    assert facts["nibble_order"] == "low-first"
    assert facts["scale_direction"] == "dequantization (x = code * scale)"
    assert facts["nominal_bits"] == 4.5 and facts["group_size"] == 16
    assert facts["config_scheme"] == ("nvfp4-pack-quantized" if config else None)
    assert facts["symmetric"] is True
    assert facts["implied_amax"] == pytest.approx(3.7, rel=1e-6)
    assert set(q.parts) == {"codes", "scales", "global_scale"}


def test_nvfp4_stacked_experts_and_input_scales(tmp_path):
    rng = np.random.default_rng(2)
    tensors, exact = nvfp4_tensors(rng, rows=12, cols=48)
    tensors = {k: (v.reshape(3, 4, -1) if v.ndim == 2 else v) for k, v in tensors.items()}
    tensors["m.proj.input_global_scale"] = np.array([7.0], dtype=np.float32)
    (q,) = scanned(write_checkpoint(tmp_path, tensors))
    assert q.shape == (3, 4, 48) and q.problems == []
    assert "input_global_scale" in q.parts
    assert same_bits(q.read(slice(5, 11), slice(0, 48)), exact[5:11].astype(np.float32))


def test_nvfp4_one_global_scale_per_stacked_matrix(tmp_path):
    rng = np.random.default_rng(15)
    experts = [nvfp4_tensors(rng, rows=4, cols=32, gs=gs) for gs in (100.0, 2000.0, 7.5)]
    tensors = {k: np.stack([t[k] for t, _ in experts]) for k in experts[0][0]}
    tensors["m.proj.weight_global_scale"] = tensors["m.proj.weight_global_scale"].reshape(3)
    (q,) = scanned(write_checkpoint(tmp_path, tensors))
    exact = np.concatenate([e for _, e in experts])
    assert q.problems == [] and q.facts["global_scale"] == [100.0, 2000.0, 7.5]
    assert q.facts["implied_amax"] == 2688 / 7.5
    assert same_bits(q.read(slice(2, 11), slice(0, 32)), exact[2:11].astype(np.float32))
    tensors["m.proj.weight_global_scale"] = np.ones(2, dtype=np.float32)
    (q,) = scanned(write_checkpoint(tmp_path / "two", tensors))
    assert "not one float32 (or one per stacked matrix)" in q.problems[0]


def test_nvfp4_swapped_nibbles_read_differently(tmp_path):
    """A high-nibble-first file is not this layout's: the values fmt reads are the
    low-first decoding, which audit's checks (vs the original) catch."""
    tensors, exact = nvfp4_tensors(np.random.default_rng(3))
    packed = tensors["m.proj.weight_packed"]
    tensors["m.proj.weight_packed"] = ((packed << 4) | (packed >> 4)).astype(np.uint8)
    (q,) = scanned(write_checkpoint(tmp_path, tensors))
    assert q.facts["nibble_order"] == "low-first"
    swapped = exact.reshape(8, 32, 2)[..., ::-1].reshape(8, 64)
    assert same_bits(q.dequantize(), swapped.astype(np.float32))


# -- pack-quantized from the definition ----------------------------------------------------

@pytest.mark.parametrize("bits, asym, config", [(4, False, True), (4, True, True),
                                                (8, False, True), (8, True, False),
                                                (3, False, True), (5, True, False)])
def test_pack_equals_the_exact_decoding(tmp_path, bits, asym, config):
    tensors, exact = pack_tensors(np.random.default_rng(bits), bits=bits, asym=asym)
    cfg = ct_config("pack-quantized", num_bits=bits, type="int", group_size=128,
                    strategy="group", symmetric=not asym) if config else None
    (q,) = scanned(write_checkpoint(tmp_path, tensors, cfg))
    assert q.problems == [] and (q.key, q.shape, q.element) == ("m.proj.weight", (8, 256),
                                                                f"int{bits}")
    assert same_bits(q.dequantize(), exact.astype(np.float32))
    assert same_bits(q.read(slice(2, 7), slice(0, 256)), exact[2:7].astype(np.float32))
    assert q.facts["symmetric"] is (not asym) and q.facts["group_size"] == 128
    assert q.facts["num_bits_from"] == ("config.json" if config else
                                        "weight_shape and the packed width")
    assert q.facts["nominal_bits"] == bits + (32 + bits * asym) / 128
    assert q.facts["config_scheme"] == ("pack-quantized" if config else None)


def test_pack_channel_tensor_gidx_and_bfloat16_scales(tmp_path):
    rng = np.random.default_rng(7)
    tensors, _ = pack_tensors(rng, bits=4, cols=64, group=64, scale_dtype=ml_dtypes.bfloat16)
    q_words = tensors["m.proj.weight_packed"]
    (q,) = scanned(write_checkpoint(tmp_path / "channel", tensors))
    assert q.group.spelling == "row" and q.problems == []
    codes = q.elements_reader(0, 8).astype(np.float64)
    scale = tensors["m.proj.weight_scale"].astype(np.float64)
    assert same_bits(q.dequantize(), (codes * scale).astype(np.float32))
    one = dict(tensors, **{"m.proj.weight_scale": np.array([0.03], dtype=np.float32)})
    (q,) = scanned(write_checkpoint(tmp_path / "tensor", one))
    assert q.group.spelling == "tensor"
    assert same_bits(q.dequantize(), (codes * np.float64(np.float32(0.03))).astype(np.float32))
    g_idx = rng.integers(0, 4, 64).astype(np.int32)
    grouped = {"m.proj.weight_packed": q_words, "m.proj.weight_g_idx": g_idx,
               "m.proj.weight_shape": np.array([8, 64], dtype=np.int64),
               "m.proj.weight_scale": rng.uniform(0.01, 0.02, (8, 4)).astype(np.float32)}
    (q,) = scanned(write_checkpoint(tmp_path / "gidx", grouped,
                                    ct_config("pack-quantized", num_bits=4, group_size=16)))
    want = codes * grouped["m.proj.weight_scale"].astype(np.float64)[:, g_idx]
    assert q.facts["g_idx"] and same_bits(q.dequantize(), want.astype(np.float32))


def test_pack_older_packing_is_told_apart(tmp_path):
    """3-bit values at 10 per word (older releases) vs the dense stream of 0.20."""
    tensors, exact = pack_tensors(np.random.default_rng(9), bits=3, per_word=10)
    (q,) = scanned(write_checkpoint(tmp_path, tensors, ct_config("pack-quantized", num_bits=3,
                                                                  group_size=128)))
    assert q.facts["packing"].startswith("10 per int32 word")
    assert same_bits(q.dequantize(), exact.astype(np.float32))


def test_pack_stacked_experts_with_zero_points(tmp_path):
    """E x O x I weights: packed per expert, zero points packed along each expert's rows."""
    rng = np.random.default_rng(12)
    experts = [pack_tensors(rng, bits=4, rows=6, cols=64, group=32, asym=True,
                            scale_dtype=np.float16) for _ in range(3)]
    tensors = {k: np.stack([t[k] for t, _ in experts]) for k in experts[0][0]}
    tensors["m.proj.weight_shape"] = np.array([3, 6, 64], dtype=np.int64)
    (q,) = scanned(write_checkpoint(tmp_path, tensors))
    exact = np.concatenate([e for _, e in experts])
    assert q.shape == (3, 6, 64) and q.problems == [] and q.facts["zero_point"] == "packed"
    assert same_bits(q.read(slice(4, 15), slice(0, 64)), exact[4:15].astype(np.float32))


def test_mixed_config_groups_by_target(tmp_path):
    rng = np.random.default_rng(13)
    nv, nv_exact = nvfp4_tensors(rng, module="m.attn")
    pk, pk_exact = pack_tensors(rng, bits=8, module="m.mlp")
    config = {"quantization_config": {"format": "mixed-precision", "config_groups": {
        "a": {"targets": ["re:.*attn$"], "format": "nvfp4-pack-quantized",
              "weights": {"num_bits": 4, "type": "float", "group_size": 16}},
        "b": {"targets": ["re:.*mlp$"], "format": "pack-quantized",
              "weights": {"num_bits": 8, "type": "int", "group_size": 128}}}}}
    found = {q.key: q for q in scanned(write_checkpoint(tmp_path, {**nv, **pk}, config))}
    assert found["m.attn.weight"].facts["config_scheme"] == "nvfp4-pack-quantized"
    assert found["m.mlp.weight"].facts["config_scheme"] == "pack-quantized"
    assert same_bits(found["m.attn.weight"].dequantize(), nv_exact.astype(np.float32))
    assert same_bits(found["m.mlp.weight"].dequantize(), pk_exact.astype(np.float32))


@pytest.mark.parametrize("shape", [np.array([8, -256]), np.array([[8, 256]]),
                                   np.array([8.0, 256.0]), np.array([8, 2 ** 62]),
                                   np.arange(1, 20)])
def test_hostile_weight_shape_is_a_problem(tmp_path, shape):
    tensors, _ = pack_tensors(np.random.default_rng(14))
    tensors["m.proj.weight_shape"] = shape
    (q,) = scanned(write_checkpoint(tmp_path, tensors, ct_config("pack-quantized",
                                                                  num_bits=4)))
    assert q.problems and "weight_shape" in q.problems[0]
    one_error_line(invoke("quantize", tmp_path), "weight_shape")


# -- bad input: problems, and one Error: line ----------------------------------------------

def nvfp4_broken(tensors: dict, what: str) -> dict:
    if what == "truncated packed":
        tensors["m.proj.weight_packed"] = tensors["m.proj.weight_packed"][:, :24].copy()
    elif what == "half as many scales":
        tensors["m.proj.weight_scale"] = tensors["m.proj.weight_scale"][:, :2].copy()
    elif what == "no global scale":
        del tensors["m.proj.weight_global_scale"]
    elif what == "zero global scale":
        tensors["m.proj.weight_global_scale"] = np.zeros(1, dtype=np.float32)
    return tensors


@pytest.mark.parametrize("what, fragment", [
    ("truncated packed", "not [8, 3]"), ("half as many scales", "not [8, 4]"),
    ("no global scale", "weight_global_scale is missing"),
    ("zero global scale", "holds 0.0, not a positive number")])
def test_nvfp4_bad_input(tmp_path, what, fragment):
    tensors, _ = nvfp4_tensors(np.random.default_rng(4))
    folder = write_checkpoint(tmp_path, nvfp4_broken(tensors, what))
    (q,) = scanned(folder)
    assert q.problems and fragment in q.problems[0]
    one_error_line(invoke("quantize", folder), fragment)


def pack_broken(tensors: dict, what: str) -> dict:
    if what == "weight_shape disagrees":
        tensors["m.proj.weight_shape"] = np.array([8, 100], dtype=np.int64)
    elif what == "wrong-shape scales":
        tensors["m.proj.weight_scale"] = tensors["m.proj.weight_scale"][:, :1].copy()
    elif what == "truncated packed":
        tensors["m.proj.weight_packed"] = tensors["m.proj.weight_packed"][:, :20].copy()
    elif what == "zero point shape":
        tensors["m.proj.weight_zero_point"] = np.zeros((3, 2), dtype=np.int32)
    elif what == "bits unknown":
        del tensors["m.proj.weight_shape"]
    return tensors


@pytest.mark.parametrize("what, fragment", [
    ("weight_shape disagrees", "weight_shape [8, 100] disagrees"),
    ("truncated packed", "disagrees with m.proj.weight_packed [8, 20]"),
    ("wrong-shape scales", "not one per groups of 128"),
    ("zero point shape", "not a zero point"),
    ("bits unknown", "the number of bits is unknown")])
def test_pack_bad_input(tmp_path, what, fragment):
    tensors, _ = pack_tensors(np.random.default_rng(5))
    config = None if what == "bits unknown" else ct_config("pack-quantized", num_bits=4,
                                                           group_size=128)
    folder = write_checkpoint(tmp_path, pack_broken(tensors, what), config)
    (q,) = scanned(folder)
    assert q.problems and fragment in q.problems[0], q.problems
    one_error_line(invoke("quantize", folder), fragment)


def test_gidx_out_of_range_is_one_error_line(tmp_path):
    tensors, _ = pack_tensors(np.random.default_rng(6), cols=64, group=16)
    tensors["m.proj.weight_g_idx"] = np.full(64, 9, dtype=np.int32)
    folder = write_checkpoint(tmp_path, tensors, ct_config("pack-quantized", num_bits=4,
                                                           group_size=16))
    one_error_line(invoke("quantize", folder), "names groups outside 0..3")


def test_truncated_file_is_one_error_line(tmp_path):
    tensors, _ = nvfp4_tensors(np.random.default_rng(8))
    write_checkpoint(tmp_path, tensors)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-40])
    one_error_line(invoke("quantize", tmp_path))


@pytest.mark.slow
def test_fresh_process_reads_both_layouts(tmp_path):
    nv, nv_exact = nvfp4_tensors(np.random.default_rng(10), rows=16, cols=128)
    pk, pk_exact = pack_tensors(np.random.default_rng(11), rows=16, cols=128, asym=True)
    folder = write_checkpoint(tmp_path / "q", {**nv, **{k.replace("m.proj", "m.up"): v
                                                        for k, v in pk.items()}},
                              ct_config("nvfp4-pack-quantized", num_bits=4, group_size=16))
    ref = {"m.proj.weight": (nv_exact * 1.01).astype(np.float32),
           "m.up.weight": (pk_exact + 0.001).astype(np.float32)}
    write_checkpoint(tmp_path / "ref", ref)
    done = run_fmt("quantize", folder, "--json")
    assert done.returncode == 0, done.stderr
    assert b"already quantized" in done.stderr and b"Traceback" not in done.stderr
    shown = {t["key"]: t for t in strict_loads(done.stdout)["tensors"]}
    assert set(shown) == {"m.proj.weight", "m.up.weight"}
    done = run_fmt("compare", tmp_path / "ref", folder, "--json")
    assert done.returncode == 0, done.stderr
    found = {t["key"]: t for t in strict_loads(done.stdout)["tensors"]}
    for key, exact in (("m.proj.weight", nv_exact), ("m.up.weight", pk_exact)):
        diff = np.abs(ref[key].astype(np.float64) - exact.astype(np.float32))
        assert found[key]["max_abs_error"] == pytest.approx(diff.max(), rel=1e-12)


# -- written by compressed-tensors itself --------------------------------------------------

LIBRARY_SCHEMES = ("NVFP4A16", "W4A16", "W4A16_ASYM", "W8A16", "W3A16")


def library_checkpoint(folder, scheme: str, dtype, seed: int = 0):
    """A one-Linear model quantized by compressed-tensors (its qparams from the library's
    calculate_qparams / generate_gparam), compressed by ModelCompressor and saved as the
    library saves it; returns the original weight and the library's decompression of it."""
    torch = pytest.importorskip("torch")
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    from safetensors.torch import save_file

    if not hasattr(ModelCompressor, "compress_model"):
        pytest.skip(f"compressed-tensors {ct.__version__}: no ModelCompressor.compress_model")
    torch.manual_seed(seed)
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(256, 64, bias=False, dtype=dtype)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])}))
    module, weight = model.proj, model.proj.weight.data
    args = module.quantization_scheme.weights
    glob = None
    if hasattr(module, "weight_global_scale"):
        glob = generate_gparam(weight.min(), weight.max())
        module.weight_global_scale.data.copy_(glob)
    groups = weight.unflatten(-1, (-1, args.group_size))
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=glob)
    module.weight_scale.data.copy_(scale)
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero)
    original = weight.clone()
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    compressor.update_config(str(folder))
    compressor.decompress_model(model)
    library = model.proj.weight.data.float().numpy()
    return original.float().numpy(), library, model.proj.weight.dtype


def exact_decoding(folder) -> np.ndarray:
    """The stored tensors decoded here from the definition, in float64."""
    from oracle import read_safetensors

    tensors, _ = read_safetensors(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    weights = config["config_groups"]["group_0"]["weights"]
    scale = tensors["proj.weight_scale"].astype(np.float64)
    if "proj.weight_global_scale" in tensors:
        packed = tensors["proj.weight_packed"]
        codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
        per = np.repeat(scale, weights["group_size"], axis=1)
        return fp4_decoded(codes) * per / float(tensors["proj.weight_global_scale"][0])
    bits, (rows, cols) = weights["num_bits"], tensors["proj.weight_shape"]
    stream = [sum(int(w) << (32 * k) for k, w in enumerate(row.view(np.uint32)))
              for row in tensors["proj.weight_packed"]]
    mask = (1 << bits) - 1
    q = np.array([[(s >> (i * bits)) & mask for i in range(cols)] for s in stream])
    q -= 1 << (bits - 1)
    col = np.arange(cols) // weights["group_size"]
    zero = np.zeros(scale.shape)
    if "proj.weight_zero_point" in tensors:
        packed = tensors["proj.weight_zero_point"].T
        zs = [sum(int(w) << (32 * k) for k, w in enumerate(r.view(np.uint32))) for r in packed]
        zero = np.array([[(s >> (i * bits)) & mask for i in range(rows)] for s in zs]).T
        zero = zero - (1 << (bits - 1))
    return (q - zero[:, col]) * scale[:, col]


@pytest.fixture(scope="module")
def library_folders(tmp_path_factory):
    import_torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    found = {}
    for scheme in LIBRARY_SCHEMES:
        for dtype in (import_torch.bfloat16, import_torch.float32):
            folder = tmp_path_factory.mktemp(f"{scheme}-{str(dtype)[6:]}")
            found[scheme, str(dtype)[6:]] = (folder, *library_checkpoint(folder, scheme, dtype))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("scheme", LIBRARY_SCHEMES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_library_checkpoints(library_folders, scheme, dtype):
    folder, original, library, library_dtype = library_folders[scheme, dtype]
    (q,) = scanned(folder)
    nvfp4 = scheme.startswith("NVFP4")
    assert q.layout == ("compressed-tensors-nvfp4" if nvfp4 else "compressed-tensors-pack")
    assert q.problems == [] and q.key == "proj.weight" and q.shape == (64, 256)
    assert q.facts["config_scheme"] == ("nvfp4-pack-quantized" if nvfp4 else "pack-quantized")
    assert q.facts["symmetric"] is (not scheme.endswith("ASYM"))
    values = q.dequantize()
    exact = exact_decoding(folder)
    assert same_bits(values, exact.astype(np.float32))  # fmt = the exact decoding, rounded once
    if str(library_dtype) == "torch.float32":  # the library decodes exactly: bit for bit
        assert same_bits(library, values)
    else:  # it rounds to bfloat16: within its rounding of the exact values
        assert str(library_dtype) == "torch.bfloat16"
        assert np.all(np.abs(library - exact) <= BF16_ROUNDING * np.abs(exact))
    # and the dequantized weight is the original within the format's step
    assert np.abs(values - original).max() <= np.abs(original).max() * (0.34 if nvfp4 else 0.2)


@pytest.mark.slow
def test_library_checkpoint_through_fmt(library_folders, tmp_path):
    """fmt quantize DIR and fmt compare ORIG DIR in a fresh process: the dequantized tensor
    is the original's name, and compare's error is the one against fmt's values."""
    from oracle import write_safetensors as write

    for scheme in ("NVFP4A16", "W4A16_ASYM"):
        folder, original, _, _ = library_folders[scheme, "bfloat16"]
        ref = tmp_path / scheme
        ref.mkdir()
        write(ref / "model.safetensors", {"proj.weight": original.astype(np.float32)})
        done = run_fmt("quantize", folder, "--json")
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
        assert [t["key"] for t in strict_loads(done.stdout)["tensors"]] == ["proj.weight"]
        done = run_fmt("compare", ref, folder, "--json")
        assert done.returncode == 0, done.stderr
        (found,) = strict_loads(done.stdout)["tensors"]
        values = exact_decoding(folder).astype(np.float32)
        want = np.abs(original.astype(np.float64) - values).max()
        assert found["max_abs_error"] == pytest.approx(want, rel=1e-12)
