"""The inputs of ``fmt softmax``: the article's example, random draws, and the numbers of
``--scores`` / ``--values`` (a list typed on the command line, or a file of one tensor)."""

from __future__ import annotations

import os

import numpy as np

from fmtcli.attention.softmax import (
    ARTICLE_BLOCK,
    ARTICLE_SCORES,
    ARTICLE_VALUES,
    MAX_ELEMENTS,
    MAX_KEYS,
)
from fmtcli.base.errors import BadValueError, DataError, Param, UsageError, shown
from fmtcli.inputs import pick
from fmtcli.inputs.files import SUFFIXES
from fmtcli.numerics.literals import parse_values


def article_example() -> tuple[tuple[float, ...], tuple[float, ...], int]:
    """The article's worked example: scores 1, 3, 2, 0 against values 10, 20, 30, 40 in
    blocks of two (18.81 after block 1, 22.14 at the end)."""
    return ARTICLE_SCORES, ARTICLE_VALUES, ARTICLE_BLOCK


def random_inputs(keys: int, dim: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scores and values drawn from N(0, 1) (float32, as a model's tensors are): ``keys``
    scores -- the scale of q.k / sqrt(d) for unit-variance q and k -- and values of ``dim``
    components (a vector when ``dim`` is 1, else a (keys, dim) matrix)."""
    if keys < 1 or dim < 1:
        raise UsageError("random inputs need keys >= 1 and dim >= 1, got " + Param("keys", keys)
                         + ", " + Param("dim", dim))
    if keys > MAX_KEYS or keys * dim > MAX_ELEMENTS:
        raise UsageError(f"{keys:,} keys x {dim:,} component{'' if dim == 1 else 's'}: at "
                         f"most {MAX_KEYS:,} keys and {MAX_ELEMENTS:,} values")
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(keys).astype(np.float32)
    values = rng.standard_normal((keys, dim) if dim > 1 else keys).astype(np.float32)
    return scores, values



def read_numbers(text: str, option: str, matrix: bool = False
                 ) -> tuple[np.ndarray, str | None]:
    """The numbers of ``--scores`` or ``--values`` (``option``): a LIST in the syntax of
    ``fmt underflow`` (``1,3,2,0``, ``2^-3``, ``0x1p-4``) or else a FILE of one tensor (any
    input ``fmt`` reads: ``.npy``, ``.npz``, ``.safetensors``, ``.pt``, text, JSON, ``-`` for
    stdin).  A vector, or with ``matrix`` also a (keys, dim) matrix (a single column is a
    vector).  A file that is unreadable, holds several tensors, the wrong shape or non-finite
    numbers is a DataError; text that is neither numbers nor a file a UsageError.  Returns
    the numbers (float64) and the file's name as messages show it (None for a list)."""
    if not text.strip():
        raise UsageError(f"{option} must not be empty")
    if text != "-":
        try:
            return np.array(parse_values([text]), dtype=np.float64), None
        except BadValueError as error:
            if not (os.path.exists(text) or text.lower().endswith(SUFFIXES)):
                raise UsageError(f"{option} {shown(text)} is neither a list of numbers "
                                 f"({error.message}) nor a file") from None
    source = pick.pick_file(text, purpose="for the softmax", taker=option)
    where = pick.where(text)
    if source.size > MAX_ELEMENTS:
        raise DataError(f"{where}: {source.size:,} numbers (at most {MAX_ELEMENTS:,})")
    array = np.asarray(source.array(), dtype=np.float64)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    elif array.size == max(array.shape, default=1) and not (matrix and array.ndim == 2):
        array = array.reshape(-1)  # (1, N), (N, 1, 1), a scalar: a vector
    if array.ndim != 1 and not (matrix and array.ndim == 2):
        shape = "x".join(map(str, array.shape))
        wanted = "a vector or a (keys, dim) matrix" if matrix else "a vector"
        raise DataError(f"{where}: {option} must be {wanted}, got shape {shape}")
    bad = ~np.isfinite(array)
    if bad.any():
        index = ", ".join(map(str, np.unravel_index(int(np.argmax(bad)), array.shape)))
        raise DataError(f"{where}: {option} must be finite, [{index}] is "
                        f"{array[bad].flat[0]}")
    return array, where
