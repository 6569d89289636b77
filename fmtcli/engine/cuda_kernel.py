"""The CUDA fast path of ``fmt quantize``: one fused kernel, one pass over the tensor.

For blocks of B elements along the last axis (B a power of two up to 1024) with amax
scales, nearest-even rounding and saturation, the kernel reads each element once and does
everything the CPU engine does with it:

- the block's amax (an integer max of the magnitudes' bits, so NaN > inf > finite) across
  the lanes that share the block;
- its scale, ``max / amax`` as one correctly rounded float32 division, clamped as the
  engine clamps it (``scaling``);
- the scaled cast ``r = cast(x * scale)``: the hardware's nearest-even, saturating FP8
  conversion (``cvt.rn.satfinite.e4m3x2.f32`` / ``e5m2x2``) for E4M3 and E5M2, otherwise the
  engine's magic-number addition (``rounding.round_float32_nearest_even``);
- ``x_q = r / scale``, correctly rounded, and every statistic of ``metrics.ErrorAccumulator``.

Median and p99 come from the same histogram as on the CPU: the top 16 bits of the float32
relative error ``|x_q - x| / |x|``.  Every block of threads keeps the bins where nonzero
relative errors fall (2**-32 up to 1, 4096 bins, 16 KiB of shared memory) plus slots for
zero inputs, flushed values (relative error exactly 1) and exact results; every element
adds 1 to one of them.  The relative error is taken with the fast reciprocal (1 ulp) and
redone in float64 (difference and quotient, truncated to float32) when it lands within 8 ulp
of a bin edge, as the CPU engine does, so every element lands in the bin the CPU gives it:
the histogram, and so the quantiles, equal the CPU engine's exactly.  The block's totals go
to the device with one atomic each; the last block to finish copies them into page-locked,
device-mapped host memory and zeroes them for the next launch, so a call is one launch and
one wait.

Blocks with inf or NaN, extreme magnitudes (outside 2**-60..2**60) or values scaled past
the rounding threshold take a careful path: IEEE divisions, float64 sums, every count.

The kernel is CUDA C (``quantize_stats.cu``, this module prepends its #defines), compiled at
first use with NVRTC and launched through the driver: private torch API fenced in
``torch_cuda``.  Where that is missing, ``available()`` says so and quantize takes its general
path.  torch is imported only when this path runs.  ``Tuning`` sets the launch shape and may
carry another kernel source (``benchmarks/tune_gpu.py`` times variants that way).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from dataclasses import dataclass
from importlib import resources

import numpy as np

from fmtcli.base.dtypes import KERNEL_CODES
from fmtcli.engine import torch_cuda
from fmtcli.engine.scales import ScaleSummary
from fmtcli.numerics.rounding import (
    OverflowPolicy,
    RoundingMode,
    beyond_threshold,
    magic_rounding_applies,
)
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import Granularity, ScaleFormat, Scheme
from fmtcli.streaming.metrics import FINITE_BINS, HIST_BINS, ONE_BIN, ErrorAccumulator
from fmtcli.streaming.stream import matrix_shape

THREADS = 256  # threads per block of the launch
WINDOW_LOW = 0x3000  # first histogram bin kept in shared memory: relative error 2**-32
WINDOW = 4096  # bins kept in shared memory (up to relative error 1.0, metrics.ONE_BIN)


@dataclass(frozen=True)
class Tuning:
    """How the kernel is built and launched; the default is what ships (measured on an H200:
    benchmarks/tune_gpu_h200.txt).  ``source``: another kernel body in place of
    ``quantize_stats.cu`` (same #defines, same arguments), for timing variants."""

    elements: int = 16  # elements per thread (at least; blocks over 256 elements: block / 32)
    min_blocks: int = 2  # blocks of threads each multiprocessor must hold at once (registers)
    blocks_per_sm: int = 4  # blocks of threads launched per multiprocessor
    source: str | None = None


SHIPPED = Tuning()


@functools.lru_cache(maxsize=1)
def shipped_source() -> str:
    """The kernel body as shipped: ``quantize_stats.cu`` beside this module."""
    return resources.files(__package__).joinpath("quantize_stats.cu").read_text()

HARDWARE_CASTS = {"float8_e4m3fn": 1, "float8_e5m2": 2}
# The layout of the kernel's running totals on the device and of the copy its last block
# leaves in host memory, int64: HEAD slots (COUNTERS, then DONE, the count of finished
# blocks), the window's bins, then the whole histogram (only for relative errors outside
# the window, which float32 data cannot produce: kept as a guard)
HEAD = 17
COUNTERS = ("zeros", "flushed_or_zero", "exact_or_zero", "nonfinite", "nan", "beyond", "pairs",
            "nan_scales", "max_err_bits", "scale_max_bits", "scale_min_inverted_bits",
            "sum_err", "sum_err2", "sum_x2", "outside", "above")  # above: |x * scale| > max



def fast_path_applies(scheme: Scheme, shape: tuple[int, ...]) -> bool:
    """Whether the fused kernel handles this scheme and tensor: it blocks the flat data, so
    the rows of the tensor's matrix view (``stream.matrix_shape``) must hold whole blocks
    (a row of 200 under blocks of 128 ends in a block of 72 on the CPU)."""
    spec = scheme.format
    block = scheme.block
    cols = matrix_shape(shape)[1]
    return (scheme.granularity is Granularity.BLOCK and scheme.axis == -1
            and scheme.scale_rule is ScaleRule.AMAX and scheme.scale_format is ScaleFormat.FLOAT32
            and scheme.rounding is RoundingMode.NEAREST_EVEN
            and scheme.overflow is OverflowPolicy.SATURATE
            and magic_rounding_applies(spec) and spec.has_zero and spec.signed
            and 1 <= block <= 1024 and block & (block - 1) == 0
            and cols % block == 0 and cols % layout(block)[0] == 0)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the fused kernel can run here: a CUDA device, a torch that compiles and
    launches it (``torch_cuda.unusable_reason``), and the kernel compiling and exposing its
    driver handle.  Tried once per process."""
    if torch_cuda.unusable_reason() is not None:
        return False
    try:
        torch_cuda.function_handle(_compiled(128, 0, 0, SHIPPED))
        return True
    except Exception:  # no NVRTC library, an unsupported device, an API change
        return False


@functools.lru_cache(maxsize=8)
def hardware_cast_supported(device_index: int) -> bool:
    """FP8 conversion instructions (``cvt ... e4m3x2``) need compute capability 8.9+."""
    import torch

    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def layout(block: int, tuning: Tuning = SHIPPED) -> tuple[int, int, int]:
    """(V, L, G): elements per thread, lanes sharing one block, blocks per thread."""
    v = max(tuning.elements, block // 32)
    if block >= v:
        return v, block // v, 1
    return v, 1, v // block


def kernel_source(block: int, dtype: int, cast: int, tuning: Tuning = SHIPPED) -> str:
    """The CUDA C source for blocks of ``block`` elements, input code ``dtype``
    (``dtypes.KERNEL_CODES``) and cast ``cast`` (``HARDWARE_CASTS`` code, 0 for the
    magic-number rounding)."""
    v, lanes, groups = layout(block, tuning)
    return (f"#define V {v}\n#define L {lanes}\n#define G {groups}\n#define DTYPE {dtype}\n"
            f"#define CAST {cast}\n#define THREADS {THREADS}\n"
            f"#define MIN_BLOCKS {tuning.min_blocks}\n"
            f"#define WINDOW_LOW {WINDOW_LOW}u\n#define WINDOW {WINDOW}u\n"
            f"#define HEAD {HEAD}\n#define OUTSIDE {COUNTERS.index('outside')}\n"
            f"#define DONE {HEAD - 1}\n") + (tuning.source or shipped_source())


def compile_kernel(source: str, name: str):
    """NVRTC-compile ``source`` for the current device, without contracting a * b + c into
    fused multiply-adds where the source does not ask for them (the engine's rounding
    depends on each step being rounded)."""
    return torch_cuda.compile_source(source, name)


def quantize_blocks_cuda(x, scheme: Scheme, *, hardware_cast: bool = True,
                         tuning: Tuning = SHIPPED) -> tuple[ErrorAccumulator, ScaleSummary]:
    """Statistics of ``scheme`` (see ``fast_path_applies``) on a CUDA tensor of float32,
    bfloat16 or float16, and a summary of its scales (count, min, max, NaN; distinct values
    are not counted here).  One kernel launch; the kernel writes its totals straight into
    page-locked host memory, so the host only waits for it."""
    import torch

    x = x.contiguous().reshape(-1)
    buffers = launch(x, scheme, hardware_cast=hardware_cast, tuning=tuning)
    hist = np.zeros(HIST_BINS, np.int64)  # while the kernel runs
    torch.cuda.current_stream(x.device).synchronize()
    # (read in place: _unpack keeps no reference to the buffer, which the next launch reuses)
    head = buffers.host[:HEAD + WINDOW] if x.numel() else np.zeros(HEAD + WINDOW, np.int64)
    if head[COUNTERS.index("outside")]:
        hist += buffers.host[HEAD + WINDOW:]
    return _unpack(head, hist, x.numel(), scheme.block)


def launch(x, scheme: Scheme, *, hardware_cast: bool = True,
           tuning: Tuning = SHIPPED) -> _Buffers:
    """Start the kernel on the flat contiguous CUDA tensor ``x``; the buffers its totals
    will be in once the current stream gets there."""
    import torch

    spec = scheme.format
    block = scheme.block
    dtype = KERNEL_CODES[str(x.dtype).removeprefix("torch.")]
    v, _, _ = layout(block, tuning)
    if x.numel() % block or x.numel() % v:
        raise ValueError(f"the tensor must hold whole blocks and whole runs of {v} elements "
                         "(fast_path_applies)")
    n_chunks = x.numel() // v
    if n_chunks >= 2**31:
        raise ValueError("tensor too large for one launch")
    device = x.device.index or 0
    cast = (HARDWARE_CASTS.get(spec.name, 0)
            if hardware_cast and hardware_cast_supported(device) else 0)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    buffers = _buffers(device, stream)
    if n_chunks:
        key = (spec.name, block, dtype, cast, device, tuning)
        prepared = _PREPARED.get(key)
        if prepared is None:
            prepared = _PREPARED[key] = _Prepared(spec, block, dtype, cast, device, tuning)
        try:
            prepared(x, n_chunks, buffers, stream)
        except Exception:
            _buffers.cache_clear()  # a failed launch may leave them dirty
            raise
    return buffers


class _Buffers:
    """The kernel's running totals on the device (zero between launches: the kernel's
    last block zeroes them) and the page-locked, device-mapped host memory it copies them
    to; one pair per device and stream."""

    SIZE = HEAD + WINDOW + HIST_BINS

    def __init__(self, device_index: int):
        import torch

        self.totals = torch.zeros(self.SIZE, dtype=torch.int64, device=f"cuda:{device_index}")
        self.mapped = torch_cuda.MappedHostBuffer(self.SIZE)
        self.device_pointer = self.mapped.device_pointer
        self.host = self.mapped.host


@functools.lru_cache(maxsize=8)
def _buffers(device_index: int, stream: int) -> _Buffers:
    return _Buffers(device_index)


@functools.lru_cache(maxsize=32)
def _compiled(block: int, dtype: int, cast: int, tuning: Tuning):
    return compile_kernel(kernel_source(block, dtype, cast, tuning), "fmt_quantize_stats")


class _Prepared:
    """A compiled kernel with its scalar arguments and grid made once per format, block
    size, dtype, device and tuning: a launch is then one driver call."""

    def __init__(self, spec, block: int, dtype: int, cast: int, device_index: int,
                 tuning: Tuning):
        import torch

        self.kernel = _compiled(block, dtype, cast, tuning)
        m = spec.mantissa_bits
        lo, hi = clean_scales(spec)
        self.scalars = [ctypes.c_double(spec.max), ctypes.c_double(beyond_threshold(spec)),
                        ctypes.c_double(lo), ctypes.c_double(hi),
                        ctypes.c_int(int(np.float32(spec.smallest_normal).view(np.int32))),
                        ctypes.c_int(int(np.float32(2.0 ** (spec.max_exponent + 1))
                                         .view(np.int32))),
                        ctypes.c_int((23 - m) << 23)]
        sms = torch.cuda.get_device_properties(device_index).multi_processor_count
        self.grid = sms * tuning.blocks_per_sm

    def __call__(self, x, n_chunks: int, buffers: _Buffers, stream: int) -> None:
        grid = max(1, min(self.grid, -(-n_chunks // THREADS)))
        torch_cuda.launch(self.kernel, grid, THREADS, stream,
                          [ctypes.c_void_p(x.data_ptr()), ctypes.c_int(n_chunks),
                           ctypes.c_void_p(buffers.totals.data_ptr()),
                           ctypes.c_void_p(buffers.device_pointer), *self.scalars])


_PREPARED: dict[tuple, _Prepared] = {}  # by format name, block, dtype, cast, device, tuning


def clean_scales(spec) -> tuple[float, float]:
    """The scales for which the kernel dequantizes with a reciprocal taken once per block.

    NVIDIA's IEEE division (``__fdiv_rn``) refines a reciprocal of the divisor, multiplies,
    and corrects with two fused multiply-adds, after a range check (``FCHK``) that sends
    extreme operands to a slow path.  For ``r / scale`` with r on the format's grid, scale,
    every nonzero quotient and r itself within [2**-100, 2**100] keep clear of that range,
    so the kernel runs the same sequence with the reciprocal hoisted out of the block:
    the same results (tests/engine/test_gpu.py compares them on every value of several formats).
    """
    low = max(2.0 ** -100, spec.max * 2.0 ** -100)
    high = min(2.0 ** 100, spec.smallest_subnormal * 2.0 ** 100)
    if spec.smallest_subnormal < 2.0 ** -100 or spec.max > 2.0 ** 100 or low > high:
        return 1.0, 0.0  # never
    return float(np.float32(low)), float(np.float32(high))


def _unpack(head: np.ndarray, hist: np.ndarray, count: int, block: int
            ) -> tuple[ErrorAccumulator, ScaleSummary]:
    """The accumulator and scale summary from the kernel's totals and window of bins;
    ``hist`` holds the bins outside the window (zeros where no relative error fell there)
    and becomes the accumulator's histogram.  (Plain Python on one list: this runs after
    the wait, on every call.)"""
    (zeros, flushed_or_zero, exact_or_zero, nonfinite, nan, beyond, pairs, nan_scales,  # COUNTERS
     max_err, high, inverted_low, _, _, _, outside, above) = head[:len(COUNTERS)].tolist()
    sum_err, sum_err2, sum_x2 = struct.unpack("<3d", head[_SUMS].tobytes())
    window = head[HEAD:HEAD + WINDOW]
    binned = int(hist[:FINITE_BINS].sum()) if outside else 0
    hist[WINDOW_LOW:WINDOW_LOW + WINDOW] += window
    flushed = flushed_or_zero - zeros
    exact = exact_or_zero - zeros  # exact results of nonzero inputs
    nonzero = count - zeros - nonfinite
    hist[0] += exact
    hist[ONE_BIN] += flushed  # relative error exactly 1
    # population elements whose relative error is inf or NaN (x_q inf/NaN) rank last, past
    # the finite bins, as on the CPU
    hist[FINITE_BINS] += nonzero - binned - int(window.sum()) - exact - flushed
    # finite inputs whose result is inf or NaN (a block holding NaN has a NaN scale): an
    # unbounded error, as metrics counts it
    acc = ErrorAccumulator(count=count, nonzero=nonzero, zeros=zeros,
                           nonfinite_inputs=nonfinite, flushed=flushed, saturated=beyond,
                           above_max=above,
                           nan_produced=nan, unbounded=count - nonfinite - pairs,
                           finite_pairs=pairs, sum_err=sum_err,
                           sum_err2=sum_err2, sum_x2=sum_x2, max_abs_err=_float(max_err),
                           hist=hist)
    n_blocks = count // block
    summary = ScaleSummary(count=n_blocks, nan=nan_scales, counted=False)
    if n_blocks > nan_scales:
        summary.high = _float(high)
        summary.low = _float(~inverted_low & 0xFFFFFFFF)
    return acc, summary


_SUMS = slice(COUNTERS.index("sum_err"), COUNTERS.index("sum_x2") + 1)


def _float(bits: int) -> float:
    """The float32 with these bits."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]
