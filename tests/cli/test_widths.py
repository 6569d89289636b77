"""Every command's default output at 80 and 120 columns: nothing cut with "…", no line wider
than the terminal, and the figures of the JSON document present in the table (a cell that
rich cropped silently, "6" for 6.757e-05, would miss its figure)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from cli_helpers import assert_fits, json_of, succeeds
from report_files import bert_like

from fmtcli.render.numbers import input_text, value_text

WIDTHS = [80, 120]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import numpy as np
    from safetensors.numpy import save_file

    directory = tmp_path_factory.mktemp("widths")
    bert = bert_like(directory)
    rng = np.random.default_rng(5)
    small = {"embeddings.word_embeddings.weight": rng.standard_normal((300, 64)) * 0.05,
             "encoder.layer.0.attention.output.LayerNorm.weight": rng.standard_normal(64),
             "encoder.layer.0.attention.self.query.weight": rng.standard_normal((64, 64))}
    save_file({k: v.astype(np.float32) for k, v in small.items()},
              str(directory / "small.safetensors"))
    np.save(directory / "one.npy", (rng.standard_normal((32, 256)) * 1e-3).astype(np.float32))
    np.save(directory / "steps.npy", (rng.standard_normal((6, 512)) * 4).astype(np.float32))
    return {"bert": bert, "small": directory / "small.safetensors",
            "one": directory / "one.npy", "steps": directory / "steps.npy"}


@functools.cache
def _document_text(*args) -> str:
    return json.dumps(json_of(*args))


def document(*args) -> dict:
    """``fmt ARGS --json``, strictly parsed: run once per argument list for the module (the
    same document serves every width), a fresh copy each call."""
    return json.loads(_document_text(*args))


def table(width: int, *args) -> str:
    """``fmt ARGS`` at ``width`` columns: it must succeed and fit the width uncut."""
    out = succeeds(*args, env={"COLUMNS": str(width)}).stdout
    assert_fits(out, width)
    return out


def assert_shown(out: str, *texts: str) -> None:
    missing = [t for t in texts if t not in out]
    assert not missing, (missing, out)


def sqnr(s: dict) -> str:
    return f"{s['sqnr_db']:.1f} dB"


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", [[], ["--all"]], ids=["default", "all"])
def test_range(width, args):
    out = table(width, "range", *args)
    specs = document("range", *args)
    assert_shown(out, *[s["name"] for s in specs])
    assert_shown(out, *[f"{int(s['max']):,}" for s in specs if s["max"] < 1e7])


UNDERFLOW = [
    ["1e-5", "3e-7", "0.1"],
    ["1e-5", "3e-7", "0.1", "--format", "fp16", "--format", "bf16", "--format", "e4m3",
     "--format", "e5m2", "--format", "e2m1"],
    ["1e-5", "3e-7", "--scale", "64", "--scale", "2^-10"],
    ["6.757e-05", "--format", "e4m3", "--format", "e5m2", "--scale", "2^12"],
]


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", UNDERFLOW, ids=["values", "formats", "scales", "one"])
def test_underflow(width, args):
    out = table(width, "underflow", *args)
    rows = document("underflow", *args)
    assert_shown(out, *{r["format"] for r in rows})
    assert_shown(out, *{value_text(r["stored"]) for r in rows})
    assert_shown(out, *{input_text(r["value"]) for r in rows})
    assert_shown(out, *{value_text(r["recovered"]) for r in rows if "recovered" in r})


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["example", "one", "one-all", "small", "small-all"])
def test_quantize_small_inputs(width, which, files):
    args = {"example": [], "one": [files["one"]], "one-all": [files["one"], "--compare", "all"],
            "small": [files["small"]], "small-all": [files["small"], "--compare", "all"]}[which]
    out = table(width, "quantize", *args)
    doc = document("quantize", *args)
    schemes = doc["total"] or doc["tensors"][0]["schemes"]
    assert_shown(out, *[sqnr(s) for s in schemes], *[s["label"] for s in schemes])
    if doc["total"]:  # a row per tensor: every name whole, every figure
        assert_shown(out, *[t["key"] for t in doc["tensors"]])
        assert_shown(out, *[sqnr(s) for t in doc["tensors"] for s in t["schemes"]])


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_quantize_summary_of_a_checkpoint(width, files):
    out = table(width, "quantize", files["bert"], "--top", "16")  # all 16 roles, in order
    doc = document("quantize", files["bert"])
    assert_shown(out, *[sqnr(s) for s in doc["total"]])
    for group in doc["groups"]:  # the role, whole or cut before its layer index
        head, _, rest = group["pattern"].partition(".*.")
        assert (group["pattern"] in out) or (f"{head}." in out and f"*.{rest}" in out), group
        assert f"x{group['count']}" in out
    assert_shown(out, *{sqnr(g["schemes"][-1]) for g in doc["groups"]})
    default = table(width, "quantize", files["bert"])  # the 5 worst roles and tensors
    assert "11 more roles" in " ".join(default.split())
    assert len(default.splitlines()) <= 62  # one screen, for 86 tensors


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_quantize_per_tensor_and_worst_blocks(width, files):
    out = table(width, "quantize", files["bert"], "--per-tensor", "--worst-blocks", "3")
    doc = document("quantize", files["bert"], "--worst-blocks", "3")
    assert_shown(out, *[sqnr(s) for t in doc["tensors"] if t["schemes"]
                        for s in t["schemes"]])
    if width == 120:  # names whole on their own line (80: broken after a dot)
        assert_shown(out, *[t["key"] for t in doc["tensors"] if t["schemes"]])
    assert_shown(out, *[value_text(b["amax"], 4) for b in doc["worst_blocks"]])


SCALE_SEARCH = [[], ["small"], ["steps", "--over-first-axis"], ["one", "--block", "32"]]


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", SCALE_SEARCH, ids=["example", "checkpoint", "delayed",
                                                     "blocks"])
def test_scale_search(width, args, files):
    args = [files.get(a, a) for a in args]
    out = table(width, "scale-search", *args)
    doc = document("scale-search", *args)
    assert_shown(out, *[c["name"] for c in doc["candidates"]])
    assert_shown(out, *[sqnr(c) for c in doc["candidates"]])


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", [[], ["--histogram"], ["--format", "e5m2"]])
def test_loss_scale(width, args):
    out = table(width, "loss-scale", *args)
    doc = document("loss-scale", *[a for a in args if a != "--histogram"])
    assert_shown(out, *[f"2^{s['log2_scale']}" for s in doc["scales"]])


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_check_backends(width):
    out = table(width, "check-backends")
    reports = document("check-backends")["reports"]
    assert_shown(out, *{r["format"] for r in reports}, *{f"{r['inputs']:,}" for r in reports})


def test_scale_search_of_a_checkpoint_is_a_table_at_80_columns(files):
    """Scales that differ per tensor make a range too wide for one line at 80 columns: the
    range goes on two lines rather than the table becoming one record per rule."""
    out = table(80, "scale-search", files["small"])
    doc = document("scale-search", files["small"])
    assert "SQNR" in out.splitlines()[1]  # a header row, not records
    assert len(out.splitlines()) < 3 * len(doc["candidates"]) + 10


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_quantize_summary_comparing_every_recipe(width, files):
    """Seven schemes with long labels: the total stays a table (each label on a line of its
    own above its figures where it does not fit beside them), not one record per scheme."""
    out = table(width, "quantize", files["bert"], "--compare", "all")
    doc = document("quantize", files["bert"], "--compare", "all")
    total = out[out.index("Total of"):]
    header = total.splitlines()[2]
    assert "flushed" in header and "SQNR" in header and "saturated" in header
    assert_shown(total, *[s["label"] for s in doc["total"]], *[sqnr(s) for s in doc["total"]])


@pytest.mark.slow
@pytest.mark.parametrize("width", [40, 50, 60])
def test_the_loss_scale_histogram_shortens_its_bars_on_a_narrow_terminal(width):
    """Below 80 columns the bars get shorter rather than cut with an ellipsis."""
    out = table(width, "loss-scale", "--histogram")
    assert "█" in out and "log2|g| per binade" in out


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """DeepSeek-V3 FP8 folders (examples/make_example_files.deepseek_fp8) of the small
    checkpoint (3 tensors) and of the BERT-like one (86: a summary by role)."""
    import json

    from report_files import example_files_module

    from fmtcli.engine.writers import write_safetensors

    examples = example_files_module()
    directory = tmp_path_factory.mktemp("audit")
    folders = {}
    for name, tensors in (("small", examples.model_tensors()),
                          ("bert", examples.bert_tensors())):
        folder = directory / name
        folder.mkdir()
        plain = {k: v.astype(np.float32) if v.dtype == np.float64 else v
                 for k, v in tensors.items()}
        write_safetensors(str(folder / "model.safetensors"), examples.deepseek_fp8(plain))
        (folder / "config.json").write_text(json.dumps({"quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
        folders[name] = folder
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["small", "bert", "bert-all"])
def test_audit(width, which, quantized):
    args = [quantized[which.split("-")[0]], *(["--all"] if which.endswith("all") else [])]
    out = table(width, "audit", *args)
    doc = document("audit", *args)
    listed = doc["tensors"] if which != "bert" else []
    assert_shown(out, *{f"{t['bits_per_param']:.3f}" for t in listed})
    assert_shown(out, *{value_text(t["values"]["amax"], 3) for t in listed})
    if which == "bert":
        assert_shown(out, *{f"x{r['tensors']}" for r in doc["roles"][:5]})
    totals = doc["totals"]
    assert_shown(out, f"{totals['effective_bits_per_param']:.3f}",
                 f"{totals['params']:,}", "Plain data")


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_train(width):
    """A tiny ``fmt train`` (tests/commands/test_train_cli.py has the rest)."""
    pytest.importorskip("torch")
    args = ["--steps", "4", "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16",
            "--batch", "4", "--log-every", "2", "--threads", "1", "--recipe", "tensorwise"]
    out = table(width, "train", *args)
    doc = document("train", *args)
    assert_shown(out, *{f"{p['loss']:.4f}" for r in doc["recipes"] for p in r["losses"]})
    assert_shown(out, *{t["layer"] for r in doc["recipes"] for t in r["tensors"]})
