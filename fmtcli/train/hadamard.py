"""The random Hadamard transform (RHT) of Transformer Engine's NVFP4 recipe.

Transformer Engine's NVFP4 training recipe (``NVFP4BlockScaling``, its ``disable_rht``
switch) rotates the two inputs of the weight-gradient GEMM ``dW = dY^T X`` before casting
them to NVFP4: each block of 16 values along the GEMM's reduction axis (the tokens) is
multiplied by one 16 x 16 matrix ``Q = diag(s) H16 / sqrt(16)``, with ``H16`` the
Sylvester Hadamard matrix (scipy.linalg.hadamard's) and ``s`` a fixed "random" sign
vector.  TE defines them in ``transformer_engine/pytorch/tensor/nvfp4_tensor.py``
(``get_wgrad_sign_vector``: ``[1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]``;
``get_rht_matrix``: ``sign_matrix @ get_hadamard_matrix(16)``, the latter scaled by
``1 / sqrt(16)``) and applies it as ``x.reshape(-1, 16) @ Q``
(``transformer_engine/jax/quantize/hadamard.py``'s ``apply_rht`` spells the same product).

``Q`` is orthogonal (``Q Q^T = I``), so rotating both inputs along the axis they are summed
over leaves the exact product unchanged: ``(A Q)(B Q)^T = A B^T``; an outlier of one
block is spread over its 16 values (each gets +-x/4), which narrows the block's range
before the cast.  fmt applies ``Q`` in float32 (TE holds it in bfloat16, where its entries
+-1/4 are exact too) along the last axis, in whole blocks; a ragged tail shorter than a
block is left as it is (the identity on those values: still orthogonal).
"""

from __future__ import annotations

import functools

import numpy as np

from fmtcli.base.errors import Param, UsageError

#: Transformer Engine's fixed sign vector of the 16-point RHT (nvfp4_tensor.py).
TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
SIZES = (2, 4, 8, 16, 32, 64, 128)
#: blocks per matrix product: a product of (8192, 16) x (16, 16) wakes OpenBLAS's threads,
#: which on a loaded 2-core machine cost 3-16 ms a call; 1024 rows at a time take 0.3 ms for
#: the same 8192 (measured, fmt train's default wgrad input, 128 x 1024)
ROWS = 1024


def check_size(n: int) -> None:
    """A transform size fmt builds: a power of two, 2..128."""
    if n not in SIZES:
        raise UsageError(Param("hadamard", n) + ": the Hadamard size must be a power of two "
                         "from 2 to 128 (Transformer Engine's NVFP4 recipe uses 16)")


@functools.cache
def hadamard_matrix(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (entries +-1, scipy.linalg.hadamard's order)
    divided by sqrt(n): orthogonal."""
    check_size(n)
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h = (h / np.sqrt(n)).astype(np.float32)
    h.setflags(write=False)
    return h


def signs(n: int) -> np.ndarray:
    """The sign vector: Transformer Engine's for n = 16; for other sizes a fixed draw
    (seed 16) of +-1, as TE fixes its own."""
    if n == 16:
        return np.array(TE_SIGNS, dtype=np.float32)
    return np.where(np.random.default_rng(16).random(n) < 0.5, -1.0, 1.0).astype(np.float32)


@functools.cache
def rht_matrix(n: int = 16) -> np.ndarray:
    """``diag(signs) @ H_n / sqrt(n)``: TE's ``get_rht_matrix`` (float32, read-only)."""
    q = signs(n)[:, None] * hadamard_matrix(n)
    q.setflags(write=False)
    return q


def _blocks(x: np.ndarray, n: int, q: np.ndarray) -> np.ndarray:
    """``x`` (rows, cols) with every whole block of ``n`` along the last axis times ``q``."""
    rows, cols = x.shape
    whole = cols - cols % n
    out = np.array(x, dtype=np.float32, order="C")
    if whole:
        body = np.ascontiguousarray(out[:, :whole]).reshape(-1, n)
        out[:, :whole] = np.concatenate([body[i:i + ROWS] @ q
                                         for i in range(0, len(body), ROWS)]).reshape(rows, whole)
    return out


def forward(x: np.ndarray, n: int = 16) -> np.ndarray:
    """``x`` rotated: each block of ``n`` along the last axis times ``Q`` (a new array)."""
    return _blocks(np.asarray(x, dtype=np.float32), n, rht_matrix(n))


def inverse(y: np.ndarray, n: int = 16) -> np.ndarray:
    """The rotation undone: times ``Q^T`` (``Q`` is orthogonal)."""
    return _blocks(np.asarray(y, dtype=np.float32), n, np.ascontiguousarray(rht_matrix(n).T))
