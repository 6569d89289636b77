"""The figures of ``fmt dot``: one output C against one float64 reference R (``Errors``, by
``error_figures``; ``arithmetic.dot``'s module docstring, item 5), and one real GEMM on the
GPU (``GpuRun``, by ``dot_cuda``).  Every error is relative, in the units of C."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Errors:
    """One output C against one float64 reference R (module docstring, item 5)."""

    max_rel_error: float
    rel_fro_error: float
    calc_diff: float

    def to_dict(self) -> dict:
        return {"max_rel_error": self.max_rel_error, "rel_fro_error": self.rel_fro_error,
                "calc_diff": self.calc_diff}


@dataclass(frozen=True)
class GpuRun:
    """One real GEMM on the GPU: its errors against both references and against the
    emulation of the same settings; or why it could not run."""

    kernel: str
    fast_accum: bool
    available: bool
    reason: str | None = None
    out_dtype: str | None = None
    vs_quantized: Errors | None = None
    vs_unquantized: Errors | None = None
    vs_emulated: Errors | None = None
    identical_to_emulated: float | None = None  # fraction of outputs equal to the bit

    def to_dict(self) -> dict:
        def d(e):
            return None if e is None else e.to_dict()

        return {"kernel": self.kernel, "fast_accum": self.fast_accum,
                "available": self.available, "reason": self.reason,
                "out_dtype": self.out_dtype, "vs_quantized": d(self.vs_quantized),
                "vs_unquantized": d(self.vs_unquantized), "vs_emulated": d(self.vs_emulated),
                "identical_to_emulated": self.identical_to_emulated}


def error_figures(c: np.ndarray, r: np.ndarray) -> Errors:
    """C against the reference R (float64): the three figures of the module docstring.
    A zero reference gives 0 where C is zero too, else inf (calc_diff: 0 for two zeros)."""
    c = np.asarray(c, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    diff = c - r
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        top = float(np.max(np.abs(r))) if r.size else 0.0
        worst = float(np.max(np.abs(diff))) if diff.size else 0.0
        max_rel = worst / top if top > 0 else (0.0 if worst == 0 else math.inf)
        norm_r = float(np.linalg.norm(r))
        norm_d = float(np.linalg.norm(diff))
        fro = norm_d / norm_r if norm_r > 0 else (0.0 if norm_d == 0 else math.inf)
        denominator = float(np.sum(c * c + r * r))
        calc = 1.0 - 2.0 * float(np.sum(c * r)) / denominator if denominator > 0 else 0.0
    if not np.all(np.isfinite(c)):  # an accumulator that overflowed (FP16): say so
        max_rel = fro = math.inf
        calc = math.nan
    return Errors(max_rel, fro, calc)
