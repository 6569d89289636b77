"""What the scale-search and loss-scale tests share: the commands' JSON, loss-scale's
direct count of what each power-of-two scale does to a gradient, the delayed-scaling
candidates' names."""

from __future__ import annotations

import math

import numpy as np
from cli_helpers import json_of

from fmtcli.numerics.formats import get_format
from fmtcli.numerics.rounding import round_to_format

F32 = np.float32
EXPONENTS = list(range(33))  # the scales 2^0 .. 2^32 fmt loss-scale tries
DELAYED_NAMES = ["delayed max", "delayed most_recent"]


def search(*args, input: str | None = None) -> dict:
    """``fmt scale-search ARGS --json``: must succeed; the strictly parsed document."""
    return json_of("scale-search", *args, input=input)


def by_name(doc: dict) -> dict:
    return {c["name"]: c for c in doc["candidates"]}


def sweep(*args, input: str | None = None) -> dict:
    """``fmt loss-scale ARGS --json``: must succeed; the strictly parsed document."""
    return json_of("loss-scale", *args, input=input)


def direct_counts(arrays, fmt: str = "float16") -> dict:
    """{e: (flushed, subnormal, overflow, saturated)} and the nonzero count, by rounding
    g * 2**e; saturated: a value past max's rounding interval (beyond max + ulp/2, or that
    tie when max is odd) that the format stores as a finite value (no inf/NaN to give)."""
    spec = get_format(fmt)
    g = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays])
    g = g[np.isfinite(g) & (g != 0)]
    counts = {}
    for e in EXPONENTS:
        with np.errstate(over="ignore", invalid="ignore"):
            q = round_to_format((g * F32(2.0 ** e)).astype(np.float32), spec,
                                "nearest-even", "ieee")
            finite = np.isfinite(q)
            flushed = int(np.count_nonzero(q == 0))
            subnormal = int(np.count_nonzero(finite & (q != 0)
                                             & (np.abs(q) < spec.smallest_normal)))
            overflow = int(np.count_nonzero(~finite))
            ulp = 2.0 ** (math.frexp(spec.max)[1] - 1 - spec.mantissa_bits)
            scaled = np.abs(g.astype(np.float64) * 2.0 ** e)
            tie = spec.max + ulp / 2
            odd = int(spec.max / ulp) % 2 == 1  # the tie goes to the even neighbour
            beyond = (scaled > tie) | ((scaled == tie) & odd)
            saturated = int(np.count_nonzero(beyond & finite))
        counts[e] = (flushed, subnormal, overflow, saturated)
    return {"rows": counts, "nonzero": int(g.size)}


def log_uniform(rng, n: int, low: float, high: float) -> np.ndarray:
    mag = np.exp2(rng.uniform(low, high, n))
    return (np.where(rng.random(n) < 0.5, -1.0, 1.0) * mag).astype(np.float32)
