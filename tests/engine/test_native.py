"""The compiled chunk kernel (``fmtcli/numerics/_native.c``) against the numpy path.

The two must give the same statistics to the bit.  Engine level: the same ``quantize`` run
with the compiled kernel and with ``FMTCLI_KERNEL=numpy``, compared field for field (the JSON
document and every accumulator, histogram, block fact and worst block), on random,
heavy-tailed, adversarial (ties, subnormals, NaN/inf, zero blocks, negative zeros, ragged
shapes) and real-checkpoint data; each also checks which chunks the compiled kernel did (a
counting proxy stands in for the module), so that none passes with the kernel never
running.  Kernel level: ``sum_squares``, ``widen_f16``, ``tile_amax`` and
``quantize_chunk`` (element for element, histogram keys next to bin edges) against their
numpy formulations; bad arguments raise, never crash.

``FMTCLI_REQUIRE_NATIVE=1`` makes a missing build a failure (CI, where it must be built);
without it the comparison tests skip where the extension is not built.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import peer_behaviour as peer
import pytest
from inputs import facenet_weights
from oracle import write_safetensors

from fmtcli.base.choices import Granularity
from fmtcli.engine import chunk
from fmtcli.engine import run as engine
from fmtcli.inputs.tensors import TensorSource, load_path
from fmtcli.numerics import native
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.rounding import OverflowPolicy, round_float32_nearest_even
from fmtcli.numerics.scaling import ScaleRule
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming import metrics
from fmtcli.streaming.parallel import run_tasks, shared_array

ENV = native.ENV
E4M3, E5M2 = get_format("float8_e4m3fn"), get_format("float8_e5m2")
FP4 = get_format("float4_e2m1fn")


def needs_kernel() -> None:
    if not native.built():
        pytest.skip("the compiled kernel is not built (pip install -e .)")


# -- the counting proxy ----------------------------------------------------------------------

CALLS = ("quantize_chunk", "quantize_chunk:none", "tile_amax", "sum_squares", "widen_f16",
         "amax_scales", "distinct_bits")


class Counting:
    """Stands in for the compiled module: counts each function's calls (``quantize_chunk``
    apart by whether it returned statistics or None) in memory that forked workers share."""

    def __init__(self, real, counts: np.ndarray) -> None:
        self._real, self._counts = real, counts

    def __getattr__(self, name):
        real, counts = getattr(self._real, name), self._counts

        def counted(*args, **kwargs):
            result = real(*args, **kwargs)
            none = name == "quantize_chunk" and result is None
            counts[CALLS.index(name + (":none" if none else ""))] += 1
            return result

        return counted


def key_of(scheme) -> str:
    return json.dumps(scheme.to_dict(), sort_keys=True)


class Probe:
    """What the compiled kernel did: calls per function, and per scheme the chunks that
    ``ChunkKernel._run_native`` did (``done``) or gave back to numpy (``declined``)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = shared_array(len(CALLS), np.int64)
        self.outcomes = shared_array((64, 2), np.int64)  # per scheme: done, declined
        self.index: dict[str, int] = {}
        monkeypatch.setattr(native, "_compiled", Counting(native._compiled, self.calls))
        real = chunk.ChunkKernel._run_native
        probe = self

        def run_native(kernel, *args):
            got = real(kernel, *args)
            slot = probe.index.get(key_of(kernel.plan.scheme), 63)
            probe.outcomes[slot, int(got is None)] += 1
            return got

        monkeypatch.setattr(chunk.ChunkKernel, "_run_native", run_native)

    def watch(self, schemes) -> None:
        self.index = {key_of(s): i for i, s in enumerate(schemes)}
        self.outcomes[:] = 0

    def count(self, name: str) -> int:
        return int(self.calls[CALLS.index(name)])

    def done(self, i: int) -> int:
        return int(self.outcomes[i, 0])

    def declined(self, i: int) -> int:
        return int(self.outcomes[i, 1])


@pytest.fixture
def probe(monkeypatch) -> Probe:
    needs_kernel()
    monkeypatch.delenv(ENV, raising=False)
    return Probe(monkeypatch)


def both_ways(monkeypatch, probe: Probe, run):
    """``run()`` with the compiled kernel, then with FMTCLI_KERNEL=numpy (which must not
    touch the kernel at all); the two results and the outcomes of the compiled run."""
    monkeypatch.delenv(ENV, raising=False)
    compiled = run()
    calls, outcomes = probe.calls.copy(), probe.outcomes.copy()
    monkeypatch.setenv(ENV, "numpy")
    try:
        reference = run()
    finally:
        monkeypatch.delenv(ENV)
    assert np.array_equal(probe.calls, calls), "the numpy run called the compiled kernel"
    assert np.array_equal(probe.outcomes, outcomes)
    return compiled, reference


# -- comparing results -------------------------------------------------------------------------

# figures made of float sums, compared within ``peer.sum_gap`` where numpy's sums are not the
# kernel's pairwise tree (numpy < 2.3): sums of squares and the mean square (relative to
# themselves: their terms are >= 0), the signed sum of errors and the bias (relative to the
# sum of |err| <= sqrt(count * sum_err2), Cauchy-Schwarz), SQNR in dB (10 log10 of a ratio
# of two such sums)
SQUARES = {"sum_err2", "sum_x2", "sum_err2_big", "sum_x2_big", "sum_err2_tiny", "sum_x2_tiny",
           "mse", "rmse"}
SIGNED = {"sum_err", "bias"}
DECIBELS = {"sqnr_db"}


def _number(v) -> float:
    return float(v)  # a float, or its repr (run_state)


def _allowed(key: str, path: str, a, b, parent: dict, gap: float) -> float | None:
    """How far the compiled and numpy figure ``key`` may lie apart (None: to the bit)."""
    if key in SQUARES:
        return 1.01 * gap * max(abs(_number(a)), abs(_number(b)))
    if key == "sum_err":
        return 1.01 * gap * math.sqrt(_number(parent["count"]) * _number(parent["sum_err2"]))
    if key == "bias":
        return 1.01 * gap * _number(parent["rmse"])
    if key in DECIBELS or (key == "mean" and path.endswith(".per_tensor_sqnr_db")):
        return 1.01 * 2 * gap * 10 / math.log(10)
    return None


def differences(a, b, path: str = "", gap: float = 0.0) -> list[str]:
    """Where two JSON-like values differ; floats to the bit (NaN equals NaN, -0.0 is not
    0.0), except that with ``gap`` > 0 the figures made of float sums may differ by what
    ``_allowed`` says."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        found = []
        for k in a:
            allowed = _allowed(k, path, a[k], b[k], b, gap) if gap else None
            if (allowed is not None and a[k] is not None and b[k] is not None
                    and abs(_number(a[k]) - _number(b[k])) <= allowed):
                continue
            found += differences(a[k], b[k], f"{path}.{k}", gap)
        return found
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (u, v) in enumerate(zip(a, b))
                for d in differences(u, v, f"{path}[{i}]", gap)]
    if isinstance(a, float) and isinstance(b, float):
        same = (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                       == math.copysign(1, b))
    else:
        same = type(a) is type(b) and a == b
    return [] if same else [f"{path}: compiled {a!r}, numpy {b!r}"]


def assert_identical(compiled, reference, values: int = 0) -> None:
    """The two results to the bit; where numpy's sums here are not the kernel's pairwise
    tree (``peer.sum_order``), the figures made of sums of up to ``values`` values within
    the two orders' error bounds (``peer.sum_gap``), everything else to the bit."""
    gap = peer.sum_gap(values) if values else 0.0
    found = differences(compiled, reference, gap=gap)
    where = ("" if not gap else f"\n(numpy {np.__version__} sums in blocks of "
             f"{peer.sum_order()}: figures made of sums compared within their error bound, "
             f"{gap:.3g} of the sum of |terms|; all else to the bit)")
    assert not found, "\n".join(found[:25]) + where


def nonzero(counts) -> dict[int, int]:
    counts = np.asarray(counts)
    at = np.flatnonzero(counts)
    return dict(zip(at.tolist(), counts[at].tolist()))


def run_state(run) -> dict:
    """Everything a ``SchemeRun`` holds, floats as their repr (exact)."""
    acc = run.acc
    state = {name: repr(getattr(acc, name)) for name in acc.PACKED}
    state["hist"] = nonzero(acc.hist)
    state["mse"] = repr(acc.mse())
    s = run.scales
    state["scales"] = [s.count, repr(s.low), repr(s.high), s.values.tobytes().hex(), s.capped,
                       s.nan]
    state["exponents"] = None if run.exponents is None else nonzero(run.exponents)
    if run.blocks is not None:
        b = run.blocks
        state["blocks"] = [b.blocks, b.flushing, b.saturating, nonzero(b.fractions)]
    state["worst"] = [repr(v) for v in np.asarray(run.worst).reshape(-1).tolist()]
    return state


def engine_run(monkeypatch, sources, schemes, **options):
    """``quantize(...)``: its JSON document and the state of every tensor's runs."""
    states: list = []
    real = engine.quantize_tensor

    def recording(*args, **kwargs):
        runs, kept = real(*args, **kwargs)
        states.append([run_state(r) for r in runs])
        return runs, kept

    monkeypatch.setattr(engine, "quantize_tensor", recording)
    try:
        doc = quantize(sources, schemes, **options).to_dict()
    finally:
        monkeypatch.setattr(engine, "quantize_tensor", real)
    return {"doc": doc, "runs": states}


def source(x: np.ndarray, name: str = "t.npy") -> TensorSource:
    return TensorSource(name, None, x.shape, "float32", lambda: x)


def values_in(sources) -> int:
    """How many values the sources hold (a bound on any one sum's length)."""
    return sum(math.prod(s.shape) for s in sources)


# -- data ---------------------------------------------------------------------------------------

def signs(rng, shape) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def grid_of(dtype) -> np.ndarray:
    """The non-negative finite values of an ml_dtypes format, ascending."""
    size = 16 if dtype == ml_dtypes.float4_e2m1fn else 256
    values = np.arange(size, dtype=np.uint8).view(dtype).astype(np.float64)
    return np.unique(values[np.isfinite(values) & (values >= 0)])


def ties_rows(rng, dtype, fmax: float, every: int, rows: int) -> np.ndarray:
    """Rows of 128 whose values lie exactly halfway between grid points (and on them),
    with the format's max every ``every`` columns, so that amax and MX block scales are
    exactly 1: the scaled values are ties.  Odd rows also hold the tie just past max
    (rounding to max, even) and the next grid step past max (saturating)."""
    g = grid_of(dtype)
    step = g[-1] - g[-2]
    pool = np.r_[(g[:-1] + g[1:]) / 2, g]
    x = rng.choice(pool, (rows, 128)) * signs(rng, (rows, 128))
    x[:, ::every] = fmax * signs(rng, (rows, 128 // every))
    x[1::2, 1], x[1::2, 2] = g[-1] + step / 2, -(g[-1] + step)
    return x.astype(np.float32)


def edge_values(rng, count: int = 16384) -> np.ndarray:
    """Positive float32 x whose E4M3 rounding at scale 1 has a float32 relative error
    within ``EDGE_ULPS`` ulp of a histogram bin edge (``count`` of them): searched among
    x = g / (1 + e) and g / (1 - e) for the grid points g and the bin edges e."""
    g = grid_of(ml_dtypes.float8_e4m3fn)
    g = g[(g >= 2.0 ** -6) & (g <= 448)]
    keys = np.arange(0x3400, 0x3D80, dtype=np.uint32)  # relative errors 2**-23 .. 2**-4
    edges = (keys << 16).view(np.float32).astype(np.float64)
    x = np.unique(np.r_[(g[:, None] / (1 + edges[None, :])).ravel(),
                        (g[:, None] / (1 - edges[None, :])).ravel()].astype(np.float32))
    x_q = round_float32_nearest_even(x.copy(), E4M3)
    rel = np.abs(x_q - x) / x
    low = rel.view(np.uint32) & 0xFFFF
    near = x[(rel > 0) & ((low + metrics.EDGE_ULPS) % 0x10000 < 2 * metrics.EDGE_ULPS)]
    return rng.choice(near, min(count, near.size), replace=False)


def dataset(name: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if name == "normal":  # 1000 columns: ragged against every block
        return (rng.standard_normal((64, 1000)) * 0.02).astype(np.float32)
    if name == "heavy":  # magnitudes spanning 1e-30 .. 1e30
        mag = 10.0 ** rng.uniform(-30, 30, (48, 1024))
        return (mag * signs(rng, mag.shape)).astype(np.float32)
    if name == "ties":
        return np.concatenate([ties_rows(rng, ml_dtypes.float8_e4m3fn, 448, 128, 32),
                               ties_rows(rng, ml_dtypes.float4_e2m1fn, 6, 16, 32),
                               ties_rows(rng, ml_dtypes.float8_e5m2, 57344, 16, 32)])
    if name == "subnormals":
        x = (rng.standard_normal((64, 512))).astype(np.float32)
        sub = rng.integers(1, 0x800000, (24, 512), dtype=np.uint32).view(np.float32)
        x[8:32] = sub * signs(rng, sub.shape)  # whole blocks of float32 subnormals
        x[32:40] = np.float32(2.0 ** -126) * rng.uniform(0.5, 2, (8, 512))  # around tiny
        tiny = rng.random(x.shape) < 0.2  # values that flush next to larger ones
        x[tiny] *= np.float32(1e-12)
        x[40:48, ::3] = np.float32(1e-44)
        return x
    if name == "nonfinite":  # in a few chunks only: the others stay compiled
        x = rng.standard_normal((64, 1000)).astype(np.float32)
        x[3, 17], x[3, 18] = np.nan, -np.nan
        x[40, 5], x[41, 999] = np.inf, -np.inf
        x.view(np.uint32)[60, 200] = 0x7FC01234  # a NaN payload
        return x
    if name == "zero_blocks":
        x = rng.standard_normal((64, 1000)).astype(np.float32)
        x[8:16] = 0  # all-zero rows (and tiles)
        x[20:40, 128:256] = 0  # all-zero blocks
        x[rng.random(x.shape) < 0.05] = -0.0
        x[50] = -0.0
        return x
    if name == "all_zero":
        return np.zeros((32, 640), np.float32)
    if name == "negative_zero":
        return np.full((16, 300), -0.0, np.float32)
    if name == "long_row":  # a 1-D tensor longer than a chunk: chunked along its columns
        return rng.standard_normal(70001).astype(np.float32)
    if name == "short_1d":
        return (rng.standard_normal(1000) * np.exp(rng.normal(0, 3, 1000))).astype(np.float32)
    if name == "wide_rows":  # per-row tiles longer than the kernel's 4096-value stretches
        return (rng.standard_normal((6, 9000)) * np.exp(rng.normal(0, 2, (6, 9000)))
                ).astype(np.float32)
    if name == "edges":
        x = edge_values(rng)
        return (x * signs(rng, x.shape)).astype(np.float32)
    raise ValueError(name)


DATASETS = ["normal", "heavy", "ties", "subnormals", "nonfinite", "zero_blocks", "all_zero",
            "negative_zero", "long_row", "short_1d", "wide_rows", "edges"]


def schemes() -> list:
    fixed = dict(per=Granularity.TENSOR, scale_rule=ScaleRule.FIXED)
    ieee = OverflowPolicy.IEEE
    return [
        build_scheme(block=128),  # 0
        build_scheme(format=FP4, block=32),
        build_scheme(format=E5M2, block=16),
        build_scheme(per=Granularity.TENSOR),
        build_scheme(per=Granularity.ROW),
        build_scheme(tile="128x128"),  # 5
        build_scheme(recipe="mxfp8"),
        build_scheme(recipe="mxfp4"),
        build_scheme(recipe="nvfp4"),
        build_scheme(block=64, scale_rule=ScaleRule.PERCENTILE, percentile=99.0),
        build_scheme(per=Granularity.TENSOR, scale_rule=ScaleRule.PERCENTILE,  # 10
                     percentile=99.9),
        build_scheme(block=128, margin=2),
        build_scheme(block=128, margin=-2),  # clips: saturates
        build_scheme(block=128, overflow=ieee),  # in range: compiled all the same
        build_scheme(block=128, margin=-2, overflow=ieee),  # past max: numpy's (NaN)
        build_scheme(format=E5M2, per=Granularity.TENSOR, margin=-3, overflow=ieee),  # 15
        build_scheme(fixed_scale=1.0, **fixed),
        build_scheme(format=FP4, fixed_scale=1.0, **fixed),
        build_scheme(format=E5M2, fixed_scale=1.0, **fixed),
    ]


PAST_MAX_IEEE = (14, 15)  # schemes that put values past max without saturating


# -- engine level: the whole quantize result -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", DATASETS)
def test_quantize_gives_the_numpy_path_s_result_to_the_bit(monkeypatch, probe, name):
    x = dataset(name)
    plan = schemes()
    probe.watch(plan)
    compiled, reference = both_ways(monkeypatch, probe, lambda: engine_run(
        monkeypatch, [source(x)], plan, workers=1, chunk_elements=8192, worst_blocks=5))
    assert_identical(compiled, reference, x.size)
    # the compiled kernel did its part: every scheme that keeps to the format's range (or
    # saturates) had chunks done by it; chunks holding inf or NaN and values past max
    # under --overflow ieee went to numpy
    assert probe.count("quantize_chunk") > 0
    ran = {i for i in range(len(plan)) if probe.done(i)}
    declined = {i for i in range(len(plan)) if probe.declined(i)}
    assert ran == set(range(len(plan))) - NEVER_COMPILED.get(name, set(PAST_MAX_IEEE))
    assert declined == DECLINED.get(name, set(PAST_MAX_IEEE))


# Which schemes the compiled kernel does no chunk of, and which have chunks it gives back
# to numpy (the rest: every chunk compiled).  Default: the two --overflow ieee schemes that
# put values past max (every chunk).  nvfp4 on data spanning 60 decades: every chunk has a
# block whose E4M3 scale underflows to 0 (an infinite scale); on the subnormals, some.
# NaN/inf data: their chunks; scales spanning the tensor (per-tensor, its percentile, and a
# 128x128 tile over all 64 rows) are NaN, so every chunk.  Where a chunk keeps within range
# (the ties' E4M3 rows under E5M2's scale, the subnormal and zero rows) ieee stays
# compiled.  (nvfp4 on the heavy data: every chunk declines, but the tensor's amax block,
# measured again alone for the median outside it, keeps within range: compiled.)
NEVER_COMPILED = {"heavy": {14, 15}, "ties": {14}, "subnormals": set(),
                  "nonfinite": {3, 5, 10, 14, 15}, "zero_blocks": set(), "all_zero": set(),
                  "negative_zero": set()}
DECLINED = {"heavy": {8, 14, 15}, "subnormals": {8, 14, 15}, "nonfinite": set(range(19)),
            "all_zero": set(), "negative_zero": set()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["heavy", "nonfinite", "subnormals"])
@pytest.mark.parametrize("chunk_elements, workers", [(4096, 1), (65536, 1), (4096, 2),
                                                     (8192, 2)])
def test_chunk_sizes_and_forked_workers_keep_the_result_identical(monkeypatch, probe, name,
                                                                   chunk_elements, workers):
    x = dataset(name)
    plan = schemes()
    if workers > 1:
        monkeypatch.setattr(engine, "PARALLEL_ELEMENTS", 0)  # fork even for this tensor
    probe.watch(plan)
    compiled, reference = both_ways(monkeypatch, probe, lambda: engine_run(
        monkeypatch, [source(x)], plan, workers=workers, chunk_elements=chunk_elements,
        worst_blocks=5))
    assert_identical(compiled, reference, x.size)
    if name == "nonfinite" and chunk_elements >= x.size:  # one chunk, holding NaN: numpy's
        assert probe.done(0) == 0 and probe.declined(0) > 0
    else:  # counted in the workers too (shared memory)
        assert probe.count("quantize_chunk") > 0 and probe.done(0) > 0


@pytest.mark.slow
def test_several_tensors_groups_and_totals_are_identical(monkeypatch, probe):
    rng = np.random.default_rng(3)
    sources = [source((rng.standard_normal(shape) * 0.05).astype(np.float32), name)
               for name, shape in (("layers.0.w", (40, 300)), ("layers.1.w", (40, 300)),
                                   ("bias", (300,)), ("head.w", (7, 129)))]
    plan = schemes()
    probe.watch(plan)
    compiled, reference = both_ways(monkeypatch, probe, lambda: engine_run(
        monkeypatch, sources, plan, workers=1, chunk_elements=4096, worst_blocks=5))
    assert_identical(compiled, reference, values_in(sources))
    assert probe.done(0) > 0 and probe.done(7) > 0


# -- mse_only (fmt scale-search's ranking) ---------------------------------------------------

MSE_SCHEMES = {"block 128": build_scheme(block=128), "fp4 block 32": build_scheme(format=FP4,
                                                                                 block=32),
               "per-tensor": build_scheme(per=Granularity.TENSOR),
               "ieee past max": build_scheme(block=128, margin=-2,
                                             overflow=OverflowPolicy.IEEE),
               "mxfp8": build_scheme(recipe="mxfp8"), "mxfp4": build_scheme(recipe="mxfp4"),
               "clipping margin": build_scheme(block=128, margin=-2)}


def mse_state(monkeypatch, probe, x, scheme, skip=()):
    def run():
        runs, _ = engine.quantize_tensor(source(x), [scheme], workers=1, chunk_elements=8192,
                                         mse_only=True)
        acc = runs[0].acc
        state = {name: repr(getattr(acc, name)) for name in acc.PACKED if name not in skip}
        state["mse"] = repr(acc.mse())
        state["hist"] = None if acc.hist is None else nonzero(acc.hist)
        return state

    probe.watch([scheme])
    return both_ways(monkeypatch, probe, run)


@pytest.mark.parametrize("label", list(MSE_SCHEMES))
@pytest.mark.parametrize("name", ["normal", "nonfinite"])
def test_mse_only_gives_the_same_mse_and_squared_errors(monkeypatch, probe, name, label):
    compiled, reference = mse_state(monkeypatch, probe, dataset(name), MSE_SCHEMES[label],
                                    skip=("saturated",))
    assert_identical(compiled, reference, dataset(name).size)
    if label == "ieee past max":
        assert probe.done(0) == 0 and probe.declined(0) > 0
    elif not (name == "nonfinite" and label == "per-tensor"):
        assert probe.done(0) > 0


# (mxfp8, mxfp4 and the clipping margin saturate values: the compiled path once counted
# them under mse_only, where the numpy path counts nothing)
@pytest.mark.parametrize("label", [
    "block 128", "fp4 block 32", "per-tensor", "mxfp8", "mxfp4", "clipping margin"])
def test_mse_only_accumulators_are_identical_field_for_field(monkeypatch, probe, label):
    compiled, reference = mse_state(monkeypatch, probe, dataset("normal"), MSE_SCHEMES[label])
    assert probe.done(0) > 0
    assert_identical(compiled, reference, dataset("normal").size)


# -- real checkpoint data, and float16 / bfloat16 files ---------------------------------------

CHECKPOINT_SCHEMES = [0, 1, 3, 4, 6, 7, 8, 9, 12]


@pytest.mark.parametrize("net", ["pnet", "rnet", "onet"])
def test_mtcnn_weights_give_the_same_statistics_both_ways(monkeypatch, probe, net):
    pytest.importorskip("torch")
    sources = load_path(str(facenet_weights() / f"{net}.pt"))
    plan = [schemes()[i] for i in CHECKPOINT_SCHEMES]
    probe.watch(plan)
    compiled, reference = both_ways(monkeypatch, probe, lambda: engine_run(
        monkeypatch, sources, plan, workers=1, chunk_elements=8192, worst_blocks=5))
    assert_identical(compiled, reference, values_in(sources))
    assert len(compiled["runs"]) == len([s for s in sources if s.skipped is None]) > 3
    assert all(probe.done(i) > 0 for i in range(len(plan)))


def half_data(dtype) -> np.ndarray:
    """float16/bfloat16 values spanning the type (its subnormals too), -0, and inf/NaN in
    the last rows only (earlier chunks stay compiled)."""
    rng = np.random.default_rng(8)
    finfo = ml_dtypes.finfo(dtype)
    low, high = math.log2(float(finfo.smallest_subnormal)), math.log2(float(finfo.max))
    x = np.exp2(rng.uniform(low, high, (64, 1000))) * signs(rng, (64, 1000))
    h = x.astype(dtype)
    h[5, :7] = -0.0
    h[-1, 3], h[-1, 9], h[-2, 1] = np.nan, np.inf, -np.inf
    bits = h.view(np.uint16)
    bits[-2, 50] = 0x7C01 if dtype == np.float16 else 0x7F81  # signalling NaN payloads
    bits[-2, 51] = 0xFE12 if dtype == np.float16 else 0xFFC3
    return h


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["f16-npy", "f16-safetensors", "bf16-npy",
                                  "bf16-safetensors"])
def test_float16_and_bfloat16_files_give_the_same_statistics_both_ways(monkeypatch, probe,
                                                                       tmp_path, kind):
    half = kind.startswith("f16")
    h = half_data(np.float16 if half else ml_dtypes.bfloat16)
    if kind.endswith("npy"):
        path = tmp_path / "h.npy"
        np.save(path, h)
    else:
        path = write_safetensors(tmp_path / "h.safetensors", {"h": h, "w": h[:8, :128].copy()})
    sources = load_path(str(path))
    plan = [schemes()[i] for i in (0, 1, 3, 7, 8, 12, 14)]
    probe.watch(plan)
    compiled, reference = both_ways(monkeypatch, probe, lambda: engine_run(
        monkeypatch, sources, plan, workers=1, chunk_elements=8192, worst_blocks=5))
    assert_identical(compiled, reference, values_in(sources))
    assert probe.done(0) > 0
    assert probe.declined(0) > 0  # the chunk of the last rows (inf, NaN)
    # float16 read from the mapped file chunk by chunk is widened by the kernel
    assert (probe.count("widen_f16") > 0) == half


# -- kernel level ------------------------------------------------------------------------------

def bits64(v: float) -> int:
    return int(np.float64(v).view(np.uint64))


def pairwise_squares(x: np.ndarray, largest: float) -> float:
    """``metrics._sum_of_squares`` of float32 ``x`` with numpy's pairwise tree written out
    (``peer.pairwise_sum``) in place of np.add.reduce: float32 squares in [2**-23, 2**50],
    float64 squares otherwise."""
    if 2.0 ** -23 <= largest <= 2.0 ** 50:
        return float(peer.pairwise_sum(np.square(x)))
    return float(peer.pairwise_sum(np.square(x, dtype=np.float64)))


@pytest.mark.slow
def test_sum_squares_is_numpy_s_pairwise_sum_to_the_bit():
    """The kernel's sum of squares is numpy's pairwise tree to the bit (written out in the
    test), and the numpy path's to the bit where numpy sums by that tree."""
    needs_kernel()
    rng = np.random.default_rng(4)
    below, above = float(np.nextafter(2.0 ** -23, 0)), float(np.nextafter(2.0 ** 50, np.inf))
    for n in [*range(301), 4095, 4096, 4097, 8191, 8193, 20001, 262143, 262144]:
        base = (rng.standard_normal(n) * np.exp2(rng.uniform(-12, 12, n))).astype(np.float64)
        for largest in (2.0 ** -23, below, 1.0, 2.0 ** 50, above, math.nan):
            size = largest if math.isfinite(largest) else 1.0
            x = (base / max(1.0, float(np.abs(base).max(initial=0))) * size).astype(np.float32)
            got = native._compiled.sum_squares(x, n, largest)
            assert bits64(got) == bits64(pairwise_squares(x, largest)), (n, largest)
            want = metrics._sum_of_squares(x, largest)[0]
            magnitudes = float(np.sum(np.square(x, dtype=np.float64)))
            peer.assert_numpy_s_sum(got, want, n, magnitudes, (n, largest))
    # the two sides of the switch do differ (so the test can tell which one ran)
    x = rng.standard_normal(1000).astype(np.float32)
    assert (native._compiled.sum_squares(x, x.size, 2.0 ** -23)
            != native._compiled.sum_squares(x, x.size, below))


@pytest.mark.slow
def test_the_sum_order_probe_tells_the_orders_apart_and_the_tolerance_is_tight():
    """``peer.order_of`` names numpy's two known orders and fails on a third; where they
    differ, a summed figure may move by its bound and no more, other figures not at all."""
    assert peer.order_of(peer.pairwise_sum, "float32") is None
    assert peer.order_of(lambda x: peer.blocked_sum(x, 8192), "float32", 8192) == 8192
    with pytest.raises(AssertionError, match="neither"):
        peer.order_of(lambda x: np.cumsum(x)[-1], "float32")  # one after another
    assert peer.sum_gap(100, "float32") == 0 or 0 < peer.sum_gap(100) < peer.sum_gap(65536)
    gap = 1e-6
    doc = {"count": 10, "rmse": 2.0, "mse": 4.0, "bias": 0.5, "sqnr_db": 30.0, "amax": 1.5}
    near = {**doc, "mse": 4.0 * (1 + gap), "bias": 0.5 + gap, "sqnr_db": 30.0 + 8 * gap}
    assert differences(near, doc, gap=gap) == [] and differences(near, doc) != []
    for key, value in (("mse", 4.0 * (1 + 2 * gap)), ("bias", 0.5 + 3 * gap),
                       ("sqnr_db", 30.0 + 9 * gap), ("amax", 1.5 + 1e-12)):
        assert differences({**doc, key: value}, doc, gap=gap) != [], key


def test_widen_f16_is_astype_on_every_float16_bit_pattern():
    needs_kernel()
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    out = np.empty(h.size, np.float32)
    native._compiled.widen_f16(h, out, h.size)
    want = h.astype(np.float32)
    wrong = np.flatnonzero(out.view(np.uint32) != want.view(np.uint32))
    assert not wrong.size, [(hex(int(h.view(np.uint16)[i])), hex(int(out.view(np.uint32)[i])),
                             hex(int(want.view(np.uint32)[i]))) for i in wrong[:5]]
    for start, stop in ((1, 2), (0x7C00, 0x7C13), (0xFC01, 0xFC20), (3, 65536)):  # unaligned
        part = h[start:stop]
        out = np.empty(part.size, np.float32)
        native._compiled.widen_f16(part, out, part.size)
        assert np.array_equal(out.view(np.uint32), part.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("rows, cols, tr, tc", [(1, 1, 1, 1), (7, 1000, 1, 128),
                                                (130, 300, 128, 128), (64, 64, 64, 64),
                                                (5, 33, 2, 16), (3, 10, 8, 32),
                                                (1, 70001, 1, 70001), (9, 17, 9, 1)])
def test_tile_amax_is_the_numpy_tile_amax_to_the_bit(rows, cols, tr, tc):
    needs_kernel()
    rng = np.random.default_rng(rows * 131 + cols)
    x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-140, 120, (rows, cols)))
         ).astype(np.float32)
    u = x.view(np.uint32)
    out = np.empty((-(-rows // tr), -(-cols // tc)), np.float32)
    if x.size > 8:  # NaN of several payloads and signs, inf; a tile of -0
        flat = u.reshape(-1)
        flat[rng.choice(x.size, 4, replace=False)] = [0x7FC00000, 0xFFC00001, 0x7F800001,
                                                      0xFF800000]
        if out.size > 1:
            x[-min(rows, tr):, -min(cols, tc):] = -0.0
    native._compiled.tile_amax(x, rows, cols, tr, tc, out)
    want = chunk.tile_amax(x, tr, tc)
    assert out.shape == want.shape
    assert x.size <= 8 or np.isnan(want).any()
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def magic(spec) -> tuple[int, int, int]:
    """The rounding constants ChunkKernel passes to quantize_chunk."""
    return (int(np.float32(spec.smallest_normal).view(np.uint32)),
            int(np.float32(2.0 ** (spec.max_exponent + 1)).view(np.uint32)),
            (23 - spec.mantissa_bits) << 23)


def reference_chunk(x, scales, tr, tc, spec, fmax):
    """The numpy path's element-level results for a padded float32 chunk: err = x_q - x,
    x_q, exact histogram keys (and the float32 ones before the redo), per-block flushed counts, values past max per block, max rel."""
    rows, cols = x.shape
    shape4 = (rows // tr, tr, cols // tc, tc)
    s4 = scales[:, None, :, None]
    r = round_float32_nearest_even(np.multiply(x.reshape(shape4), s4).reshape(-1), spec)
    past = (np.abs(r) > fmax).reshape(shape4)  # fmax inf: known to stay in range
    np.clip(r, -fmax, fmax, out=r)
    x_q4 = r.reshape(shape4) / s4
    err = (x_q4 - x.reshape(shape4)).reshape(rows, cols)
    x_q = x_q4.reshape(rows, cols)
    with np.errstate(invalid="ignore"):  # 0 / 0 for zeros: NaN, as the engine has it
        rel = np.abs(err) / np.abs(x)
    keys = metrics._bin_keys(rel.reshape(-1).copy(), x.reshape(-1), x_q.reshape(-1))
    naive = rel.reshape(-1).view(np.uint32) >> 16
    flushed = ((x_q == 0) & (x != 0)).reshape(shape4).sum(axis=(1, 3))
    rel4 = rel.reshape(shape4)
    max_rel = np.fmax.reduce(np.fmax.reduce(rel4, axis=3), axis=1)
    return err, x_q, keys, naive, flushed, past.sum(axis=(1, 3)), max_rel


def compiled_chunk(x, scales, tr, tc, spec, fmax):
    rows, cols = x.shape
    nb = (rows // tr, cols // tc)
    scratch = np.empty(x.size, np.float32)
    hist = np.zeros(metrics.HIST_BINS, np.int64)
    flushed, saturated = np.empty(nb, np.int64), np.empty(nb, np.int64)
    max_rel = np.empty(nb, np.float32)
    got = native._compiled.quantize_chunk(x, scales, (rows, cols), (tr, tc),
                                          (*magic(spec), fmax), scratch, hist=hist,
                                          flushed=flushed, saturated=saturated,
                                          max_rel=max_rel)
    return got, scratch.reshape(rows, cols), hist, flushed, saturated, max_rel


LARGE_SCALE = np.float32(1.37)


def large_errors() -> np.ndarray:
    """FP4 values (scaled by ``LARGE_SCALE``) whose relative errors lie on and next to the
    bin edges between 1/4 and 4, where the kernel takes an error as possibly inexact: near
    the grid, and saturated from two to a thousand times max (x_q = fl(6 / s) and x more
    than a factor 2 apart: x_q - x is inexact); plus values that flush to zero and values a
    hair from zero: 128 columns."""
    edges = (np.arange(0x3E80, 0x4080, dtype=np.uint32) << 16).view(np.float32)
    grid = np.float32([0.5, 1, 1.5, 2, 3, 4, 6]) / LARGE_SCALE
    ulps = np.arange(-3, 4, dtype=np.int32)
    with np.errstate(divide="ignore"):  # 1 - 1: an edge of 1, dropped below as inf
        wanted = [grid[:, None] / (1 + sign * edges[None, :].astype(np.float64))
                  for sign in (1, -1)]
    top = edges[(edges >= 0.5) & (edges < 1)].astype(np.float64)
    wanted.append(np.float64(6 / LARGE_SCALE) / (1 - top))
    parts = []
    for w in wanted:
        v = w.astype(np.float32).reshape(-1)
        v = v[np.isfinite(v) & (v > 0)]
        parts.append((v.view(np.int32)[:, None] + ulps[None, :]).view(np.float32).reshape(-1))
    parts.append(np.float32([1e-30, 0.2, 0.24, 0.25, 1e-45, -1e-38, 0.0, -0.0]))
    x = np.concatenate(parts)
    x[1::2] *= -1
    return np.r_[x, np.zeros((-x.size) % 128, np.float32)].reshape(-1, 128)


@pytest.mark.parametrize("case", ["edges", "ties", "normal", "saturating", "wide", "large"])
def test_quantize_chunk_element_for_element(case):
    """Each error x_q - x, the histogram (keys next to a bin edge redone exactly), per-block
    flushed / saturated / max relative error, and the sums, against the numpy path's."""
    needs_kernel()
    rng = np.random.default_rng(len(case))
    spec, fmax, tr, tc = E4M3, math.inf, 1, 128
    if case == "edges":
        x = dataset("edges")
        x = np.r_[x, np.zeros((-x.size) % 128, np.float32)].reshape(-1, 128)
        scales = np.ones((x.shape[0], 1), np.float32)
    elif case == "ties":  # E4M3 rows at scale 1 (as MX scales them): ties, saturation
        fmax = E4M3.max
        x = dataset("ties")[:32]
        scales = np.ones((32, 1), np.float32)
    elif case == "normal":
        x = (rng.standard_normal((64, 512)) * 0.02).astype(np.float32)
        x[3, :40] = 0
        x[7, 5] = -0.0
        x[9, :128] = 1e-9
        scales = (448 / chunk.tile_amax(x, 1, 128)).astype(np.float32)
    elif case == "saturating":
        spec, fmax, tr, tc = FP4, FP4.max, 2, 32
        x = rng.standard_normal((64, 256)).astype(np.float32)
        scales = (8 / chunk.tile_amax(x, tr, tc)).astype(np.float32)  # values past 6
    elif case == "large":  # relative errors of 1/4 and more next to bin edges
        spec, fmax = FP4, FP4.max
        x = large_errors()
        scales = np.full((x.shape[0], 1), LARGE_SCALE, np.float32)
    else:  # tiles wider than the kernel's 4096-value stretches
        tc = 9000
        x = rng.standard_normal((4, 9000)).astype(np.float32)
        scales = (448 / chunk.tile_amax(x, tr, tc)).astype(np.float32)
    got, err, hist, flushed, saturated, max_rel = compiled_chunk(x, scales, tr, tc, spec, fmax)
    want_err, x_q, keys, naive, want_flushed, past, want_rel = reference_chunk(
        x, scales, tr, tc, spec, fmax)
    assert got is not None
    assert np.array_equal(err.view(np.uint32), want_err.view(np.uint32))
    assert np.array_equal(hist, np.bincount(keys, minlength=metrics.HIST_BINS))
    assert np.array_equal(flushed, want_flushed)
    assert np.array_equal(saturated, past)
    assert np.array_equal(max_rel.view(np.uint32), want_rel.view(np.uint32))
    sum_err, max_err, sum_err2, zero_results, nan_keys, n_saturated, n_above = got
    wide = np.repeat(np.repeat(scales, tr, axis=0), tc, axis=1)
    assert n_above == int(np.count_nonzero(np.abs(x * wide) > fmax))  # |x * s| > max
    flat = want_err.reshape(-1)
    magnitudes = float(np.sum(np.abs(flat), dtype=np.float64))
    assert bits64(sum_err) == bits64(float(peer.pairwise_sum(flat)))
    peer.assert_numpy_s_sum(sum_err, float(np.add.reduce(flat)), flat.size, magnitudes,
                            "sum_err")
    assert max_err == float(np.abs(flat).max())
    assert bits64(sum_err2) == bits64(pairwise_squares(np.abs(flat), max_err))
    peer.assert_numpy_s_sum(sum_err2, metrics._sum_of_squares(np.abs(flat), max_err)[0],
                            flat.size, float(np.sum(np.square(flat, dtype=np.float64))),
                            "sum_err2")
    assert zero_results == int(np.count_nonzero(x_q == 0))
    assert nan_keys == int(np.count_nonzero((keys & 0x7FFF) > metrics.FINITE_BINS))
    assert n_saturated == int(past.sum())
    if case == "edges":  # thousands next to an edge, and the exact redo moved some keys
        with np.errstate(invalid="ignore"):  # the padding's 0 / 0
            low = (np.abs(want_err) / np.abs(x)).view(np.uint32).reshape(-1) & 0xFFFF
        assert np.count_nonzero((low + metrics.EDGE_ULPS) % 0x10000 < 2 * metrics.EDGE_ULPS
                                ) >= 16000
        assert np.count_nonzero(keys != naive) >= 100
    if case == "large":  # many inexact errors next to an edge, redone; zeros too
        with np.errstate(invalid="ignore"):
            rel = (np.abs(want_err) / np.abs(x)).reshape(-1)
        low = rel.view(np.uint32) & 0xFFFF
        near = ((low + metrics.EDGE_ULPS) % 0x10000 < 2 * metrics.EDGE_ULPS) & (rel >= 0.25)
        assert np.count_nonzero(near & np.isfinite(rel)) >= 1000
        assert np.count_nonzero(keys != naive) >= 10
        assert zero_results > 0 and n_saturated > 500
    if case == "ties":
        g = grid_of(ml_dtypes.float8_e4m3fn)
        assert np.isin(np.abs(x), (g[:-1] + g[1:]) / 2).sum() > 1000
    if case in ("ties", "saturating"):
        assert n_saturated > 0


def test_quantize_chunk_gives_up_on_a_non_finite_chunk_and_leaves_the_histogram():
    needs_kernel()
    x = np.random.default_rng(2).standard_normal((4, 128)).astype(np.float32)
    x[2, 7] = np.inf
    scales = np.ones((4, 1), np.float32)
    got, _, hist, *_ = compiled_chunk(x, scales, 1, 128, E4M3, math.inf)
    assert got is None and not hist.any()
    # and the next call's histogram starts clean (the kernel's own counters were reset)
    x[2, 7] = 0.5
    got, _, hist, *_ = compiled_chunk(x, scales, 1, 128, E4M3, math.inf)
    assert got is not None and hist.sum() == x.size


def bad_calls():
    f32 = np.zeros(8, np.float32)
    f64 = np.zeros(8, np.float64)
    hist = np.zeros(metrics.HIST_BINS, np.int64)
    one = np.zeros(1, np.float32)
    two = np.zeros(2, np.float32)
    m = magic(E4M3)

    def chunk_call(x=f32, s=one, rows=1, cols=8, tr=1, tc=8, scratch=None, h=hist, fl=None,
                   sat=None, rel=None):
        return ("quantize_chunk", (x, s, (rows, cols), (tr, tc), (*m, 448.0),
                                   np.zeros(8, np.float32) if scratch is None else scratch),
                {"hist": h, "flushed": fl, "saturated": sat, "max_rel": rel})

    empty = np.empty(0, np.float32)
    readonly = np.zeros(8, np.float32)
    readonly.flags.writeable = False
    return {
        "x too short": chunk_call(x=f32[:7]),
        "x float64": chunk_call(x=f64),
        "x not contiguous": chunk_call(x=np.zeros(16, np.float32)[::2]),
        "x not a buffer": chunk_call(x=[0.0] * 8),
        "scales too many": chunk_call(s=two),
        "scales float64": chunk_call(s=np.zeros(1, np.float64)),
        "scratch too short": chunk_call(scratch=np.zeros(7, np.float32)),
        "scratch read-only": chunk_call(scratch=readonly),
        "hist too short": chunk_call(h=hist[:-1]),
        "hist int32": chunk_call(h=np.zeros(metrics.HIST_BINS, np.int32)),
        "hist float64": chunk_call(h=np.zeros(metrics.HIST_BINS, np.float64)),
        "flushed wrong size": chunk_call(fl=np.zeros(2, np.int64)),
        "saturated float32": chunk_call(sat=np.zeros(1, np.float32)),
        "max_rel int32": chunk_call(rel=np.zeros(1, np.int32)),
        "cols not whole tiles": chunk_call(tc=3, s=np.zeros(3, np.float32)),
        "rows not whole tiles": chunk_call(rows=2, cols=4, tr=3, tc=4),
        "zero rows": chunk_call(rows=0),
        "negative tile": chunk_call(tr=-1),
        "too few arguments": ("quantize_chunk", (f32, one)),
        "outputs by position": ("quantize_chunk", (f32, one, (1, 8), (1, 8), (*m, 448.0),
                                                   np.zeros(8, np.float32), hist)),
        "a tile of one number": ("quantize_chunk", (f32, one, (1, 8), 8, (*m, 448.0),
                                                    np.zeros(8, np.float32))),
        "rounding short of fmax": ("quantize_chunk", (f32, one, (1, 8), (1, 8), m,
                                                      np.zeros(8, np.float32))),
        "tile_amax out too small": ("tile_amax", (f32, 2, 4, 1, 4, one)),
        "tile_amax zero tile": ("tile_amax", (f32, 2, 4, 0, 4, two)),
        "tile_amax negative rows": ("tile_amax", (f32, -2, -4, 1, 1, one)),
        "tile_amax x float64": ("tile_amax", (f64, 2, 4, 1, 4, two)),
        "tile_amax out read-only": ("tile_amax", (f32, 8, 1, 8, 1, readonly[:1])),
        "sum_squares n wrong": ("sum_squares", (f32, 9, 1.0)),
        "sum_squares n negative": ("sum_squares", (f32, -1, 1.0)),
        "sum_squares float64": ("sum_squares", (f64, 8, 1.0)),
        "sum_squares largest not a number": ("sum_squares", (f32, 8, "big")),
        "widen_f16 float32 in": ("widen_f16", (f32, f32, 8)),
        "widen_f16 out float64": ("widen_f16", (np.zeros(8, np.float16), f64, 8)),
        "widen_f16 n wrong": ("widen_f16", (np.zeros(8, np.float16), f32, 9)),
        "widen_f16 out too short": ("widen_f16", (np.zeros(8, np.float16), f32[:7], 8)),
        "rows * cols overflows": ("quantize_chunk", (empty, empty, (2**32, 2**32), (1, 1),
                                                     (*m, 1.0), empty)),
        "tile_amax rows * cols overflows": ("tile_amax", (empty, 2**32, 2**32, 2**32, 2**32,
                                                          one)),
    }


# Bad arguments that crashed the process (found by these tests: a NULL format in an error
# message, rows * cols wrapping to 0), run in a child process, so that a crash fails the
# test instead of taking pytest down.
CRASHES = ("widen_f16 float32 in", "widen_f16 n wrong", "rows * cols overflows",
           "tile_amax rows * cols overflows")


@pytest.mark.parametrize("case", [case for case in bad_calls() if case not in CRASHES])
def test_bad_arguments_raise_and_do_not_crash(case):
    needs_kernel()
    name, args, *kwargs = bad_calls()[case]
    with pytest.raises((ValueError, TypeError, BufferError, OverflowError)):
        getattr(native._compiled, name)(*args, **(kwargs[0] if kwargs else {}))


CHILD = """
import sys
sys.path[:0] = {tests!r}
import test_native
from fmtcli.numerics import native
name, args, *kwargs = test_native.bad_calls()[{case!r}]
try:
    getattr(native._compiled, name)(*args, **(kwargs[0] if kwargs else {{}}))
except (ValueError, TypeError, BufferError, OverflowError):
    print("raised")
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", CRASHES)
def test_bad_arguments_that_crashed_raise_in_a_child_process(case):
    needs_kernel()
    here = Path(__file__).resolve()
    child = CHILD.format(tests=[str(here.parent), str(here.parents[1])], case=case)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "raised"), done.stderr[-400:]


# -- the switch, and the guard -----------------------------------------------------------------

@pytest.mark.parametrize("value", ["numpy", "NUMPY", " Numpy\n", "\tnumpy  "])
def test_fmtcli_kernel_numpy_turns_the_kernel_off(monkeypatch, value):
    needs_kernel()
    monkeypatch.setenv(ENV, value)
    assert native.module() is None
    plan = engine.plan_schemes(source(np.ones((2, 128), np.float32)), [build_scheme()])[0]
    assert chunk.ChunkKernel(plan, 0).native is None
    monkeypatch.delenv(ENV)
    assert native.module() is native._compiled
    assert chunk.ChunkKernel(plan, 0).native is native._compiled


@pytest.mark.parametrize("value", ["", "native", "numpyx", "num py", "c"])
def test_other_values_of_fmtcli_kernel_leave_it_on(monkeypatch, value):
    needs_kernel()
    monkeypatch.setenv(ENV, value)
    assert native.module() is native._compiled


@pytest.mark.parametrize("value", [None, "numpy"])
def test_a_forked_worker_honours_fmtcli_kernel(monkeypatch, value):
    needs_kernel()
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    seen = shared_array((2, 2), np.int64, fill=-1)  # per task: forked, kernel off

    def task(item, worker):
        seen[item] = (os.getpid() != parent, native.module() is None)
        return 1

    parent = os.getpid()
    run_tasks(task, 2, 2)
    assert seen.tolist() == [[1, int(value is not None)]] * 2


def test_forked_workers_under_fmtcli_kernel_numpy_never_call_the_kernel(monkeypatch, probe):
    monkeypatch.setattr(engine, "PARALLEL_ELEMENTS", 0)
    x = dataset("normal")
    monkeypatch.setenv(ENV, "numpy")
    quantize([source(x)], [build_scheme()], workers=2, chunk_elements=8192)
    assert probe.calls.sum() == 0
    monkeypatch.delenv(ENV)
    quantize([source(x)], [build_scheme()], workers=2, chunk_elements=8192)
    assert probe.count("quantize_chunk") > 0  # the same run does reach it when on


def test_the_extension_is_built_where_it_is_required():
    """``FMTCLI_REQUIRE_NATIVE=1`` (CI, release builds): the compiled kernel must be there,
    and built from the current ``_native.c`` (a stale build would test old code)."""
    if os.environ.get("FMTCLI_REQUIRE_NATIVE", "").strip() != "1":
        pytest.skip("FMTCLI_REQUIRE_NATIVE=1 is not set")
    assert native.built(), "fmtcli.numerics._native is not built: pip install -e ."
    c_source = Path(native.__file__).with_name("_native.c")
    built = Path(native._compiled.__file__)
    assert built.stat().st_mtime >= c_source.stat().st_mtime, (
        f"{built.name} is older than _native.c: rebuild with pip install -e .")
