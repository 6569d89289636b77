"""``fmt train`` on the command line: its defaults, its refusals (each in a fresh process,
one ``Error:`` line, the right exit code, no traceback), the missing-torch error, and a
tiny real run: one valid JSON document with the issue's keys, tables that fit 80 and 120
columns and show the JSON's figures.  The renderer's shapes (tables split to the width,
rows thinned) are checked on a result built by hand, with no torch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest
from cli_helpers import assert_fits, run_fmt, run_fmt_each, strict_loads, succeeds

from fmtcli.train.results import RecipeRun, TensorRecord, TrainResult, TrainSettings

TINY = ["--steps", "6", "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16",
        "--batch", "4", "--log-every", "2", "--threads", "1"]
RECIPES = ["--recipe", "tensorwise,fp16,fp8-unscaled"]


def test_the_cli_defaults_are_the_librarys():
    """The options' defaults (kept in cli/train.py so that ``fmt --help`` loads no library)
    are TrainSettings' and loop.DEFAULT_RECIPES."""
    from fmtcli.cli import train as cli

    defaults = {f.name: f.default for f in fields(TrainSettings)}
    assert {k: defaults[k] for k in cli.DEFAULTS} == cli.DEFAULTS
    pytest.importorskip("torch")
    from fmtcli.train.loop import DEFAULT_RECIPES

    assert tuple(cli.DEFAULT_RECIPES.split(",")) == DEFAULT_RECIPES


def _one_error(code: int, out: bytes, err: bytes, want: int | tuple, *fragments: str,
               case: list | None = None) -> None:
    text = err.decode()
    assert code in (want if isinstance(want, tuple) else (want,)), (case, code, text)
    assert out == b"", out
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), text
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.slow
def test_bad_input_is_one_error_line_each(tmp_path):
    pytest.importorskip("torch")
    small = tmp_path / "small.txt"
    small.write_bytes(b"too short")
    cases = [
        (["--recipe", "tensorwyse"], 2, "unknown recipe 'tensorwyse'", "tensorwise"),
        (["--recipe", ""], 2, "--recipe"),
        (["--steps", "0"], 2, "--steps"),
        (["--width", "130"], 2, "--width 130", "--heads 4"),
        (["--layers", "100000", "--width", "4096"], 2, "GiB"),
        (["--data", str(small)], 1, "too few for one batch"),
        (["--data", str(tmp_path / "missing.txt")], 1, "cannot read"),
        (["--capture-steps", "5"], 2, "--capture DIR"),
        (["--capture", str(tmp_path / "c"), "--capture-steps", "x"], 2, "--capture-steps"),
        (["--capture", str(tmp_path / "c"), "--capture-steps", "500"], 2, "--capture-steps"),
        (["--recipe", "delayed", "--amax-history", "0"], 2, "--amax-history 0"),
        (["--lr", "-1"], 2, "--lr"),
    ]
    from cli_helpers import cuda_available

    if not cuda_available():
        cases.append((["--device", "cuda"], 2, "--device cuda", "CUDA"))
    results = run_fmt_each([["train", *args] for args, *_ in cases])
    for (args, want, *fragments), (code, out, err) in zip(cases, results):
        _one_error(code, out, err, want, *fragments, case=args)
    assert not (tmp_path / "c").exists()  # nothing written by a refused run


def test_without_torch_one_error_line_says_how_to_install_it():
    """torch made unimportable (sys.modules['torch'] = None) before the app runs."""
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['fmt', 'train', "
            "'--steps', '2']\nfrom fmtcli.cli import main\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    _one_error(done.returncode, done.stdout, done.stderr, 2, "fmt train needs PyTorch",
               "pip install 'fmtcli[torch]'")


@pytest.fixture(scope="module")
def tiny():
    """A tiny real run: its JSON document (strictly parsed) and its tables at 80 and 120."""
    pytest.importorskip("torch")
    doc = strict_loads(succeeds("train", *TINY, *RECIPES, "--json").stdout)
    tables = {w: succeeds("train", *TINY, *RECIPES, env={"COLUMNS": str(w)}).stdout
              for w in (80, 120)}
    return doc, tables


@pytest.mark.slow
def test_the_json_holds_the_issues_keys(tiny):
    doc, _ = tiny
    assert doc["settings"]["steps"] == 6 and doc["baseline"] == "bf16"
    names = [r["name"] for r in doc["recipes"]]
    assert names == ["bf16", "tensorwise", "fp16", "fp8-unscaled"]
    for run in doc["recipes"]:
        assert {"losses", "final_loss", "gap_to_baseline", "diverged_at", "tensors"} <= set(run)
        assert [s["step"] for s in run["losses"]][:3] == [2, 4, 6][:len(run["losses"])]
        roles = {t["role"] for t in run["tensors"]}
        assert roles == {"activation", "weight", "grad_output"} or run["name"] == "fp32"
        for t in run["tensors"]:
            assert {"flushed_share", "saturated_share", "amax_min", "amax_max",
                    "scale_min", "scale_max"} <= set(t)
    fp16 = doc["recipes"][2]
    grads = [t for t in fp16["tensors"] if t["role"] == "grad_output"]
    assert all(t["fp16_underflow_unscaled"] is not None for t in grads)
    assert doc["recipes"][0]["gap_to_baseline"] in (None, 0.0)  # the baseline against itself


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
def test_the_tables_fit_and_show_the_figures(tiny, width):
    doc, tables = tiny
    out = tables[width]
    assert_fits(out, width)
    for run in doc["recipes"]:
        assert run["name"] in out
        for point in run["losses"]:
            if point["loss"] is not None:
                assert f"{point['loss']:.4f}" in out, (run["name"], point)
        for t in run["tensors"]:
            assert t["layer"] in out
    assert "seed-to-seed spread" in out and "0.25%" in out


# -- the renderer on a result built by hand (no torch) --------------------------------------

def _run(name: str, steps: int, every: int, diverged: int | None = None) -> RecipeRun:
    losses = tuple((s, 5.0 - s / 1000) for s in range(every, steps + 1, every))
    if diverged is not None:
        losses = tuple(p for p in losses if p[0] < diverged) + ((diverged, None),)
    records = tuple(TensorRecord(f"layers.{i}.mlp.fc1", role, "float8_e4m3fn", 1000, 990,
                                 3, 1, 0.5, 7.25, 61.8, 896.0, steps)
                    for i in range(2) for role in ("activation", "weight", "grad_output"))
    final = None if diverged else losses[-1][1]
    return RecipeRun(name, f"the recipe {name}", 0, losses, final,
                     None if diverged or name == "bf16" else 0.001234, diverged,
                     "the loss is nan" if diverged else None, 4.1, records, 0.25,
                     diverged or steps)


def _result(names: list[str], steps: int = 1000, every: int = 25) -> TrainResult:
    settings = TrainSettings(steps=steps, log_every=every)
    runs = tuple(_run(n, steps, every, 176 if n == "fp8-unscaled" else None) for n in names)
    return TrainResult(settings, "<test>", 1 << 20, runs, (4.0, 4.01, 3.99), 0.005)


def _draw(result, width: int) -> str:
    import io

    from rich.console import Console

    from fmtcli.render import render

    buffer = io.StringIO()
    Console(file=buffer, width=width).print(render(result))
    return buffer.getvalue()


ALL = ["bf16", "fp32", "fp16", "fp16-static", "fp16-dynamic", "tensorwise", "delayed",
       "rowwise", "deepseek", "mxfp8", "mxfp4", "nvfp4", "fp8-unscaled"]


@pytest.mark.parametrize("width", [80, 120])
def test_many_recipes_split_into_tables_that_fit(width):
    out = _draw(_result(ALL), width)
    assert_fits(out, width)
    headers = [line for line in out.splitlines() if line.strip().startswith("step ")]
    assert len(headers) == 2  # 13 recipes: two tables at 80 and at 120 columns
    for name in ALL:
        assert any(name in h.split() for h in headers), name
    assert "step 176" in out and "+0.123%" in out and "0.5%" in out
    assert "7.25" in out and "61.8..896" in out


def test_a_long_run_shows_every_kth_row_and_the_last():
    from fmtcli.render.train import LOSS_ROWS, shown_steps

    steps = list(range(25, 2001, 25))
    kept = shown_steps(steps)
    assert len(kept) <= LOSS_ROWS and kept[-1] == 2000
    assert kept == sorted(set(kept)) and set(kept) <= set(steps)
    assert shown_steps([25, 50]) == [25, 50]
    out = _draw(_result(["bf16", "tensorwise"], steps=2000), 80)
    assert "every k-th logged step shown" in out
    assert "2000" in out


@pytest.mark.slow
def test_capture_writes_the_chosen_steps_and_refuses_to_overwrite(tmp_path):
    """--capture DIR --capture-steps 2,4: one safetensors file per step with each Linear's
    input, weight and grad_output; a second run without --force refuses (nothing written)."""
    pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors.numpy")
    folder = tmp_path / "cap"
    args = ["train", *TINY, "--recipe", "tensorwise", "--capture", folder,
            "--capture-steps", "2,4", "--json"]
    first = run_fmt(*args, timeout=600)
    assert first.returncode == 0, first.stderr.decode()
    doc = strict_loads(first.stdout.decode())
    assert [p.rsplit("/", 1)[-1] for p in doc["captured"]] == \
        ["step-000002.safetensors", "step-000004.safetensors"]
    names = set(safetensors.load_file(str(folder / "step-000002.safetensors")))
    assert {"layers.0.mlp.fc1.input", "layers.0.mlp.fc1.weight",
            "layers.0.mlp.fc1.grad_output"} <= names
    again = run_fmt(*args, timeout=600)
    _one_error(again.returncode, again.stdout, again.stderr, (1, 2), "--force")
