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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.base.choices import AccumulationRounding, OverflowPolicy, RoundingMode
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import round_to_format
from fmtcli.numerics.scaling import amax_to_scale

#: Products added in one fused step: the K of one Hopper FP8 wgmma (m64nNk32).
GROUP = 32
#: The default accumulator: 13 fraction bits (14 significant), DeepSeek-V3's "around 14 bits".
DEFAULT_BITS = 13
#: Widths the aligned-sum model holds exactly in float64 (B + 1 + log2(group + 1) <= 53).
MAX_BITS = 40
#: The largest M * N * K emulated (about 30 s of numpy work on two cores).
MAX_WORK = 1 << 31
#: The largest M * N (the float64 references and the outputs are held whole).
MAX_OUTPUTS = 1 << 24
#: The memory an emulation may need (estimated before it starts, ``memory_needed``): the
#: command then fits a 4 GiB process with room for Python and numpy themselves.
MAX_MEMORY = 3 << 30
#: Bytes of one tile's products (M_t x group x N_t): the emulation runs tile by tile.
TILE_BYTES = 32 << 20
#: Steps of the Python loop (tiles x K / group): each costs ~0.1 ms of numpy overhead.
MAX_STEPS = 1 << 17
DEFAULT_BLOCK = 128


# -- results -------------------------------------------------------------------------------

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


# -- errors --------------------------------------------------------------------------------

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


# -- options -------------------------------------------------------------------------------

def parse_granularity(text: str) -> tuple[str, int | None]:
    """'tensor', 'row', 'block' or 'block:BS' -> (kind, BS or None)."""
    value = text.strip().lower()
    if value in ("tensor", "row"):
        return value, None
    if value == "block":
        return "block", DEFAULT_BLOCK
    if value.startswith("block:"):
        size = value[6:]
        if size.isdigit() and 0 < int(size) <= 1 << 20:
            return "block", int(size)
    raise UsageError(Param("scale_granularity", text) + " is not tensor, row or block:BS "
                     f"(BS a block size, e.g. block:{DEFAULT_BLOCK})")


def granularity_label(kind: str, block: int | None) -> str:
    return f"block:{block}" if kind == "block" else kind


def check_format(spec: FormatSpec) -> None:
    """A GEMM's operands need a sign and a zero: scale formats (E8M0) cannot hold them."""
    if not spec.signed or not spec.has_zero:
        raise UsageError(Param("format", spec.name, repr) + " is a scale format (no sign or no "
                         "zero): a GEMM needs a signed element format")


# -- inputs --------------------------------------------------------------------------------

def random_operands(m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (m x k) and B (k x n), float64, entries N(0, 1) from ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)), rng.standard_normal((k, n))


def load_operands(paths: list[str]) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """A and B (float64, 2-D) from two files, or from one file holding two tensors (named
    a and b, else in the file's order); their names."""
    from fmtcli.inputs.tensors import load_inputs

    sources = [s for s in load_inputs(paths) if s.skipped is None]
    if len(paths) == 1:  # tensors named a and b are A and B, whatever else the file holds
        named = [[s for s in sources if (s.key or "").lower().rsplit(".", 1)[-1] == w]
                 for w in ("a", "b")]
        if all(len(h) == 1 for h in named) and named[0][0] is not named[1][0]:
            sources = [named[0][0], named[1][0]]
    if len(sources) != 2:
        raise DataError(f"dot takes two tensors A and B (two files, or one file holding two, "
                        f"or named a and b); {', '.join(shown(p) for p in paths[:5])} "
                        f"{'holds' if len(paths) == 1 else 'hold'} {len(sources)} usable")
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


def tiles(m: int, n: int, group: int, itemsize: int = 8) -> tuple[int, int]:
    """Rows and columns of the output tiles: one tile's products (rows x group x cols) fill
    at most TILE_BYTES (whole rows where they fit)."""
    per_column = group * itemsize
    cols = min(n, max(1, TILE_BYTES // per_column))
    rows = min(m, max(1, TILE_BYTES // (per_column * cols)))
    return rows, cols


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


# -- quantization --------------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """One quantized operand: its codes (float32 values of the format), its float32
    dequantization scales ``d = 1 / scale`` in their own grid, and ``x_q = code * d``."""

    codes: np.ndarray
    dequant: np.ndarray
    values: np.ndarray  # float64, code * d (exact)


def _expand(scales: np.ndarray, rows: int, cols: int, shape: tuple[int, int]) -> np.ndarray:
    """A grid of per-tile values repeated over tiles of rows x cols, cut to ``shape``."""
    return np.repeat(np.repeat(scales, rows, axis=0), cols, axis=1)[:shape[0], :shape[1]]


def _tile_amax(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """max |x| of each rows x cols tile (the last tiles may be short)."""
    r, c = x.shape
    pr, pc = -r % rows, -c % cols
    padded = np.pad(np.abs(x), ((0, pr), (0, pc)))
    return padded.reshape((r + pr) // rows, rows, (c + pc) // cols, cols).max(axis=(1, 3))


def is_narrow(spec: FormatSpec) -> bool:
    """Formats of 8 bits or fewer are scaled into range, as FP8 GEMMs do; wider ones (FP16,
    BF16, FP32) are cast as they are (scale 1): scaling them to their max would only
    overflow the products."""
    return spec.bits <= 8


def quantize_operand(x: np.ndarray, spec: FormatSpec, rows: int, cols: int) -> Operand:
    """``x`` scaled per tile of rows x cols (the whole matrix for a tensor scale), cast to
    ``spec`` (float32 product, saturating nearest-even), with its dequantization scales;
    a wide format (``is_narrow`` false) is cast with scale 1."""
    x32 = np.asarray(x, dtype=np.float32)
    rows, cols = min(rows, x.shape[0]), min(cols, x.shape[1])  # a tile beyond x: all of x
    amax = _tile_amax(x32, rows, cols)
    if is_narrow(spec):
        scale = amax_to_scale(amax, spec).astype(np.float32)
    else:
        scale = np.ones(amax.shape, dtype=np.float32)
    dequant = (np.float32(1.0) / scale).astype(np.float32)
    full = _expand(scale, rows, cols, x.shape)
    codes = round_to_format(x32 * full, spec, RoundingMode.NEAREST_EVEN, OverflowPolicy.SATURATE)
    # products of codes must be exact: float32 holds 24 significant bits, 2 x 12 at most
    exact32 = codes.dtype != np.float64 and spec.mantissa_bits <= 11
    codes = np.asarray(codes, dtype=np.float32 if exact32 else np.float64)
    values = codes.astype(np.float64) * _expand(dequant, rows, cols, x.shape).astype(np.float64)
    return Operand(codes, dequant, values)


def quantize_operands(a: np.ndarray, b: np.ndarray, spec: FormatSpec, kind: str,
                      block: int | None) -> tuple[Operand, Operand]:
    """A and B quantized with the tiles of ``kind`` (module docstring, item 1)."""
    (m, k), n = a.shape, b.shape[1]
    if kind == "tensor":
        return quantize_operand(a, spec, m, k), quantize_operand(b, spec, k, n)
    if kind == "row":
        return quantize_operand(a, spec, 1, k), quantize_operand(b, spec, k, 1)
    return quantize_operand(a, spec, 1, block), quantize_operand(b, spec, block, block)


# -- the accumulator -----------------------------------------------------------------------

def _cut(x: np.ndarray, rounding: AccumulationRounding) -> np.ndarray:
    """To an integer: toward zero, or to nearest with ties to even."""
    return np.trunc(x) if rounding is AccumulationRounding.TOWARD_ZERO else np.rint(x)


def round_to_bits(x: np.ndarray, bits: int, rounding: AccumulationRounding) -> np.ndarray:
    """``x`` (float64) to a float of ``bits`` fraction bits (bits + 1 significant), with an
    unbounded exponent."""
    _, e = np.frexp(x)  # x = f * 2**e, 0.5 <= |f| < 1: the leading bit is worth 2**(e - 1)
    inverse = np.ldexp(1.0, bits + 1 - e)
    return _cut(x * inverse, rounding) / inverse


def aligned_step(acc: np.ndarray, products: np.ndarray, bits: int,
                 rounding: AccumulationRounding) -> np.ndarray:
    """One fused step of the tensor-core model: ``acc`` (M x N, float64) plus
    ``products`` (M x g x N): every term aligned to the largest exponent among them and cut
    to ``bits`` fraction bits below its leading bit, the cut terms added exactly, the sum cut
    to ``bits`` fraction bits again (module docstring, item 3)."""
    top = np.maximum(np.abs(acc), np.abs(products).max(axis=1))
    _, e = np.frexp(top)
    inverse = np.ldexp(1.0, bits + 1 - e)  # one unit of the aligned grid is 1 / inverse
    if products.dtype == np.float32 and bits <= 22:  # exact in float32: the cheap path
        inverse_w = inverse.astype(np.float32)[:, None, :]
    else:
        inverse_w = inverse[:, None, :]
    terms = _cut(products * inverse_w, rounding).sum(axis=1, dtype=np.float64)
    total = (terms + _cut(acc * inverse, rounding)) / inverse
    return round_to_bits(total, bits, rounding)


def format_step(acc: np.ndarray, products: np.ndarray, spec: FormatSpec,
                rounding: AccumulationRounding) -> np.ndarray:
    """One step of an ordinary accumulator in ``spec``: ``acc + sum(products)`` (exact in
    float64 for FP8 products) rounded once to ``spec``."""
    total = acc + products.sum(axis=1, dtype=np.float64)
    mode = RoundingMode(rounding.value)
    return np.asarray(round_to_format(total, spec, mode, OverflowPolicy.IEEE), dtype=np.float64)


def _k_factor(a: Operand, b: Operand, kind: str, block: int | None, k0: int,
              n: int, c0: int = 0) -> np.ndarray | np.float32:
    """The float32 dequantization factor ``d_a * d_b`` of the K range starting at k0 (one
    scale block), per output or for all; B's columns start at ``c0`` (a tile)."""
    if kind == "tensor":
        return np.float32(a.dequant[0, 0] * b.dequant[0, 0])
    if kind == "row":
        return (a.dequant[:, :1] * b.dequant[:1, :]).astype(np.float32)
    kb = k0 // block
    db = b.dequant[kb:kb + 1, np.arange(c0, c0 + n) // block]  # each column's block
    return (a.dequant[:, kb:kb + 1] * db).astype(np.float32)


def emulate_gemm(a: Operand, b: Operand, kind: str, block: int | None, *,
                 bits: int | None = DEFAULT_BITS, accumulator: FormatSpec | None = None,
                 rounding: AccumulationRounding = AccumulationRounding.TOWARD_ZERO,
                 promote_every: int | None = None, group: int = GROUP) -> np.ndarray:
    """The float32 output C of the GEMM of two quantized operands with the limited
    accumulator (``bits`` or ``accumulator``) in steps of ``group`` products, promoted to
    FP32 every ``promote_every`` elements of K (None: never)."""
    m, k = a.codes.shape
    n = b.codes.shape[1]
    interval = k if promote_every is None else promote_every
    if kind == "block" and k > block and block % interval:
        if promote_every is None:
            raise UsageError(f"block:{block} scales change along K every {block}: promote "
                             f"the partial sums within each block (e.g. "
                             + Param("promote_every", block) + ")")
        raise UsageError(Param("promote_every", interval) + " does not divide the scale block "
                         f"{block}: a partial sum must stay within one block")
    out = np.zeros((m, n), dtype=np.float32)
    wide = a.codes.dtype == np.float64 or b.codes.dtype == np.float64
    rows, cols = tiles(m, n, group, 8 if wide else 4)
    for r0 in range(0, m, rows):  # every output depends on its row of A and column of B
        ta = Operand(a.codes[r0:r0 + rows], a.dequant if kind == "tensor" else
                     a.dequant[r0:r0 + rows], a.values[r0:r0 + rows])
        for c0 in range(0, n, cols):
            tb = Operand(b.codes[:, c0:c0 + cols], b.dequant if kind == "tensor" else
                         b.dequant[:, c0:c0 + cols] if kind == "row" else b.dequant,
                         b.values[:, c0:c0 + cols])
            out[r0:r0 + rows, c0:c0 + cols] = _emulate_tile(
                ta, tb, kind, block, c0, bits, accumulator, rounding, interval, group, wide)
    return out


def _emulate_tile(a: Operand, b: Operand, kind: str, block: int | None, c0: int,
                  bits: int | None, accumulator: FormatSpec | None,
                  rounding: AccumulationRounding, interval: int, group: int,
                  wide: bool) -> np.ndarray:
    """The outputs of one tile: A's rows and B's columns (from column ``c0`` of B, which
    keeps its whole block scales), K in steps of ``group``, promoted every ``interval``."""
    m, k = a.codes.shape
    n = b.codes.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    for start in range(0, k, interval):
        stop = min(start + interval, k)
        acc = np.zeros((m, n), dtype=np.float64)
        for g0 in range(start, stop, group):
            g1 = min(g0 + group, stop)
            pa = a.codes[:, g0:g1]
            pb = b.codes[g0:g1, :]
            if wide:
                pa, pb = pa.astype(np.float64), pb.astype(np.float64)
            products = pa[:, :, None] * pb[None, :, :]  # (M, g, N), exact
            if accumulator is None:
                acc = aligned_step(acc, products, bits, rounding)
            else:
                acc = format_step(acc, products, accumulator, rounding)
        factor = _k_factor(a, b, kind, block, start, n, c0)
        with np.errstate(over="ignore", invalid="ignore"):
            out = (out + acc.astype(np.float32) * factor).astype(np.float32)
    return out


def exact_products(a: Operand, b: Operand) -> np.ndarray:
    """The float64 product of the quantized inputs (the accumulation's reference)."""
    return a.values @ b.values


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
    if accumulator_bits is not None and accumulator is not None:
        raise UsageError("accumulator_bits and accumulator are alternatives: give one")
    if accumulator is None:
        bits = DEFAULT_BITS if accumulator_bits is None else accumulator_bits
        if not 1 <= bits <= MAX_BITS:
            raise UsageError(Param("accumulator_bits", bits) + f" is outside 1..{MAX_BITS}")
    else:
        bits = None
        if not accumulator.signed or not accumulator.has_zero:
            raise UsageError(Param("accumulator", accumulator.name, repr) + " is a scale format: "
                             "an accumulator needs a sign and a zero")
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

