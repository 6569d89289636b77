"""Library errors speak Python, the command line speaks options: ``str(error)`` names the
library's parameters (``block=0``), never a flag; the command line says the same error with its
options (``--block 0``); keywords that are not parameters are left alone.
"""

from __future__ import annotations

import pytest
from cli_helpers import invoke

from fmtcli.base.errors import FmtError, Param

LIBRARY_ERRORS = [  # (a library call that raises, what str(error) says)
    (lambda: __import__("fmtcli.numerics.schemes").numerics.schemes.build_scheme(block=0),
     "block=0: a block size must be >= 1"),
    (lambda: __import__("fmtcli.numerics.schemes").numerics.schemes.build_scheme(block=4, tile="2x2"),
     "block=4 and tile='2x2' are alternatives: give one"),
    (lambda: __import__("fmtcli.numerics.backends").numerics.backends.resolve(
        "ml_dtypes", "cpu", __import__("fmtcli").get_format("tf32")),
     "ml_dtypes has no tfloat32 (use backend='numpy')"),
    (lambda: __import__("fmtcli.numerics.schemes").numerics.schemes.comparison_schemes(
        __import__("fmtcli.numerics.schemes").numerics.schemes.build_scheme(), "some"),
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

    # the parameters the error carries become options; text that looks like one stays text
    error = FmtError("x=1 and " + Param("force", True),
                     "use " + Param("product", "exact") + " or size=2")
    assert as_options(error) == "x=1 and --force (use --product exact or size=2)"
