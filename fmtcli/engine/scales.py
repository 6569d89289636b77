"""The scales a scheme used: ``ScaleSummary`` while a tensor runs, ``ScaleStats`` in a result.

``x_q = cast(x * scale) / scale``: a summary keeps the count, range, NaNs and distinct values
(capped at ``DISTINCT_CAP``) of the float32 (or float64, exact product) scales of every
block, tile or row; summaries merge exactly, in any order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fmtcli.numerics import native

DISTINCT_CAP = 1 << 16


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array, sorted (``np.unique`` without its import of
    ``numpy.ma``, 7 ms of every run's start-up in numpy 2.4)."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


@dataclass
class ScaleSummary:
    """Running min / max / distinct count of the scales used (distinct is capped).  Scales
    are float32, or float64 under the exact product; distinct values are kept as float64."""

    count: int = 0
    low: float = math.inf
    high: float = -math.inf
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # sorted
    capped: bool = False
    nan: int = 0
    counted: bool = True  # False where distinct values were not counted (the CUDA path)

    def add(self, scales: np.ndarray) -> None:
        """Fold in an array of scales (any shape)."""
        s = np.ascontiguousarray(scales).reshape(-1)
        if s.dtype != np.float32:
            with np.errstate(over="ignore", under="ignore"):
                narrow = s.astype(np.float32)
            s = narrow if np.array_equal(narrow, s, equal_nan=True) else s.astype(np.float64)
        self.count += s.size
        nan = np.isnan(s)
        finite = s[~nan] if nan.any() else s
        self.nan += s.size - finite.size
        if finite.size:
            self.low = min(self.low, float(finite.min()))
            self.high = max(self.high, float(finite.max()))
        if self.capped or not finite.size:
            return
        bits = finite.view(np.uint32) if finite.dtype == np.float32 else None
        if bits is not None and not np.any(bits & np.uint32(0x807FFFFF)) and np.all(bits):
            # powers of two
            exponents = np.flatnonzero(np.bincount(bits >> np.uint32(23), minlength=256))
            with np.errstate(over="ignore"):  # exponent 255: inf (NVFP4's dead blocks)
                self._fold(np.ldexp(np.float32(1), exponents.astype(np.int32) - 127))
            return
        kernel = native.module()
        if kernel is not None and bits is not None and bits.flags.c_contiguous:
            # the compiled hash set: the first DISTINCT_CAP + 1 distinct patterns in one
            # pass (sorting every scale of a large grid cost more than the chunk work)
            found = np.empty(DISTINCT_CAP + 1, np.uint32)
            count = kernel.distinct_bits(bits, bits.size, found.size, found)
            if count > DISTINCT_CAP:
                self.capped, self.values = True, np.zeros(0, np.float64)
            else:
                self._fold(np.sort(found[:count].view(np.float32)))
            return
        step = DISTINCT_CAP + 1  # a slice this long already tells whether the cap is passed
        for start in range(0, finite.size, step):
            if self._fold(distinct(finite[start:start + step])):
                return

    def _fold(self, sorted_values: np.ndarray) -> bool:
        """Merge distinct values in; True once the cap is passed."""
        self.values = distinct(np.concatenate([self.values, sorted_values.astype(np.float64)]))
        if self.values.size > DISTINCT_CAP:
            self.capped, self.values = True, np.zeros(0, np.float64)
        return self.capped

    def merge(self, other: ScaleSummary) -> None:
        self.count += other.count
        self.nan += other.nan
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)
        self.capped = self.capped or other.capped
        self.counted = self.counted and other.counted
        if not self.capped:
            self._fold(other.values)

    def stats(self) -> ScaleStats:
        """The summary as a result keeps it (frozen)."""
        known = self.count - self.nan
        return ScaleStats(
            count=self.count, min=self.low if known else None,
            max=self.high if known else None,
            distinct=None if self.capped or not self.counted else int(self.values.size),
            distinct_more_than=DISTINCT_CAP if self.capped and self.counted else None,
            nan=self.nan)


@dataclass(frozen=True)
class ScaleStats:
    """The scales a scheme used: how many, their range (None when all are NaN), how many
    distinct values (None where not counted: past ``DISTINCT_CAP``, then
    ``distinct_more_than`` says so, or on the CUDA path) and how many NaN."""

    count: int
    min: float | None
    max: float | None
    distinct: int | None
    distinct_more_than: int | None
    nan: int

    @property
    def single(self) -> float | None:
        """The one scale every block used, or None where they differ."""
        if self.count == 1 or (self.min is not None and self.min == self.max
                               and self.distinct == 1):
            return self.min
        return None

    def to_dict(self) -> dict:
        return {"count": self.count, "min": self.min, "max": self.max,
                "distinct": self.distinct, "distinct_more_than": self.distinct_more_than,
                "nan": self.nan}
