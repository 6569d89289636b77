"""The IO model of Dao et al. 2022 (FlashAttention, Theorem 2 and Appendix C): how many
bytes standard attention and FlashAttention move between HBM and the chip, and how many
FLOPs each does, for one shape.

Counts are those of the paper's algorithms, per (batch, head) pair, in elements, then
times the element size in bits / 8 and the number of pairs (N_q queries, N_k keys, head
dim d, on-chip memory M elements):

- Standard attention, forward (Algorithm 0): read Q, K; write S; read S, write P; read P, V;
  write O:  ``2 N_q d + 2 N_k d + 4 N_q N_k``  -- Theta(N d + N^2).
- FlashAttention, forward (Algorithm 1), blocks ``B_c = ceil(M / 4d)``,
  ``B_r = min(B_c, d)``, ``T_c = ceil(N_k / B_c)`` passes of the outer loop: write O, l, m
  once (``N_q d + 2 N_q``); read every K_j, V_j once (``2 N_k d``); in each pass read Q_i,
  O_i, l_i, m_i and write O_i, l_i, m_i for every query block (``3 N_q d + 4 N_q``):
  ``N_q d + 2 N_q + 2 N_k d + T_c (3 N_q d + 4 N_q)``  -- Theta(N^2 d^2 / M).
- Backward, for the paper's Fig. 2 (which times forward + backward): standard
  (Algorithm 3) ``7 N_q N_k + 4 N_q d + 4 N_k d``; FlashAttention (Algorithm 4: dQ, dK, dV
  initialised, K_j, V_j read once, Q_i, O_i, dO_i, dQ_i, l_i, m_i read and dQ_i written in
  each pass, dK_j, dV_j written once) ``N_q d + 6 N_k d + T_c (5 N_q d + 2 N_q)``.
- FLOPs: a multiply-add is 2, exp/max/divide 1.  Forward: ``4 N_q N_k d`` for the two
  products, softmax ``5 N_q N_k`` (standard) or ``4 N_q N_k`` plus the online rescaling
  ``T_c (4 N_q d + 8 N_q)`` (FlashAttention).  Backward: ``8 N_q N_k d`` for the four
  products plus ``2 N_q N_k + 2 N_q d`` for dS; FlashAttention also recomputes S and P
  (``2 N_q N_k d + 3 N_q N_k``).
The model counts dense attention: a causal mask changes neither count.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from fmtcli.attention.limits import IO_LIMITS
from fmtcli.base.errors import Param, UsageError

#: The default on-chip memory: the GPU of the paper's Fig. 2.  Dao et al. 2022 §2.1 give the
#: A100 "192KB of on-chip SRAM per each of 108 streaming multiprocessors".
DEFAULT_GPU = "A100"
GPU_SRAM_BYTES = {  # shared memory (or L1/shared SRAM) per SM, bytes
    "A100": 192 * 1024,  # Dao et al. 2022 §2.1 (L1 + shared; at most 164 KiB as shared)
    "H100": 228 * 1024,  # Hopper: 256 KiB L1/shared, up to 228 KiB shared per SM
}
#: The paper's Fig. 2 (Dao et al. 2022): GPT-2 medium's attention, forward + backward, on
#: an A100: seq 1024, head dim 64, 16 heads, batch 64, fp16.
PAPER_SHAPE = {"batch": 64, "heads": 16, "seq": 1024, "dim": 64, "element_bits": 16}
PAPER_FIGURES = {"standard_flops": 66.6e9, "flash_flops": 75.2e9,
                 "standard_bytes": 40.3e9, "flash_bytes": 4.4e9,
                 "standard_ms": 41.7, "flash_ms": 7.3}
#: The largest value of each size the model takes (``fmt attention``'s options say the same).
LIMITS = IO_LIMITS


def check_limits(**sizes: int | None) -> None:
    """Each size given (a keyword of ``LIMITS``; None: not given) is an integer from 1 to its
    limit; else a UsageError naming it, its value and the limit."""
    for name, value in sizes.items():
        if value is None:
            continue
        try:
            value = operator.index(value)
        except TypeError:
            raise UsageError(Param(name, value, repr) + " must be an integer") from None
        if not 1 <= value <= LIMITS[name]:
            shown = f"{value:,}" if value.bit_length() < 64 else f"a {len(str(value))}-digit number"
            raise UsageError(Param(name, value, shown) + f" must be from 1 to {LIMITS[name]:,}")


@dataclass(frozen=True)
class IoModel:
    """HBM traffic (bytes) and FLOPs of standard attention and FlashAttention for one shape:
    the forward pass (``standard_bytes`` ... ``flash_flops``; Theorem 2's quantity) and
    forward + backward (``*_fwd_bwd``, what the paper's Fig. 2 reports).  ``sram_bytes`` is
    the on-chip memory M assumed (``sram_source`` says whose), ``block_q``/``block_k`` the
    blocks B_r/B_c of Algorithm 1 (from M unless given)."""

    batch: int
    heads: int
    seq_q: int
    seq_k: int
    dim: int
    element_bits: int
    sram_bytes: int
    sram_source: str
    block_q: int
    block_k: int
    standard_bytes: int
    flash_bytes: int
    standard_flops: int
    flash_flops: int
    standard_bytes_fwd_bwd: int
    flash_bytes_fwd_bwd: int
    standard_flops_fwd_bwd: int
    flash_flops_fwd_bwd: int

    @property
    def is_paper_shape(self) -> bool:
        """Whether this is the shape of the paper's Fig. 2 (then ``PAPER_FIGURES`` apply)."""
        return (self.batch, self.heads, self.seq_q, self.seq_k, self.dim, self.element_bits) \
            == (PAPER_SHAPE["batch"], PAPER_SHAPE["heads"], PAPER_SHAPE["seq"],
                PAPER_SHAPE["seq"], PAPER_SHAPE["dim"], PAPER_SHAPE["element_bits"])

    def to_dict(self) -> dict:
        out = {"standard_bytes": self.standard_bytes, "flash_bytes": self.flash_bytes,
               "standard_flops": self.standard_flops, "flash_flops": self.flash_flops,
               "sram_bytes": self.sram_bytes, "block_q": self.block_q,
               "block_k": self.block_k, "sram_source": self.sram_source,
               "element_bits": self.element_bits,
               "standard_bytes_fwd_bwd": self.standard_bytes_fwd_bwd,
               "flash_bytes_fwd_bwd": self.flash_bytes_fwd_bwd,
               "standard_flops_fwd_bwd": self.standard_flops_fwd_bwd,
               "flash_flops_fwd_bwd": self.flash_flops_fwd_bwd}
        if self.is_paper_shape:
            out["paper_fig2"] = dict(PAPER_FIGURES)
        return out


def paper_blocks(sram_elements: int, dim: int) -> tuple[int, int]:
    """(B_r, B_c) of Algorithm 1 for M elements of SRAM: B_c = ceil(M / 4d), B_r = min(B_c, d)."""
    block_k = -(-sram_elements // (4 * dim))  # integer ceil: exact for any size
    return min(block_k, dim), block_k


def io_model(batch: int, heads: int, seq_q: int, dim: int, element_bits: int = 16,
             sram_bytes: int | None = None, seq_k: int | None = None,
             block_q: int | None = None, block_k: int | None = None) -> IoModel:
    """The counts of the module docstring for (batch, heads, seq, dim) with elements of
    ``element_bits`` bits and ``sram_bytes`` of on-chip memory (default: the A100's 192 KiB
    per SM, ``DEFAULT_GPU``).  ``block_q``/``block_k`` override the paper's B_r/B_c (the IO
    count depends on B_c only, through T_c)."""
    seq_k = seq_q if seq_k is None else seq_k
    check_limits(batch=batch, heads=heads, seq=seq_q, dim=dim, element_bits=element_bits,
                 sram_bytes=sram_bytes, block_q=block_q, block_k=block_k)
    check_limits(seq=seq_k)
    if sram_bytes is None:
        sram_bytes = GPU_SRAM_BYTES[DEFAULT_GPU]
        source = f"the {DEFAULT_GPU}'s {sram_bytes // 1024} KiB per SM, as Dao et al. 2022 assume"
    else:
        source = "given"
    elements = sram_bytes * 8 // element_bits
    if elements < 4 * dim:
        raise UsageError(Param("sram", sram_bytes) + f" bytes hold {elements} elements: "
                         f"Algorithm 1's blocks need at least 4 * dim = {4 * dim}")
    br, bc = paper_blocks(elements, dim)
    br = block_q if block_q is not None else br
    bc = block_k if block_k is not None else bc
    n, m, d = seq_q, seq_k, dim
    t_c = -(-m // bc)
    std_fwd = 2 * n * d + 2 * m * d + 4 * n * m
    fl_fwd = n * d + 2 * n + 2 * m * d + t_c * (3 * n * d + 4 * n)
    std_bwd = 7 * n * m + 4 * n * d + 4 * m * d
    fl_bwd = n * d + 6 * m * d + t_c * (5 * n * d + 2 * n)
    std_f = 4 * n * m * d + 5 * n * m
    fl_f = 4 * n * m * d + 4 * n * m + t_c * (4 * n * d + 8 * n)
    bwd = 8 * n * m * d + 2 * n * m + 2 * n * d
    std_fb = std_f + bwd
    fl_fb = fl_f + bwd + 2 * n * m * d + 3 * n * m
    pairs = batch * heads

    def nbytes(elements_: int) -> int:
        return elements_ * pairs * element_bits // 8

    return IoModel(batch, heads, seq_q, seq_k, dim, element_bits, sram_bytes, source, br, bc,
                   nbytes(std_fwd), nbytes(fl_fwd), std_f * pairs, fl_f * pairs,
                   nbytes(std_fwd + std_bwd), nbytes(fl_fwd + fl_bwd), std_fb * pairs,
                   fl_fb * pairs)
