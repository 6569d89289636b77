"""Attention in a chosen precision against a float64 reference: standard attention and the
blockwise online-softmax algorithm (FlashAttention), emulated with numpy.

Both methods compute ``O = softmax(Q K^T / sqrt(d)) V`` per (batch, head) pair; the arrays
are ``(batch, heads, seq, dim)`` and every figure is in the units of O itself.

What is rounded where (F is ``--format``; "narrow" means 8 bits or fewer: FP8, FP6, FP4):

- Inputs (``quantized``).  Wide F (FP32, FP16, BF16, any custom format of 9 bits or more):
  Q, K, V are cast to F, no scale (IEEE overflow).  Narrow F: as FP8 attention kernels do
  (Shah et al. 2024, FlashAttention-3, §3.3), ``x_q = cast(x * scale) / scale``
  (``numerics.tiles``) with scales from ``scaling.amax_to_scale`` (amax rule, saturating
  cast), one per tensor or one per block of ``block_q`` rows of Q / ``block_k`` rows of K
  and V (all ``dim`` columns, per head).
  ``hadamard`` first multiplies Q and K by the same random orthogonal matrix
  ``diag(signs) H / sqrt(d)`` (H: Walsh-Hadamard), which leaves Q K^T unchanged and spreads
  an outlier over all d columns ("incoherent processing", FlashAttention-3 §3.3).
- Products.  Every matrix product accumulates in float32 (the tensor cores' FP32
  accumulators), scores are scaled by 1/sqrt(d) in float32; softmax statistics (running
  max m, running sum l, exp) are float32.
- Standard attention (Dao et al. 2022, Algorithm 0) writes S and P to memory: in F for wide
  formats; in float16 for narrow ones (the FP8 baseline of FlashAttention-3 §4.3 keeps its
  softmax in FP16), and P is then quantized to F like the inputs (one scale per tensor, or
  per ``block_q x block_k`` tile of P) before ``P V``.
- Blockwise attention (Dao et al. 2022, Algorithm 1, with the output normalised once at
  the end as FlashAttention-2 does): for each block of ``block_k`` keys, ``P~ = exp(S - m)``
  is cast to F before ``P~ V`` (narrow F: with one static scale, the amax rule's for an
  amax of 1 -- 448 for E4M3, 6 for FP4 -- since P~ <= 1 by construction);
  O, m and l never leave float32.
- The output: rounded to F for wide formats (what the kernel writes), float32 for narrow
  ones (FP8 kernels write a 16-bit output; its rounding is not the question here).

The reference is float64 standard attention of the inputs as given (before any rounding
or transform).  Work is vectorised over heads and query blocks: the only Python loop is
over key blocks (the online softmax is sequential in them) and over groups of heads that
keep the N x N temporaries near 2**25 elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.attention.quantized import (
    cast,
    quantize_inputs,
    random_orthogonal_hadamard,
    scale_group,
    walsh_hadamard,
)
from fmtcli.attention.ranges import check_float32_range, check_scores, overflowed
from fmtcli.base.choices import Granularity
from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.formats import FormatSpec, get_format
from fmtcli.numerics.scaling import amax_to_scale
from fmtcli.numerics.tiles import amax_scaled_cast, check_element_format, is_narrow, scaled_cast

__all__ = ["CHUNK_ELEMENTS", "METHODS", "OUTLIER_STD", "AccuracyRow", "attention_accuracy",
           "cast", "check_format", "error_row", "flash_attention", "quantize_inputs",
           "random_orthogonal_hadamard", "random_qkv", "reference_attention",
           "standard_attention", "walsh_hadamard"]

#: Temporaries of one group of heads stay near this many elements (float32: 128 MiB).
CHUNK_ELEMENTS = 1 << 25
#: Standard deviation of the extra term of an outlier entry: FlashAttention-3 §4.3 draws
#: each entry from N(0, 1) + N(0, 100) * Bernoulli(p), i.e. an outlier adds N(0, 10**2).
OUTLIER_STD = 10.0
METHODS = ("standard", "flash")
FLOAT16 = get_format("float16")


@dataclass(frozen=True)
class AccuracyRow:
    """One method in one format against the float64 reference.

    ``rmse``: root mean square of ``O - O_ref`` over every output element; ``max_abs_error``:
    the largest ``|O - O_ref|``; ``max_rel_error``: the largest relative error of one output
    vector (one query of one head), ``||o - o_ref||_2 / ||o_ref||_2`` -- element-wise ratios
    would be dominated by outputs that happen to lie near 0."""

    method: str
    format: str
    rmse: float
    max_abs_error: float
    max_rel_error: float

    def to_dict(self) -> dict:
        return {"method": self.method, "format": self.format, "rmse": self.rmse,
                "max_abs_error": self.max_abs_error, "max_rel_error": self.max_rel_error}


def check_format(spec: FormatSpec) -> None:
    """Attention needs signed values and a zero: scale formats (E8M0) cannot hold it."""
    check_element_format(spec, "attention")


# -- inputs (their rounding: ``quantized``) ------------------------------------------------

def random_qkv(batch: int, heads: int, seq: int, dim: int, seed: int = 0,
               outliers: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V of shape (batch, heads, seq, dim), float64, entries N(0, 1); with
    ``outliers`` = p, a fraction p of the entries (each independently) gets an extra
    N(0, 10**2) term: FlashAttention-3's outlier model (Shah et al. 2024, §4.3, p = 0.001)."""
    if not 0.0 <= outliers <= 1.0 or math.isnan(outliers):
        raise UsageError(Param("outliers", outliers, repr)
                         + " is a fraction of the entries: 0 <= p <= 1")
    rng = np.random.default_rng(seed)
    shape = (batch, heads, seq, dim)
    out = []
    for _ in range(3):
        x = rng.standard_normal(shape)
        if outliers > 0:
            hit = rng.random(shape) < outliers
            x[hit] += OUTLIER_STD * rng.standard_normal(int(hit.sum()))
        out.append(x)
    return out[0], out[1], out[2]


# -- the methods -------------------------------------------------------------------------

def _groups(g: int, n_q: int, n_k: int) -> list[slice]:
    """Slices of the g (batch x head) pairs whose n_q x n_k temporaries fit CHUNK_ELEMENTS."""
    per = max(1, CHUNK_ELEMENTS // max(1, n_q * n_k))
    return [slice(i, min(g, i + per)) for i in range(0, g, per)]


def _causal_mask(q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """True where key j (k0 <= j < k1) lies after query i (q0 <= i < q1): masked out."""
    return np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None]


def reference_attention(q, k, v, causal: bool = False, largest_score: bool = False):
    """Exact attention in float64, ``softmax(Q K^T / sqrt(d)) V`` (max-subtracted softmax),
    for arrays (..., seq, dim); the yardstick of every method here.  ``largest_score``:
    also the largest |row max| of the scores (what ``check_scores`` takes)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    lead = q.shape[:-2]
    qf, kf, vf = (a.reshape(-1, *a.shape[-2:]) for a in (q, k, v))
    g, n_q, d = qf.shape
    out = np.empty((g, n_q, vf.shape[-1]))
    largest = 0.0
    for part in _groups(g, n_q, kf.shape[1]):
        s = qf[part] @ kf[part].transpose(0, 2, 1) / math.sqrt(d)
        if causal:
            s[:, _causal_mask(0, n_q, 0, kf.shape[1])] = -np.inf
        top = s.max(axis=-1, keepdims=True)
        largest = max(largest, float(np.max(np.abs(top))))
        s -= top
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        out[part] = s @ vf[part]
    out = out.reshape(*lead, n_q, -1)
    return (out, largest) if largest_score else out


def _store(x: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """An intermediate of standard attention as written to memory: in ``spec`` (wide), in
    float16 (narrow: the FP8 baseline's 16-bit softmax)."""
    return cast(x, spec if not is_narrow(spec) else FLOAT16)


def standard_attention(qq, kq, vq, spec: FormatSpec, granularity: Granularity, block_q: int,
                       block_k: int, causal: bool = False) -> np.ndarray:
    """Standard attention on inputs already quantized (``quantize_inputs``): S and P
    materialised and stored as the module docstring says, P quantized for narrow formats,
    float32 products.  Returns float32 (..., seq_q, dim)."""
    lead = qq.shape[:-2]
    qf, kf, vf = (a.reshape(-1, *a.shape[-2:]) for a in (qq, kq, vq))
    g, n_q, d = qf.shape
    n_k = kf.shape[1]
    inv = np.float32(1.0 / math.sqrt(d))
    mask = _causal_mask(0, n_q, 0, n_k) if causal else None
    parts = _groups(g, n_q, n_k)

    def probabilities(part: slice) -> np.ndarray:
        s = np.matmul(qf[part], kf[part].transpose(0, 2, 1)) * inv
        s = _store(s, spec)
        if mask is not None:
            s[:, mask] = -np.inf
        top = s.max(axis=-1, keepdims=True)
        if not np.isfinite(top).all():  # check_scores foresees this but at its edge
            raise overflowed(f"standard attention's S in "
                              f"{(spec if not is_narrow(spec) else FLOAT16).name}")
        s -= top
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return _store(s, spec)

    amax = None
    cached: dict[int, np.ndarray] = {}
    if is_narrow(spec) and granularity is Granularity.TENSOR:  # one scale for all of P
        amax = 0.0
        for i, part in enumerate(parts):
            p = probabilities(part)
            amax = max(amax, float(p.max()))
            if len(parts) == 1:
                cached[i] = p
    out = np.empty((g, n_q, vf.shape[-1]), dtype=np.float32)
    for i, part in enumerate(parts):
        p = cached.pop(i) if i in cached else probabilities(part)
        if is_narrow(spec):
            p = amax_scaled_cast(p, spec, scale_group(granularity, block_q, block_k),
                                 amax=amax)
        out[part] = np.matmul(p, vf[part])
    if not is_narrow(spec):
        out = cast(out, spec)
    return out.reshape(*lead, n_q, -1)


def flash_attention(qq, kq, vq, spec: FormatSpec, block_k: int,
                    causal: bool = False) -> np.ndarray:
    """Blockwise attention with the online softmax (Dao et al. 2022, Algorithm 1) on inputs
    already quantized: for each block of ``block_k`` keys, all queries of all heads at once,
    ``m_new = max(m, rowmax S)``, ``P~ = exp(S - m_new)`` cast to ``spec`` (narrow formats:
    with the static scale that the amax rule gives an amax of 1, since ``P~ <= 1``),
    ``l = l exp(m - m_new) + rowsum P~``, ``acc = acc exp(m - m_new) + P~ V``; ``O = acc / l``.
    Query blocks are independent in this algorithm (their rows never mix), so they are
    computed together.  With ``causal``, block j only touches queries >= its first key."""
    lead = qq.shape[:-2]
    qf, kf, vf = (a.reshape(-1, *a.shape[-2:]) for a in (qq, kq, vq))
    g, n_q, d = qf.shape
    n_k = kf.shape[1]
    inv = np.float32(1.0 / math.sqrt(d))
    narrow = is_narrow(spec)
    p_scale = np.float32(amax_to_scale(np.float64(1.0), spec)) if narrow else None
    out = np.empty((g, n_q, vf.shape[-1]), dtype=np.float32)
    for part in _groups(g, n_q, block_k):
        q = qf[part]
        m = np.full((q.shape[0], n_q, 1), -np.inf, dtype=np.float32)
        total = np.zeros_like(m)
        acc = np.zeros((q.shape[0], n_q, vf.shape[-1]), dtype=np.float32)
        for start in range(0, n_k, block_k):
            stop = min(n_k, start + block_k)
            rows = slice(start if causal else 0, n_q)  # causal: earlier queries see no key here
            if rows.start >= n_q:
                break
            s = np.matmul(q[:, rows], kf[part, start:stop].transpose(0, 2, 1)) * inv
            if causal:
                s[:, _causal_mask(rows.start, n_q, start, stop)] = -np.inf
            m_old = m[:, rows]
            m_new = np.maximum(m_old, s.max(axis=-1, keepdims=True))
            if np.isposinf(m_new).any():  # check_scores foresees this but at its edge
                raise overflowed("blockwise attention's float32 S")
            s -= m_new
            np.exp(s, out=s)
            with np.errstate(invalid="ignore"):  # -inf - -inf: rows with no key yet
                alpha = np.exp(m_old - m_new)
            alpha[np.isnan(alpha)] = 0.0
            total[:, rows] = total[:, rows] * alpha + s.sum(axis=-1, keepdims=True)
            if narrow:  # P~ <= 1: one static scale maps 1 onto the format's max
                p = scaled_cast(s, spec, p_scale)
            else:
                p = cast(s, spec)
            with np.errstate(over="ignore", invalid="ignore"):  # checked after the loop
                acc[:, rows] = acc[:, rows] * alpha + np.matmul(p, vf[part, start:stop])
            m[:, rows] = m_new
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out[part] = acc / total
        if not np.isfinite(out[part]).all():  # l ~ N_k at most: acc passed float32's max
            raise overflowed(f"blockwise attention's float32 accumulator (acc = sum of "
                              f"P~ V over up to {n_k:,} keys, V up to "
                              f"{float(np.max(np.abs(vf[part]))):.3g})")
    if not is_narrow(spec):
        out = cast(out, spec)
    return out.reshape(*lead, n_q, -1)


# -- the errors --------------------------------------------------------------------------

def error_row(method: str, spec: FormatSpec, out: np.ndarray, ref: np.ndarray) -> AccuracyRow:
    """The three figures of ``out`` against ``ref`` (module AccuracyRow); an output that is
    not finite (an overflow no check above foresaw) is refused, never reported as NaN."""
    if not np.isfinite(out).all():
        raise overflowed(f"{method} attention in {spec.name}")
    err = np.asarray(out, dtype=np.float64) - ref
    rmse = float(np.sqrt(np.mean(err * err)))
    max_abs = float(np.max(np.abs(err)))
    num = np.sqrt(np.sum(err * err, axis=-1))
    den = np.sqrt(np.sum(ref * ref, axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(num == 0, 0.0, num / den)
    return AccuracyRow(method, spec.name, rmse, max_abs, float(np.max(rel)))


def attention_accuracy(q, k, v, spec: FormatSpec, granularity: Granularity = Granularity.BLOCK,
                       block_q: int = 64, block_k: int = 64, causal: bool = False,
                       hadamard: bool = False, seed: int = 0,
                       reference: np.ndarray | None = None,
                       labels: tuple[str, str, str] = ("Q", "K", "V")) -> list[AccuracyRow]:
    """Standard and blockwise attention of (..., seq, dim) arrays in ``spec`` against the
    float64 reference: one ``AccuracyRow`` per method.  Without ``reference`` it is computed
    here, after the checks that keep every figure finite (``ranges``: inputs within
    float32's range, scores within the range they are held in; a DataError naming the
    input, ``labels``, otherwise); a caller that gives ``reference`` has made them."""
    check_format(spec)
    if granularity not in (Granularity.TENSOR, Granularity.BLOCK):
        raise UsageError(f"scale granularity {granularity.value!r}: tensor or block")
    if block_q < 1 or block_k < 1:
        raise UsageError("block sizes must be positive (block_q, block_k)")
    if reference is None:
        for x, label in zip((q, k, v), labels):
            check_float32_range(np.asarray(x), label)
        ref, largest = reference_attention(q, k, v, causal, largest_score=True)
        check_scores(largest, spec, np.shape(q)[-1], labels)
    else:
        ref = reference
    qq, kq, vq = quantize_inputs(q, k, v, spec, granularity, block_q, block_k, hadamard, seed,
                                 labels)
    std = standard_attention(qq, kq, vq, spec, granularity, block_q, block_k, causal)
    rows = [error_row("standard", spec, std, ref)]
    del std
    fl = flash_attention(qq, kq, vq, spec, block_k, causal)
    rows.append(error_row("flash", spec, fl, ref))
    return rows
