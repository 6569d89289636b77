"""``fmt dot``: an FP8 GEMM ``C = A @ B`` emulated with an accumulator of limited precision,
against float64.

What is computed (A is M x K, B is K x N; every error is in the units of C):

1. Quantization (the project's rule, ``scaling.amax_to_scale`` with the amax rule and a
   saturating nearest-even cast by ``rounding.round_to_format``): ``code = cast(x * scale)``
   with a float32 product, and the value the kernel multiplies is ``x_q = code / scale``,
   the division done as FP8 kernels do it: times the float32 dequantization scale
   ``d = 1 / scale`` (``torch._scaled_mm`` and DeepGEMM take ``d``).  Scales by
   ``granularity``: ``tensor`` (one for A, one for B); ``row`` (one per row of A and one per
   column of B: torch's rowwise scaling); ``block:BS`` (DeepSeek-V3 §3.3.1: A per 1 x BS
   tile along K, B per BS x BS block).
2. Products of codes are exact (an FP8 product has at most 8 significant bits; float32
   holds it exactly, float64 where the format's products need more than 24 bits).
3. Accumulation, in steps of ``group`` products (32 by default: the K of one Hopper FP8
   ``wgmma`` instruction, whose products the tensor core adds in one fused operation):

   - ``accumulator_bits = B`` (the tensor-core model): the step's products and the running
     sum are aligned to the largest exponent among them and each is cut to ``B`` fraction
     bits below that exponent's leading bit (``rounding``: toward zero, as measured on
     NVIDIA tensor cores, or nearest-even); the cut terms are added exactly, and the sum is
     normalised and cut again to ``B`` fraction bits (a carry can need it).  This is the
     model Fasi, Higham, Mikaitis and Pranesh fitted to V100/T4/A100 tensor cores
     ("Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021: alignment to the largest
     exponent, truncation, normalisation) and Khattak and Mikaitis extend to H100's FP8
     ("Accurate models of NVIDIA tensor cores", arXiv:2512.07004, 2025).  DeepSeek-V3
     (arXiv:2412.19437, §3.3.2) measured that H800 FP8 GEMMs keep "around 14 bits"; read
     as 14 significant bits, that is ``B = 13`` (the default here), which an H200's
     ``torch._scaled_mm(use_fast_accum=True)`` matches: 90% of its outputs equal this
     model's to the bit (benchmarks/RESULTS.md).  The exponent range is unbounded (FP32's
     8-bit exponent never overflows here).
   - ``accumulator_format = F``: an ordinary floating-point register in F (range included:
     FP16 can overflow to inf): each step's products are added exactly (float64) and the sum
     ``acc + products`` is rounded once to F (``rounding.round_to_format``).
4. Promotion (DeepSeek-V3 §3.3.2, DeepGEMM): with ``promote_every = NC`` the limited
   accumulator restarts every NC elements of K; each partial sum is multiplied by its
   dequantization factor ``d_a * d_b`` (float32) and added to an FP32 accumulator (float32
   arithmetic, as on CUDA cores).  Without promotion the whole K stays in the limited
   accumulator and the factor is applied once at the end (``torch._scaled_mm``'s epilogue);
   block scales change along K, so they need promotion within each block.
5. Errors of the float32 output C against R, float64 products of (a) the same quantized
   inputs -- the accumulation's own error -- and (b) the unquantized inputs -- everything:
   ``max_rel_error = max|C - R| / max|R|`` (the largest error of one output, relative to the
   largest output: element-wise ratios are dominated by outputs near 0),
   ``rel_fro_error = ||C - R||_F / ||R||_F``, and DeepGEMM's
   ``calc_diff = 1 - 2 * sum(C R) / sum(C^2 + R^2)`` (``deep_gemm`` testing utilities).

Vectorised over all M x N outputs; the only Python loop is over the K steps of ``group``.
``gemm`` holds the quantization (items 1-2) and the accumulator (3-4), ``dot_figures`` the
errors (5), ``dot_cuda`` the real GEMM; this module the options, the limits and the command
(the names of all four importable from here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fmtcli.arithmetic.dot_figures import Errors, GpuRun, error_figures
from fmtcli.arithmetic.gemm import (
    DEFAULT_BITS,
    GROUP,
    TILE_BYTES,
    Operand,
    aligned_step,
    emulate_gemm,
    exact_products,
    format_step,
    operand_groups,
    quantize_operand,
    quantize_operands,
    round_to_bits,
    tiles,
)
from fmtcli.base.choices import AccumulationRounding, Granularity
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.tiles import check_element_format, is_narrow

__all__ = ["DEFAULT_BITS", "DEFAULT_BLOCK", "GROUP", "MAX_BITS", "MAX_MEMORY", "MAX_OUTPUTS",
           "MAX_STEPS", "MAX_WORK", "TILE_BYTES", "DotResult", "DotSettings", "Errors",
           "GpuRun", "Operand", "aligned_step", "analyse_dot", "check_format", "check_size",
           "emulate_gemm", "error_figures", "exact_products", "format_step",
           "granularity_label", "is_narrow", "load_operands", "loop_steps", "memory_needed",
           "operand_groups", "parse_granularity", "quantize_operand", "quantize_operands",
           "random_operands", "round_to_bits", "tiles"]

#: Widths the aligned-sum model holds exactly in float64 (B + 1 + log2(group + 1) <= 53).
MAX_BITS = 40
#: The largest M * N * K emulated (about 30 s of numpy work on two cores).
MAX_WORK = 1 << 31
#: The largest M * N (the float64 references and the outputs are held whole).
MAX_OUTPUTS = 1 << 24
#: The memory an emulation may need (estimated before it starts, ``memory_needed``): the
#: command then fits a 4 GiB process with room for Python and numpy themselves.
MAX_MEMORY = 3 << 30
#: Steps of the Python loop (tiles x K / group): each costs ~0.1 ms of numpy overhead.
MAX_STEPS = 1 << 17
DEFAULT_BLOCK = 128


# -- results -------------------------------------------------------------------------------

@dataclass(frozen=True)
class DotSettings:
    """What was multiplied and how: shapes, format, scales, the accumulator model."""

    m: int
    n: int
    k: int
    format: str
    scale_granularity: str          # "tensor", "row" or "block:BS"
    accumulator_bits: int | None    # the tensor-core model's fraction bits, or None
    accumulator_format: str | None  # an ordinary accumulator in this format, or None
    accumulation_rounding: str
    promote_every: int | None
    group: int
    seed: int | None                # None for inputs from files
    inputs: tuple[str, ...]
    scaled: bool = True             # False: a format over 8 bits, cast with scale 1

    def to_dict(self) -> dict:
        return {"m": self.m, "n": self.n, "k": self.k, "format": self.format,
                "scale_granularity": self.scale_granularity,
                "accumulator_bits": self.accumulator_bits,
                "accumulator_format": self.accumulator_format,
                "accumulation_rounding": self.accumulation_rounding,
                "promote_every": self.promote_every, "group": self.group, "seed": self.seed,
                "inputs": list(self.inputs), "scaled": self.scaled}


@dataclass(frozen=True)
class DotResult:
    """All of ``fmt dot``: the settings; the quantization alone (exact sums of the quantized
    inputs against the unquantized product); the emulated GEMM against both references;
    and, with a GPU, the real GEMMs."""

    settings: DotSettings
    quantization: Errors
    vs_quantized: Errors
    vs_unquantized: Errors
    gpu: str | None = None
    torch_version: str | None = None
    gpu_runs: tuple[GpuRun, ...] | None = None

    def to_dict(self) -> dict:
        out = {"settings": self.settings.to_dict(),
               "quantization": self.quantization.to_dict(),
               "emulated": {"vs_quantized": self.vs_quantized.to_dict(),
                            "vs_unquantized": self.vs_unquantized.to_dict()},
               "gpu": None}
        if self.gpu_runs is not None:
            out["gpu"] = {"device": self.gpu, "torch": self.torch_version,
                          "runs": [r.to_dict() for r in self.gpu_runs]}
        return out


# -- options -------------------------------------------------------------------------------

def parse_granularity(text: str) -> tuple[str, int | None]:
    """'tensor', 'row', 'block' or 'block:BS' -> (kind, BS or None): the kinds of the one
    vocabulary (``numerics.granularity``) that a GEMM takes."""
    message = (Param("scale_granularity", text) + " is not tensor, row or block:BS "
               f"(BS a block size, e.g. block:{DEFAULT_BLOCK})")
    group = ScaleGroup.parse(text, (Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK),
                             DEFAULT_BLOCK, message=message)
    if group.axis != -1:  # a GEMM's blocks run along K
        raise UsageError(message)
    return group.kind.value, group.block


def granularity_label(kind: str, block: int | None) -> str:
    """'tensor', 'row', 'block:BS': the text ``parse_granularity`` reads."""
    return ScaleGroup(kind, block).spelling


def check_format(spec: FormatSpec) -> None:
    """A GEMM's operands need a sign and a zero: scale formats (E8M0) cannot hold them."""
    check_element_format(spec, "a GEMM")


# -- inputs --------------------------------------------------------------------------------

def random_operands(m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (m x k) and B (k x n), float64, entries N(0, 1) from ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)), rng.standard_normal((k, n))


def load_operands(paths: list[str]) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """A and B (float64, 2-D) from two files, or from one file holding two tensors (named
    a and b, else in the file's order); their names."""
    from fmtcli.inputs.pick import pick

    sources = pick(paths, purpose="to multiply", taker="fmt dot", count=2,
                   roles=({"a"}, {"b"}), how=" tensors A and B: two files, or one file "
                   "holding two, or named a and b")
    for label, source in zip("AB", sources):
        shape = tuple(source.shape)
        if len(shape) != 2 or 0 in shape:
            raise DataError(f"{label} ({shown(source.name)}) must be a nonempty matrix, got "
                            f"shape {'x'.join(map(str, shape)) or 'scalar'}")
    (m, k), (k_b, n) = sources[0].shape, sources[1].shape
    if k == k_b:  # the limits before reading: the files may be far larger than memory
        check_size(m, n, k)
    arrays = []
    for label, source in zip("AB", sources):
        x = np.asarray(source.array(), dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise DataError(f"{label} ({shown(source.name)}) holds NaN or inf")
        arrays.append(x)
    a, b = arrays
    if a.shape[1] != b.shape[0]:
        raise DataError(f"A is {a.shape[0]}x{a.shape[1]} and B {b.shape[0]}x{b.shape[1]}: "
                        "A's columns must equal B's rows (K)")
    return a, b, tuple(s.name for s in sources)


def memory_needed(m: int, n: int, k: int) -> int:
    """Bytes the emulation holds at its peak, an upper estimate: A and B in float64 with
    the copies quantization makes (~48 bytes an element), the M x N outputs, references
    and error figures (~72 bytes an output: float64 arrays, the largest transients of
    ``error_figures`` included) and one tile's products with their temporaries (5 x
    TILE_BYTES).  Measured peaks (``/usr/bin/time``) lie below it (docs/dot.md)."""
    return 48 * (m + n) * k + 72 * m * n + 5 * TILE_BYTES


def loop_steps(m: int, n: int, k: int, group: int = GROUP,
               promote_every: int | None = None) -> int:
    """Iterations of the emulation's Python loop: tiles x (K intervals x groups in each)."""
    rows, cols = tiles(m, n, group)
    interval = k if promote_every is None else min(promote_every, k)
    per_tile = -(-k // interval) * -(-interval // group)
    return -(-m // rows) * -(-n // cols) * per_tile


def check_size(m: int, n: int, k: int, group: int = GROUP,
               promote_every: int | None = None) -> None:
    """Refuse products the CPU emulation cannot finish in reasonable time or memory, with
    the estimate and the limit, before any work."""
    if m * n > MAX_OUTPUTS:
        raise UsageError(f"M x N = {m * n:,} outputs is beyond the emulation's "
                         f"{MAX_OUTPUTS:,}")
    if m * n * k > MAX_WORK:
        raise UsageError(f"M x N x K = {m * n * k:,} is beyond the emulation's {MAX_WORK:,} "
                         "(about 30 s of work)")
    memory = memory_needed(m, n, k)
    if memory > MAX_MEMORY:
        raise UsageError(f"M = {m:,}, N = {n:,}, K = {k:,} would need ~{memory / 2**30:.1f} "
                         f"GiB (at most {MAX_MEMORY / 2**30:.0f} GiB: A and B hold "
                         f"(M + N) x K = {(m + n) * k:,} values)")
    steps = loop_steps(m, n, k, group, promote_every)
    if steps > MAX_STEPS:
        raise UsageError(f"M = {m:,}, N = {n:,}, K = {k:,} would take {steps:,} steps of "
                         f"{group} products (at most {MAX_STEPS:,}, ~0.1 ms each)"
                         + ("" if promote_every is None else
                            ": promote less often than " + Param("promote_every", promote_every)))


def _accumulator_bits(accumulator_bits: int | None, accumulator: FormatSpec | None
                      ) -> int | None:
    """The tensor-core model's fraction bits (default 13), or None for an ordinary
    ``accumulator`` format; refused: both given, bits outside 1..MAX_BITS, a scale format."""
    if accumulator_bits is not None and accumulator is not None:
        raise UsageError("accumulator_bits and accumulator are alternatives: give one")
    if accumulator is None:
        bits = DEFAULT_BITS if accumulator_bits is None else accumulator_bits
        if not 1 <= bits <= MAX_BITS:
            raise UsageError(Param("accumulator_bits", bits) + f" is outside 1..{MAX_BITS}")
        return bits
    if not accumulator.signed or not accumulator.has_zero:
        raise UsageError(Param("accumulator", accumulator.name, repr) + " is a scale format: "
                         "an accumulator needs a sign and a zero")
    return None


# -- the whole command ---------------------------------------------------------------------

def analyse_dot(spec: FormatSpec, *, m: int = 256, n: int = 256, k: int = 4096,
                operands: tuple[np.ndarray, np.ndarray] | None = None,
                inputs: tuple[str, ...] = (), granularity: str = "tensor",
                accumulator_bits: int | None = None, accumulator: FormatSpec | None = None,
                rounding: AccumulationRounding | str = AccumulationRounding.TOWARD_ZERO,
                promote_every: int | None = None, group: int = GROUP, seed: int = 0,
                device: str = "cpu") -> DotResult:
    """``fmt dot``: A and B (``operands``, else random N(0, 1) of m x k and k x n from
    ``seed``) quantized to ``spec`` with ``granularity`` scales, multiplied with the limited
    accumulator (``accumulator_bits`` fraction bits, default 13, or an ordinary
    ``accumulator`` format), against float64; ``device='cuda'``: also torch._scaled_mm."""
    check_format(spec)
    rounding = AccumulationRounding(rounding)
    kind, block = parse_granularity(granularity)
    bits = _accumulator_bits(accumulator_bits, accumulator)
    if promote_every is not None and promote_every < 1:
        raise UsageError(Param("promote_every", promote_every) + " must be at least 1")
    if group < 1:
        raise UsageError(Param("group", group) + " must be at least 1")
    if device not in ("cpu", "cuda"):
        raise UsageError(Param("device", device, repr) + " is cpu or cuda")
    if operands is None:
        for name, value in (("m", m), ("n", n), ("k", k)):
            if value < 1:
                raise UsageError(Param(name, value) + " must be at least 1")
        check_size(m, n, k, group, promote_every)
        a, b = random_operands(m, n, k, seed)
    else:
        a, b = operands
        m, k = a.shape
        n = b.shape[1]
        check_size(m, n, k, group, promote_every)
        seed = None
    if device == "cuda":  # before minutes of emulation: is there a GPU at all?
        from fmtcli.arithmetic.dot_cuda import cuda_torch

        cuda_torch()
    qa, qb = quantize_operands(a, b, spec, kind, block)
    reference_q = exact_products(qa, qb)
    reference = a @ b
    c = emulate_gemm(qa, qb, kind, block, bits=bits, accumulator=accumulator,
                     rounding=rounding, promote_every=promote_every, group=group)
    settings = DotSettings(m, n, k, spec.name, granularity_label(kind, block),
                           bits, None if accumulator is None else accumulator.name,
                           rounding.value, promote_every, group, seed, tuple(inputs),
                           is_narrow(spec))
    result = dict(settings=settings, quantization=error_figures(reference_q, reference),
                  vs_quantized=error_figures(c, reference_q),
                  vs_unquantized=error_figures(c, reference))
    if device == "cuda":
        from fmtcli.arithmetic.dot_cuda import run_scaled_mm

        gpu, version, runs = run_scaled_mm(qa, qb, spec, kind, reference_q, reference, c)
        result.update(gpu=gpu, torch_version=version, gpu_runs=tuple(runs))
    return DotResult(**result)

