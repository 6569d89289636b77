"""The command line under hostile arguments and odd environments (issue 9).

Every refusal is exit 2 (usage) or 1 (data) with exactly one ``Error:`` line on stderr and
nothing on stdout; every success with ``--json`` prints one strictly valid JSON document;
no traceback, no temporary file left, no target touched.  The suite runs with
FMT_TRACEBACK=1 (tests/conftest.py): only the guard's own tests unset it.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import (
    assert_data_error,
    assert_error,
    assert_usage_error,
    invoke,
    quantize_json,
    strict_loads,
)
from oracle import write_safetensors

import fmtcli.engine.writers as output
from fmtcli.base.errors import FmtError

BIG = "9" * 5000
LONG = "x" * 100_000


def leftovers(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), ".fmtcli-*"))


def checkpoint_like_a_real_one(path) -> list[str]:
    """An int64 position_ids first (skipped), then 108 float tensors: 2-D weights, 1-D
    biases and norms, 1-element gains, bf16 and fp16 ones; long dotted keys."""
    rng = np.random.default_rng(6)
    arrays = {"embeddings.position_ids": np.arange(512, dtype=np.int64)[None]}
    shapes = [("attention.self.query.weight", (64, 64)), ("attention.self.query.bias", (64,)),
              ("attention.self.value.weight", (64, 64)), ("attention.output.LayerNorm.bias", (64,)),
              ("intermediate.dense.weight", (256, 64)), ("intermediate.dense.bias", (256,)),
              ("output.dense.weight", (64, 256)), ("output.LayerNorm.weight", (64,)),
              ("extra.scalar_gain", (1,))]
    for layer in range(12):
        for name, shape in shapes:
            x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            if "value" in name:
                x = x.astype(ml_dtypes.bfloat16)
            elif "LayerNorm" in name:
                x = x.astype(np.float16)
            arrays[f"encoder.layer.{layer}.{name}"] = x
    write_safetensors(path, arrays)
    return list(arrays)


# -- the guard: a bug is one line and exit 70 ------------------------------------------------

def injected_bug(*args, **kwargs):
    raise RuntimeError("injected bug\nwith a second line")


def test_an_internal_error_is_one_line_with_exit_code_70(monkeypatch):
    monkeypatch.setattr("fmtcli.underflow.underflow_table", injected_bug)
    result = invoke("underflow", "1", env={"FMT_TRACEBACK": None})
    assert result.exit_code == 70
    assert result.stdout == ""
    assert result.stderr == ("Error: internal error: RuntimeError: injected bug\\nwith a second "
                             "line (please report it; FMT_TRACEBACK=1 shows the traceback)\n")


def test_fmt_traceback_lets_the_internal_error_raise(monkeypatch):
    monkeypatch.setattr("fmtcli.underflow.underflow_table", injected_bug)
    result = invoke("underflow", "1", env={"FMT_TRACEBACK": "1"})
    assert isinstance(result.exception, RuntimeError)


def test_the_suite_runs_with_tracebacks_on():
    assert os.environ.get("FMT_TRACEBACK") == "1"


def test_ctrl_c_is_aborted_with_exit_code_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fmtcli.underflow.underflow_table", interrupted)
    result = invoke("underflow", "1")
    assert result.exit_code == 130
    assert result.stderr == "Aborted.\n"


def test_a_warning_becomes_one_note_line(monkeypatch):
    from fmtcli.underflow import underflow_table as real

    def warns(*args, **kwargs):
        warnings.warn("overflow encountered in multiply (injected)", RuntimeWarning,
                      stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr("fmtcli.underflow.underflow_table", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = invoke("underflow", "1", "--json")
    assert result.exit_code == 0
    strict_loads(result.stdout)
    assert result.stderr == ("Note: overflow encountered in multiply (injected) "
                             "(RuntimeWarning)\n")


# -- item 6: a checkpoint whose first tensor is skipped, in table mode ------------------------

@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("extra", [[], ["--recipe", "mxfp8"]])
def test_a_real_looking_checkpoint_renders_at_any_width(tmp_path, columns, extra):
    keys = checkpoint_like_a_real_one(tmp_path / "model.safetensors")
    result = invoke("quantize", tmp_path / "model.safetensors", *extra, "--top", "20",
                    env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    assert "\u2026" not in result.stdout
    for part in ("encoder.", "attention.", "scalar_gain", "Total", "per-tensor"):
        assert part in result.stdout, part
    assert "position_ids" not in result.stdout  # skipped: said once, on stderr
    assert result.stderr.count("position_ids") == 1
    assert result.stderr.startswith("Note: skipped")
    assert len(keys) == 109


def test_a_skipped_tensor_is_in_the_json_skipped_list(tmp_path):
    checkpoint_like_a_real_one(tmp_path / "model.safetensors")
    result = invoke("quantize", tmp_path / "model.safetensors", "--json", "--compare", "none")
    assert result.exit_code == 0
    doc = strict_loads(result.stdout)
    assert doc["skipped"] == [{"source": str(tmp_path / "model.safetensors"),
                               "key": "embeddings.position_ids", "dtype": "int64",
                               "shape": [1, 512],
                               "reason": "dtype int64 is not a real floating-point type"}]
    assert len(doc["tensors"]) == 109 and len(doc["total"]) == 1


def test_quantize_json_without_skipped_tensors_has_an_empty_list():
    doc = strict_loads(invoke("quantize", "--json").stdout)
    assert doc["skipped"] == []


@pytest.mark.parametrize("command", [["scale-search"], ["loss-scale"]])
def test_scale_search_notes_each_skipped_tensor_once(tmp_path, command):
    np.savez(tmp_path / "c.npz", ids=np.arange(8), w=np.linspace(-1, 1, 64, dtype=np.float32))
    result = invoke(*command, tmp_path / "c.npz")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("Note: skipped") == 1 and "ids" in result.stderr


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [
    ["range"], ["range", "--all"], ["underflow", "1e-8", "68.00000357", "--scale", "1024"],
    ["underflow", "1e-8", "2**-24"], ["quantize"], ["quantize", "--compare", "all"],
    ["check-backends", "e2m1"],
])
def test_every_table_fits_the_console(args, columns):
    result = invoke(*args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= columns
    assert "\u2026" not in result.stdout


# -- item 8: numbers with thousands of digits -------------------------------------------------

@pytest.mark.parametrize("args", [
    ["underflow", BIG], ["underflow", "0." + "1" * 5000], ["underflow", "1e999999999999"],
    ["underflow", "1", "--scale", BIG], ["underflow", "1", "--scale", "0." + "1" * 5000],
    ["underflow", "1e" + BIG], ["underflow", "2**" + BIG], ["underflow", "0x1p" + BIG],
    ["range", f"e{BIG}m1"], ["range", "e1m999999"], ["range", f"e5m2_b{BIG}"],
    ["range", f"e5m{BIG}"], ["quantize", "--fixed-scale", BIG],
])
def test_huge_numbers_in_arguments_are_usage_errors(args):
    assert_usage_error(invoke(*args))


def test_a_long_exact_decimal_is_still_read():
    # 2**-1074 written out exactly has 751 significant digits: a number, not an attack
    exact = format(np.ldexp(1.0, -1074), ".1100f").rstrip("0")
    result = invoke("underflow", exact, "--format", "fp64" if False else "fp32", "--json")
    assert result.exit_code == 0, result.stderr
    assert strict_loads(result.stdout)[0]["value"] == 5e-324


# -- item 11: seeds ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["underflow", "0.3", "-r", "stochastic"],
                                     ["quantize", "-r", "stochastic"],
                                     ["check-backends", "e2m1"]])
@pytest.mark.parametrize("seed", ["18446744073709551616", "-1", BIG, "1.5", "nan", ""])
def test_seeds_outside_0_to_2_64_are_usage_errors(command, seed):
    assert "--seed" in assert_usage_error(invoke(*command, "--seed", seed))


@pytest.mark.parametrize("command", [["underflow", "0.3", "-r", "stochastic"],
                                     ["quantize", "-r", "stochastic", "--compare", "none"]])
def test_the_largest_seed_works(command):
    result = invoke(*command, "--seed", str(2**64 - 1), "--json")
    assert result.exit_code == 0, result.stderr
    strict_loads(result.stdout)


def test_check_backends_seed_help_says_what_it_seeds():
    help_text = " ".join(invoke("check-backends", "--help").stdout.split())
    assert "random sample of float32" in help_text
    assert "stochastic" not in help_text


# -- item 12: --out ---------------------------------------------------------------------------

@pytest.fixture
def data(tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(-3, 3, 256, dtype=np.float32))
    return tmp_path / "x.npy"


def test_out_onto_a_directory_is_refused_even_with_force(data, tmp_path):
    (tmp_path / "outdir.npy").mkdir()
    message = assert_usage_error(invoke("quantize", data, "--out", tmp_path / "outdir.npy",
                                        "--force"))
    assert "is a directory" in message
    assert leftovers(tmp_path) == [] and os.listdir(tmp_path / "outdir.npy") == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_out_where_no_file_can_be_created_is_refused():
    message = assert_error(invoke("quantize", "--out", "/proc/self/x.npy"), (1, 2))
    assert "/proc/self" in message


def test_out_under_a_file_is_refused(data, tmp_path):
    (tmp_path / "afile").write_text("keep")
    assert "not a directory" in assert_usage_error(
        invoke("quantize", data, "--out", tmp_path / "afile" / "x.npy"))
    assert (tmp_path / "afile").read_text() == "keep"


def test_out_through_a_symlink_needs_force_and_replaces_the_link_only(data, tmp_path):
    (tmp_path / "target.npy").write_bytes(b"precious")
    os.symlink(tmp_path / "target.npy", tmp_path / "link.npy")
    assert "symbolic link" in assert_usage_error(
        invoke("quantize", data, "--out", tmp_path / "link.npy"))
    result = invoke("quantize", data, "--out", tmp_path / "link.npy", "--force",
                    "--compare", "none")
    assert result.exit_code == 0, result.stderr
    assert not os.path.islink(tmp_path / "link.npy")
    assert np.load(tmp_path / "link.npy").shape == (256,)
    assert (tmp_path / "target.npy").read_bytes() == b"precious"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_a_write_failing_midway_removes_its_temporary(data, tmp_path, monkeypatch, suffix):
    (tmp_path / f"old{suffix}").write_bytes(b"old")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "_reserve", disk_full)  # the .npy's blocks, allocated first
    monkeypatch.setattr(output, "_write_safetensors", disk_full)
    monkeypatch.setattr(output.np, "savez", disk_full)
    message = assert_data_error(invoke("quantize", data, "--out", tmp_path / f"old{suffix}",
                                    "--force"))
    assert "No space left on device" in message
    assert leftovers(tmp_path) == []
    assert (tmp_path / f"old{suffix}").read_bytes() == b"old"


def test_a_failing_rename_removes_its_temporary(data, tmp_path, monkeypatch):
    def refuse(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output.os, "replace", refuse)
    assert "Permission denied" in assert_data_error(
        invoke("quantize", data, "--out", tmp_path / "q.npz"))
    assert leftovers(tmp_path) == [] and not (tmp_path / "q.npz").exists()


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_a_bug_midway_still_removes_the_temporary(data, tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(output, "_write_safetensors", injected_bug)
    monkeypatch.setattr(output.NpyWriter, "write", injected_bug)
    result = invoke("quantize", data, "--out", tmp_path / f"q{suffix}")
    assert isinstance(result.exception, RuntimeError)
    assert leftovers(tmp_path) == [] and not (tmp_path / f"q{suffix}").exists()


def test_reserving_the_npy_blocks_fails_cleanly_on_a_full_disk(tmp_path, monkeypatch):
    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.os, "posix_fallocate", no_space)
    with pytest.raises(output.DataError, match="No space left"):
        output.NpyWriter(str(tmp_path / "q.npy"), (4, 4))
    assert leftovers(tmp_path) == []


# -- item 13: streams that cannot encode Unicode ----------------------------------------------

ASCII_COMMANDS = [["range"], ["range", "--all"], ["underflow", "1e-8", "68.00000357"],
                  ["underflow", "1e-8", "--scale", "1024"], ["quantize"],
                  ["scale-search"], ["loss-scale", "--histogram"],
                  ["check-backends", "e2m1"]]


@pytest.mark.parametrize("environment", [{"PYTHONIOENCODING": "ascii"},
                                         {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                          "PYTHONCOERCECLOCALE": "0",
                                          "PYTHONIOENCODING": ""}])
@pytest.mark.parametrize("args", ASCII_COMMANDS)
def test_output_degrades_to_ascii(args, environment):
    env = {**os.environ, "COLUMNS": "100", **environment}
    proc = subprocess.run([sys.executable, "-m", "fmtcli", *args], capture_output=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert "Traceback" not in proc.stderr.decode(errors="replace")
    proc.stdout.decode("ascii")  # nothing a C locale cannot show
    assert len(proc.stdout) > 100


# -- items 15, 16: paths with newlines, empty names -------------------------------------------

def test_a_path_with_a_newline_makes_a_one_line_error(tmp_path):
    message = assert_usage_error(invoke("quantize", "--out", str(tmp_path / "a\nb.txt")))
    assert "a\\nb.txt" in message


@pytest.mark.parametrize("args", [
    ["quantize", "--format", ""], ["quantize", "--format", " "], ["quantize", "--recipe", ""],
    ["quantize", "--tile", ""], ["scale-search", "--format", ""], ["scale-search", "--tile", ""],
    ["loss-scale", "--format", ""], ["underflow", "1", "--format", ""],
    ["underflow", "1", "--scale", ""], ["underflow", ""], ["range", ""],
    ["check-backends", ""], ["check-backends", "--format", ""],
    ["quantize", "--format", "e4m3,"], ["range", "e4m3,,e5m2"], ["underflow", "1,,2"],
])
def test_empty_names_are_refused_everywhere(args):
    assert_usage_error(invoke(*args))


def test_an_empty_key_is_refused(data):
    assert "--key" in assert_usage_error(invoke("quantize", data, "--key", ""))


# -- papercuts ------------------------------------------------------------------------------------

def test_plain_fmt_prints_the_help_on_stdout():
    result = invoke()
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: ") and "quantize" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("command, usage", [
    ("underflow", "[OPTIONS] VALUE..."), ("quantize", "[OPTIONS] [FILE]..."),
    ("range", "[OPTIONS] [FORMAT]..."), ("scale-search", "[OPTIONS] [FILE]..."),
    ("check-backends", "[OPTIONS] [FORMAT]...")])
def test_usage_lines_mark_repeatable_arguments(command, usage):
    assert invoke(command, "--help").stdout.splitlines()[0].endswith(f"{command} {usage}")


def test_per_offers_only_what_it_takes():
    help_text = invoke("quantize", "--help").stdout
    # typer 0.26 writes a choice as [a|b], later releases as <a|b>
    assert re.search(r"[<\[]tensor\|row\|column[>\]]", help_text), help_text
    assert "block|tile" not in help_text
    assert "'block' is not one of" in assert_usage_error(invoke("quantize", "--per", "block"))


def test_the_input_value_is_shown_with_all_its_digits():
    result = invoke("underflow", "68.00000357", "--format", "e4m3fn")
    assert "68.00000357" in result.stdout


def test_a_zero_count_has_no_percentage():
    result = invoke("quantize", "--compare", "none", "--block", "1")
    assert "flushed to zero" in result.stdout
    assert "0 (0)" not in result.stdout


def test_per_column_on_a_1d_tensor_is_noted(data):
    result = invoke("quantize", data, "--per", "column")
    assert result.exit_code == 0
    assert "Note: --per column on the 1-D tensor" in result.stderr


def scheme_of(*args) -> dict:
    return quantize_json(*args, "--compare", "none")["tensors"][0]["schemes"][0]


def test_percentile_rule_through_the_cli():
    from fmtcli.inputs.tensors import example_tensor

    x = np.abs(np.asarray(example_tensor().array(), np.float64))
    stats = scheme_of("--per", "tensor", "--percentile", "99")
    assert stats["scale_rule"] == "percentile" and stats["percentile"] == 99
    scale = stats["scales"]["max"]  # the 99th percentile of |x| maps to 448
    assert abs(448 / scale / np.percentile(x, 99) - 1) < 0.02
    assert stats["saturated"] >= 1  # the outlier of 100 is clipped


def test_fixed_scale_through_the_cli():
    stats = scheme_of("--fixed-scale", "2**6")
    assert stats["scale_rule"] == "fixed" and stats["fixed_scale"] == 64
    assert stats["granularity"] == "tensor"
    assert stats["scales"]["min"] == stats["scales"]["max"] == 64


@pytest.mark.parametrize("args, says", [
    (["--scale-rule", "percentile"], "needs --percentile"),
    (["--scale-rule", "fixed"], "needs --fixed-scale"),
    (["--percentile", "99", "--scale-rule", "amax"], "--percentile goes with"),
    (["--fixed-scale", "4", "--scale-rule", "mx-floor"], "--fixed-scale goes with"),
    (["--percentile", "99", "--fixed-scale", "4"], "alternatives"),
    (["--percentile", "0"], "(0, 100]"), (["--percentile", "101"], "(0, 100]"),
    (["--percentile", "nan"], "(0, 100]"), (["--fixed-scale", "0"], "positive"),
    (["--fixed-scale", "-inf"], "positive"), (["--fixed-scale", "abc"], "cannot read"),
])
def test_scale_rule_and_value_must_go_together(args, says):
    assert says in assert_usage_error(invoke("quantize", *args))


# -- a battery of hostile arguments ----------------------------------------------------------------

HOSTILE = [
    ["underflow", "--5"], ["underflow", "1e"], ["underflow", "0x"], ["underflow", "2**"],
    ["underflow", "2^-1e3"], ["underflow", "1e-400"], ["underflow", "0x1p-2000"],
    ["underflow", "--bogus"], ["underflow", "abc"], ["underflow", "1", "--format", "nope"],
    ["underflow", "1", "--format", "e4m3\u2603"], ["underflow", "1", "-r", "sideways"],
    ["underflow", "1", "--overflow", ""], ["underflow", "1", "--backend", "cupy"],
    ["underflow", "1", "--scale", "0**-1"], ["underflow", "1", "--scale", "nan"],
    ["underflow", LONG], ["range", LONG], ["range", "e0m3"], ["range", "e12m3"],
    ["range", "e4m3_b9999"], ["range", "\u0661"], ["range", "e4m3\nx"],
    ["quantize", "--block", "0"], ["quantize", "--block", "-1"], ["quantize", "--block", BIG],
    ["quantize", "--block", "2**40"], ["quantize", "--tile", "0x5"],
    ["quantize", "--tile", "1x1x1"], ["quantize", "--tile", "x"], ["quantize", "--tile", LONG],
    ["quantize", "--chunk", "0"], ["quantize", "--chunk", BIG], ["quantize", "--workers", "0"],
    ["quantize", "--workers", "100000"], ["quantize", "--margin", str(10**30)],
    ["quantize", "--margin", "-1"], ["quantize", "--margin", "nan"],
    ["quantize", "--format", LONG], ["quantize", "--format", "e4m3,e5m2"],
    ["quantize", "--recipe", "nope"], ["quantize", "--recipe", LONG],
    ["quantize", "--key", "w"], ["quantize", "--compare", "most"],
    ["quantize", "--axis", "1"], ["quantize", "--axis", BIG], ["quantize", "--per", ""],
    ["quantize", "--block", "32", "--per", "row"], ["quantize", "--out", "x.txt"],
    ["quantize", "--out", LONG + ".npy"], ["quantize", "--out", ""],
    ["quantize", "--compare", "all", "--out", "x.npy"], ["quantize", "/nonexistent.npy"],
    ["quantize", LONG], ["quantize", "--recipe", "nvfp4", "--scale-rule", "pow2-floor"],
    ["quantize", "--backend", "torch", "--format", "e2m1"],
    ["scale-search", "--history", "0"], ["scale-search", "--history", BIG],
    ["scale-search", "--metric", "vibes"], ["scale-search", "--histogram"],
    ["scale-search", "--loss-scale", "--block", "32"], ["scale-search", "--seed", "1"],
    ["scale-search", "--format", "e4m3,e5m2"], ["scale-search", "--workers", "-3"],
    ["check-backends", "nope"], ["check-backends", "--seed", "x"], ["--bogus"], ["nope"],
]


@pytest.mark.parametrize("args", HOSTILE, ids=[" ".join(a)[:40] for a in HOSTILE])
def test_hostile_arguments_are_refused_in_one_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_error(invoke(*args), (1, 2))
    assert os.listdir(tmp_path) == []


def test_quantize_of_empty_stdin_is_a_data_error():
    assert_data_error(invoke("quantize", "-", input=""))


JSON_RUNS = [
    ["range"], ["range", "--all", "e7m0"], ["underflow", "-nan", "+inf", "-0", "1_0", "\u0661"],
    ["underflow", "1e-8", "--scale", "2**16", "--format", "e4m3,e5m2"],
    ["underflow", "65505", "--format", "fp16", "--overflow", "saturate"],
    ["quantize"], ["quantize", "--compare", "all"], ["quantize", "--block", "2**40"],
    ["quantize", "--block", str(2**40)], ["quantize", "--tile", "1x1"],
    ["quantize", "--chunk", str(2**62), "--workers", "1024"],
    ["quantize", "--format", "e4m3", "--format", "e5m2"],
    ["quantize", "--overflow", "ieee", "--format", "e2m1", "--per", "tensor"],
    ["scale-search"], ["loss-scale"], ["check-backends", "e2m1"],
]


@pytest.mark.parametrize("args", JSON_RUNS, ids=[" ".join(a)[:40] for a in JSON_RUNS])
def test_json_is_one_strict_document(args):
    result = invoke(*args, "--json")
    if result.exit_code != 0:  # a refusal is fine, if it is a clean one
        assert_error(result, (1, 2))
        return
    assert "Traceback" not in result.stderr
    strict_loads(result.stdout)
    for line in result.stderr.splitlines():
        assert line.startswith(("Note:", "Error:")), line


# -- --product: the width of x * scale, chosen on the command line (issue 9 item 4c) -----------

@pytest.mark.parametrize("product, flushed", [("float32", 1), ("exact", 0)])
def test_quantize_product_option(tmp_path, product, flushed):
    (tmp_path / "t.csv").write_text("9.0\n0.375\n")
    result = invoke("quantize", tmp_path / "t.csv", "--format", "e2m1", "--per", "tensor",
                    "--product", product, "--json")
    assert result.exit_code == 0, result.stderr
    stats = strict_loads(result.stdout)["tensors"][0]["schemes"][0]
    assert stats["product"] == product and stats["flushed"] == flushed


@pytest.mark.parametrize("command", [["underflow", "1"], ["quantize"], ["scale-search"]])
def test_product_takes_float32_or_exact(command):
    assert "--product" in assert_usage_error(invoke(*command, "--product", "float16"))
    result = invoke(*command, "--product", "exact", "--json")
    assert result.exit_code == 0, result.stderr
    strict_loads(result.stdout)


# -- library errors speak Python, the command line speaks options ---------------------------

LIBRARY_ERRORS = [  # (a library call that raises, what str(error) says)
    (lambda: __import__("fmtcli.numerics.schemes").schemes.build_scheme(block=0),
     "block=0: a block size must be >= 1"),
    (lambda: __import__("fmtcli.numerics.schemes").schemes.build_scheme(block=4, tile="2x2"),
     "block=4 and tile='2x2' are alternatives: give one"),
    (lambda: __import__("fmtcli.numerics.backends").backends.resolve(
        "ml_dtypes", "cpu", __import__("fmtcli").get_format("tf32")),
     "ml_dtypes has no tfloat32 (use backend='numpy')"),
    (lambda: __import__("fmtcli.numerics.schemes").schemes.comparison_schemes(
        __import__("fmtcli.numerics.schemes").schemes.build_scheme(), "some"),
     "compare='some': compare takes tensor, none or all"),
]


@pytest.mark.parametrize("call, text", LIBRARY_ERRORS)
def test_library_errors_name_parameters_not_command_line_flags(call, text):
    with pytest.raises(FmtError) as caught:
        call()
    assert str(caught.value) == text and "--" not in str(caught.value)


@pytest.mark.parametrize("args, line", [
    (["quantize", "--block", "0"], "Error: --block 0: a block size must be >= 1"),
    (["quantize", "--block", "4", "--tile", "2x2"],
     "Error: --block 4 and --tile 2x2 are alternatives: give one"),
    (["underflow", "1", "--backend", "ml_dtypes", "--format", "tf32"],
     "Error: ml_dtypes has no tfloat32 (use --backend numpy)"),
    (["quantize", "--out", "a b.txt"],
     "Error: --out 'a b.txt': an output file must end in .npy, .npz, .safetensors"),
])
def test_the_command_line_says_library_errors_with_its_options(args, line):
    result = invoke(*args)
    assert result.exit_code == 2 and result.stderr == line + "\n"


def test_keywords_that_are_not_parameters_are_left_alone():
    from fmtcli.cli import as_options

    error = FmtError("x=1 and force=True", "use product='exact' or size=2")
    assert as_options(error) == "x=1 and --force (use --product exact or size=2)"
