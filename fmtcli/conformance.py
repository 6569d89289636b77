"""Can I trust this cast?  Every available backend against fmtcli's engine, class by class.

Inputs (float32), for each format: every float16 and every bfloat16 bit pattern; for
formats of up to 16 bits every code point of the format itself (in and out); random
float32 over all binades (seeded); the exact midpoints between neighbouring values of the
format (ties) and the float32 values just below and above them; the subnormal range;
values around and beyond max; +-0, +-inf and NaN.

The reference is the engine (nearest-even, IEEE overflow), which is bit-exact with
ml_dtypes for float32 input except where ml_dtypes is wrong or silent (see rounding).
Mismatches are sorted into classes by what the input is (first that applies): ``nan``
(input NaN), ``inf`` (input +-inf), ``overflow`` (|x| beyond max), ``zero`` (input +-0),
``subnormal`` (below the smallest normal), ``tie`` (an exact midpoint), ``other``; and
within each, ``nan_payload`` (both NaN, other bits), ``sign_of_zero`` (+0 against -0) and
``value`` (a real difference).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .backends import Backend, Device, available_backends, cast
from .formats import FormatSpec
from .rounding import all_values, round_to_format

CLASSES = ("nan", "inf", "overflow", "zero", "subnormal", "tie", "other")
KINDS = ("value", "nan_payload", "sign_of_zero")


def conformance_inputs(spec: FormatSpec, seed: int = 0, random_count: int = 1 << 18
                       ) -> tuple[np.ndarray, np.ndarray]:
    """float32 inputs and a boolean mask of which are exact ties of the format."""
    parts = [np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
             .astype(np.float32),
             np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
             .astype(np.float32)]
    rng = np.random.default_rng(seed)
    parts.append(rng.integers(0, 1 << 32, random_count, dtype=np.uint64)
                 .astype(np.uint32).view(np.float32))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]
    for k in (1.0, 1.0001, 1.03, 1.1, 1.5, 2.0, 4.0, 1e3):
        specials += [spec.max * k, -spec.max * k]
    for k in (0.25, 0.5, 0.75, 1.0, 1.5):
        specials += [spec.smallest_subnormal * k, -spec.smallest_subnormal * k]
    with np.errstate(over="ignore"):
        parts.append(np.array(specials, dtype=np.float64).astype(np.float32))
    ties = np.zeros(0, np.float32)
    if spec.bits <= 16:
        values = all_values(spec)
        finite = np.unique(values[np.isfinite(values)])
        parts.append(values.astype(np.float32))
        mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
        mids = mids[(mids.astype(np.float64) == (finite[:-1] + finite[1:]) / 2)]  # exact only
        ties = np.concatenate([mids, -mids])
    ties_around = [ties, np.nextafter(ties, np.float32(np.inf)),
                   np.nextafter(ties, np.float32(-np.inf))]
    x = np.concatenate(parts + ties_around).astype(np.float32)
    is_tie = np.zeros(x.size, bool)
    if ties.size:
        start = sum(p.size for p in parts)
        is_tie[start:start + ties.size] = True
    return x, is_tie


def classify_inputs(x: np.ndarray, is_tie: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """Index into CLASSES for every input (first class that applies)."""
    with np.errstate(invalid="ignore"):
        a = np.abs(x.astype(np.float64))
    cls = np.full(x.size, CLASSES.index("other"), np.int8)
    cls[is_tie] = CLASSES.index("tie")
    cls[(a < spec.smallest_normal) & (a > 0)] = CLASSES.index("subnormal")
    cls[a == 0] = CLASSES.index("zero")
    cls[(a > spec.max) & np.isfinite(a)] = CLASSES.index("overflow")
    cls[np.isinf(a)] = CLASSES.index("inf")
    cls[np.isnan(a)] = CLASSES.index("nan")
    return cls


@dataclass(frozen=True)
class Mismatch:
    input_class: str
    kind: str
    count: int
    examples: tuple[tuple[float, float, float], ...]  # (input, reference, backend)

    def to_dict(self) -> dict:
        return {"class": self.input_class, "kind": self.kind, "count": self.count,
                "examples": [{"input": i, "reference": r, "backend": b}
                             for i, r, b in self.examples]}


@dataclass(frozen=True)
class BackendReport:
    format: str
    backend: str
    device: str
    inputs: int
    mismatches: tuple[Mismatch, ...]
    error: str | None = None

    @property
    def agrees(self) -> bool:
        return self.error is None and not any(m.kind == "value" for m in self.mismatches)

    @property
    def value_mismatches(self) -> int:
        """Inputs whose values differ for real (not NaN payloads, not the sign of zero)."""
        return sum(m.count for m in self.mismatches if m.kind == "value")

    def to_dict(self) -> dict:
        return {"format": self.format, "backend": self.backend, "device": self.device,
                "inputs": self.inputs, "agrees": self.agrees,
                "value_mismatches": self.value_mismatches,
                "mismatches": [m.to_dict() for m in self.mismatches], "error": self.error}


@dataclass(frozen=True)
class ConformanceResult:
    reports: tuple[BackendReport, ...]

    def to_dict(self) -> list[dict]:
        return [r.to_dict() for r in self.reports]


def compare(x, is_tie, reference: np.ndarray, other: np.ndarray, spec: FormatSpec,
            examples: int = 3) -> tuple[Mismatch, ...]:
    """Mismatches of ``other`` against ``reference`` by input class and kind."""
    ref_bits, other_bits = reference.view(np.uint32), other.view(np.uint32)
    differ = ref_bits != other_bits
    both_nan = np.isnan(reference) & np.isnan(other)
    zeros = (reference == 0) & (other == 0)
    kind = np.where(both_nan, 1, np.where(zeros, 2, 0))
    classes = classify_inputs(x, is_tie, spec)
    out = []
    for c, name in enumerate(CLASSES):
        for k, kind_name in enumerate(KINDS):
            where = np.flatnonzero(differ & (classes == c) & (kind == k))
            if where.size:
                picks = where[:examples]
                out.append(Mismatch(name, kind_name, int(where.size), tuple(
                    (float(x[i]), float(reference[i]), float(other[i])) for i in picks)))
    return tuple(out)


def check_backends(specs: list[FormatSpec], seed: int = 0) -> ConformanceResult:
    """Every available backend other than the engine, on every format, against the engine."""
    reports = []
    for spec in specs:
        x, is_tie = conformance_inputs(spec, seed)
        reference = round_to_format(x, spec)
        for backend, device in available_backends(spec):
            if backend is Backend.NUMPY:
                continue
            try:
                other = cast(x, spec, backend, device)
            except Exception as error:
                reports.append(BackendReport(spec.name, backend.value, device.value, x.size,
                                             (), f"{type(error).__name__}: {error}"))
                continue
            reports.append(BackendReport(spec.name, backend.value, device.value, x.size,
                                         compare(x, is_tie, reference, other, spec)))
        if len(available_backends(spec)) < 2:
            reports.append(BackendReport(spec.name, "-", Device.CPU.value, x.size, (),
                                         "no backend besides the engine casts to this format"))
    return ConformanceResult(tuple(reports))
