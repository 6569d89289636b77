"""The compiled kernel's 16-bit inputs and its per-chunk helpers, against numpy.

bfloat16 and float16 chunks go to the kernel as stored (``kind`` 1 and 2: it widens them
as it goes); every function must give what it gives on the same values widened to float32
first, to the bit.  ``amax_scales`` must be ``scaling.amax_to_scale``'s amax rule and
``distinct_bits`` the distinct values ``ScaleSummary`` counted by sorting.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import peer_behaviour as peer
import pytest
from engine_helpers import Spy

from fmtcli.engine import chunk
from fmtcli.engine.scales import DISTINCT_CAP, ScaleSummary, distinct
from fmtcli.numerics import native
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.scaling import ScaleRule, amax_to_scale
from fmtcli.streaming import blocks, metrics

E4M3 = get_format("float8_e4m3fn")
KINDS = {"bfloat16": (ml_dtypes.bfloat16, 1), "float16": (np.float16, 2)}


@pytest.fixture(autouse=True, params=["simd", "portable"])
def kernel(request):
    """The kernel with its hand-vectorised float16/bfloat16 paths (F16C, AVX-512, where this
    CPU has them), and with its portable code alone: both must give the same bits."""
    if not native.built():
        pytest.skip("the compiled kernel is not built (pip install -e .)")
    native._compiled.simd(request.param == "simd")
    yield native._compiled
    native._compiled.simd(True)


def every_pattern(dtype) -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def sample(dtype, shape, seed) -> np.ndarray:
    """Values over the whole range of the 16-bit type, subnormals and zeros of both signs
    included (no inf or NaN: the kernel is never given a chunk holding them)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 12, shape))).astype(dtype)
    flat = x.reshape(-1)
    flat[:: 97] = 0
    flat[1:: 101] = -0.0
    return x


@pytest.mark.parametrize("name", list(KINDS))
def test_kind_of_and_values_are_views(name):
    dtype, kind = KINDS[name]
    x = np.zeros((3, 4), dtype)
    view, got = native.values(x)
    assert got == kind and view.dtype == np.uint16 and np.shares_memory(view, x)
    assert native.kind_of(np.float32) == 0 and native.kind_of(np.float64) is None
    assert native.reads_as_stored(dtype) and not native.reads_as_stored(np.float32)


def test_widen_f16_keeps_every_pattern_both_ways(kernel):
    """float16 to float32 on all 65,536 patterns (signalling NaNs too, which the hardware
    conversion would quiet) and at every alignment of a short tail."""
    h = every_pattern(np.float16)
    want = h.astype(np.float32)
    for start in (0, 1, 7, 9, 15):
        out = np.empty(h.size - start, np.float32)
        kernel.widen_f16(h[start:], out, out.size)
        assert np.array_equal(bits(out), bits(want[start:])), start


@pytest.mark.parametrize("name", list(KINDS))
def test_tile_amax_as_stored_is_the_widened_amax_on_every_pattern(kernel, name):
    dtype, kind = KINDS[name]
    x = every_pattern(dtype).reshape(512, 128)  # inf and every NaN payload included
    wide = x.astype(np.float32)
    for tr, tc in ((1, 128), (2, 32), (512, 128), (3, 7), (512, 1)):
        out = np.empty((-(-512 // tr), -(-128 // tc)), np.float32)
        kernel.tile_amax(x.view(np.uint16), 512, 128, tr, tc, out, kind)
        assert np.array_equal(bits(out), bits(chunk.tile_amax(wide, tr, tc))), (tr, tc)
    assert np.array_equal(bits(chunk.chunk_amax(x, 1, 128)), bits(chunk.tile_amax(wide, 1, 128)))


@pytest.mark.parametrize("name", list(KINDS))
def test_sum_squares_as_stored_is_the_widened_sum_to_the_bit(kernel, name):
    dtype, kind = KINDS[name]
    for n in [*range(0, 300, 7), 1000, 4096, 65537]:
        x = sample(dtype, n, n).reshape(-1)
        wide = x.astype(np.float32)
        largest = float(np.abs(wide).max(initial=0))
        for big in (largest, 2.0 ** 60):  # float32 squares, and the float64 side
            got = kernel.sum_squares(x.view(np.uint16), n, big, kind)
            want = kernel.sum_squares(wide, n, big, 0)
            assert bits(np.float64(got)) == bits(np.float64(want)), (n, big)
            peer.assert_numpy_s_sum(got, metrics._sum_of_squares(wide, big)[0], n,
                                    float(np.sum(np.square(wide, dtype=np.float64))), (n, big))


def run_chunk(kernel, x, kind, scales, tr, tc, fmax):
    rows, cols = x.shape
    nb = (rows // tr, cols // tc)
    m = E4M3.mantissa_bits
    magic = (int(np.float32(E4M3.smallest_normal).view(np.uint32)),
             int(np.float32(2.0 ** (E4M3.max_exponent + 1)).view(np.uint32)), (23 - m) << 23)
    scratch = np.empty(x.size, np.float32)
    hist = np.zeros(metrics.HIST_BINS, np.int64)
    flushed, saturated = np.empty(nb, np.int64), np.empty(nb, np.int64)
    max_rel = np.empty(nb, np.float32)
    got = kernel.quantize_chunk(x, scales, (rows, cols), (tr, tc), (*magic, fmax), scratch,
                                hist=hist, flushed=flushed, saturated=saturated,
                                max_rel=max_rel, kind=kind)
    return got, bits(scratch), hist, flushed, saturated, bits(max_rel)


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("tr, tc, fmax", [(1, 128, math.inf), (2, 32, E4M3.max),
                                          (1, 5000, math.inf), (4, 1, math.inf)])
def test_quantize_chunk_as_stored_is_the_widened_chunk_to_the_bit(kernel, name, tr, tc, fmax):
    """Stretches widened inside the kernel (tiles wider than its 4,096-value stretches too)
    give every statistic, error and key that the float32 chunk gives."""
    dtype, kind = KINDS[name]
    x = sample(dtype, (8, 10000 if tc == 5000 else 1024), tr * tc)
    wide = x.astype(np.float32)
    amax = chunk.tile_amax(wide, tr, tc)
    with np.errstate(divide="ignore"):  # an all-zero tile: scale 1
        scales = np.where(amax > 0, 448 / amax, 1).astype(np.float32)
    if fmax != math.inf:
        scales *= np.float32(1.5)  # values past max, saturated
    stored = run_chunk(kernel, x.view(np.uint16), kind, scales, tr, tc, fmax)
    widened = run_chunk(kernel, wide, 0, scales, tr, tc, fmax)
    assert stored[0] is not None and stored[0] == widened[0]
    for a, b in zip(stored[1:], widened[1:]):
        assert np.array_equal(a, b)
    if fmax != math.inf:
        assert stored[0][5] > 0  # saturated


def test_quantize_chunk_rejects_an_unknown_kind_and_a_wrong_item_size(kernel):
    x = np.zeros(8, np.uint16)
    args = (np.ones(1, np.float32), (1, 8), (1, 8), (0, 0, 0, 448.0), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="kind"):
        kernel.quantize_chunk(x, *args, kind=3)
    with pytest.raises(ValueError):
        kernel.quantize_chunk(np.zeros(8, np.float32), *args, kind=1)  # 4-byte items as 16-bit
    with pytest.raises(ValueError):
        kernel.quantize_chunk(x, *args, kind=0)  # 2-byte items as float32
    with pytest.raises(ValueError, match="kind"):
        kernel.tile_amax(x, 1, 8, 1, 8, np.zeros(1, np.float32), -1)
    with pytest.raises(ValueError, match="kind"):
        kernel.sum_squares(x, 8, 1.0, 7)


MARGINS = (0, 1, -3, 0.5, 2.25, -0.75, 130, -130)


@pytest.mark.parametrize("margin", MARGINS)
def test_amax_scales_is_amax_to_scale_to_the_bit(kernel, margin):
    rng = np.random.default_rng(7)
    specials = np.array([0, -0.0, np.inf, np.nan, 1e-45, 1.4e-45, 1e-40, 1.1754944e-38,
                         3.4028235e38, 1.0, 448, 447.99997, 6e-8], np.float32)
    with np.errstate(over="ignore"):  # some overflow to inf: a case too
        amax = np.concatenate([specials, np.abs(rng.standard_normal(5000)).astype(np.float32)
                               * np.exp2(rng.integers(-149, 128, 5000)).astype(np.float32)])
    amax = np.abs(amax).astype(np.float32)
    for spec in (E4M3, get_format("float4_e2m1fn"), get_format("float8_e5m2"),
                 get_format("e8m7")):
        out = np.empty(amax.size, np.float32)
        kernel.amax_scales(amax, out, amax.size, np.float32(spec.max), 2.0 ** -margin)
        want = amax_to_scale(amax, spec, "amax", margin)
        assert np.array_equal(bits(out), bits(want)), spec.name


@pytest.mark.parametrize("margin", [0, 1.5])
def test_scales_for_takes_the_compiled_rule_where_it_applies(kernel, monkeypatch, margin):
    from fmtcli.numerics.schemes import build_scheme

    amax = np.abs(np.random.default_rng(1).standard_normal((4, 2))).astype(np.float32)
    amax[0, 0], amax[1, 1] = 0, np.inf
    calls = []

    class Spy:
        def __getattr__(self, name):
            real = getattr(kernel, name)
            return (lambda *a: (calls.append(name), real(*a))[1]) if name == "amax_scales" \
                else real

    monkeypatch.setattr(native, "_compiled", Spy())
    for rule, compiled in ((ScaleRule.AMAX, True), (ScaleRule.POW2_FLOOR, False)):
        scheme = build_scheme(format=E4M3, block=128, scale_rule=rule, margin=margin)
        calls.clear()
        got = chunk.scales_for(amax, chunk.Plan(scheme, (1, 128), False))
        assert bool(calls) is compiled
        assert np.array_equal(bits(got), bits(amax_to_scale(amax, E4M3, rule, margin)))


@pytest.mark.parametrize("case", ["few", "cap", "over", "zeros", "powers", "empty"])
def test_distinct_bits_and_the_scale_summary_match_sorting(kernel, monkeypatch, case):
    rng = np.random.default_rng(len(case))
    if case == "few":
        s = rng.choice(np.float32([0.5, 3, 7.25, 1e-30, 3e30]), 100000)
    elif case == "cap":  # exactly DISTINCT_CAP distinct values, repeated
        s = np.tile(np.arange(1, DISTINCT_CAP + 1, dtype=np.float32), 3)
        rng.shuffle(s)
    elif case == "over":
        s = np.arange(1, DISTINCT_CAP + 2, dtype=np.float32)
    elif case == "zeros":
        s = np.float32([0, 0, 2, 0, 2, 5, np.nan, 0, np.inf])
    elif case == "powers":
        s = np.exp2(rng.integers(-20, 20, 5000)).astype(np.float32)
    else:
        s = np.zeros(0, np.float32)
    finite = s[~np.isnan(s)]
    found = np.empty(DISTINCT_CAP + 1, np.uint32)
    count = kernel.distinct_bits(bits(finite), finite.size, found.size, found)
    want = distinct(finite)
    assert count == min(want.size, DISTINCT_CAP + 1)
    if count <= DISTINCT_CAP:
        assert np.array_equal(np.sort(found[:count].view(np.float32)), want)
    compiled = ScaleSummary()
    compiled.add(s)
    monkeypatch.setattr(native, "_compiled", None)
    sorted_ = ScaleSummary()
    sorted_.add(s)
    assert compiled.stats() == sorted_.stats()
    assert np.array_equal(compiled.values, sorted_.values)


def test_distinct_bits_leaves_its_set_empty_for_the_next_call(kernel):
    a = (np.arange(1, 40001, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)
    out = np.empty(50000, np.uint32)
    assert kernel.distinct_bits(a.astype(np.uint32), a.size, 50000, out) == 40000
    assert kernel.distinct_bits(a.astype(np.uint32), a.size, 50000, out) == 40000
    assert kernel.distinct_bits(a[:10], 10, 3, out[:3]) == 3  # stops at the limit
    assert kernel.distinct_bits(a.astype(np.uint32), a.size, 50000, out) == 40000
    with pytest.raises(ValueError):
        kernel.distinct_bits(a.astype(np.uint32), a.size, 1 << 20, out)


@pytest.mark.parametrize("seed", range(4))
def test_fraction_counts_is_the_plain_histogram(seed):
    rng = np.random.default_rng(seed)
    sizes = blocks.block_sizes(70, 300, 8, 128)
    flushed = np.where(rng.random(sizes.shape) < 0.3, rng.integers(0, 50, sizes.shape), 0)
    flushed = np.minimum(flushed, sizes)
    fraction = (flushed / sizes).astype(np.float32).reshape(-1)
    keys = (fraction.view(np.uint32) >> np.uint32(blocks.FRACTION_SHIFT)).astype(np.int64)
    keys = np.where(fraction > 0, np.maximum(keys - blocks.FRACTION_FIRST_KEY, 0) + 1, 0)
    want = np.bincount(keys, minlength=blocks.FRACTION_BINS)
    assert np.array_equal(blocks.fraction_counts(flushed, sizes), want)
    assert np.array_equal(blocks.fraction_counts(np.zeros_like(flushed), sizes),
                          np.bincount(np.zeros(flushed.size, np.int64),
                                      minlength=blocks.FRACTION_BINS))
    assert np.array_equal(blocks.fraction_counts(np.array([3]), np.array([7])),
                          blocks.fraction_counts(np.array([[3]]), np.array([[7]])))


@pytest.mark.slow
def test_a_build_without_the_x86_paths_gives_the_same_bits(kernel, tmp_path):
    """The source compiled as on a CPU without x86 extensions (no target clones, no F16C or
    AVX2 code: ``FMTCLI_PORTABLE_ONLY``) builds and agrees with the installed module."""
    import importlib.util
    import shutil
    import subprocess
    import sysconfig
    from pathlib import Path

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = Path(native.__file__).with_name("_native.c")
    target = tmp_path / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([compiler, "-O2", "-ffp-contract=off", "-fno-math-errno", "-fPIC",
                    "-shared", "-DFMTCLI_PORTABLE_ONLY", "-I", sysconfig.get_paths()["include"],
                    str(source), "-o", str(target)], check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("_native", target)
    portable = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(portable)
    for dtype, kind in KINDS.values():
        x = sample(dtype, (8, 1024), kind)
        wide = x.astype(np.float32)
        amax = chunk.tile_amax(wide, 1, 128)
        scales = np.where(amax > 0, 448 / amax, 1).astype(np.float32)
        assert (run_chunk(portable, x.view(np.uint16), kind, scales, 1, 128, math.inf)[0]
                == run_chunk(kernel, x.view(np.uint16), kind, scales, 1, 128, math.inf)[0])
        for big in (1.0, 2.0 ** 60):
            assert (portable.sum_squares(x.view(np.uint16), x.size, big, kind)
                    == kernel.sum_squares(x.view(np.uint16), x.size, big, kind))
    h = every_pattern(np.float16)
    a, b = np.empty(h.size, np.float32), np.empty(h.size, np.float32)
    portable.widen_f16(h, a, h.size)
    kernel.widen_f16(h, b, h.size)
    assert np.array_equal(bits(a), bits(b))


@pytest.mark.parametrize("name", ["float32", *KINDS])
def test_every_kind_takes_the_native_path_from_a_file(kernel, name, tmp_path, monkeypatch):
    """A .npy of float32, bfloat16 or float16 (native byte order) is quantized by the
    compiled kernel, its chunks read as stored (ml_dtypes 0.7.0's bfloat16 included: the
    kind is told by the type object, not by a name or a character code)."""
    from fmtcli.inputs.tensors import load_path
    from fmtcli.numerics.schemes import build_scheme
    from fmtcli.quantize import quantize

    dtype, kind = KINDS.get(name, (np.float32, 0))
    path = tmp_path / f"{name}.npy"
    np.save(path, sample(dtype, (64, 256), 3))
    source = load_path(str(path))[0]
    assert native.kind_of(np.dtype(dtype)) == kind
    spy = Spy(kernel)
    monkeypatch.setattr(native, "_compiled", spy)
    quantize([source], [build_scheme(block=32)], workers=1)
    assert spy.kinds and set(spy.kinds) == {kind}


def test_kind_of_is_the_type_not_the_name():
    """Only numpy's float32/float16 and ml_dtypes' bfloat16 type objects, native order."""
    assert native.kind_of(ml_dtypes.bfloat16) == 1
    assert native.kind_of(np.dtype("<f2")) == 2 and native.kind_of(np.dtype("=f4")) == 0
    assert native.kind_of(np.dtype(">f2")) is None and native.kind_of(np.dtype(">f4")) is None
    assert native.kind_of(np.uint16) is None and native.kind_of(np.int16) is None
    assert native.kind_of(np.dtype([("bfloat16", "<u2")])) is None  # a name is not enough
    assert native.kind_of(ml_dtypes.float8_e4m3fn) is None
