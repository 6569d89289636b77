"""Cast backends: fmtcli's own numpy engine, ml_dtypes, and torch's dtypes on CPU or CUDA.

``cast(x, spec, backend, device)`` stores every element of x in the format and returns the
values (as float32 for float32 input, float64 for float64), so results of different
backends compare element by element.  torch is imported only when asked for: it stays an
optional extra (``pip install 'fmtcli[torch]'``).

- ``numpy``: ``rounding.round_to_format`` (nearest-even, IEEE overflow: the reference).
- ``ml_dtypes``: ``x.astype(ml_dtypes.<name>)``; float64 input is rounded through float32
  there (double rounding), which the engine avoids.
- ``torch``: ``torch.from_numpy(x).to(device).to(torch.<name>)``, exactly what a training
  job's eager cast does, including the installed version's overflow behaviour.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from fmtcli.base.choices import Backend, Device
from fmtcli.base.dtypes import TORCH_NAMES
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import OverflowPolicy, RoundingMode, round_to_format


def torch_module():
    """The torch module, or a usage error that names the install command."""
    try:
        import torch
    except ImportError:
        raise UsageError("the torch backend needs torch",
                         "pip install 'fmtcli[torch]' (or pip install torch)") from None
    return torch


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def gpu_present() -> bool:
    """Whether torch is installed and an NVIDIA device node exists: cheap (no torch import),
    the first step of deciding whether a GPU is worth starting."""
    return (importlib.util.find_spec("torch") is not None
            and any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0")))


def torch_dtype(spec: FormatSpec):
    """torch's dtype for the format, or None where torch has no eager cast to it."""
    if spec.name not in TORCH_NAMES:
        return None
    return getattr(torch_module(), spec.name, None)


def supports(backend: Backend, spec: FormatSpec, device: Device = Device.CPU) -> bool:
    """Whether the backend can cast to this format on this device."""
    if backend is Backend.NUMPY:
        return device is Device.CPU
    if backend is Backend.ML_DTYPES:
        return device is Device.CPU and spec.ml_dtype is not None
    if backend is Backend.TORCH:
        try:
            dtype = torch_dtype(spec)
        except UsageError:
            return False
        return dtype is not None and (device is Device.CPU or cuda_available())
    return False


def resolve(backend: Backend | str, device: Device | str, spec: FormatSpec,
            rounding: RoundingMode | str | None = None) -> tuple[Backend, Device]:
    """The backend and device to use for one format.  ``auto`` is the engine, the fastest
    on the CPU (benchmarks/RESULTS.md), or torch with ``--device cuda``; device ``auto`` is
    the CPU for one format (``quantize.cuda.route``, the one GPU decision, sends a large
    tensor to the GPU where the fused kernel takes its scheme).  Never imports torch for
    ``auto``.

    What a backend cannot do is refused before torch is imported (seconds): a rounding mode
    other than nearest-even (``rounding``, when given) on ml_dtypes or torch, and a format
    outside ``TORCH_NAMES`` on torch (no FP4/FP6/custom casts)."""
    backend, device = Backend(backend), Device(device)
    if backend is Backend.AUTO:
        if device is Device.CUDA:
            return resolve(Backend.TORCH, device, spec, rounding)
        return Backend.NUMPY, Device.CPU
    if device is Device.AUTO:
        device = Device.CPU
    if (rounding is not None and backend is not Backend.NUMPY
            and RoundingMode(rounding) is not RoundingMode.NEAREST_EVEN):
        raise UsageError(f"the {backend.value} backend rounds to nearest-even only",
                         "use " + Param("backend", "numpy") + " for other rounding modes")
    if backend is Backend.TORCH:
        if spec.name not in TORCH_NAMES:
            raise UsageError(f"torch has no eager cast to {spec.name}",
                             "use " + Param("backend", "numpy") + " or 'ml_dtypes'")
        torch = torch_module()
        if device is Device.CUDA and not torch.cuda.is_available():
            raise UsageError(Param("device", "cuda") + ": torch sees no CUDA device")
        if torch_dtype(spec) is None:
            raise UsageError(f"torch {torch.__version__} has no eager cast to {spec.name}",
                             "use " + Param("backend", "numpy") + " or 'ml_dtypes'")
        return backend, device
    if device is Device.CUDA:
        raise UsageError(Param("device", "cuda") + " needs " + Param("backend", "torch")
                         + f" (not {backend.value})")
    if backend is Backend.ML_DTYPES and spec.ml_dtype is None:
        raise UsageError(f"ml_dtypes has no {spec.name}", "use " + Param("backend", "numpy"))
    return backend, device


def cast(x: np.ndarray, spec: FormatSpec, backend: Backend | str = Backend.NUMPY,
         device: Device | str = Device.CPU) -> np.ndarray:
    """The values the backend stores for x (nearest-even; overflow as the backend does).

    The raw cast, as ``check-backends`` reports it; ``cast_with_policy`` adds the clamp that
    a saturating recipe applies first."""
    backend, device = resolve(backend, device, spec)
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    if backend is Backend.NUMPY:
        return round_to_format(x, spec)
    if backend is Backend.ML_DTYPES:
        with np.errstate(all="ignore"):
            return x.astype(spec.ml_dtype).astype(x.dtype)
    torch = torch_module()
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device.value)
    return t.to(torch_dtype(spec)).to(t.dtype).cpu().numpy()


def cast_with_policy(x: np.ndarray, spec: FormatSpec, backend: Backend | str,
                     device: Device | str, overflow: OverflowPolicy | str) -> np.ndarray:
    """``cast`` under an overflow policy.  ``saturate``: |x| is clamped to max first, as real
    recipes clamp before their cast (torchao's ``to_fp8_saturated``, Transformer Engine), so
    no backend turns a value past max into NaN or inf (NaN input stays NaN; inf becomes
    +-max).  ``ieee``: the backend's own behaviour, unchanged.  The numpy engine applies the
    policy itself (``rounding.apply_range``)."""
    backend = Backend(backend)
    if backend is Backend.NUMPY:
        x = working_input(x)
        return round_to_format(x, spec, overflow=overflow)
    if OverflowPolicy(overflow) is OverflowPolicy.SATURATE:
        x = np.clip(working_input(x), -spec.max, spec.max)
    return cast(x, spec, backend, device)


def working_input(x) -> np.ndarray:
    """x as float32 or float64 (other dtypes become float32), as ``cast`` takes it."""
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def available_backends(spec: FormatSpec) -> list[tuple[Backend, Device]]:
    """Every (backend, device) that can cast to ``spec`` here."""
    out = [(b, Device.CPU) for b in (Backend.NUMPY, Backend.ML_DTYPES, Backend.TORCH)
           if supports(b, spec, Device.CPU)]
    if supports(Backend.TORCH, spec, Device.CUDA):
        out.append((Backend.TORCH, Device.CUDA))
    return out
