"""The named choices of fmtcli's parameters, and the defaults the command line shows.

Every option with a fixed set of values is a ``str`` Enum here (its home module imports and
re-exports it: ``rounding.RoundingMode``, ``backends.Backend``, ...).  This module imports
nothing else, so the command line builds its parser -- and answers ``fmt --version`` and
``fmt --help`` -- without loading numpy or ml_dtypes.
"""

from __future__ import annotations

import os
from enum import Enum


class RoundingMode(str, Enum):
    """How a value between two neighbours of the format is resolved."""

    NEAREST_EVEN = "nearest-even"
    NEAREST_AWAY = "nearest-away"
    TOWARD_ZERO = "toward-zero"
    UP = "up"
    DOWN = "down"
    STOCHASTIC = "stochastic"


class OverflowPolicy(str, Enum):
    """What a value beyond the format's max becomes."""

    IEEE = "ieee"
    SATURATE = "saturate"


class ScaleRule(str, Enum):
    """How a block's amax (or a percentile, or a given value) sets its scale (``scaling``)."""

    AMAX = "amax"
    POW2_FLOOR = "pow2-floor"
    POW2_CEIL = "pow2-ceil"
    POW2_NEAREST = "pow2-nearest"
    MX_FLOOR = "mx-floor"
    MX_CEIL = "mx-ceil"
    MX_EVEN = "mx-even"
    MX_RCEIL = "mx-rceil"
    PERCENTILE = "percentile"
    FIXED = "fixed"


class Product(str, Enum):
    """The width of ``x * scale`` before the cast (``scaling``)."""

    FLOAT32 = "float32"
    EXACT = "exact"


class Granularity(str, Enum):
    """What one scale covers: the one vocabulary of every analysis (its sizes, block N and
    tile RxC, in ``numerics.granularity.ScaleGroup``).  quantize's schemes take tensor to
    tile; ``head`` and ``token-head`` are a KV cache's (one scale per KV head, or per token
    and head), and each command's options take the kinds it has."""

    TENSOR = "tensor"
    ROW = "row"
    COLUMN = "column"
    BLOCK = "block"
    TILE = "tile"
    HEAD = "head"
    TOKEN_HEAD = "token-head"


class Backend(str, Enum):
    """Whose cast stores the values (``backends``)."""

    AUTO = "auto"
    NUMPY = "numpy"
    ML_DTYPES = "ml_dtypes"
    TORCH = "torch"


class Device(str, Enum):
    """Where the torch backend runs (``backends``)."""

    AUTO = "auto"  # the CPU, except where quantize sends a large tensor to the GPU
    CPU = "cpu"
    CUDA = "cuda"


class AttentionDevice(str, Enum):
    """Where ``fmt attention`` runs torch's SDPA kernels (its emulation is numpy, CPU)."""

    CPU = "cpu"
    CUDA = "cuda"


class ScaleGranularity(str, Enum):
    """The kinds of ``Granularity`` that ``fmt attention``'s ``--scale-granularity`` takes
    (its narrow-format emulation: one scale per tensor, or per block of rows)."""

    TENSOR = "tensor"
    BLOCK = "block"


class AccumulationRounding(str, Enum):
    """How ``fmt dot``'s limited accumulator drops the bits below its last place: truncation
    (what tensor cores are measured to do) or round-to-nearest-even."""

    TOWARD_ZERO = "toward-zero"
    NEAREST_EVEN = "nearest-even"


class DotDevice(str, Enum):
    """Where ``fmt dot`` also runs the real FP8 GEMM (its emulation is numpy, CPU)."""

    CPU = "cpu"
    CUDA = "cuda"


class Metric(str, Enum):
    """What scale-search's best rule minimises (SQNR: maximises)."""

    MSE = "mse"
    SQNR = "sqnr"
    MEDIAN_REL = "median-rel"
    P99_REL = "p99-rel"
    FLUSHED = "flushed"


class OutLayout(str, Enum):
    """The checkpoint layouts ``fmt quantize --out DIR --layout`` writes
    (``quantize.layout_out``)."""

    COMPRESSED_TENSORS = "compressed-tensors"
    DEEPSEEK_FP8 = "deepseek-fp8"
    MODELOPT_NVFP4 = "modelopt-nvfp4"


#: The recipes of ``schemes.RECIPES``, in order (tests check that the two agree).
RECIPE_NAMES = ("tensorwise", "rowwise", "deepseek", "mxfp8", "mxfp6", "mxfp4", "nvfp4")
#: Values per chunk of the streaming engine: ~1 MiB of float32, fits the L2 cache.
CHUNK_ELEMENTS = 1 << 18
#: Amax history length of delayed scaling: Transformer Engine's default amax_history_len.
HISTORY = 1024
#: Above this many tensors, ``fmt quantize``'s table is a summary (roles, worst, total).
SUMMARY_ABOVE = 8
#: Rows of each list of a summary (roles, worst tensors, roles whose blocks flush) by
#: default (``--top``): with its titles and captions, about one screen at 80 columns.
SUMMARY_TOP = 5


def cores_available() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count):
    the most worker processes ``--workers`` and ``--dask local:N`` start here."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


#: What ``fmt range`` and ``fmt underflow`` show by default: the article's six formats.
ARTICLE_FORMATS = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
                   "float8_e5m2")
