"""The private corners of torch and CUDA that the fused kernel needs, fenced in one place.

The fused quantize kernel (``cuda_kernel``) is CUDA C compiled at run time.  torch has no
public API for that, so this module uses three things that may change without notice:

- ``torch.cuda._compile_kernel(source, name, nvcc_options=...)`` -- NVRTC compilation
  (private; present from torch 2.8, whose CUDA wheels ship the NVRTC library);
- the ``.func`` attribute of what it returns -- the driver's ``CUfunction`` handle, which
  lets one launch be a single ``cuLaunchKernel`` call with arguments prepared once;
- the CUDA driver library, ``libcuda.so.1``, through ctypes -- for that launch and for
  page-locked, device-mapped host memory the kernel writes its totals into.

``unusable_reason()`` checks all three (and the version) once; when it names a reason the
fused path is off and ``fmt quantize`` takes its general path (torch casts chunk by chunk),
which is slower but gives the same statistics.  Nothing else in fmtcli touches these.
"""

from __future__ import annotations

import ctypes
import functools

MIN_TORCH = (2, 8)  # the first torch with torch.cuda._compile_kernel
NVRTC_OPTIONS = ("-fmad=false",)  # never contract a * b + c: every step is rounded on its own


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch ("2.11.0+cu128" -> (2, 11))."""
    import torch

    major, minor = (torch.__version__.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@functools.lru_cache(maxsize=1)
def unusable_reason() -> str | None:
    """Why the fused kernel cannot run here (None: it can): no torch, no CUDA device, a
    torch older than ``MIN_TORCH`` or without the private compiler, no driver library."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if torch_version() < MIN_TORCH:
        return f"torch {torch.__version__} is older than {'.'.join(map(str, MIN_TORCH))}"
    if not hasattr(torch.cuda, "_compile_kernel"):
        return f"torch {torch.__version__} has no torch.cuda._compile_kernel"
    try:
        driver()
    except OSError as error:
        return f"the CUDA driver library cannot be loaded ({error})"
    return None


def compile_source(source: str, name: str):
    """NVRTC-compile ``source`` for the current device; the kernel ``name`` in it, callable
    as ``kernel(grid=..., block=..., args=[...])`` (torch's wrapper)."""
    import torch

    return torch.cuda._compile_kernel(source, name, nvcc_options=list(NVRTC_OPTIONS))


def function_handle(kernel) -> int:
    """The driver's ``CUfunction`` of a compiled kernel, for ``launch``; AttributeError where
    this torch's wrapper does not expose it (``cuda_kernel.available`` then says no)."""
    return kernel.func


def launch(kernel, grid: int, threads: int, stream: int, args: list) -> None:
    """One ``cuLaunchKernel`` of a 1-D grid on ``stream`` with ``args`` (ctypes values)."""
    pointers = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
    check(driver().cuLaunchKernel(function_handle(kernel), grid, 1, 1, threads, 1, 1, 0,
                                  ctypes.c_void_p(stream), pointers, None))


class MappedHostBuffer:
    """Page-locked host memory of ``size`` int64 values that the device writes through a
    pointer of its own (``device_pointer``); ``host`` is a numpy view of it."""

    def __init__(self, size: int) -> None:
        import numpy as np

        lib = driver()
        host = ctypes.c_void_p()
        check(lib.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(size * 8),
                                 ctypes.c_uint(0x03)))  # CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP
        self._pointer = host
        mapped = ctypes.c_uint64()
        check(lib.cuMemHostGetDevicePointer_v2(ctypes.byref(mapped), host, ctypes.c_uint(0)))
        self.device_pointer = mapped.value
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * size).from_address(host.value))

    def __del__(self):
        try:
            driver().cuMemFreeHost(self._pointer)
        except Exception:  # interpreter shutdown: the process frees it anyway
            pass


@functools.lru_cache(maxsize=1)
def driver():
    """The CUDA driver library (already loaded by torch's CUDA runtime)."""
    return ctypes.CDLL("libcuda.so.1")


def check(rc: int) -> None:
    if rc:
        raise RuntimeError(f"CUDA driver error {rc} in fmtcli's quantize kernel")
