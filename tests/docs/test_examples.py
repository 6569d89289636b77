"""Every script in examples/ runs with the installed fmtcli and prints its key figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# Figures each example must print (an example not listed here must still run cleanly).
KEY_FIGURES = {
    "article_formats.py": [
        "65,504", "448", "240", "57,344", "2^-10", "2^-7 ~ 0.00781", "0.125", "0.25",
        "FP8 E4M3 (fnuz)", "4.0948e-05", "9.997e-09", "1.0012e-08", "flushed", "subnormal",
        "All figures agree with the article.",
    ],
    "outlier_experiment.py": ["16.0%", "14.1%", "2.4%", "per-block scales rescue"],
}


def run_python(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_there_are_examples():
    assert [path.name for path in EXAMPLES] and set(KEY_FIGURES) <= {p.name for p in EXAMPLES}


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    proc = run_python(str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip()
    for figure in KEY_FIGURES.get(path.name, []):
        assert figure in proc.stdout, figure


def test_article_example_exits_nonzero_when_a_figure_disagrees():
    # Swap FP16 for BF16 behind the example's back: its checks must catch it.
    code = (
        "import runpy, fmtcli\n"
        "real = fmtcli.get_format\n"
        "fmtcli.get_format = lambda name: real('bfloat16' if name == 'float16' else name)\n"
        "runpy.run_path('examples/article_formats.py', run_name='__main__')\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH: float16: largest value" in proc.stderr
    assert "All figures agree" not in proc.stdout
