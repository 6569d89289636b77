"""ModelOpt NVFP4 and gpt-oss MXFP4 checkpoints (``inputs.layouts.modelopt_nvfp4``,
``gptoss_mxfp4``): fixtures written from the definitions (tests/layout_fixtures.py) decode
exactly; stacked experts; the broken fixtures decode as what they store; the commands read
the folders as dequantized tensors; bad input is a problem and one Error: line.

Where the real readers import (gpt-oss's ``gpt_oss/torch/weights.py`` and ModelOpt's
``NVFP4QTensor``, both on torch), they are the oracle; the tests skip without them.
"""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import run_fmt, strict_loads
from layout_fixtures import (
    decode_packed,
    fp8_labelled_nvfp4,
    mxfp4_gptoss,
    nvfp4_modelopt,
    nvfp4_quantize,
    pack,
)
from safetensors.numpy import save_file

from fmtcli.inputs import layouts
from fmtcli.inputs.layouts.base import LayoutNote
from fmtcli.inputs.safetensorsfile import load_safetensors
from fmtcli.inputs.tensors import load_path

KEY = "model.layers.0.mlp.down_proj.weight"
EXPERTS = "block.0.mlp.mlp1_weight"


def weight(shape, seed=0, scale=0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def claimed(path) -> dict:
    """{key: Quantized} of a fixture folder, through scan with the folder's config."""
    sources = load_path(str(path), as_stored=True)
    return {q.key: q for q in layouts.scan(sources, layouts.read_config(str(path))).quantized}


def load_file(path: str) -> dict:
    """{key: array as stored} of a .safetensors file (safetensors.numpy cannot load float8)."""
    return {s.key: np.array(s.stored()) for s in load_safetensors(path)}


def dequantized(path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutNote)
        return {s.key: s for s in load_path(str(path))}


def assert_exact(q, expected: np.ndarray) -> None:
    got = q.dequantize()
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected.astype(np.float32)), np.abs(got - expected).max()


def run_error(*args) -> str:
    done = run_fmt(*args)
    err = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b"", (done.returncode, err)
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# -- ModelOpt NVFP4 --------------------------------------------------------------------------

@pytest.mark.parametrize("configs", ["both", "config", "hf", "none"])
def test_a_modelopt_nvfp4_weight_decodes_exactly_with_its_facts(tmp_path, configs):
    fx = nvfp4_modelopt(tmp_path / "m", weight((48, 64)), configs=configs)
    q = claimed(fx.path)[KEY]
    assert_exact(q, fx.expected[KEY])
    assert (q.layout, q.element, q.scale_dtype, q.group.spelling) == (
        "modelopt-nvfp4", "float4_e2m1fn", "float8_e4m3fn", "block:16")
    assert q.shape == (48, 64) and q.problems == []
    assert set(q.parts) == {"codes", "scales", "global_scale", "input_scale"}
    assert q.facts["global_scale_convention"] == "modelopt"
    assert q.facts["nibble_order"] == "low-first" and q.facts["nominal_bits"] == 4.5
    assert q.facts["scale_direction"].startswith("dequantization")
    want = {"both": ("NVFP4", "config.json"), "config": ("NVFP4", "config.json"),
            "hf": ("NVFP4", "hf_quant_config.json"), "none": (None, None)}[configs]
    assert (q.facts["config_scheme"], q.facts["config_file"]) == want
    # 4 bits per value + one byte per 16 + the two float32 scalars
    assert q.bits_per_param == pytest.approx(4.5 + 64 / (48 * 64))


def test_the_elements_and_scales_are_the_stored_codes_and_block_scales(tmp_path):
    w = weight((16, 64), seed=1)
    fx = nvfp4_modelopt(tmp_path / "m", w)
    q = claimed(fx.path)[KEY]
    codes, scale, _ = nvfp4_quantize(w)
    stored = load_file(str(fx.path / "model.safetensors"))[KEY]
    assert np.array_equal(q.elements_reader(0, 16), decode_packed(stored).astype(np.float32))
    assert np.array_equal(q.scales_reader(), scale.astype(np.float32))


def test_a_chunk_of_rows_equals_the_same_rows_of_the_whole(tmp_path):
    fx = nvfp4_modelopt(tmp_path / "m", weight((40, 96), seed=2))
    q = claimed(fx.path)[KEY]
    whole = q.dequantize()
    assert np.array_equal(q.read(slice(7, 23), slice(0, 96)), whole[7:23])
    assert np.array_equal(q.read(slice(3, 5), slice(16, 40)), whole[3:5, 16:40])


@pytest.mark.parametrize("per_matrix", [False, True])
def test_stacked_nvfp4_experts_decode_matrix_by_matrix(tmp_path, per_matrix):
    w = weight((3, 8, 32), seed=3) * np.array([1, 10, 100], np.float32)[:, None, None]
    fx = nvfp4_modelopt(tmp_path / "m", w, per_matrix_global=per_matrix)
    q = claimed(fx.path)[KEY]
    assert q.problems == [] and q.shape == (3, 8, 32)
    assert_exact(q, fx.expected[KEY])
    assert np.array_equal(q.read(slice(6, 19), slice(0, 32)),
                          fx.expected[KEY].reshape(24, 32)[6:19].astype(np.float32))


@pytest.mark.parametrize("broken", ["half_scales", "inverted_global", "swapped_nibbles"])
def test_a_broken_nvfp4_fixture_decodes_as_it_is_stored_and_not_as_the_healthy_one(
        tmp_path, broken):
    w = weight((32, 64), seed=4)
    healthy = nvfp4_modelopt(tmp_path / "ok", w)
    fx = nvfp4_modelopt(tmp_path / broken, w, **{broken: True})
    q = claimed(fx.path)[KEY]
    assert q.problems == []  # structurally sound: fmt audit's checks judge the values
    assert_exact(q, fx.expected[KEY])
    assert not np.allclose(fx.expected[KEY], healthy.expected[KEY], rtol=0.05)


def test_the_healthy_fixture_is_modelopts_nvfp4_of_the_weight(tmp_path):
    # the codes' error is within half an FP4 step of each block's scale
    w = weight((16, 32), seed=5)
    fx = nvfp4_modelopt(tmp_path / "m", w)
    q = claimed(fx.path)[KEY]
    second = load_file(str(fx.path / "model.safetensors"))[KEY + "_scale_2"]
    step = q.scales_reader().astype(np.float64) * float(second.reshape(-1)[0])
    error = np.abs(fx.expected[KEY] - w).reshape(16, 2, 16).max(axis=-1)
    assert np.all(error <= step * 1.0 + 1e-12)  # FP4's widest gap is 2 (4 -> 6): half is 1


def test_an_fp8_folder_labelled_nvfp4_is_claimed_with_the_mismatch_as_its_problem(tmp_path):
    w = weight((16, 32), seed=6)
    fx = fp8_labelled_nvfp4(tmp_path / "m", w)
    q = claimed(fx.path)[KEY]
    assert q.layout == "modelopt-nvfp4" and q.element == "float8_e4m3fn"
    assert q.facts["config_scheme"] == "NVFP4" and "not NVFP4" in q.problems[0]
    assert np.array_equal(q.rows_reader(0, 16), fx.expected[KEY].astype(np.float32))
    line = run_error("quantize", fx.path)
    assert "names NVFP4" in line and KEY in line


def test_a_folder_of_plain_float8_weights_without_an_nvfp4_config_is_not_modelopts(tmp_path):
    fx = fp8_labelled_nvfp4(tmp_path / "m", weight((16, 32)))
    (fx.path / "config.json").unlink()
    (fx.path / "hf_quant_config.json").unlink()
    assert all(q.layout != "modelopt-nvfp4" for q in claimed(fx.path).values())


# -- gpt-oss MXFP4 ---------------------------------------------------------------------------

@pytest.mark.parametrize("hf_names", [False, True])
def test_stacked_gptoss_experts_decode_exactly(tmp_path, hf_names):
    experts = weight((4, 6, 96), seed=7, scale=1.0)
    experts[2] *= 2.0 ** -20  # an expert far from the others: its own E8M0 exponents
    down = weight((5, 64), seed=8, scale=3.0)
    names = {EXPERTS: experts, "block.0.mlp.mlp2_weight": down}
    if hf_names:
        names = {"model.layers.0.mlp.experts.gate_up_proj": experts,
                 "model.layers.0.mlp.experts.down_proj": down}
    fx = mxfp4_gptoss(tmp_path / "g", names, hf_names=hf_names,
                      extra={"block.0.mlp.mlp1_bias": np.ones(6, np.float32)})
    found = claimed(fx.path)
    assert set(found) == set(names)
    for key, w in names.items():
        q = found[key]
        assert (q.layout, q.element, q.scale_dtype, q.group.spelling) == (
            "gptoss-mxfp4", "float4_e2m1fn", "e8m0", "block:32")
        assert q.shape == w.shape and q.problems == []
        assert_exact(q, fx.expected[key])
        assert q.facts["nibble_order"] == "low-first" and q.facts["nominal_bits"] == 4.25
        assert q.facts["config_scheme"] == "mxfp4"
    q = found[next(iter(names))]
    rows = q.read(slice(5, 17), slice(0, 96))
    assert np.array_equal(rows, fx.expected[next(iter(names))].reshape(24, 96)[5:17])
    assert q.scales_reader().shape == (4, 6, 3)
    plain = dequantized(fx.path)["block.0.mlp.mlp1_bias"]
    assert plain.quantized is None and plain.dtype == "float32"


def test_gptoss_swapped_nibbles_decode_as_stored(tmp_path):
    w = weight((8, 64), seed=9, scale=1.0)
    good = mxfp4_gptoss(tmp_path / "ok", {EXPERTS: w})
    fx = mxfp4_gptoss(tmp_path / "bad", {EXPERTS: w}, swapped_nibbles=True, config=False)
    q = claimed(fx.path)[EXPERTS]
    assert q.facts["config_scheme"] is None
    assert_exact(q, fx.expected[EXPERTS])
    assert not np.allclose(fx.expected[EXPERTS], good.expected[EXPERTS], rtol=0.05)


def test_gptoss_reader_is_the_oracle_where_it_imports(tmp_path):
    torch = pytest.importorskip("torch")
    weights = pytest.importorskip("gpt_oss.torch.weights")
    experts = weight((3, 4, 64), seed=10, scale=1.0)
    fx = mxfp4_gptoss(tmp_path / "g", {EXPERTS: experts}, config=False)
    theirs = weights.Checkpoint(str(fx.path), torch.device("cpu")).get(EXPERTS)
    assert theirs.dtype == torch.bfloat16  # exact: FP4 values times powers of two
    mine = claimed(fx.path)[EXPERTS].dequantize()
    assert np.array_equal(theirs.float().numpy(), mine)


def test_modelopt_dequantize_is_the_oracle_where_it_imports(tmp_path):
    torch = pytest.importorskip("torch")
    nvfp4 = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    w = weight((16, 64), seed=11)
    packed, scale, second = nvfp4.NVFP4QTensor.quantize(torch.from_numpy(w), 16)
    folder = tmp_path / "m"
    folder.mkdir()
    stem = KEY[:-len("weight")]
    save_file({KEY: packed._quantized_data.numpy(),
               KEY + "_scale": scale.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn),
               KEY + "_scale_2": second.reshape(()).numpy(),
               stem + "input_scale": np.asarray(np.float32(1.0))},
              str(folder / "model.safetensors"))
    (folder / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}))
    q = claimed(folder)[KEY]
    theirs = packed.dequantize(dtype=torch.float32, scale=scale, double_scale=second,
                               block_sizes={-1: 16}).numpy()
    exact = (decode_packed(packed._quantized_data.numpy()).reshape(16, 4, 16)
             * scale.float().numpy().astype(np.float64)[..., None]
             * float(second)).reshape(16, 64)
    mine = q.dequantize()
    assert np.array_equal(mine, exact.astype(np.float32))
    # the fixtures' writer is ModelOpt's quantizer, byte for byte
    codes, my_scale, my_second = nvfp4_quantize(w)
    assert np.array_equal(pack(codes), packed._quantized_data.numpy())
    assert np.array_equal(my_scale.view(np.uint8), scale.view(torch.uint8).numpy())
    assert my_second == second.numpy()
    # ModelOpt rounds scale * double_scale to float32 first: one ulp at most
    assert np.all(np.abs(theirs - mine) <= np.spacing(np.abs(mine)))


# -- the commands ------------------------------------------------------------------------------

def test_fmt_quantize_and_compare_read_the_folders_as_dequantized_weights(tmp_path):
    w = weight((32, 64), seed=12)
    nv = nvfp4_modelopt(tmp_path / "nv", w)
    experts = weight((2, 8, 64), seed=13, scale=1.0)
    go = mxfp4_gptoss(tmp_path / "go", {EXPERTS: experts})
    orig = tmp_path / "orig.safetensors"
    save_file({KEY: w, EXPERTS: experts}, str(orig))
    done = run_fmt("quantize", nv.path, "--json")
    assert done.returncode == 0, done.stderr
    doc = strict_loads(done.stdout)
    assert [t["key"] for t in doc["tensors"]] == [KEY]
    assert b"already quantized (modelopt-nvfp4)" in done.stderr
    for fx, key in ((nv, KEY), (go, EXPERTS)):
        done = run_fmt("compare", orig, fx.path, "--json")
        assert done.returncode == 0, done.stderr
        (tensor,) = strict_loads(done.stdout)["tensors"]
        assert tensor["key"] == key
        exact = fx.expected[key].astype(np.float32).astype(np.float64)
        ref = (w if key == KEY else experts).astype(np.float64)
        sqnr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - exact) ** 2))
        assert tensor["sqnr_db"] == pytest.approx(sqnr, rel=1e-6)  # compare's own sums
        # fmt's own NVFP4 / MXFP4 of the original is the exporter's: the same SQNR
        assert tensor["fmt_sqnr_db"] == pytest.approx(tensor["sqnr_db"], rel=1e-6)
        assert tensor["verdict"] == "ok"


# -- bad input -------------------------------------------------------------------------------

def test_truncated_gptoss_blocks_are_a_problem_and_one_error_line(tmp_path):
    fx = mxfp4_gptoss(tmp_path / "g", {EXPERTS: weight((4, 64), scale=1.0)})
    path = fx.path / "model.safetensors"
    tensors = load_file(str(path))
    tensors[EXPERTS + ".blocks"] = np.ascontiguousarray(tensors[EXPERTS + ".blocks"][..., :15])
    save_file(tensors, str(path))
    q = claimed(fx.path)[EXPERTS]
    assert "15 bytes per block, not 16" in q.problems[0]
    assert "15 bytes per block" in run_error("quantize", fx.path)


def test_gptoss_scales_of_the_wrong_shape_are_a_problem_and_one_error_line(tmp_path):
    fx = mxfp4_gptoss(tmp_path / "g", {EXPERTS: weight((4, 64), scale=1.0)})
    path = fx.path / "model.safetensors"
    tensors = load_file(str(path))
    tensors[EXPERTS + ".scales"] = np.ascontiguousarray(tensors[EXPERTS + ".scales"][:, :1])
    save_file(tensors, str(path))
    assert "not [4, 2]" in claimed(fx.path)[EXPERTS].problems[0]
    assert "not [4, 2]" in run_error("compare", fx.path, fx.path)


@pytest.mark.parametrize("cut", ["scale_shape", "short_weight", "no_global"])
def test_bad_nvfp4_parts_are_problems_and_one_error_line(tmp_path, cut):
    fx = nvfp4_modelopt(tmp_path / "m", weight((8, 64)))
    path = fx.path / "model.safetensors"
    tensors = load_file(str(path))
    if cut == "scale_shape":
        tensors[KEY + "_scale"] = np.ascontiguousarray(tensors[KEY + "_scale"][:4])
    elif cut == "short_weight":
        tensors[KEY] = np.ascontiguousarray(tensors[KEY][:, :24])
    else:
        del tensors[KEY + "_scale_2"]
    save_file(tensors, str(path))
    problems = claimed(fx.path)[KEY].problems
    want = {"scale_shape": "not [8, 4]", "short_weight": "not [8, 3]",
            "no_global": "weight_scale_2 (the float32 global scale) is missing"}[cut]
    assert want in problems[0]
    assert want in run_error("quantize", fx.path)


def test_a_truncated_file_is_one_error_line(tmp_path):
    fx = nvfp4_modelopt(tmp_path / "m", weight((8, 64)))
    path = fx.path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-40])
    run_error("quantize", fx.path)
