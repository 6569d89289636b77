"""``--json`` under odd but valid arguments: stdout is one strictly valid JSON document (no NaN
or Infinity literals), stderr only ``Note:`` lines; a refusal is a clean one.
"""

from __future__ import annotations

import pytest
from cli_helpers import assert_error, invoke, strict_loads

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


@pytest.mark.slow
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
