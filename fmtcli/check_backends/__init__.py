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

ml_dtypes' releases differ from each other on a few inputs (``ML_DTYPES_CASES``): 0.5 and
0.6 cast float64 through float32 (68.00000357 becomes 64 in float8_e4m3fn, not 72) and
round the float32 subnormals just above 2**-127 up to 2**-126 in E8M0; 0.5.0 also sent E8M0
ties to the even code (3 became 2, not 4; 0.5.3 goes up); 0.7 does as the engine on all
three.  Each is
cast by the installed ml_dtypes on every run (``ml_dtypes_cases``), never assumed from its
version.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from fmtcli.numerics.backends import Backend, Device, available_backends, cast
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import all_values, round_to_format

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
    # by value: a tie among the float16/bfloat16 patterns or the random ones is a tie too
    is_tie = np.isin(x, ties) if ties.size else np.zeros(x.size, bool)
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


#: Inputs on which ml_dtypes' releases round differently: (key, format, input, its dtype,
#: what the engine does, what a backend that stores another value does).
ML_DTYPES_CASES = (
    ("float64_input", "float8_e4m3fn", 68.00000357, "float64",
     "rounds once", "via float32"),
    ("e8m0_subnormal", "float8_e8m0fnu", 1.25 * 2.0**-127, "float32",
     "nearest", "rounds up"),
    ("e8m0_tie", "float8_e8m0fnu", 3.0, "float32",
     "tie up", "tie to even"),
)


@dataclass(frozen=True)
class PeerCase:
    """One of ``ML_DTYPES_CASES`` as cast here: the engine's value and the backend's."""

    key: str
    format: str
    input: float
    input_dtype: str
    engine: float
    backend: float
    behaviour: str  # what the backend does, in words

    @property
    def agrees(self) -> bool:
        return self.engine == self.backend or (self.engine != self.engine
                                               and self.backend != self.backend)

    def to_dict(self) -> dict:
        return {"case": self.key, "format": self.format, "input": self.input,
                "input_dtype": self.input_dtype, "engine": self.engine,
                "backend": self.backend, "agrees": self.agrees, "behaviour": self.behaviour}


def ml_dtypes_cases() -> tuple[PeerCase, ...]:
    """``ML_DTYPES_CASES`` cast by the engine and by the installed ml_dtypes."""
    from fmtcli.numerics.formats import REGISTRY

    out = []
    for key, name, value, dtype, same, other in ML_DTYPES_CASES:
        spec = REGISTRY[name]
        x = np.array([value], dtype=dtype)
        case = PeerCase(key, name, value, dtype, float(round_to_format(x, spec)[0]),
                        float(cast(x, spec, Backend.ML_DTYPES)[0]), same)
        out.append(case if case.agrees else replace(case, behaviour=other))
    return tuple(out)


@dataclass(frozen=True)
class Environment:
    """What was checked: ml_dtypes' version and its answers on ``ML_DTYPES_CASES``, torch's
    version (None: not installed), and the compiled chunk kernel of ``fmt quantize``
    (``quantize.native.KernelStatus``; None where the caller did not ask)."""

    ml_dtypes_version: str
    ml_dtypes_cases: tuple[PeerCase, ...]
    torch_version: str | None
    kernel: object | None = None

    def to_dict(self) -> dict:
        return {"ml_dtypes": {"version": self.ml_dtypes_version,
                              "cases": [c.to_dict() for c in self.ml_dtypes_cases]},
                "torch": None if self.torch_version is None else {
                    "version": self.torch_version},
                "kernel": None if self.kernel is None else self.kernel.to_dict()}


def environment(kernel=None) -> Environment:
    """The ``Environment`` of this process (imports torch where it is installed)."""
    try:
        import torch
        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = None
    return Environment(ml_dtypes.__version__, ml_dtypes_cases(), torch_version, kernel)


@dataclass(frozen=True)
class ConformanceResult:
    reports: tuple[BackendReport, ...]
    environment: Environment | None = None

    def to_dict(self) -> dict:
        return {"environment": None if self.environment is None
                else self.environment.to_dict(),
                "reports": [r.to_dict() for r in self.reports]}


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


def check_backends(specs: list[FormatSpec], seed: int = 0, kernel=None) -> ConformanceResult:
    """Every available backend other than the engine, on every format, against the engine;
    with the ``environment`` (``kernel``: the compiled kernel's status, to report with it)."""
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
    return ConformanceResult(tuple(reports), environment(kernel))
