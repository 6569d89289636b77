"""The real FP8 GEMM on a CUDA GPU: ``torch._scaled_mm`` with and without its
fast-accumulation flag, on the same codes and dequantization scales as the emulation
(``arithmetic.gemm``), with the same errors against float64 (``arithmetic.dot_figures``).

``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum)`` computes
``(a @ b) * scale_a * scale_b`` for FP8 ``a`` (row-major) and ``b`` (column-major), with
the *dequantization* scales ``d = 1 / scale``; its dims must be multiples of 16.  Without
fast accumulation cuBLAS promotes partial sums to FP32 periodically; with it, the whole K
stays in the tensor core's accumulator (the setting DeepSeek-V3 §3.3.2 warns about).

``_scaled_mm`` is private API whose signature has changed between releases: it is checked
for (present, torch >= 2.5, the keyword form used here; measured on 2.11) before use, and a
torch without it, or a GPU without FP8 tensor cores (compute capability below 8.9), gets a
row saying so instead of a result; a call torch refuses (block scales on torch 2.11) too.  torch is
imported here only, when ``--device cuda`` asks for it.
"""

from __future__ import annotations

import numpy as np

from fmtcli.arithmetic.dot_figures import GpuRun, error_figures
from fmtcli.arithmetic.gemm import Operand
from fmtcli.base.errors import Param, UsageError

#: FP8 formats torch has dtypes (and _scaled_mm kernels) for.
TORCH_FP8 = ("float8_e4m3fn", "float8_e5m2")
#: The oldest torch this calls _scaled_mm on (a, b, scale_a=, scale_b=, out_dtype=,
#: use_fast_accum=, with tensor scales); older ones get the fallback row.
MIN_TORCH = (2, 5)


def cuda_torch():
    """torch, when it is installed and sees a CUDA GPU; else a UsageError saying which is
    missing (the emulation runs without either: --device cpu)."""
    try:
        import torch
    except ImportError:
        raise UsageError("the real FP8 GEMM needs torch with a CUDA GPU, and torch is not "
                         "installed (" + Param("device", "cuda", "cuda")
                         + "); the emulation runs without it") from None
    if not torch.cuda.is_available():
        raise UsageError("the real FP8 GEMM needs a CUDA GPU, and torch sees none ("
                         + Param("device", "cuda", "cuda") + "); the emulation runs without it")
    return torch


def _version(torch) -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return (0, 0)


def unavailable_reason(torch, spec_name: str, m: int, n: int, k: int) -> str | None:
    """Why ``_scaled_mm`` cannot run this GEMM here, or None."""
    if not hasattr(torch, "_scaled_mm") or _version(torch) < MIN_TORCH:
        return (f"torch {torch.__version__} lacks the private torch._scaled_mm of torch >= "
                f"{MIN_TORCH[0]}.{MIN_TORCH[1]}; compare with the emulation alone")
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        return (f"{torch.cuda.get_device_name(0)} (compute capability {major}.{minor}) has "
                "no FP8 tensor cores (8.9 or later)")
    if spec_name not in TORCH_FP8:
        return f"torch._scaled_mm takes {' or '.join(TORCH_FP8)}, not {spec_name}"
    if m % 16 or n % 16 or k % 16:
        return f"torch._scaled_mm needs M, N, K multiples of 16, got {m}, {n}, {k}"
    return None


def _operands(torch, a: Operand, b: Operand, spec, kind: str):
    """A's codes (row-major), B's codes (column-major: the transpose of a row-major N x K)
    as FP8 on the GPU, and the dequantization scales as _scaled_mm takes them (float32):
    scalars (tensor), M x 1 and 1 x N (row), 1 x BS tiles and BS x BS blocks (block: the
    layout torch >= 2.9 accepts on sm90, where it accepts it)."""
    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).cuda()

    dtype = getattr(torch, spec.name)
    ta = t(a.codes).to(dtype)
    tb = t(b.codes.T).to(dtype).t()
    if kind == "tensor":
        return ta, tb, t(a.dequant.reshape(())), t(b.dequant.reshape(()))
    return ta, tb, t(a.dequant), t(b.dequant)


def run_scaled_mm(a: Operand, b: Operand, spec, kind: str,
                  reference_q: np.ndarray, reference: np.ndarray, emulated: np.ndarray
                  ) -> tuple[str, str, list[GpuRun]]:
    """``torch._scaled_mm`` without and with ``use_fast_accum`` on the operands' codes and
    scales: the GPU's name, torch's version, and one ``GpuRun`` each."""
    torch = cuda_torch()
    m, k = a.codes.shape
    n = b.codes.shape[1]
    runs = []
    reason = unavailable_reason(torch, spec.name, m, n, k)
    if reason is None:
        ta, tb, sa, sb = _operands(torch, a, b, spec, kind)
    for fast in (False, True):
        if reason is not None:
            runs.append(GpuRun("torch._scaled_mm", fast, False, reason))
            continue
        out, why, out_name = None, None, None
        for out_dtype in (torch.float32, torch.bfloat16):  # rowwise may want bf16 out
            try:
                out = torch._scaled_mm(ta, tb, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                       use_fast_accum=fast)
                out_name = str(out_dtype).replace("torch.", "")
                break
            except (RuntimeError, TypeError, ValueError) as error:
                why = str(error).strip().splitlines()[0] if str(error).strip() else \
                    type(error).__name__
        if out is None:
            runs.append(GpuRun("torch._scaled_mm", fast, False, f"torch refused: {why}"))
            continue
        c = out.float().cpu().numpy().astype(np.float64)
        same = float(np.mean(c == emulated.astype(np.float64)))
        runs.append(GpuRun("torch._scaled_mm", fast, True, None, out_name,
                           error_figures(c, reference_q), error_figures(c, reference),
                           error_figures(c, emulated.astype(np.float64)), same))
    return torch.cuda.get_device_name(0), torch.__version__, runs


def scaled_mm_output(a: Operand, b: Operand, spec, kind: str, fast: bool) -> np.ndarray:
    """The float32 output of one ``_scaled_mm`` (for benchmarks that compare it with
    emulations of several accumulator widths); UsageError where it cannot run."""
    torch = cuda_torch()
    m, k = a.codes.shape
    n = b.codes.shape[1]
    reason = unavailable_reason(torch, spec.name, m, n, k)
    if reason is not None:
        raise UsageError(reason)
    ta, tb, sa, sb = _operands(torch, a, b, spec, kind)
    out = torch._scaled_mm(ta, tb, scale_a=sa, scale_b=sb, out_dtype=torch.float32,
                           use_fast_accum=fast)
    return out.cpu().numpy()
