"""Which loss scale?  Sweep loss scales 2**0 .. 2**32 over gradient tensors.

Loss scaling multiplies the loss, hence every gradient, by S before the backward pass and
divides by S before the update (Micikevicius et al., 2018, §3.2): ``g_q = cast(g * S) / S``.
For each S this counts, over the nonzero finite gradients, how many flush to zero, land in
the format's subnormal range, overflow (inf/NaN) or, where the cast has no inf/NaN to give
(FP6/FP4, saturating backends), saturate: clipped to max.  A tensor with no nonzero finite
value has nothing to sweep: the result says so and recommends nothing.

The recommended scale (``best_safe``, RULE below): among the scales where nothing overflows
or saturates and whose double does not either (one binade of headroom: the next step's
gradients may be larger), the one that flushes the fewest gradients, then leaves the fewest
subnormal; ties: the smallest scale.  Without such a scale, the same order over every safe
scale.  GradScaler instead settles at the largest safe scale, at the edge.

The counts are exact: the thresholds where the format's rounding changes a value's fate
(smallest value that survives, smallest that rounds to a normal, smallest that overflows)
are found by bisection over float64 with the rounding engine itself.  Because S = 2**e,
``|g| * 2**e >= T`` exactly when ``e >= e*(g) = e_T - e_g + (m_g < m_T)`` (frexp mantissas
m and exponents of |g| and T), so one pass per threshold bins every gradient by the first
scale at which it crosses, and cumulative sums give the counts for all 33 scales at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fmtcli.base.errors import UsageError
from fmtcli.inputs.tensors import TensorInfo, TensorSource, skipped_records
from fmtcli.numerics.backends import Backend, Device, cast, resolve
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import OverflowPolicy, RoundingMode, round_to_format
from fmtcli.numerics.tapered import mantissa_bits_at
from fmtcli.streaming.parallel import default_workers, run_tasks, shared_array
from fmtcli.streaming.stream import CHUNK_ELEMENTS, ChunkReader, chunk_slices, matrix_shape

EXPONENTS = tuple(range(0, 33))
RULE = "no overflow or saturation at S and 2S; then fewest flushed, fewest subnormal, smallest S"
RULE_NO_HEADROOM = ("no overflow or saturation at S (none has it at 2S too); then fewest "
                    "flushed, fewest subnormal, smallest S")
GRAD_SCALER = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
               "growth_interval": 2000}
LOG2_LOW, LOG2_HIGH = -1075, 1024  # histogram range of floor(log2 |g|): all of float64


def _first_true(predicate, low: float, high: float) -> float:
    """Smallest positive float64 v in (low, high] with predicate(v), by bisection on the
    bit patterns (predicate must be monotone: False below, True from some value on)."""
    lo, hi = int(np.float64(low).view(np.uint64)), int(np.float64(high).view(np.uint64))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predicate(np.uint64(mid).view(np.float64)):
            hi = mid
        else:
            lo = mid
    return float(np.uint64(hi).view(np.float64))


def _past_max(spec: FormatSpec) -> float:
    """Smallest value that nearest-even rounding takes past max (where a cast without
    inf/NaN clips it): max + ulp/2, the tie itself when max's last mantissa bit is odd (the
    tie rounds up to the even value beyond), else just above it (E4M3's 448 is even)."""
    top = math.frexp(spec.max)[1] - 1
    ulp = 2.0 ** (top - mantissa_bits_at(spec, top))  # a tapered format's top binade's
    tie = spec.max + ulp / 2
    return tie if int(spec.max / ulp) % 2 else float(np.nextafter(tie, math.inf))


@dataclass(frozen=True)
class Thresholds:
    """Where the format's nearest-even rounding changes a positive value's fate: float64
    thresholds, right for float32 data too (rounding depends on the value, not its type)."""

    kept: float  # smallest value that does not flush to zero
    normal: float  # smallest value that rounds to a normal value
    overflow: float  # smallest value that becomes inf/NaN (math.inf if nothing does)
    saturate: float = math.inf  # smallest value clipped to max, where the cast never overflows

    @classmethod
    def of(cls, spec: FormatSpec, overflow: OverflowPolicy = OverflowPolicy.IEEE,
           backend: Backend = Backend.NUMPY, device: Device = Device.CPU) -> Thresholds:
        def rounds(v):
            x = np.array([v], np.float64)
            if backend is not Backend.NUMPY:
                return float(cast(x, spec, backend, device)[0])
            return float(round_to_format(x, spec, RoundingMode.NEAREST_EVEN, overflow)[0])

        tiny = float(np.finfo(np.float64).smallest_subnormal)
        top = float(np.finfo(np.float64).max)
        kept = _first_true(lambda v: rounds(v) != 0, 0.0, top)
        normal = _first_true(lambda v: rounds(v) >= spec.smallest_normal, tiny, top)
        if math.isfinite(rounds(top)):  # no inf/NaN: beyond max the cast clips
            return cls(kept, normal, math.inf, _past_max(spec))
        over = _first_true(lambda v: not math.isfinite(rounds(v)), tiny, top)
        return cls(kept, normal, over)


@dataclass(frozen=True)
class ScaleRow:
    exponent: int
    flushed: int
    subnormal: int
    overflow: int
    nonzero: int
    saturated: int = 0

    @property
    def scale(self) -> float:
        return 2.0 ** self.exponent

    @property
    def kept(self) -> int:
        """Neither flushed nor overflowed nor saturated (subnormal ones are kept)."""
        return self.nonzero - self.flushed - self.overflow - self.saturated

    @property
    def safe(self) -> bool:
        return self.overflow == 0 and self.saturated == 0

    def fraction(self, count: int) -> float:
        """A count of this row as a fraction of the nonzero finite gradients."""
        return count / max(self.nonzero, 1)

    def to_dict(self) -> dict:
        """Counts with their fraction of the nonzero finite gradients."""
        out = {"scale": self.scale, "log2_scale": self.exponent}
        for key in ("flushed", "subnormal", "overflow", "saturated", "kept"):
            out[key] = getattr(self, key)
            out[f"{key}_fraction"] = self.fraction(getattr(self, key))
        return out


@dataclass(frozen=True)
class GradScalerOutcome:
    """Where torch.amp.GradScaler's defaults (``GRAD_SCALER``) settle: the exponent of the
    scale (None: it overflows at every scale swept), about how many steps it takes, and
    whether that is the top of the sweep (it would grow further)."""

    settles_at_log2: int | None
    steps_to_settle: int | None
    capped_at_sweep: bool

    def to_dict(self) -> dict:
        settle = self.settles_at_log2
        return {**GRAD_SCALER, "settles_at": None if settle is None else 2.0 ** settle,
                "settles_at_log2": settle, "steps_to_settle": self.steps_to_settle,
                "capped_at_sweep": self.capped_at_sweep}


@dataclass(frozen=True)
class LossScaleResult:
    format: str
    thresholds: Thresholds
    nonzero: int
    count: int
    rows: tuple[ScaleRow, ...]
    log2_histogram: dict  # floor(log2|g|) -> count, nonzero finite gradients
    tensors: tuple[TensorInfo, ...]
    skipped: tuple[TensorInfo, ...] = ()

    @property
    def clips(self) -> bool:
        """Whether the cast gives no inf/NaN here: values beyond max are clipped (saturated)."""
        return math.isfinite(self.thresholds.saturate)

    @property
    def safe(self) -> list[ScaleRow]:
        """Scales where nothing overflows (a single overflow makes a mixed-precision step be
        skipped) or saturates."""
        return [r for r in self.rows if r.safe]

    @property
    def notes(self) -> list[str]:
        if self.nonzero:
            return []
        return ["nothing to sweep: no nonzero finite gradient (only zeros, NaN or inf), so no "
                "scale is recommended"]

    @property
    def most_kept(self) -> ScaleRow | None:
        """The scale that keeps the most gradients (fewest flushed, overflowed or saturated);
        the smallest such scale on ties (most headroom)."""
        if not self.nonzero:
            return None
        return min(self.rows, key=lambda r: (r.nonzero - r.kept, r.exponent))

    @property
    def best_safe_rule(self) -> str:
        """The rule ``best_safe`` was chosen by (``RULE``, or ``RULE_NO_HEADROOM``)."""
        return self._best_safe()[1]

    def _best_safe(self) -> tuple[ScaleRow | None, str]:
        safe = self.safe
        by_exponent = {r.exponent: r for r in self.rows}
        roomy = [r for r in safe if r.exponent + 1 not in by_exponent
                 or by_exponent[r.exponent + 1].safe]
        rule = RULE if roomy else RULE_NO_HEADROOM
        pool = roomy or safe
        if not self.nonzero or not pool:
            return None, rule
        return min(pool, key=lambda r: (r.flushed, r.subnormal, r.exponent)), rule

    @property
    def best_safe(self) -> ScaleRow | None:
        """The recommended scale, by ``RULE`` (None with nothing to sweep or nothing safe)."""
        return self._best_safe()[0]

    @property
    def grad_scaler(self) -> GradScalerOutcome:
        """Where torch.amp.GradScaler's defaults settle for this tensor seen every step:
        from 2**16 it halves on each overflowing step and doubles after 2000 clean ones, so
        it ends at the largest scale without overflow (then keeps probing twice that and
        backing off every 2000 steps)."""
        start = int(math.log2(GRAD_SCALER["init_scale"]))
        by_exponent = {r.exponent: r for r in self.rows}
        clean = [e for e in by_exponent if by_exponent[e].overflow == 0]
        if not clean:
            settle = None  # below 2**0: overflows at every scale swept
        elif min(clean) > start:
            settle = min(clean)
        else:
            settle = start
            while settle in by_exponent and by_exponent[settle].overflow:  # backs off
                settle -= 1
            while settle + 1 in by_exponent and not by_exponent[settle + 1].overflow:  # grows
                settle += 1
        steps = None
        if settle is not None:
            growth = max(0, settle - start) * GRAD_SCALER["growth_interval"]
            steps = growth + max(0, start - settle)  # each backoff costs one skipped step
        return GradScalerOutcome(settle, steps, settle == max(by_exponent)
                                 if settle is not None else False)

    def to_dict(self) -> dict:
        safe = self.safe
        best_safe, rule = self._best_safe()
        most_kept = self.most_kept
        t = self.thresholds
        return {
            "format": self.format, "count": self.count, "nonzero": self.nonzero,
            "thresholds": {"kept": t.kept, "normal": t.normal, "overflow": t.overflow,
                           "saturate": t.saturate},
            "scales": [r.to_dict() for r in self.rows],
            "safe_range": {"min": safe[0].scale, "max": safe[-1].scale} if safe else None,
            "most_kept": None if most_kept is None else most_kept.to_dict(),
            "best_safe": None if best_safe is None else {**best_safe.to_dict(), "rule": rule},
            "grad_scaler": self.grad_scaler.to_dict(),
            "log2_histogram": [{"log2": k, "count": v}
                               for k, v in sorted(self.log2_histogram.items())],
            "tensors": [t.to_dict() for t in self.tensors],
            "skipped": skipped_records(self.skipped),
            "notes": self.notes,
        }


def sweep_loss_scales(sources: list[TensorSource], spec: FormatSpec, *,
                      exponents=EXPONENTS, chunk_elements: int = CHUNK_ELEMENTS,
                      workers: int | None = None, backend: Backend | str = Backend.NUMPY,
                      device: Device | str = Device.CPU) -> LossScaleResult:
    """Counts of flushed / subnormal / overflowing (or saturating) nonzero gradients for every
    2**e (the thresholds from ``backend``'s cast: torch's saturating FP8 casts clip instead
    of overflowing, and are counted as saturated)."""
    if not spec.has_zero:
        raise UsageError(f"{spec.name} has no zero: loss scaling asks what flushes to zero")
    thresholds = Thresholds.of(spec, OverflowPolicy.IEEE, *resolve(backend, device, spec))
    exps = np.array(exponents, dtype=np.int64)
    if exps.size == 0 or np.any(np.diff(exps) != 1):
        raise UsageError("loss-scale exponents must be consecutive integers")
    low, span = int(exps[0]), len(exps) + 1  # first-crossing bins: low .. high, then "never"
    limits = [thresholds.kept, thresholds.normal, thresholds.overflow, thresholds.saturate]
    workers = default_workers() if workers is None else workers
    usable = [s for s in sources if s.skipped is None]
    n_bins = LOG2_HIGH - LOG2_LOW + 1
    totals = np.zeros((len(exps), 4), np.int64)  # flushed, subnormal, overflow, saturated
    histogram = np.zeros(n_bins, np.int64)
    nonzero = count = 0
    for source in usable:
        reader = ChunkReader(source)
        try:
            rows, cols = matrix_shape(source.shape)
            chunks = chunk_slices(rows, cols, [], chunk_elements)
            w = max(1, min(workers, len(chunks)))
            counts = shared_array((w, len(limits), span), np.int64)
            hist = shared_array((w, n_bins), np.int64)
            sizes = shared_array((w, 2), np.int64)

            def task(index: int, worker: int, reader=reader, chunks=chunks, counts=counts,
                     hist=hist, sizes=sizes) -> int:
                x = reader.read(*chunks[index]).reshape(-1)
                a = np.abs(x[np.isfinite(x) & (x != 0)]).astype(np.float64)
                sizes[worker] += (x.size, a.size)
                mantissa, exponent = np.frexp(a)
                for k, limit in enumerate(limits):
                    if not math.isfinite(limit):
                        continue  # nothing overflows (or saturates) at any scale
                    m_t, e_t = math.frexp(limit)
                    first = e_t - exponent + (mantissa < m_t)  # first e with |g| 2**e >= T
                    np.clip(first - low, 0, span - 1, out=first)
                    counts[worker, k] += np.bincount(first, minlength=span)
                hist[worker] += np.bincount(exponent - 1 - LOG2_LOW, minlength=n_bins)
                return x.size

            run_tasks(task, len(chunks), w)
        finally:
            reader.close()
        crossed = np.cumsum(counts.sum(axis=0), axis=1)[:, :len(exps)]  # crossed by 2**e
        usable_n = int(sizes[:, 1].sum())
        totals += np.stack([usable_n - crossed[0], crossed[0] - crossed[1], crossed[2],
                            crossed[3]], axis=1)
        histogram += hist.sum(axis=0)
        count += int(sizes[:, 0].sum())
        nonzero += int(sizes[:, 1].sum())
    rows = tuple(ScaleRow(int(e), int(f), int(s), int(o), nonzero, int(c))
                 for e, (f, s, o, c) in zip(exps, totals))
    hist = {int(i + LOG2_LOW): int(c) for i, c in enumerate(histogram) if c}
    return LossScaleResult(spec.name, thresholds, nonzero, count, rows, hist,
                           tuple(s.info() for s in usable),
                           tuple(s.info() for s in sources if s.skipped is not None))


def example_gradients(seed: int = 0) -> TensorSource:
    """A synthetic gradient tensor in the spirit of Micikevicius et al. (2018), Fig. 3: 2**20
    values whose log2|g| is normal with mean -27 and deviation 5 (random signs), so about
    three quarters lie below FP16's smallest subnormal (2**-24) and vanish without loss
    scaling, while the largest come within a factor 2**16 of FP16's max, so the largest loss
    scales overflow."""
    rng = np.random.default_rng(seed)
    log2 = rng.normal(-27.0, 5.0, 1 << 20)
    sign = np.where(rng.random(1 << 20) < 0.5, -1.0, 1.0)
    data = (sign * np.exp2(log2)).astype(np.float32)
    return TensorSource("<built-in gradients>", None, data.shape, "float32", lambda: data)
