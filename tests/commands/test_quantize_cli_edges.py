"""``fmt quantize``'s corners through the command line (issue 9's papercuts): a count of zero has
no percentage, ``--per column`` on a 1-D tensor says what it did, and the scale rules that take
a value (``--percentile``, ``--fixed-scale``) with their checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, quantize_json
from engine_helpers import stats

from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity


@pytest.fixture
def data(tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(-3, 3, 256, dtype=np.float32))
    return tmp_path / "x.npy"


def test_a_zero_count_has_no_percentage():
    result = invoke("quantize", "--compare", "none", "--block", "1")
    assert "flushed to zero" in result.stdout
    assert "0 (0)" not in result.stdout


def test_per_column_on_a_1d_tensor_is_noted(data):
    result = invoke("quantize", data, "--per", "column")
    assert result.exit_code == 0
    assert "Note: --per column on the 1-D tensor" in result.stderr


# -- scale rules that take a value ------------------------------------------------------------

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


@pytest.mark.slow
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


def test_percentile_scale_of_an_all_zero_tensor_is_one():
    """An all-zero tensor's per-tensor percentile lies in the histogram's lowest bin: it is 0
    (scale 1, nothing to scale), not the bin's upper edge (scale ~3.4e38)."""
    d = stats(np.zeros(1000, np.float32), per=Granularity.TENSOR,
              scale_rule=ScaleRule.PERCENTILE, percentile=99.9)
    assert d["scales"]["min"] == d["scales"]["max"] == 1.0
    assert d["flushed"] == 0 and d["nan_produced"] == 0
