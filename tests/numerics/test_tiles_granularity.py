"""``numerics.tiles`` (the one tile amax and scaled cast) and ``numerics.granularity`` (the
one vocabulary of what a scale covers), and that quantize, attention, dot and kv use them:
each against a brute-force reference (a loop over tiles, ml_dtypes' cast), and the source
checked to define them once."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fmtcli.base.choices import Granularity, ScaleGranularity
from fmtcli.base.errors import UsageError
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.granularity import ScaleGroup
from fmtcli.numerics.scaling import amax_to_scale
from fmtcli.numerics.schemes import Scheme
from fmtcli.numerics.tiles import (
    amax_scaled_cast,
    check_element_format,
    from_codes,
    is_narrow,
    per_element,
    scaled_cast,
    tile_amax,
    tile_view,
    to_codes,
    untile,
)

E4M3 = get_format("float8_e4m3fn")
PACKAGE = Path(__file__).resolve().parents[2] / "fmtcli"
RNG = np.random.default_rng(23)


def loop_amax(x: np.ndarray, tr: int, tc: int) -> np.ndarray:
    """max |x| of every tile of the last two axes, one tile at a time."""
    *lead, rows, cols = x.shape
    out = np.empty((*lead, -(-rows // tr), -(-cols // tc)), dtype=np.float64)
    for i, j in itertools.product(range(out.shape[-2]), range(out.shape[-1])):
        tile = np.abs(x[..., i * tr:(i + 1) * tr, j * tc:(j + 1) * tc].astype(np.float64))
        out[..., i, j] = tile.max(axis=(-2, -1))
    return out


def e4m3_saturating(v: np.ndarray) -> np.ndarray:
    """ml_dtypes' cast, clipped to ±448 first (the saturating cast), as float32."""
    return np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


# -- tile amax -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,tile", [((7, 10), (1, 4)), ((7, 10), (3, 3)), ((8, 8), (8, 8)),
                                        ((1, 5), (1, 8)), ((2, 3, 9, 6), (4, 5)),
                                        ((5, 1), (2, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_tile_amax_is_the_max_of_each_tile_ragged_edges_included(shape, tile, dtype):
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    x.flat[0] = -0.0
    got = tile_amax(x, *tile)
    assert got.dtype == dtype
    assert np.array_equal(got.astype(np.float64), loop_amax(x, *tile))


def test_a_tile_holding_nan_has_a_nan_amax_and_the_others_do_not():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    x[1, 5] = np.nan
    x[3, 0] = -np.inf
    amax = tile_amax(x, 2, 4)
    assert np.isnan(amax[0, 1]) and np.isinf(amax[1, 0])
    assert np.isfinite(amax[0, 0]) and np.isfinite(amax[1, 1])


def test_the_tile_view_broadcasts_a_grid_and_untile_restores_the_matrix():
    x = RNG.standard_normal((3, 7, 10)).astype(np.float32)
    view = tile_view(x, 2, 4)
    assert view.shape == (3, 4, 2, 3, 4)
    assert np.array_equal(untile(view, (7, 10)), x)
    grid = np.arange(12.0).reshape(4, 3)
    assert np.array_equal(per_element(grid, 2, 4, (7, 10))[6, 9], grid[3, 2])


# -- the scaled cast -----------------------------------------------------------------------

def test_the_scaled_cast_is_cast_of_x_times_scale_over_scale():
    x = (RNG.standard_normal((16, 32)) * 3).astype(np.float32)
    scale = np.float32(448 / 9.5)
    want = e4m3_saturating(x * scale) / scale
    assert np.array_equal(scaled_cast(x, E4M3, scale), want)
    codes, clipped = to_codes(x, E4M3, scale, count_clipped=True)
    assert np.array_equal(codes, e4m3_saturating(x * scale))
    assert clipped == int(np.count_nonzero(np.abs(x * scale) >= 464))  # 448 + half a step
    assert np.array_equal(from_codes(codes, scale), want)


def test_the_dequantization_direction_divides_then_multiplies():
    """vLLM's k_scale and torch._scaled_mm's scales: cast(x / d) * d, not x * (1 / d)."""
    x = (RNG.standard_normal(4096) * 50).astype(np.float32)
    d = np.float32(0.3)
    q = to_codes(x, E4M3, d, dequant=True)
    assert np.array_equal(q, e4m3_saturating(x / d))
    assert np.array_equal(from_codes(q, d, dequant=True), q * d)
    assert not np.array_equal(x / d, x * (np.float32(1) / d))  # why the direction matters
    f32 = get_format("float32")  # its cast is the identity: the quotient itself
    assert np.array_equal(to_codes(x, f32, d, dequant=True), x / d)
    assert np.array_equal(scaled_cast(x, f32, d, dequant=True), (x / d) * d)
    wide = to_codes(x.astype(np.float64), E4M3, d, dequant=True, product_dtype=np.float32)
    assert wide.dtype == np.float32 and np.array_equal(wide, q)


@pytest.mark.parametrize("group", [ScaleGroup(Granularity.TENSOR),
                                   ScaleGroup(Granularity.TILE, tile=(4, 8)),
                                   ScaleGroup(Granularity.TILE, tile=(3, 100)),
                                   ScaleGroup(Granularity.ROW)])
def test_the_amax_scaled_cast_of_each_tile_is_the_loop_over_tiles(group):
    x = (RNG.standard_normal((2, 10, 12)) * np.exp(RNG.standard_normal((2, 10, 12)))
         ).astype(np.float32)
    got = amax_scaled_cast(x, E4M3, group)
    want = np.empty_like(x)
    if group.kind is Granularity.TENSOR:
        tiles = [(slice(None), slice(None), slice(None))]
    else:
        tr, tc = group.tile_shape(10, 12)
        tiles = [(g, slice(i, i + tr), slice(j, j + tc))
                 for g in range(2) for i in range(0, 10, tr) for j in range(0, 12, tc)]
    for where in tiles:
        part = x[where]
        scale = np.float32(448) / np.float32(np.abs(part).max())
        want[where] = e4m3_saturating(part * scale) / scale
    assert np.array_equal(got, want)


def test_a_given_tensor_amax_sets_the_one_scale():
    x = RNG.standard_normal((1, 4, 4)).astype(np.float32)
    scale = np.float32(amax_to_scale(np.float64(100.0), E4M3))
    got = amax_scaled_cast(x, E4M3, ScaleGroup(Granularity.TENSOR), amax=100.0)
    assert np.array_equal(got, e4m3_saturating(x * scale) / scale)


def test_narrow_formats_and_element_formats():
    assert is_narrow(E4M3) and is_narrow(get_format("float4_e2m1fn"))
    assert not is_narrow(get_format("bfloat16"))
    check_element_format(E4M3, "attention")
    with pytest.raises(UsageError, match="is a scale format .* a GEMM needs a signed"):
        check_element_format(get_format("float8_e8m0fnu"), "a GEMM")


# -- the vocabulary ------------------------------------------------------------------------

GROUPS = [ScaleGroup(Granularity.TENSOR), ScaleGroup(Granularity.ROW),
          ScaleGroup(Granularity.COLUMN), ScaleGroup(Granularity.BLOCK, 32),
          ScaleGroup(Granularity.BLOCK, 16, axis=0), ScaleGroup(Granularity.TILE, tile=(1, 128)),
          ScaleGroup(Granularity.HEAD), ScaleGroup(Granularity.TOKEN_HEAD)]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.spelling)
def test_every_group_spells_itself_as_parse_reads_it(group):
    assert ScaleGroup.parse(group.spelling) == group
    assert ScaleGroup.parse(f"  {group.spelling.upper()} ") == group


def test_the_tile_of_each_kind():
    rows, cols = 64, 4 * 16  # a (tokens, heads x dim) matrix for the head kinds
    want = {"tensor": (64, 64), "row": (1, 64), "column": (64, 1), "block:32": (1, 32),
            "block:16,axis=0": (16, 1), "tile:1x128": (1, 64), "head": (64, 16),
            "token-head": (1, 16)}
    assert {g.spelling: g.tile_shape(rows, cols, head_dim=16) for g in GROUPS} == want
    assert ScaleGroup(Granularity.BLOCK, 16, axis=0).tile_shape(1, 40, ndim=1) == (1, 16)
    with pytest.raises(UsageError, match="width of a head"):
        ScaleGroup(Granularity.HEAD).tile_shape(rows, cols)


def test_sizes_of_other_kinds_are_dropped_and_bad_sizes_refused():
    assert ScaleGroup(Granularity.TENSOR, block=7, tile=(2, 2)) == ScaleGroup("tensor")
    assert ScaleGroup.parse("block", default_block=64) == ScaleGroup(Granularity.BLOCK, 64)
    for bad in ("block:", "block:0", "tensor:", "tile:2", "tile:0x4", "blocks", "row:3",
                f"block:{(1 << 20) + 1}", "block:8,axis=1"):
        with pytest.raises(UsageError, match="granularity="):
            ScaleGroup.parse(bad)
    with pytest.raises(UsageError, match="one of tensor, head, token-head"):
        ScaleGroup.parse("row", (Granularity.TENSOR, Granularity.HEAD, Granularity.TOKEN_HEAD))
    with pytest.raises(UsageError, match="block size"):
        ScaleGroup(Granularity.BLOCK, 0)


def test_a_scheme_covers_what_its_group_covers():
    for scheme in (Scheme(E4M3, Granularity.BLOCK, block=32, axis=0),
                   Scheme(E4M3, Granularity.TILE, tile=(128, 128)),
                   Scheme(E4M3, Granularity.COLUMN)):
        for shape in ((300, 200, 2), (1, 50, 1)):
            assert scheme.tile_shape(*shape) == scheme.group.tile_shape(*shape)
        assert scheme.label == scheme.group.label
    assert Scheme(E4M3, Granularity.BLOCK, block=32, axis=0).label == "block 32 (axis 0)"
    with pytest.raises(UsageError, match="KV cache"):
        Scheme(E4M3, Granularity.HEAD)


def test_every_command_s_granularities_are_kinds_of_the_one_vocabulary():
    from fmtcli.arithmetic.dot import granularity_label, parse_granularity
    from fmtcli.kv import GRANULARITIES, STORED

    kinds = {k.value for k in Granularity}
    assert {c.value for c in ScaleGranularity} <= kinds
    assert set(GRANULARITIES) <= kinds and set(STORED) <= set(GRANULARITIES)
    for text in ("tensor", "row", "block", "block:64"):
        kind, block = parse_granularity(text)
        assert kind in kinds
        assert granularity_label(kind, block) == ScaleGroup.parse(text).spelling


# -- the analyses use them -----------------------------------------------------------------

def test_quantize_s_chunk_kernel_is_the_scaled_cast_of_its_tile_amax_scales():
    from fmtcli.engine.chunk import ChunkKernel, Plan

    x = (RNG.standard_normal((24, 100)) * np.exp(RNG.standard_normal((24, 100)))
         ).astype(np.float32)
    scheme = Scheme(E4M3, Granularity.TILE, tile=(8, 32))
    tile = scheme.tile_shape(*x.shape)
    _, scales, kept, _ = ChunkKernel(Plan(scheme, tile, False), 0).run(
        x, (0, 0, x.shape[1]), None, "values")
    assert np.array_equal(scales, amax_to_scale(tile_amax(x, *tile), E4M3))
    full = per_element(scales, *tile, x.shape)
    assert np.array_equal(kept, scaled_cast(x, E4M3, full))
    assert np.array_equal(kept, amax_scaled_cast(x, E4M3, scheme.group))


def test_dot_s_codes_and_kv_s_round_trip_are_the_scaled_cast():
    from fmtcli.arithmetic.dot import quantize_operands
    from fmtcli.kv import candidate_scale, round_trip

    a = RNG.standard_normal((6, 40))
    b = RNG.standard_normal((40, 5))
    qa, qb = quantize_operands(a, b, E4M3, "block", 16)
    scale_b = amax_to_scale(tile_amax(b.astype(np.float32), 16, 16), E4M3).astype(np.float32)
    assert np.array_equal(qb.codes, to_codes(b.astype(np.float32), E4M3,
                                             per_element(scale_b, 16, 16, b.shape)))
    assert np.array_equal(qa.dequant, np.float32(1) / amax_to_scale(
        tile_amax(a.astype(np.float32), 1, 16), E4M3))
    x = (RNG.standard_normal((32, 2, 8)) * 4).astype(np.float32)
    k_scale = candidate_scale(x, "head", "amax", E4M3)
    assert np.array_equal(k_scale.ravel(), (np.abs(x).max(axis=(0, 2)) / 448).astype(np.float32))
    x_hat, _ = round_trip(x, k_scale, E4M3)
    assert np.array_equal(x_hat, e4m3_saturating(x / k_scale) * k_scale)


COPIES = {"tile_amax", "_tile_amax", "_tiles", "_expand", "is_narrow", "scaled_cast"}


@pytest.mark.slow
def test_the_tile_amax_scaled_cast_and_is_narrow_are_defined_once():
    """No module but numerics/tiles.py defines its functions again (attention, dot and
    quantize each had their own)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(str(path.relative_to(PACKAGE)), node.name) for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name in COPIES]
    assert {where for where, _ in found} == {"numerics/tiles.py"}, found
