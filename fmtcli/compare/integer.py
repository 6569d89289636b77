"""fmt's own quantization of an original tensor on a symmetric integer grid, for the
integer layouts fmt has no element format for (``Quantized.element`` ``int1`` .. ``int8``).

The grid (compressed-tensors 0.20.1 ``quantization/utils/helpers.py``
``calculate_qparams``, symmetric; GPTQ/AWQ exports alike): per group a *dequantization*
scale ``s = amax / q_max`` with ``q_max = 2^(b-1) - 1``, ``x_q = clip(round(x / s),
-q_max, q_max) * s`` (round half to even).  compressed-tensors itself divides by
``(q_max - q_min) / 2 = q_max + 0.5`` and clips to ``[-q_max - 1, q_max]``, a rule within a
fraction of a dB of this one; GPTQ's searched scales land above it, which the verdict never
flags.  The groups are the layout's (``Quantized.group``): the tensor, a row of the matrix
view, or a block along the rows; asymmetric layouts (a zero point), activation-ordered
groups (``g_idx``) and other groupings get no fmt's own (None).

The original is read in row chunks (``streaming.stream.ChunkReader``), float64 sums.
"""

from __future__ import annotations

import math
import re

import numpy as np

from fmtcli.base.choices import CHUNK_ELEMENTS, Granularity
from fmtcli.numerics.granularity import matrix_shape
from fmtcli.streaming.stream import ChunkReader

_ELEMENT = re.compile(r"int([1-8])")


def own_integer(original, q) -> tuple[float, float, float, str] | None:
    """(SQNR dB, sum x^2, sum e^2, the scheme's label) of fmt's own symmetric integer
    quantization of ``original`` (a TensorSource) in ``q``'s groups, or None (module
    docstring: not an integer element, asymmetric, or groups it does not take)."""
    match = _ELEMENT.fullmatch(q.element or "")
    group = q.group
    if (match is None or not q.facts.get("symmetric", False) or q.facts.get("g_idx")
            or group.kind not in (Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK)
            or (group.kind is Granularity.BLOCK and group.axis != -1)):
        return None
    rows, cols = matrix_shape(original.shape)
    size = cols if group.kind is not Granularity.BLOCK else group.block
    if rows == 0 or cols == 0 or cols % size:
        return None
    bits = int(match.group(1))
    q_max = 2 ** (bits - 1) - 1
    if q_max < 1:
        return None
    reader = ChunkReader(original)
    try:
        step = max(1, CHUNK_ELEMENTS // cols)
        chunks = [slice(r, min(rows, r + step)) for r in range(0, rows, step)]
        tensor_amax = None
        if group.kind is Granularity.TENSOR:
            tensor_amax = max(float(np.max(np.abs(reader.read(c, slice(0, cols)))))
                              for c in chunks)
        x2 = e2 = 0.0
        for c in chunks:
            x = reader.read(c, slice(0, cols)).astype(np.float64)
            groups = x.reshape(x.shape[0], -1, size)
            amax = (np.full(groups.shape[:2] + (1,), tensor_amax) if tensor_amax is not None
                    else np.max(np.abs(groups), axis=-1, keepdims=True))
            scale = np.where(amax > 0, amax / q_max, 1.0)
            error = np.clip(np.round(groups / scale), -q_max, q_max) * scale - groups
            x2 += float(np.sum(x * x))
            e2 += float(np.sum(error * error))
    finally:
        reader.close()
    sqnr = math.inf if e2 == 0 else (10 * math.log10(x2 / e2) if x2 > 0 else -math.inf)
    spelled = {Granularity.TENSOR: "tensor", Granularity.ROW: "row",
               Granularity.BLOCK: f"block {size}"}[group.kind]
    return sqnr, x2, e2, f"int{bits} {spelled} (symmetric, amax/{q_max})"
