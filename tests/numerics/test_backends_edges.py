"""A backend's refusals (torch without FP4/FP6, stochastic or directed rounding, MX recipes) come
before torch is imported: checked in a fresh interpreter that never loads it.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_backend_refusals_come_before_importing_torch():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        import numpy as np
        from fmtcli.numerics.backends import resolve
        from fmtcli.base.errors import UsageError
        from fmtcli.numerics.formats import get_format
        from fmtcli.quantize import quantize
        from fmtcli.numerics.schemes import build_scheme
        from fmtcli.inputs.tensors import TensorSource
        from fmtcli.underflow import underflow_table

        x = np.ones(4, np.float32)
        src = TensorSource("m", None, x.shape, "float32", lambda: x)
        e4m3 = get_format("float8_e4m3fn")
        attempts = [
            lambda: resolve("torch", "cpu", get_format("float4_e2m1fn")),
            lambda: resolve("torch", "cuda", get_format("float6_e3m2fn")),
            lambda: resolve("torch", "cpu", e4m3, rounding="stochastic"),
            lambda: quantize([src], [build_scheme(recipe="mxfp4")], backend="torch"),
            lambda: quantize([src], [build_scheme(rounding="up")], backend="torch"),
            lambda: underflow_table([1.0], [e4m3], rounding="down", backend="torch"),
        ]
        for attempt in attempts:
            try:
                attempt()
            except UsageError as error:
                print(error)
            else:
                raise SystemExit("not refused")
        assert "torch" not in sys.modules, "torch was imported"
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6
    assert "needs torch" not in done.stdout
