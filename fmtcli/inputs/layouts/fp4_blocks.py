"""Packed FP4 E2M1 tensors with one scale per block of the last axis, read row by row:
what ModelOpt's NVFP4 (``modelopt_nvfp4``) and gpt-oss's MXFP4 (``gptoss_mxfp4``) share.

A packed tensor holds two FP4 E2M1 codes per byte (OCP MX v1.0, section 5.3.3: sign bit,
two exponent bits with bias 1, one mantissa bit; ``base.FP4_VALUES``), the low nibble the
first of the two values in both layouts, so its dequantized last axis (``width``) is
twice its bytes.  Its scales are one per ``block`` values of the last axis: ``scales``
holds, per row of the last axis, ``ceil(width / block)`` *dequantization* scales already
decoded to floats (x = code * scale).

A chunk is rows ``r0:r1`` of the tensor's matrix view (``numerics.granularity
.matrix_shape``), a reshape of the C-order data whose columns are a multiple of the last
axis; it is decoded from the memory maps of just the last-axis rows it covers.  The
product ``code * scale [* global]`` is formed in float64, where it is exact (an FP4 value
has two significant bits, a float8 scale four, a float32 global scale 24), and rounded to
float32 once: the correctly rounded value of the stored bytes' exact decoding.
"""

from __future__ import annotations

import numpy as np

from fmtcli.inputs.layouts.base import unpack_fp4
from fmtcli.inputs.layouts.lookup import per_block


def row_span(r0: int, r1: int, cols: int, width: int) -> tuple[int, int]:
    """The last-axis rows that matrix-view rows ``r0:r1`` (``cols`` columns, a multiple of
    the last axis ``width``) cover."""
    per = cols // width
    return r0 * per, r1 * per


def fp4_values(packed: np.ndarray, a: int, b: int) -> np.ndarray:
    """The FP4 element values (float32, before any scale) of last-axis rows ``a:b`` of a
    packed tensor viewed as (rows, bytes per row), low nibble first."""
    return unpack_fp4(np.asarray(packed[a:b]), low_first=True)


def dequantized_rows(packed: np.ndarray, scales: np.ndarray, a: int, b: int, block: int,
                     factor: np.ndarray | float | None = None,
                     exact32: bool = False) -> np.ndarray:
    """Last-axis rows ``a:b`` dequantized: ``code * scales[row, j // block] * factor`` as
    float32 (rows, 2 * bytes per row).

    ``packed``: uint8 (rows, bytes per row); ``scales``: the decoded per-block scales
    (rows, blocks per row); ``factor``: None, a scalar, or one value per row (float64,
    shape (b - a,)) -- NVFP4's second-level scale.  ``exact32``: the scales are float32
    powers of two (E8M0) and there is no factor, so every product is exact in float32
    (two significant bits; 6 * 2^127 overflows and 0.5 * 2^-127 is a subnormal there as
    after float64's rounding): formed there, the same bits without the float64 pass."""
    values = fp4_values(packed, a, b)
    if exact32 and factor is None:
        return per_block(values, np.asarray(scales[a:b], dtype=np.float32), block)
    with np.errstate(over="ignore", invalid="ignore"):  # inf where the scales overflow
        scale = np.asarray(scales[a:b], dtype=np.float64)
        if factor is not None:
            factor = np.asarray(factor, dtype=np.float64)
            scale = scale * (factor[:, None] if factor.ndim == 1 else factor)
        return per_block(values.astype(np.float64), scale, block).astype(np.float32)
