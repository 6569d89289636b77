"""Builds the optional compiled chunk kernel (fmtcli/numerics/_native.c).

Everything else is declared in pyproject.toml.  The extension is optional: where it cannot
be compiled (no C compiler), the install goes on and the engine runs its numpy path, which
gives the same statistics to the bit (tests/engine/test_native.py), only slower.
"""

import sys

from setuptools import Extension, setup

# IEEE arithmetic as written: no fused multiply-add, no reassociation (the kernel must
# reproduce numpy's float32 operations and pairwise sums bit for bit)
FLAGS = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", "-fno-math-errno"]

setup(ext_modules=[Extension("fmtcli.numerics._native", ["fmtcli/numerics/_native.c"],
                             extra_compile_args=FLAGS, optional=True)])
