"""``fmt audit``: the generic checks fire on broken fixtures and stay quiet on healthy ones,
the streamed figures equal numpy's over the decoded values, the table and JSON, exit codes,
and bad input as one Error line.

DeepSeek-V3 FP8 fixtures are written here from the definition in
``fmtcli/inputs/layouts/deepseek_fp8.py`` (DeepSeek-V3 ``README_WEIGHTS.md``: a
float8_e4m3fn ``weight`` beside a float32 ``weight_scale_inv`` per 128 x 128 block, ``x =
code * scale_inv``, scale_inv = amax / 448; ``scale_fmt: ue8m0``: powers of two); the
ModelOpt and gpt-oss fixtures come from ``tests/layout_fixtures.py``.  "Half-size scales"
here is the exporter that divided by half the right scale (codes doubled and clipped at
448); a scale halved after quantization leaves the codes as they were and is the layout
checks' (NVFP4's headroom) or ``fmt compare``'s to find.
"""

from __future__ import annotations

import json
from pathlib import Path

import layout_fixtures as lf
import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_fits, invoke, json_of, strict_loads
from oracle import write_safetensors

from fmtcli.audit import audit_path, checks, stats
from fmtcli.inputs import layouts
from fmtcli.inputs.tensors import load_path

KEY = "model.layers.{}.mlp.down_proj.weight"
TILE = 128


def ds_quantize(w: np.ndarray, factor: float = 1.0, ue8m0: bool = False):
    """DeepSeek-V3's block quantization of an O x I weight: (codes float8_e4m3fn, grid
    float32 scale_inv); the codes divided by ``factor`` x the right scale."""
    rows, cols = w.shape
    grid = np.zeros((-(-rows // TILE), -(-cols // TILE)), np.float32)
    codes = np.zeros(w.shape, np.float32)
    for a in range(grid.shape[0]):
        for b in range(grid.shape[1]):
            block = w[a * TILE:(a + 1) * TILE, b * TILE:(b + 1) * TILE]
            s = np.float32(np.abs(block).max() / 448) if np.any(block) else np.float32(1)
            if ue8m0:
                s = np.float32(2.0 ** np.ceil(np.log2(s)))
            grid[a, b] = s
            codes[a * TILE:(a + 1) * TILE, b * TILE:(b + 1) * TILE] = np.clip(
                block / (s * np.float32(factor)), -448, 448)
    return codes.astype(ml_dtypes.float8_e4m3fn), grid


def deepseek(folder: Path, *, layers: int = 2, shape=(200, 300), factor: float = 1.0,
             scale_factor: float | None = None, ue8m0: bool = False, grid_rows: int | None = None,
             scale_dtype=np.float32, plain: dict | None = None, edit=None,
             config: dict | None = None) -> Path:
    """A DeepSeek-V3 FP8 folder: ``layers`` quantized down_proj weights and a bfloat16
    norm each.  ``factor``: codes made with factor x the scale (0.5: half-size scales, the
    codes clip); ``scale_factor``: the stored grid times it (default ``factor``);
    ``grid_rows``: keep only these rows of each grid (a wrong-shape scale tensor);
    ``edit(codes, grid)`` changes them in place before writing."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    tensors = {}
    for i in range(layers):
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        codes, grid = ds_quantize(w, factor, ue8m0)
        grid = grid * np.float32(factor if scale_factor is None else scale_factor)
        if edit is not None:
            edit(codes, grid)
        tensors[KEY.format(i)] = codes
        tensors[KEY.format(i) + "_scale_inv"] = (grid if grid_rows is None
                                                else grid[:grid_rows]).astype(scale_dtype)
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(shape[1],
                                                                      ml_dtypes.bfloat16)
    tensors.update(plain or {})
    write_safetensors(folder / "model.safetensors", tensors)
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [TILE, TILE],
             "activation_scheme": "dynamic", **({"scale_fmt": "ue8m0"} if ue8m0 else {})}
    (folder / "config.json").write_text(json.dumps(
        {"quantization_config": quant} if config is None else config))
    return folder


def verdicts(result) -> dict[str, set[str]]:
    """check name -> the verdicts it gave over every tensor (and the model checks)."""
    out: dict[str, set[str]] = {}
    for c in [c for t in result.tensors for c in t.checks] + list(result.totals.checks):
        out.setdefault(c.name, set()).add(c.verdict.value)
    return out


def flagged(result) -> set[str]:
    return {name for name, vs in verdicts(result).items() if vs & {"warn", "fail"}}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return deepseek(tmp_path_factory.mktemp("audit") / "healthy")


# -- healthy inputs pass -------------------------------------------------------------------

def test_a_healthy_deepseek_checkpoint_passes_every_check(healthy):
    result = audit_path(str(healthy))
    assert result.layouts == ("deepseek-fp8",) and len(result.tensors) == 2
    assert flagged(result) == set(), verdicts(result)
    ran = verdicts(result)
    for name in ("structure", "scale-count", "scale-dtype", "scale-finite", "scale-zero",
                 "values-finite", "clipping", "lowest-codes", "zero-groups", "config-scheme"):
        assert ran[name] == {"ok"}, name
    assert result.plain.count == 2 and result.plain.dtypes == {"bfloat16": 2}


@pytest.mark.parametrize("writer", ["nvfp4", "gptoss", "ue8m0"])
def test_other_healthy_layouts_pass_the_generic_checks(tmp_path, writer):
    rng = np.random.default_rng(2)
    if writer == "nvfp4":
        lf.nvfp4_modelopt(tmp_path / "m", (rng.standard_normal((64, 128)) * 0.02
                                           ).astype(np.float32))
        path = tmp_path / "m"
    elif writer == "gptoss":
        lf.mxfp4_gptoss(tmp_path / "m", {"model.layers.0.mlp.experts.down_proj":
                                         rng.standard_normal((2, 64, 128)).astype(np.float32)})
        path = tmp_path / "m"
    else:
        path = deepseek(tmp_path / "m", ue8m0=True)
    result = audit_path(str(path))
    generic = {f.__name__.replace("_", "-") for f in checks.CHECKS}
    assert not (flagged(result) & generic), verdicts(result)
    assert result.tensors


# -- each generic check fires --------------------------------------------------------------

def test_half_size_scales_clip_and_fail(tmp_path):
    result = audit_path(str(deepseek(tmp_path / "m", factor=0.5)))
    assert verdicts(result)["clipping"] == {"fail"}
    c = next(c for c in result.tensors[0].checks if c.name == "clipping")
    assert c.figures["share"] > 0.8 and "scales too small" in c.evidence


def test_double_scales_use_only_the_lowest_codes_and_fail(tmp_path):
    result = audit_path(str(deepseek(tmp_path / "m", factor=2.0)))
    assert verdicts(result)["lowest-codes"] == {"fail"}
    assert verdicts(result)["clipping"] == {"ok"}


def test_clipping_in_a_minority_of_groups_warns(tmp_path):
    def clip_blocks(codes, grid):  # 4 of 20 blocks: codes doubled and clipped (20%)
        for b in range(4):
            block = codes[:TILE, b * TILE:(b + 1) * TILE].astype(np.float32)
            codes[:TILE, b * TILE:(b + 1) * TILE] = np.clip(block * 2, -448, 448)
    result = audit_path(str(deepseek(tmp_path / "m", layers=1, shape=(256, 1280),
                                     edit=clip_blocks)))
    assert verdicts(result)["clipping"] == {"warn"}

    def clip_one(codes, grid):  # one flagged group of several is chance: ok
        codes[:TILE, :TILE] = np.clip(codes[:TILE, :TILE].astype(np.float32) * 2, -448, 448)
    result = audit_path(str(deepseek(tmp_path / "one", layers=1, shape=(256, 1280),
                                     edit=clip_one)))
    assert verdicts(result)["clipping"] == {"ok"}


def test_non_power_of_two_ue8m0_scales_fail(tmp_path):
    def perturb(codes, grid):
        grid[0, 0] *= np.float32(1.3)
    result = audit_path(str(deepseek(tmp_path / "m", ue8m0=True, edit=perturb)))
    c = next(c for c in result.tensors[0].checks if c.name == "scale-power-of-two")
    assert c.verdict.value == "fail" and c.figures["not_power_of_two"] == 1
    assert "scale_fmt ue8m0" in c.evidence
    assert "scale-power-of-two" not in verdicts(audit_path(str(deepseek(tmp_path / "f"))))


def test_a_scale_tensor_of_the_wrong_shape_fails_structure_and_count(tmp_path):
    result = audit_path(str(deepseek(tmp_path / "m", grid_rows=1)))
    v = verdicts(result)
    assert v["structure"] == {"fail"} and v["scale-count"] == {"fail"}
    c = next(c for c in result.tensors[0].checks if c.name == "scale-count")
    assert c.figures == {"scales": 3, "groups": [6]}
    assert result.tensors[0].values is None  # never read


def test_an_fp8_file_labelled_nvfp4_fails_config_scheme(tmp_path):
    rng = np.random.default_rng(4)
    lf.fp8_labelled_nvfp4(tmp_path / "m", (rng.standard_normal((64, 128)) * 0.02
                                           ).astype(np.float32))
    result = audit_path(str(tmp_path / "m"))
    c = next(c for c in result.tensors[0].checks if c.name == "config-scheme")
    assert c.verdict.value == "fail" and "float8_e4m3fn" in c.evidence
    assert c.figures["promised"] == ["fp4"]


def test_a_deepseek_config_naming_nvfp4_fails_config_scheme(tmp_path):
    path = deepseek(tmp_path / "m", config={"quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}})
    assert verdicts(audit_path(str(path)))["config-scheme"] == {"fail"}


def test_nan_and_zero_scales(tmp_path):
    def nan_scale(codes, grid):
        grid[0, 0] = np.nan
    def zero_scale(codes, grid):
        grid[1, 2] = 0
    v = verdicts(audit_path(str(deepseek(tmp_path / "a", edit=nan_scale))))
    assert v["scale-finite"] == {"fail"} and v["values-finite"] == {"fail"}
    v = verdicts(audit_path(str(deepseek(tmp_path / "b", edit=zero_scale))))
    assert v["scale-zero"] == {"warn"} and v["scale-finite"] == {"ok"}


def test_nan_codes_fail_values_finite(tmp_path):
    def nan_code(codes, grid):
        codes.view(np.uint8)[5, 7] = 0x7F  # E4M3's NaN
    v = verdicts(audit_path(str(deepseek(tmp_path / "m", edit=nan_code))))
    assert v["values-finite"] == {"fail"} and v["scale-finite"] == {"ok"}


def test_all_zero_groups_warn(tmp_path):
    def zero_blocks(codes, grid):  # 2 of 6 blocks: 33% > 5%
        codes[:TILE, :2 * TILE] = 0
    v = verdicts(audit_path(str(deepseek(tmp_path / "m", edit=zero_blocks))))
    assert v["zero-groups"] == {"warn"} and v["lowest-codes"] == {"ok"}


def test_bfloat16_scales_warn_scale_dtype(tmp_path):
    path = deepseek(tmp_path / "m", scale_dtype=ml_dtypes.bfloat16)
    result = audit_path(str(path))
    assert verdicts(result)["scale-dtype"] == {"warn"}
    assert result.tensors[0].scale_dtype == "bfloat16"


def _scanned(path: Path):
    scan = layouts.scan(load_path(str(path), as_stored=True), layouts.read_config(str(path)))
    return scan.quantized[0], scan


def test_bits_per_param_against_the_nominal(healthy):
    q, scan = _scanned(healthy)
    q.facts["nominal_bits"] = 8.0 + 32 / TILE ** 2
    assert checks.bits_per_param(q, scan, None).verdict.value == "ok"  # 8.003: edge tiles
    q.facts["nominal_bits"] = 4.5
    c = checks.bits_per_param(q, scan, None)
    assert c.verdict.value == "warn" and "nominal is 4.5" in c.evidence


def test_the_model_bits_warn_when_most_parameters_are_plain(tmp_path):
    """Embeddings and the head in bfloat16 are what every recipe keeps (ok, however many
    parameters they hold); linear layers left in bfloat16 that the config does not list
    are what ModelOpt #868's 6.12 bits/param "NVFP4" export was (warn)."""
    rng = np.random.default_rng(6)
    kept = {"lm_head.weight": np.ones((600, 128), ml_dtypes.bfloat16),
            "model.embed_tokens.weight": np.ones((600, 128), ml_dtypes.bfloat16)}
    weight = (rng.standard_normal((64, 128)) * 0.02).astype(np.float32)
    lf.nvfp4_modelopt(tmp_path / "m", weight, extra=kept)
    result = audit_path(str(tmp_path / "m"))
    c = result.totals.checks[0]
    assert c.name == "model-bits" and c.verdict.value == "ok", c.evidence
    params = 64 * 128 + 2 * 600 * 128
    assert result.totals.params == params
    assert abs(result.totals.effective_bits - (result.tensors[0].stored_bits + 2 * 600 * 128
                                               * 16) / params) < 1e-12
    assert c.figures["effective_bits"] > 3 * c.figures["nominal_bits"]  # reported, not judged
    left = {**kept, "model.layers.1.mlp.down_proj.weight": np.ones((64, 128), ml_dtypes.bfloat16)}
    lf.nvfp4_modelopt(tmp_path / "n", weight, extra=left)
    c = audit_path(str(tmp_path / "n")).totals.checks[0]
    assert c.name == "model-bits" and c.verdict.value == "warn"
    assert "bfloat16" in c.evidence and "down_proj" in c.evidence
    assert c.figures["plain_linear"] == 1 and c.figures["plain_linear_share"] == 0.5


@pytest.mark.parametrize("entry", ["model.layers.1.mlp.down_proj", "down_proj",
                                   "re:.*down_proj", "*mlp.down*"])
def test_the_model_bits_accept_linear_weights_the_config_leaves_out(entry):
    from fmtcli.audit.model_checks import is_ignored

    assert is_ignored("model.layers.1.mlp.down_proj", [entry])
    assert not is_ignored("model.layers.1.mlp.up_proj", [entry])
    assert not is_ignored("model.layers.1.mlp.down_proj", ["re:(unbalanced"])


def test_a_config_naming_a_scheme_no_tensor_holds_fails(tmp_path):
    tmp_path.joinpath("m").mkdir()
    write_safetensors(tmp_path / "m" / "model.safetensors",
                      {"w": np.ones((4, 4), np.float32)})
    (tmp_path / "m" / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}))
    result = audit_path(str(tmp_path / "m"))
    assert [(c.name, c.verdict.value) for c in result.totals.checks] == [
        ("config-quantized", "fail")]


# -- the figures ---------------------------------------------------------------------------

def test_the_streamed_figures_equal_numpy_over_the_decoded_values(healthy):
    q, scan = _scanned(healthy)
    x = q.dequantize().astype(np.float64)
    for chunk in (300, 1 << 18):  # one block row per chunk, or the whole tensor
        values, codes = stats.measure(q, chunk)
        assert values.count == x.size and values.amax == np.abs(x).max()
        assert values.rms == pytest.approx(np.sqrt(np.mean(x * x)), rel=1e-12)
        assert values.zeros == np.count_nonzero(x == 0) and values.nonfinite == 0
        assert (codes.groups, codes.zero_groups, codes.lowest) == (6, 0, 0)
        e = q.elements_reader(0, 200)
        assert codes.at_max == np.count_nonzero(np.abs(e) == 448)


def test_stacked_experts_are_grouped_matrix_by_matrix(tmp_path):
    """E x O x I with O = 200: a tile row never straddles two experts."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((3, 200, 256)) * 0.02).astype(np.float32)
    parts = [ds_quantize(m) for m in w]
    tmp_path.joinpath("m").mkdir()
    write_safetensors(tmp_path / "m" / "model.safetensors", {
        "experts.weight": np.stack([p[0] for p in parts]),
        "experts.weight_scale_inv": np.stack([p[1] for p in parts])})
    result = audit_path(str(tmp_path / "m"))
    t = result.tensors[0]
    assert t.codes.groups == 3 * 2 * 2 and flagged(result) == set(), verdicts(result)


def test_a_per_tensor_group_is_merged_across_chunks():
    """A tensor-spanning group read in many chunks counts as one."""
    from fmtcli.inputs.layouts.base import Quantized
    from fmtcli.numerics.granularity import ScaleGroup

    codes = np.zeros((64, 32), np.float32)
    codes[3, 4], codes[40, 1] = 448, -448
    codes[10:20] = 100

    def rows(r0, r1):
        return codes[r0:r1] * np.float32(0.5)
    q = Quantized("test", "w", "f", (64, 32), "float8_e4m3fn", "float32",
                  ScaleGroup("tensor"), {}, rows, {}, lambda r0, r1: codes[r0:r1],
                  lambda: np.array([0.5], np.float32))
    values, c = stats.measure(q, chunk_elements=64)  # 2 rows a chunk
    assert (c.groups, c.clipping, c.lowest, c.zero_groups, c.at_max) == (1, 0, 0, 0, 2)
    assert values.amax == 224 and values.zeros == 64 * 32 - 2 - 320


def _one_group(codes: np.ndarray, scale: float = 0.01):
    from fmtcli.inputs.layouts.base import Quantized
    from fmtcli.numerics.granularity import ScaleGroup

    codes = np.asarray(codes, np.float32).reshape(1, -1)
    return Quantized("test", "w", "f", codes.shape, "float8_e4m3fn", "float32",
                     ScaleGroup("tensor"), {}, lambda r0, r1: codes[r0:r1] * scale, {},
                     lambda r0, r1: codes[r0:r1], lambda: np.array([scale], np.float32))


def test_clipping_needs_a_pile_up_over_a_spread_group():
    """Top codes piled over the code below in a spread group clip; a group bunched near its
    amax (every code in the top binade: a LayerNorm weight of ~1.0) or top codes no more
    frequent than the next code down do not."""
    spread = np.r_[np.full(8, 448.0), np.full(2, 416.0), np.linspace(1, 300, 54)]
    assert stats.measure(_one_group(spread))[1].clipping == 1
    bunched = np.r_[np.full(40, 448.0), np.full(24, 416.0)]
    assert stats.measure(_one_group(bunched))[1].clipping == 0
    level = np.r_[np.full(8, 448.0), np.full(8, 416.0), np.linspace(1, 300, 48)]
    assert stats.measure(_one_group(level))[1].clipping == 0
    few = np.r_[np.full(4, 448.0), np.linspace(1, 300, 60)]
    assert stats.measure(_one_group(few))[1].clipping == 0


def test_a_floor_rule_s_largest_code_at_half_the_max_is_not_the_lowest_codes():
    """Power-of-two scales from a floor rule put a healthy group's amax in (max/2, max]:
    224 exactly after rounding counts as lowest codes only where the scales are not
    powers of two (an amax rule at double scale gives 224)."""
    codes = np.r_[224.0, np.linspace(-200, 200, 63)]
    assert stats.measure(_one_group(codes))[1].lowest == 1
    assert stats.measure(_one_group(codes), power_of_two=True)[1].lowest == 0
    assert stats.measure(_one_group(codes / 2), power_of_two=True)[1].lowest == 1


def test_clip_count_and_element_max():
    assert [stats.clip_count(n) for n in (16, 32, 1024, 16384)] == [5, 5, 5, 64]
    assert stats.element_top("float8_e4m3fn") == (448, 416)
    assert stats.element_top("float4_e2m1fn") == (6, 4)
    assert stats.element_max("float8_e4m3fn") == 448
    assert stats.element_max("float4_e2m1fn") == 6
    assert stats.element_max("int4") == 7 and stats.element_max("uint8") == 255
    assert stats.element_max("no-such") is None


# -- the command ---------------------------------------------------------------------------

def test_the_json_document_has_every_tensor_check_and_total(healthy):
    doc = json_of("audit", healthy)
    assert doc["layouts"] == ["deepseek-fp8"]
    t = doc["tensors"][0]
    assert {"layout", "bits_per_param", "checks", "values", "codes", "verdict"} <= set(t)
    assert {c["name"] for c in t["checks"]} >= {"structure", "clipping", "lowest-codes"}
    assert all(set(c) == {"name", "verdict", "evidence", "figures"} for c in t["checks"])
    assert doc["plain"]["count"] == 2 and len(doc["plain"]["names"]) == 2
    assert doc["totals"]["verdicts"]["fail"] == 0
    assert doc["totals"]["effective_bits_per_param"] > t["bits_per_param"]


def test_a_failed_check_exits_1_with_the_table_and_its_evidence(tmp_path):
    path = deepseek(tmp_path / "m", factor=0.5)
    result = invoke("audit", path, env={"COLUMNS": "80"})
    assert result.exit_code == 1, result.output
    assert "FAIL clipping" in result.stdout and "scales too small" in result.stdout
    assert "checks failed (exit 1)" in result.stderr
    assert "Error" not in result.stderr
    assert_fits(result.stdout, 80)
    doc = strict_loads(invoke("audit", path, "--json").stdout)
    assert doc["totals"]["verdicts"]["fail"] == 2


def test_warnings_exit_0_unless_strict(tmp_path):
    path = deepseek(tmp_path / "m", scale_dtype=ml_dtypes.bfloat16)
    result = invoke("audit", path)
    assert result.exit_code == 0 and "WARN scale-dtype" in result.stdout
    strict = invoke("audit", path, "--strict")
    assert strict.exit_code == 1 and "failed or warned" in strict.stderr


def test_key_picks_tensors_by_logical_name(healthy):
    doc = json_of("audit", healthy, "--key", "*.0.*")
    assert [t["key"] for t in doc["tensors"]] == [KEY.format(0)]
    assert doc["plain"]["names"] == [str(healthy / "model.safetensors") +
                                     ":model.layers.0.input_layernorm.weight"]
    assert_data_error(invoke("audit", healthy, "--key", "nope"), "no tensor matches")


def test_a_folder_without_quantized_tensors_is_all_plain_and_exits_0(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.float32))
    result = invoke("audit", tmp_path / "w.npy")
    assert result.exit_code == 0, result.output
    assert "No quantized layout found" in result.stdout
    assert "no quantized layout found" in result.stderr
    assert json_of("audit", tmp_path / "w.npy")["plain"]["count"] == 1


def test_many_tensors_are_summarised_by_role_and_all_lists_every_one(tmp_path):
    path = deepseek(tmp_path / "m", layers=10, shape=(128, 128))
    out = invoke("audit", path, env={"COLUMNS": "80"}).stdout
    assert "By role, worst first: 10 tensors in 1 role\n" in out
    assert "Worst 5 of 10 tensors" in out
    every = invoke("audit", path, "--all").stdout
    assert all(f"layers.{i}.mlp" in every for i in range(10))


@pytest.mark.parametrize("bad", ["missing", "suffix", "truncated"])
def test_bad_input_is_one_error_line(tmp_path, bad, healthy):
    if bad == "missing":
        path = tmp_path / "nope.safetensors"
    elif bad == "suffix":
        path = tmp_path / "model.gguf"
        path.write_bytes(b"GGUF")
    else:
        path = tmp_path / "cut.safetensors"
        data = (healthy / "model.safetensors").read_bytes()
        path.write_bytes(data[:len(data) - 1000])
    assert_data_error(invoke("audit", path), "")


def test_the_failure_shown_in_docs_audit_md_is_the_program_output(tmp_path, monkeypatch):
    """docs/audit.md's `fmt audit half-scales` block cannot run in the console-example test
    (it exits 1): it is checked here, on the fixture it names."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text()
    block = page.split("$ fmt audit half-scales    # not run", 1)[1].split("\n", 1)[1]
    expected = block.split("```", 1)[0]
    deepseek(tmp_path / "half-scales", factor=0.5)
    monkeypatch.chdir(tmp_path)
    result = invoke("audit", "half-scales", env={"COLUMNS": "80"})
    assert result.exit_code == 1
    lines = [line.rstrip() for line in result.stdout.rstrip().splitlines()]
    assert lines == [line.rstrip() for line in expected.rstrip().splitlines()]
    assert result.stderr == "Note: 2 checks failed (exit 1)\n"


def test_the_pass_reads_whole_groups_in_bounded_chunks(healthy):
    """No read spans more than the chunk (or one row of tiles); the rows are read once."""
    q, scan = _scanned(healthy)
    calls = []

    def spy(reader):
        def read(r0, r1):
            calls.append((r0, r1))
            return reader(r0, r1)
        return read
    # the pass reads the stored codes (raw_reader, the compiled kernel) or, without the
    # kernel, the dequantized rows: whichever it reads, whole tile rows once
    q.rows_reader, q.raw_reader = spy(q.rows_reader), spy(q.raw_reader)
    stats.measure(q, chunk_elements=TILE * 300)  # 128 rows of 300: one row of tiles
    assert calls == [(0, 128), (128, 200)]
    calls.clear()
    stats.measure(q, chunk_elements=1000)  # less than a tile row: still one tile row
    assert calls == [(0, 128), (128, 200)]


def test_a_sharded_folder_with_a_weight_and_its_scales_in_different_shards(tmp_path):
    rng = np.random.default_rng(9)
    codes, grid = ds_quantize((rng.standard_normal((128, 256)) * 0.02).astype(np.float32))
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(folder / "model-00001-of-00002.safetensors", {KEY.format(0): codes})
    write_safetensors(folder / "model-00002-of-00002.safetensors",
                      {KEY.format(0) + "_scale_inv": grid, "norm.weight": np.ones(256, np.float32)})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        KEY.format(0): "model-00001-of-00002.safetensors",
        KEY.format(0) + "_scale_inv": "model-00002-of-00002.safetensors",
        "norm.weight": "model-00002-of-00002.safetensors"}}))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [TILE, TILE]}}))
    for path in (folder, folder / "model.safetensors.index.json"):
        result = audit_path(str(path))
        assert [t.key for t in result.tensors] == [KEY.format(0)]
        assert result.plain.keys == ("norm.weight",) and flagged(result) == set()


@pytest.mark.parametrize("path", ["bert", "broken"])
def test_the_figures_do_not_depend_on_the_worker_count(tmp_path, path):
    folder = (deepseek(tmp_path / "m", layers=6, shape=(130, 260)) if path == "bert"
              else deepseek(tmp_path / "m", layers=3, grid_rows=1))
    from fmtcli.audit import passes

    scan = layouts.scan(load_path(str(folder), as_stored=True),
                        layouts.read_config(str(folder)))
    measured = passes.measure_all(scan.quantized, 1 << 18, 3)
    assert len(measured) == (6 if path == "bert" else 0)  # every readable one, on workers
    one = audit_path(str(folder), workers=1).to_dict()
    three = audit_path(str(folder), workers=3).to_dict()
    assert one == three
    runs = [invoke("audit", folder, "--json", "--workers", n) for n in ("1", "2")]
    assert runs[0].stdout == runs[1].stdout and runs[0].exit_code == runs[1].exit_code


def test_a_check_that_cannot_read_a_part_fails_under_its_own_name(healthy):
    from fmtcli.base.errors import DataError

    def scale_grid(q, scan):
        raise DataError("its scales are unreadable")
    q, scan = _scanned(healthy)
    c = checks.run_check(scale_grid, q, scan)
    assert (c.name, c.verdict.value) == ("scale-grid", "fail")
    assert c.evidence == "could not be read: its scales are unreadable"


def test_empty_quantized_tensors_and_odd_plain_dtypes_give_a_result(tmp_path):
    """A weight with no rows (and its empty grid) and a complex plain tensor: figures of
    nothing, no division by zero."""
    folder = tmp_path / "m"
    folder.mkdir()
    np.savez(folder / "w.npz", **{"w": np.zeros((0, 256), ml_dtypes.float8_e4m3fn).view(np.uint8),
                                  "c": np.ones(4, np.complex64)})
    write_safetensors(folder / "model.safetensors", {
        KEY.format(0): np.zeros((0, 256), ml_dtypes.float8_e4m3fn),
        KEY.format(0) + "_scale_inv": np.zeros((0, 2), np.float32)})
    result = audit_path(str(folder / "model.safetensors"))  # empty: plain, skipped
    assert result.totals.params == 0 and result.totals.nominal_bits is None
    assert {r["reason"] for r in result.to_dict()["skipped"]} == {"empty"}
    plain = audit_path(str(folder / "w.npz")).plain
    assert plain.count == 2 and plain.dtypes["complex64"] == 1


def test_the_groups_a_shape_needs():
    from fmtcli.inputs.layouts.base import Quantized
    from fmtcli.numerics.granularity import ScaleGroup

    def q(shape, group):
        return Quantized("t", "w", "f", shape, "float8_e4m3fn", "float32", group, {},
                         lambda r0, r1: None)
    tile = ScaleGroup("tile", tile=(128, 128))
    assert checks.expected_groups(q((200, 300), tile)) == {6}
    assert checks.expected_groups(q((3, 200, 256), tile)) == {3 * 2 * 2, 5 * 2}
    assert checks.expected_groups(q((0, 256), tile)) == {0}
    assert checks.expected_groups(q((64, 128), ScaleGroup("block", 16))) == {64 * 8}
    assert checks.expected_groups(q((64, 128), ScaleGroup("tensor"))) == {1}


def test_a_large_tensor_s_chunks_on_workers_give_the_figures_of_one_process(tmp_path):
    from fmtcli.audit import passes

    folder = deepseek(tmp_path / "m", layers=1, shape=(1024, 256), factor=0.5)
    scan = layouts.scan(load_path(str(folder), as_stored=True),
                        layouts.read_config(str(folder)))
    chunk = TILE * 256  # one tile row a chunk: 8 chunks, at least 2 per worker
    q = scan.quantized[0]
    assert len(list(stats.Pass(q, None, None).chunks(chunk))) == 8
    assert stats.measure(q, chunk, workers=3) == stats.measure(q, chunk)
    assert len(passes.measure_all(scan.quantized, chunk, 3)) == 1
    one = audit_path(str(folder), chunk_elements=chunk, workers=1).to_dict()
    assert one == audit_path(str(folder), chunk_elements=chunk, workers=3).to_dict()
    assert one["totals"]["verdicts"]["fail"] == 1


LIBRARY_PRESETS = ("FP8", "FP8_DYNAMIC", "FP8_BLOCK", "MXFP8", "MXFP4", "NVFP4A16", "W4A16",
                   "W4A16_ASYM", "W8A16")


@pytest.mark.slow
@pytest.mark.parametrize("preset", LIBRARY_PRESETS)
def test_compressed_tensors_own_checkpoints_pass_the_generic_checks(tmp_path, preset):
    """A Linear of torch's own (uniform) initialisation quantized by compressed-tensors'
    preset (its observers' min/max qparams), compressed and saved as the library saves:
    no generic check warns or fails."""
    ct = pytest.importorskip("compressed_tensors")
    torch = pytest.importorskip("torch")
    try:
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import (
            QuantizationConfig,
            apply_quantization_config,
            preset_name_to_scheme,
        )
        from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    except ImportError as missing:
        pytest.skip(f"compressed-tensors {ct.__version__} lacks {missing}")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(512, 256, bias=False, dtype=torch.bfloat16)
    try:
        scheme = preset_name_to_scheme(preset, ["Linear"])
    except (KeyError, ValueError):
        pytest.skip(f"compressed-tensors {ct.__version__} has no {preset} preset")
    apply_quantization_config(model, QuantizationConfig(config_groups={"g": scheme}))
    module, w = model.proj, model.proj.weight.data
    args = module.quantization_scheme.weights
    glob = None
    if hasattr(module, "weight_global_scale"):
        glob = generate_gparam(w.min(), w.max())
        module.weight_global_scale.data.copy_(glob)
    strategy = str(getattr(args.strategy, "value", args.strategy))
    if strategy == "tensor":
        low, high = w.amin(), w.amax()
    elif strategy == "channel":
        low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    elif strategy == "block":
        bh, bw = args.block_structure
        blocks = w.reshape(w.shape[0] // bh, bh, w.shape[1] // bw, bw)
        low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
    else:  # group, tensor_group
        groups = w.unflatten(-1, (-1, args.group_size))
        low, high = groups.amin(-1), groups.amax(-1)
    scale, zero = calculate_qparams(low, high, args, global_scale=glob)
    module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero)
    if hasattr(module, "input_scale"):
        module.input_scale.data.fill_(0.03125)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    folder = tmp_path / "ct"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    compressor.update_config(str(folder))
    result = audit_path(str(folder))
    assert result.tensors, result.to_dict()["plain"]
    generic = {f.__name__.replace("_", "-") for f in checks.CHECKS}
    assert not (flagged(result) & generic), verdicts(result)
