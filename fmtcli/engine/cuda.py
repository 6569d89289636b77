"""Where each scheme of ``fmt quantize`` runs: the one place that decides for the GPU.

``route`` takes the user's ``--backend``/``--device`` and a tensor, and says for every
scheme whose cast stores its values and whether the fused CUDA kernel (``cuda_kernel``)
runs it whole.  ``backends.resolve`` answers for one format (device ``auto`` is the CPU
there); only here does ``auto`` send a large tensor to a GPU:

- ``--backend torch --device cuda``: the schemes the kernel takes (``cuda_kernel.
  fast_path_applies``) run in it, the others chunk by chunk through torch on the GPU;
- ``--backend auto --device auto``: from ``AUTO_CUDA_ELEMENTS`` values of one tensor on,
  when torch sees a GPU with room for the tensor, the schemes the kernel takes go there and
  the others stay on the CPU engine;
- anything else, and every run that writes ``--out``: chunk by chunk as resolved.
"""

from __future__ import annotations

import warnings

import numpy as np

from fmtcli.base.dtypes import KERNEL_CODES
from fmtcli.base.errors import DataError, Param, shown
from fmtcli.engine.results import SchemeRun
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.backends import Backend, Device, cuda_available, gpu_present, resolve
from fmtcli.numerics.scaling import Product
from fmtcli.numerics.schemes import Scheme, for_tensor
from fmtcli.streaming.stream import view_shape

# From this many elements of one tensor on, --backend auto with --device auto runs the
# schemes the fused CUDA kernel takes on the GPU when torch and a GPU with room for it are
# there.  Below it the CPU engine wins end to end: on the H200 machine (16 cores) an 8 GiB
# .npy took 3.15 s on the CPU against 4.64 s through CUDA, most of it torch's import
# (benchmarks/RESULTS.md); the lines cross near 14 GiB there, sooner with fewer cores.
AUTO_CUDA_ELEMENTS = 1 << 32
GPU_HEADROOM = 1.1  # free GPU memory wanted per byte of the tensor: a tenth to spare
ON_GPU = (Backend.TORCH, Device.CUDA)


def route(source: TensorSource, schemes: list[Scheme], backend: Backend | str,
          device: Device | str, writes_output: bool
          ) -> tuple[list[tuple[Backend, Device]], list[bool]]:
    """For each scheme, the (backend, device) whose cast stores its values, and whether the
    fused kernel runs it whole.  What a backend cannot do (formats, rounding modes) is
    refused before torch is imported (``backends.resolve``)."""
    casts = [resolve(backend, device, s.format, s.rounding) for s in schemes]
    none = [False] * len(schemes)
    if writes_output:  # the kernel keeps no values: --out goes chunk by chunk
        return casts, none
    auto = (Backend(backend) is Backend.AUTO and Device(device) is Device.AUTO
            and source.size >= AUTO_CUDA_ELEMENTS)
    if auto:
        if not (gpu_present() and cuda_available()):  # the cheap check first
            return casts, none
        on_gpu = kernel_takes(source, schemes, [ON_GPU] * len(schemes))
        if not (any(on_gpu) and fits_on_gpu(source)):
            return casts, none
        return [ON_GPU if g else c for g, c in zip(on_gpu, casts)], on_gpu
    return casts, kernel_takes(source, schemes, casts)


def kernel_takes(source: TensorSource, schemes: list[Scheme], casts) -> list[bool]:
    """Which schemes the fused CUDA kernel takes on this tensor: torch on CUDA, blocks along
    the last axis with amax scales, float32/bfloat16/float16 data, a float32 product."""
    if source.dtype not in KERNEL_CODES or ON_GPU not in casts:
        return [False] * len(schemes)
    from fmtcli.engine.cuda_kernel import available, fast_path_applies

    if not available():
        return [False] * len(schemes)
    return [c == ON_GPU and s.product is Product.FLOAT32
            and fast_path_applies(for_tensor(s, source.key, len(view_shape(source.shape))),
                                  source.shape)
            for s, c in zip(schemes, casts)]


def fits_on_gpu(source: TensorSource) -> bool:
    """Whether the current GPU's free memory holds the tensor (float32, or a 16-bit float:
    the kernel's inputs) with ``GPU_HEADROOM`` to spare."""
    import torch

    itemsize = 4 if source.dtype == "float32" else 2
    return torch.cuda.mem_get_info()[0] > GPU_HEADROOM * source.size * itemsize


def quantize_on_gpu(source: TensorSource, schemes: list[Scheme], progress):
    """The whole tensor on the GPU, each scheme by the fused kernel (one pass each)."""
    import torch

    from fmtcli.engine.cuda_kernel import quantize_blocks_cuda

    data = np.ascontiguousarray(source.array())  # a memory map of .npy/.safetensors data
    if not data.dtype.isnative:  # a big-endian file: torch takes only native byte order
        data = data.astype(data.dtype.newbyteorder("="))
    # by name: np.dtype("bfloat16") exists only once ml_dtypes is imported, which a float32
    # run never needs (start-up imports it lazily)
    bfloat16 = data.dtype.name == "bfloat16" or source.dtype == "bfloat16"
    with warnings.catch_warnings():  # a read-only map: torch warns, but only reads it here
        warnings.simplefilter("ignore", UserWarning)
        try:  # one host-to-device copy of the stored bits, no float64 detour
            x = torch.from_numpy(data.view(np.int16) if bfloat16 else data).cuda()
        except torch.cuda.OutOfMemoryError:
            free = torch.cuda.mem_get_info()[0]
            raise DataError(f"{shown(source.name)}: {data.nbytes / 2**30:.1f} GiB does not fit "
                            f"in the GPU's free memory ({free / 2**30:.1f} GiB)",
                            "use " + Param("device", "cpu")) from None
    if bfloat16:
        x = x.view(torch.bfloat16)
    results = []
    for scheme in schemes:
        scheme = for_tensor(scheme, source.key, len(view_shape(source.shape)))
        acc, summary = quantize_blocks_cuda(x, scheme)
        results.append(SchemeRun(scheme, acc, summary))  # no per-block facts on this path
    if progress:
        progress(source.size, source.size)
    return results
