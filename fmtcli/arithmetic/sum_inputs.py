"""The inputs of ``fmt sum``: the values (a file, random draws, a constant repeated; with
none, the article's 0.01 ten thousand times) and the summation order's name."""

from __future__ import annotations

import math

import numpy as np

from fmtcli.base.errors import DataError, Param, UsageError, shown

#: The article's example, ``fmt sum`` with no input: 0.01 added ten thousand times.
DEFAULT_CONSTANT = "0.01"
DEFAULT_COUNT = 10_000
ORDERS = ("sequential", "pairwise", "kahan", "blocked:B")
DISTRIBUTIONS = ("normal", "uniform", "lognormal")
MAX_VALUES = 10_000_000  # values held (float64: 80 MB) and summed by vectorised paths
MAX_BLOCK = 1 << 16


def sum_inputs(path: str | None = None, random: int | None = None, dist: str = "normal",
               seed: int = 0, constant: float | None = None,
               count: int | None = None) -> tuple[np.ndarray, str]:
    """The values to sum (float64) and a description: a FILE of one tensor (any input
    ``fmt`` reads; flattened), ``random`` draws from ``dist`` (normal: N(0, 1); uniform:
    [0, 1); lognormal: exp(N(0, 1))) with ``seed``, or ``constant`` repeated ``count``
    times (default 10,000).  With none of them: the article's 0.01, ten thousand times."""
    given = [path is not None, random is not None, constant is not None]
    if sum(given) > 1:
        raise UsageError("give one input: a FILE, " + Param("random", "N", "N") + " or "
                         + Param("constant", "V", "V"))
    if count is not None and constant is None and (path is not None or random is not None):
        raise UsageError(Param("count", "N", "N") + " goes with " + Param("constant", "V", "V")
                         + " (" + Param("random", "N", "N") + " sets its own count)")
    if random is not None:
        check_count(random, "random")
        if dist not in DISTRIBUTIONS:
            raise UsageError(f"unknown distribution {shown(dist)} (one of "
                             f"{', '.join(DISTRIBUTIONS)})")
        rng = np.random.default_rng(seed)
        draw = {"normal": lambda: rng.standard_normal(random),
                "uniform": lambda: rng.random(random),
                "lognormal": lambda: rng.lognormal(0.0, 1.0, random)}[dist]
        return draw(), f"{random:,} {dist} draws (seed {seed})"
    if path is not None:
        return _read_file(path)
    if constant is None:
        constant = float(DEFAULT_CONSTANT)
    n = DEFAULT_COUNT if count is None else count
    check_count(n, "count")
    if not math.isfinite(constant):
        raise UsageError(f"constant must be finite, got {constant}")
    return np.full(n, float(constant)), f"{short_number(constant)} x {n:,}"


def short_number(x: float) -> str:
    text = repr(float(x))
    return text.removesuffix(".0")


def check_count(n: int, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise UsageError(f"{name} must be at least 1, got " + Param(name, n, str))
    if n > MAX_VALUES:
        raise UsageError(Param(name, n, f"{n:,}") + f": at most {MAX_VALUES:,} values")


def _read_file(path: str) -> tuple[np.ndarray, str]:
    from fmtcli.inputs import pick

    source = pick.pick_file(path, purpose="to sum", taker="fmt sum")
    where = pick.where(path)
    if source.size > MAX_VALUES:
        raise DataError(f"{where}: {source.size:,} values (at most {MAX_VALUES:,})")
    if source.size == 0:
        raise DataError(f"{where} holds no values")
    values = np.asarray(source.array(), dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(values)
    if bad.any():
        index = int(np.argmax(bad))
        raise DataError(f"{where}: the values must be finite, value {index:,} is "
                        f"{values[index]}")
    return values, where


def parse_order(order: str) -> tuple[str, int | None]:
    """``sequential``, ``pairwise``, ``kahan`` or ``blocked:B`` -> (name, B or None)."""
    text = order.strip().lower()
    if text in ("sequential", "pairwise", "kahan"):
        return text, None
    name, colon, size = text.partition(":")
    if name == "blocked":
        if not colon or not size.strip().isdigit() or len(size.strip()) > 9:
            raise UsageError(f"order {shown(order)}: write blocked:B with a block size, "
                             "e.g. blocked:128")
        block = int(size)
        if not 1 <= block <= MAX_BLOCK:
            raise UsageError(f"order {shown(order)}: the block size must be 1..{MAX_BLOCK:,}")
        return "blocked", block
    raise UsageError(f"unknown order {shown(order)} (sequential, pairwise, kahan or "
                     "blocked:B)")


