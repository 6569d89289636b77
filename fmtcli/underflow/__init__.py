"""Will this value survive? Store values in formats, with and without a (loss) scale.

Scale direction, as everywhere in fmtcli: ``x_q = cast(x * scale) / scale``.  The scaled
value ``x * scale`` follows ``product`` (``scaling.Product``): by default ``exact`` -- the
values are typed literals, taken in float64, and the product is float64 (exact for
power-of-two scales, the usual loss scales); ``float32`` rounds the value and the scale to
float32 and multiplies (and divides back) in float32, as ``fmt quantize`` does by default.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from fmtcli.base.errors import Param, UsageError
from fmtcli.numerics.backends import Backend, Device, cast_with_policy, resolve
from fmtcli.numerics.fates import FATES, Fate, classify, classify_scaled, relative_error
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import OverflowPolicy, RoundingMode, apply_range, round_unbounded
from fmtcli.numerics.scaling import F32_MAX, F32_TINY, Product


@dataclass(frozen=True)
class Stored:
    """One value stored in one format."""

    stored: float
    rel_error: float
    fate: Fate


@dataclass(frozen=True)
class UnderflowRow:
    """One (value, format, scale) combination.  ``scale`` is None for the unscaled row."""

    value: float
    format: str
    plain: Stored
    item: int = 0  # position of the value among the inputs (rows are grouped by it)
    scale: float | None = None
    scaled: float | None = None
    scaled_store: Stored | None = None
    recovered: float | None = None
    recovered_rel_error: float | None = None

    @property
    def survives(self) -> bool:
        """Whether the value comes back: its (scaled) fate is not flushed, overflow or
        invalid, and the recovered value is finite and nonzero (zero for a zero input)."""
        store = self.scaled_store or self.plain
        if store.fate in (Fate.FLUSHED, Fate.OVERFLOW, Fate.INVALID):
            return False
        back = self.recovered if self.scale is not None else store.stored
        if math.isnan(self.value) or math.isinf(self.value):
            return True
        return math.isfinite(back) and (back != 0) == (self.value != 0)

    def to_dict(self) -> dict:
        out = {"value": self.value, "format": self.format, "scale": self.scale,
               "stored": self.plain.stored, "rel_error": self.plain.rel_error,
               "status": self.plain.fate.value}
        if self.scale is not None:
            out.update({"scaled": self.scaled, "scaled_stored": self.scaled_store.stored,
                        "scaled_rel_error": self.scaled_store.rel_error,
                        "scaled_status": self.scaled_store.fate.value,
                        "recovered": self.recovered,
                        "recovered_rel_error": self.recovered_rel_error})
        out["survives"] = self.survives
        return out


@dataclass(frozen=True)
class UnderflowResult:
    rows: tuple[UnderflowRow, ...]
    rounding: RoundingMode
    overflow: OverflowPolicy

    @property
    def scaled(self) -> bool:
        return any(row.scale is not None for row in self.rows)

    def to_dict(self) -> list[dict]:
        return [row.to_dict() for row in self.rows]


def store(x: np.ndarray, spec: FormatSpec, rounding: RoundingMode, overflow: OverflowPolicy,
          rng: np.random.Generator | None, backend: Backend = Backend.NUMPY,
          device: Device = Device.CPU) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round float64 ``x`` into ``spec``: (stored values, relative errors, fate indices).
    Another backend stores the values with its own cast (nearest-even, its own overflow)."""
    with np.errstate(invalid="ignore", over="ignore"):
        unbounded = round_unbounded(x, spec, rounding, rng)
        if backend is Backend.NUMPY:
            stored = apply_range(x, unbounded.copy(), spec, rounding, overflow)
        else:  # saturate clamps before the backend's cast, as recipes do
            stored = cast_with_policy(x, spec, backend, device, overflow).astype(np.float64)
    return stored, relative_error(x, stored), classify(x, unbounded, stored, spec)


def _to_float32_where_finite(q: np.ndarray) -> np.ndarray:
    """q rounded to float32 (as float64 values) where float32 holds it, else q."""
    narrow = q.astype(np.float32).astype(np.float64)
    return np.where(np.isfinite(narrow) | ~np.isfinite(q), narrow, q)


def underflow_table(values: list[float], formats: list[FormatSpec], scales: list[float] = (),
                    rounding: RoundingMode = RoundingMode.NEAREST_EVEN,
                    overflow: OverflowPolicy = OverflowPolicy.IEEE,
                    seed: int = 0, backend: Backend | str = Backend.NUMPY,
                    device: Device | str = Device.CPU,
                    product: Product | str = Product.EXACT) -> UnderflowResult:
    """Store each value in each format, unscaled and under each scale.

    Returns one row per (value, format, scale); with no scales, one row per (value, format)
    with ``scale=None``.  Stochastic rounding draws from a generator seeded by ``seed`` and
    the format's name, so a format's draws do not depend on which others are listed.
    """
    if not values:
        raise UsageError("no values given")
    if not formats:
        raise UsageError("no formats given")
    if seed < 0:
        raise UsageError(Param("seed", seed) + ": a seed must be >= 0")
    narrow = Product(product) is Product.FLOAT32
    for scale in scales:
        if not np.isfinite(scale) or scale <= 0:
            raise UsageError(f"a scale must be a positive finite number, got {scale!r}")
        if narrow and not (F32_TINY <= scale <= F32_MAX):
            raise UsageError(f"the scale {scale!r} is not a normal float32 (the float32 "
                             "product)", "use " + Param("product", "exact"))
    x = np.asarray(values, dtype=np.float64)
    rows_by_value: list[list[UnderflowRow]] = [[] for _ in values]
    for spec in formats:
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
        chosen = resolve(backend, device, spec, rounding=rounding)  # refused before torch loads
        stored, rel, fate = store(x, spec, rounding, overflow, rng, *chosen)
        plain = [Stored(float(s), float(r), FATES[f]) for s, r, f in zip(stored, rel, fate)]
        per_scale = []
        for scale in scales:
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                if narrow:  # float32 value times float32 scale, rounded to float32
                    s32 = np.float32(scale)
                    scaled = (x.astype(np.float32) * s32).astype(np.float64)
                else:
                    scaled = x * scale
                s_stored, s_rel, s_fate = store(scaled, spec, rounding, overflow, rng, *chosen)
                # float32: s_stored / s32 in float64 rounded once to float32 is the float32
                # quotient (53 >= 2 * 24 + 2 bits); a wide format's stored value past
                # float32's max (e8m3fn) still divides exactly in float64
                recovered = (_to_float32_where_finite(s_stored / np.float64(s32)) if narrow
                             else s_stored / scale)
            per_scale.append((scale, scaled, s_stored, s_rel, classify_scaled(x, scaled, s_fate),
                              recovered, relative_error(x, recovered)))
        for i, value in enumerate(values):
            rows = rows_by_value[i]
            if not scales:
                rows.append(UnderflowRow(float(value), spec.name, plain[i], item=i))
            for scale, scaled, s_stored, s_rel, s_fate, recovered, rec_rel in per_scale:
                rows.append(UnderflowRow(
                    float(value), spec.name, plain[i], item=i, scale=float(scale),
                    scaled=float(scaled[i]),
                    scaled_store=Stored(float(s_stored[i]), float(s_rel[i]), FATES[s_fate[i]]),
                    recovered=float(recovered[i]), recovered_rel_error=float(rec_rel[i])))
    return UnderflowResult(tuple(row for rows in rows_by_value for row in rows), rounding, overflow)
