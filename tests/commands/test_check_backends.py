"""``fmt check-backends`` against the installed ml_dtypes (no torch needed), what it says of
its environment (ml_dtypes' version and answers where its releases differ, the compiled
kernel), and the note a large input gets when the kernel was not built.

What ml_dtypes does is found by casting (``peer_behaviour``), so these hold for every
release pyproject allows: a release that rounds twice is reported as rounding twice, and
one that rounds once as agreeing.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import peer_behaviour as peer
import pytest
from cli_helpers import assert_fits, invoke, json_of, run_fmt

from fmtcli.numerics import native


def ml_dtypes_report(doc: dict, name: str) -> dict:
    return next(r for r in doc["reports"] if r["backend"] == "ml_dtypes"
                and r["format"] == name)


def test_the_environment_is_what_the_installed_ml_dtypes_does():
    env = json_of("check-backends", "fp16")["environment"]
    assert env["ml_dtypes"]["version"] == ml_dtypes.__version__
    cases = {c["case"]: c for c in env["ml_dtypes"]["cases"]}
    assert set(cases) == {"float64_input", "e8m0_subnormal", "e8m0_tie"}
    f64 = cases["float64_input"]
    assert (f64["input"], f64["input_dtype"], f64["engine"]) == (68.00000357, "float64", 72.0)
    twice = peer.rounds_float64_through_float32("float8_e4m3fn")
    assert f64["backend"] == (64.0 if twice else 72.0)
    assert f64["agrees"] is not twice
    assert f64["behaviour"] == ("via float32" if twice else "rounds once")
    sub = cases["e8m0_subnormal"]
    up = peer.e8m0_subnormals_round_up()
    assert sub["engine"] == 2.0**-127 and sub["backend"] == (2.0**-126 if up else 2.0**-127)
    assert sub["agrees"] is not up
    tie = cases["e8m0_tie"]
    even = peer.e8m0_ties_to_even_code()
    assert tie["engine"] == 4.0 and tie["backend"] == (2.0 if even else 4.0)
    assert tie["agrees"] is not even
    assert env["kernel"] == {"built": native.built(), "fmtcli_kernel": None,
                             "on": native.built()}


def test_e8m0_mismatches_are_reported_as_the_installed_ml_dtypes_makes_them():
    """Before 0.7 ml_dtypes rounds the float32 subnormals just above 2**-127 up (a value
    mismatch, 2**-127 -> 2**-126 in the example); 0.7 agrees."""
    report = ml_dtypes_report(json_of("check-backends", "--format", "e8m0"), "float8_e8m0fnu")
    values = [m for m in report["mismatches"] if m["kind"] == "value"]
    if not (peer.e8m0_subnormals_round_up() or peer.e8m0_ties_to_even_code()):
        assert report["agrees"] and not values
        return
    assert report["value_mismatches"] > 0 and not report["agrees"]
    by_class = {m["class"]: m for m in values}
    if peer.e8m0_subnormals_round_up():  # 2**-127 is E8M0's smallest normal: class other
        example = by_class["other"]["examples"][0]
        assert example["reference"] == 2.0**-127 and example["backend"] == 2.0**-126
    else:
        assert "other" not in by_class
    if peer.e8m0_ties_to_even_code():  # 3 -> 2, ...: class tie
        assert by_class["tie"]["count"] >= 126
        example = by_class["tie"]["examples"][0]
        assert example["backend"] * 2 == example["reference"]
    else:
        assert "tie" not in by_class


def test_float64_input_is_one_of_the_cases_and_the_table_says_what_it_found():
    out = invoke("check-backends", "fp16", env={"COLUMNS": "80"}).stdout
    assert_fits(out, 80)
    assert f"ml_dtypes {ml_dtypes.__version__} where its releases differ" in out
    line = next(x for x in out.splitlines() if "68.00000357 (float64)" in x)
    twice = peer.rounds_float64_through_float32("float8_e4m3fn")
    assert line.split()[-2:] == (["via", "float32"] if twice else ["rounds", "once"])
    assert line.split()[3:5] == (["72", "64"] if twice else ["72", "72"])


@pytest.mark.slow
@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built here")
def test_the_kernel_line_says_built_and_whether_fmtcli_kernel_turns_it_off():
    on = invoke("check-backends", "fp16").stdout
    assert "compiled kernel of fmt quantize: built, in use (FMTCLI_KERNEL unset)" in on
    off = invoke("check-backends", "fp16", env={"FMTCLI_KERNEL": "numpy"})
    assert "built, turned off (FMTCLI_KERNEL =numpy)" in " ".join(off.stdout.split())
    doc = json_of("check-backends", "fp16", env={"FMTCLI_KERNEL": "numpy"})
    assert doc["environment"]["kernel"] == {"built": True, "fmtcli_kernel": "numpy",
                                            "on": False}


@pytest.mark.slow
def test_an_install_without_the_kernel_says_so(monkeypatch):
    monkeypatch.setattr(native, "_compiled", None)
    doc = json_of("check-backends", "fp16")
    assert doc["environment"]["kernel"] == {"built": False, "fmtcli_kernel": None, "on": False}
    out = " ".join(invoke("check-backends", "fp16").stdout.split())
    assert "compiled kernel of fmt quantize: not built (no C compiler at install time?)" in out


@pytest.fixture
def no_kernel(monkeypatch):
    """The install without a C compiler: no compiled kernel, no note said yet."""
    monkeypatch.setattr(native, "_compiled", None)
    monkeypatch.setattr(native, "_NOTED", False)


def big_file(tmp_path, name="x.npy", values=1 << 10):
    path = tmp_path / name
    np.save(path, np.random.default_rng(0).standard_normal((values // 64, 64))
            .astype(np.float32))
    return path


NOTE = "Note: the compiled kernel is not built (no C compiler at install time?)"


def test_a_large_input_without_the_kernel_gets_one_note(no_kernel, monkeypatch, tmp_path):
    monkeypatch.setattr(native, "NOTE_BYTES", 1000)  # 4 KiB of float32 is "large" here
    a, b = big_file(tmp_path, "a.npy"), big_file(tmp_path, "b.npy")
    result = invoke("quantize", a, b, "--block", "32", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count(NOTE) == 1, result.stderr
    assert "MiB of values run on numpy alone" in result.stderr
    again = invoke("scale-search", a, "--json")  # once per process: said already
    assert again.exit_code == 0 and NOTE not in again.stderr


def test_a_small_input_without_the_kernel_gets_no_note(no_kernel, tmp_path):
    result = invoke("quantize", big_file(tmp_path), "--block", "32", "--json")
    assert result.exit_code == 0 and NOTE not in result.stderr


def test_scale_search_of_a_large_input_without_the_kernel_gets_the_note(no_kernel,
                                                                         monkeypatch, tmp_path):
    monkeypatch.setattr(native, "NOTE_BYTES", 1000)
    result = invoke("scale-search", big_file(tmp_path), "--json")
    assert result.exit_code == 0 and result.stderr.count(NOTE) == 1, result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built here")
def test_the_note_is_for_a_missing_kernel_not_for_one_turned_off(monkeypatch, tmp_path):
    """In a fresh process over 64 MiB of values: FMTCLI_KERNEL=numpy is the user's choice
    (no note); a built kernel gets none either."""
    path = tmp_path / "big.npy"
    np.save(path, np.zeros((1 << 10, (64 << 20) // 4 // (1 << 10) + 1), np.float32))
    for env in ({}, {"FMTCLI_KERNEL": "numpy"}):
        done = run_fmt("quantize", path, "--per", "tensor", "--json", env=env)
        assert done.returncode == 0 and b"compiled kernel" not in done.stderr, done.stderr
