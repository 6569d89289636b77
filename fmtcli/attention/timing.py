"""Time ``torch.nn.functional.scaled_dot_product_attention`` on a CUDA GPU, one backend at
a time (``torch.nn.attention.sdpa_kernel``): math (standard attention, S and P in memory),
flash (FlashAttention-2), efficient (memory-efficient attention, xFormers' kernel) and
cuDNN where this torch has it; with each backend's peak memory and its output's error
against the float64 reference.  The article's trade (Dao et al. 2022, Fig. 2): more FLOPs,
far less traffic, faster -- on the user's GPU.

torch is imported here only, when a timing is asked for: the rest of fmtcli never needs it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from fmtcli.attention.accuracy import error_row
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec

#: torch dtypes SDPA computes in, by fmtcli format name.
TORCH_DTYPES = ("float32", "float16", "bfloat16")
#: (name shown, SDPBackend member) in the order timed.
BACKENDS = (("math", "MATH"), ("flash", "FLASH_ATTENTION"),
            ("efficient", "EFFICIENT_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"))


@dataclass(frozen=True)
class TimingRow:
    """One SDPA backend: ``ms`` the median time of one forward call (milliseconds, CUDA
    events), ``tflops`` the attention FLOPs (4 N_q N_k d per head, halved when causal) per
    second over that time (10**12), ``peak_bytes`` the peak memory allocated during a call
    above what the inputs already held; the error figures as in ``AccuracyRow``.  A backend
    that cannot run this shape or dtype has ``available`` False and ``reason``."""

    backend: str
    dtype: str
    available: bool
    reason: str | None = None
    ms: float | None = None
    tflops: float | None = None
    peak_bytes: int | None = None
    rmse: float | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None

    def to_dict(self) -> dict:
        return {"backend": self.backend, "dtype": self.dtype, "available": self.available,
                "reason": self.reason, "ms": self.ms, "tflops": self.tflops,
                "peak_bytes": self.peak_bytes, "rmse": self.rmse,
                "max_abs_error": self.max_abs_error, "max_rel_error": self.max_rel_error}


def cuda_torch():
    """torch, when it is installed and sees a CUDA GPU; else a UsageError saying which is
    missing (``--time`` and ``--device cuda`` end there, exit 2)."""
    try:
        import torch
    except ImportError:
        raise UsageError("timing needs torch with a CUDA GPU, and torch is not installed ("
                         + Param("device", "cuda", "cuda") + ")") from None
    if not torch.cuda.is_available():
        raise UsageError("timing needs a CUDA GPU, and torch sees none ("
                         + Param("device", "cuda", "cuda") + ")")
    return torch


def device_name() -> str:
    torch = cuda_torch()
    return torch.cuda.get_device_name(0)


def _median_ms(torch, call, min_repeats: int = 5, budget_s: float = 0.5) -> float:
    """The median of repeated timings of ``call`` (CUDA events), after two warm-up calls:
    at least ``min_repeats`` calls, more while they take under ``budget_s`` in all."""
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    times: list[float] = []
    while len(times) < min_repeats or (sum(times) < budget_s * 1e3 and len(times) < 100):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def time_sdpa(q, k, v, spec: FormatSpec, reference: np.ndarray,
              causal: bool = False) -> list[TimingRow]:
    """Each SDPA backend on (batch, heads, seq, dim) arrays cast to ``spec`` (float32,
    float16 or bfloat16) on the first CUDA GPU: time, peak memory and error against
    ``reference`` (float64 attention of the same inputs)."""
    if spec.name not in TORCH_DTYPES:
        raise UsageError(f"torch's scaled_dot_product_attention has no {spec.name} kernels: "
                         "timing takes format float16, bfloat16 or float32")
    torch = cuda_torch()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = getattr(torch, spec.name)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to("cuda", dtype)
                  for a in (q, k, v))
    b, h, n_q, d = tq.shape
    flops = 4 * b * h * n_q * tk.shape[2] * d * (0.5 if causal else 1.0)
    rows = []
    for name, member in BACKENDS:
        backend = getattr(SDPBackend, member, None)
        if backend is None:
            rows.append(TimingRow(name, spec.name, False, "not in this torch"))
            continue

        def call(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        try:
            with warnings.catch_warnings(record=True) as said:  # why a kernel was not used
                warnings.simplefilter("always")
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                out = call()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                ms = _median_ms(torch, call)
        except RuntimeError as error:  # this backend cannot run this shape/dtype/GPU
            texts = [str(w.message) for w in said] + [str(error)]
            reason = next((t.strip().splitlines()[0] for t in texts if t.strip()), "failed")
            rows.append(TimingRow(name, spec.name, False, reason[:200]))
            torch.cuda.empty_cache()
            continue
        err = error_row(name, spec, out.float().cpu().numpy(), reference)
        rows.append(TimingRow(name, spec.name, True, None, ms,
                              flops / (ms * 1e-3) / 1e12 if ms > 0 else math.inf, int(peak),
                              err.rmse, err.max_abs_error, err.max_rel_error))
        del out
        torch.cuda.empty_cache()
    return rows
