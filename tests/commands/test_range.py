"""``fmt range``: every format's figures, checked against the article ("Lower precision") and
an independent oracle (numpy/ml_dtypes finfo) rather than against fmtcli's own library; format
names, aliases, custom ``eXmY`` and the suggestions for a mistyped name; the table; the real
entry point (``python -m fmtcli``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, json_of, strict_loads

from fmtcli.numerics.formats import ARTICLE_FORMATS, REGISTRY

ARTICLE_SIX = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
               "float8_e5m2"]


RANGE_KEYS = {"name", "aliases", "bits", "exponent_bits", "mantissa_bits", "bias", "max",
              "smallest_normal", "smallest_subnormal", "eps", "has_inf", "has_nan",
              "has_negative_zero"}


# -- the figures ------------------------------------------------------------------------------

def test_range_default_is_the_article_six_in_order_with_all_keys():
    specs = json_of("range")
    assert [s["name"] for s in specs] == ARTICLE_SIX
    assert list(ARTICLE_FORMATS) == ARTICLE_SIX
    for spec in specs:
        assert RANGE_KEYS <= spec.keys(), RANGE_KEYS - spec.keys()
        assert isinstance(spec["aliases"], list)


@pytest.mark.slow
@pytest.mark.parametrize("name, bits, max_, eps", [
    ("float16", 16, 65504.0, 2.0 ** -10),
    ("bfloat16", 16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 0.0078125),
    ("float8_e4m3fn", 8, 448.0, 0.125),
    ("float8_e4m3fnuz", 8, 240.0, 0.125),
    ("float8_e5m2", 8, 57344.0, 0.25),
    ("float32", 32, float(np.finfo(np.float32).max), 2.0 ** -23),
])
def test_range_article_figures(name, bits, max_, eps):
    spec = {s["name"]: s for s in json_of("range")}[name]
    assert spec["bits"] == bits
    assert spec["max"] == max_
    assert spec["eps"] == eps


def test_range_article_rounded_figures():
    specs = {s["name"]: s for s in json_of("range")}
    assert round(specs["float16"]["eps"], 5) == 0.00098  # "0.00098"
    assert round(specs["bfloat16"]["eps"], 4) == 0.0078  # "0.0078"
    # BF16 "has the same range as FP32"
    assert f"{specs['bfloat16']['max']:.2g}" == f"{specs['float32']['max']:.2g}" == "3.4e+38"


def test_range_layout_and_specials_of_the_article_formats():
    s = {d["name"]: d for d in json_of("range")}
    f16 = s["float16"]
    assert (f16["exponent_bits"], f16["mantissa_bits"], f16["bias"]) == (5, 10, 15)
    assert f16["smallest_normal"] == 2.0 ** -14
    assert f16["smallest_subnormal"] == 2.0 ** -24
    assert (f16["has_inf"], f16["has_nan"], f16["has_negative_zero"]) == (True, True, True)
    fn, fnuz = s["float8_e4m3fn"], s["float8_e4m3fnuz"]
    assert (fn["has_inf"], fn["has_nan"], fn["has_negative_zero"]) == (False, True, True)
    assert (fnuz["has_inf"], fnuz["has_nan"], fnuz["has_negative_zero"]) == (False, True, False)
    assert (fn["bias"], fnuz["bias"]) == (7, 8)
    assert fn["smallest_subnormal"] == 2.0 ** -9 and fnuz["smallest_subnormal"] == 2.0 ** -10
    e5m2 = s["float8_e5m2"]
    assert (e5m2["exponent_bits"], e5m2["mantissa_bits"], e5m2["has_inf"]) == (5, 2, True)
    assert "fp16" in f16["aliases"] and "bf16" in s["bfloat16"]["aliases"]


def test_range_all_lists_every_registered_format_matching_finfo():
    specs = json_of("range", "--all")
    assert [s["name"] for s in specs] == list(REGISTRY)
    assert "tfloat32" in [s["name"] for s in specs]
    assert len(specs) == len(REGISTRY) >= 15
    for spec in specs:
        if spec["name"] == "tfloat32":  # float32's range, float16's precision
            assert spec["eps"] == 2.0 ** -10
            assert spec["smallest_normal"] == 2.0 ** -126
            assert spec["max"] == (2 - 2.0 ** -10) * 2.0 ** 127
            continue
        if spec["name"] == "hifloat8":  # tapered, no ml_dtype: tests/numerics/test_hifloat8.py
            assert (spec["max"], spec["finite_values"]) == (2.0 ** 15, 253)
            continue
        dtype = np.dtype(getattr(ml_dtypes, spec["name"], None) or spec["name"])
        info = np.finfo(dtype) if spec["name"] in ("float32", "float16") else ml_dtypes.finfo(dtype)
        assert spec["max"] == float(info.max), spec["name"]
        assert spec["eps"] == float(info.eps), spec["name"]
        assert spec["smallest_normal"] == float(info.smallest_normal), spec["name"]
        assert spec["smallest_subnormal"] == float(info.smallest_subnormal), spec["name"]
        assert spec["bits"] == info.bits, spec["name"]


# -- format names -----------------------------------------------------------------------------

def test_range_named_formats_aliases_comma_lists_and_case():
    specs = json_of("range", "fp16,bf16", "E4M3FNUZ", "torch.float8_e5m2")
    assert [s["name"] for s in specs] == ["float16", "bfloat16", "float8_e4m3fnuz",
                                          "float8_e5m2"]


@pytest.mark.parametrize("custom, registered", [("e5m10", "fp16"), ("e8m7", "bf16"),
                                                 ("e4m3_b7fn", "float8_e4m3fn")])
def test_range_custom_format_figures_equal_the_registered_one(custom, registered):
    custom_spec, registered_spec = json_of("range", custom, registered)
    for key in RANGE_KEYS - {"name", "aliases"}:
        assert custom_spec[key] == registered_spec[key], key


def test_range_custom_e5m10_is_float16():
    (spec,) = json_of("range", "e5m10")
    assert spec["name"] == "e5m10"
    assert (spec["max"], spec["eps"], spec["smallest_subnormal"]) == (65504, 2.0 ** -10, 2.0 ** -24)


@pytest.mark.parametrize("columns", ["200", "40"])
def test_range_bare_e4m3_prints_one_note_line_and_valid_json(columns):
    result = invoke("range", "e4m3", "--json", env={"COLUMNS": columns})
    assert result.exit_code == 0
    (spec,) = strict_loads(result.stdout)
    assert spec["name"] == "float8_e4m3fn" and spec["max"] == 448
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "e4m3fnuz" in lines[0] and "240" in lines[0]
    assert "Note" not in result.stdout


def test_range_unambiguous_names_print_no_note():
    result = invoke("range", "e4m3fn", "e4m3fnuz", "--json")
    assert result.exit_code == 0
    assert result.stderr == ""


@pytest.mark.slow
@pytest.mark.parametrize("args, suggestion", [
    (("range", "fp17"), "fp16"),
    (("range", "e4m3fnz"), "e4m3fnuz"),
    (("range", "fp16,bf17", "--json"), "bf16"),
    (("range", "--all", "fp17"), "fp16"),
    (("underflow", "1e-8", "--format", "bfloat61"), "bfloat16"),
])
def test_unknown_format_is_a_usage_error_with_suggestions(args, suggestion):
    result = invoke(*args)
    assert_usage_error(result)
    assert result.stderr.startswith("Error: unknown format")
    assert suggestion in result.stderr


def test_range_mistyped_option_is_a_usage_error():
    result = invoke("range", "--jsn")
    assert_usage_error(result, "--jsn")


# -- the table --------------------------------------------------------------------------------

def test_range_table_shows_exact_figures():
    result = invoke("range")
    assert result.exit_code == 0
    out = result.stdout
    for figure in ("65,504", "448", "240", "57,344", "0.001953125", "0.0078125", "0.125"):
        assert figure in out, figure
    for name in ARTICLE_SIX:
        assert name in out
    assert result.stderr == ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_range_all_table_lists_tfloat32():
    result = invoke("range", "--all")
    assert result.exit_code == 0
    assert "tfloat32" in result.stdout and "float4_e2m1fn" in result.stdout


# -- the real entry point ---------------------------------------------------------------------

def test_python_m_fmtcli_range_json():
    proc = subprocess.run([sys.executable, "-m", "fmtcli", "range", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    specs = strict_loads(proc.stdout)
    assert [s["name"] for s in specs] == ARTICLE_SIX
    assert math.isclose(specs[1]["max"], 65504)
