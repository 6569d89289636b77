"""``Quantized.raw_reader``: a layout's rows as stored (codes + per-tile multipliers), what
``fmt audit``'s compiled pass (``numerics/_native.c`` ``code_stats``) reads instead of
the two float arrays.

Two oracles, on every layout that has a raw reader, healthy and hostile (NaN, inf, zero,
overflowing and underflowing scales; E4M3's NaN codes; stacked experts; ragged tiles):

- ``RawChunk``'s formula, evaluated here in numpy (``float32(((table[code] * grid) * mul)
  / div)`` in float64), equals the reader's own ``rows_reader`` to the bit;
- ``audit.stats.measure`` by the kernel equals ``measure`` by the numpy passes
  (``FMTCLI_KERNEL=numpy``): every count and amax exactly, the rms to 1e-12.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from layout_fixtures import (
    ct_config,
    ct_tensors,
    deepseek_config,
    deepseek_fp8_tensors,
    mxfp4_gptoss,
    nvfp4_modelopt,
    write_layout,
)

from fmtcli.audit.stats import Pass, measure, stored_counts
from fmtcli.inputs import layouts
from fmtcli.inputs.tensors import load_path
from fmtcli.numerics import native

RNG = np.random.default_rng(7)


def weights(shape, seed=0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.02
    w.flat[:: max(1, w.size // 7)] *= 40  # a few outliers
    return w


def scan(folder):
    sources = load_path(str(folder), as_stored=True)
    return layouts.scan(sources, layouts.read_config(str(folder))).quantized


def hostile_scales(scales: np.ndarray) -> np.ndarray:
    """A copy of float scales with NaN, inf, 0, a huge and a tiny value planted."""
    out = np.array(scales, dtype=np.float32, copy=True).reshape(-1)
    for i, v in enumerate((np.nan, np.inf, 0.0, 3e38, 1e-44)):
        if i < out.size:
            out[(i * 7) % out.size] = v
    return out.reshape(np.shape(scales))


def folders(tmp_path) -> dict:
    """Every layout with a raw reader, by name -> folder."""
    made = {}

    def ct(name, scheme, w, mutate=None):
        tensors = ct_tensors("model.layers.0.mlp.up_proj", w, scheme)
        if mutate:
            mutate(tensors)
        made[name] = write_layout(tmp_path / name, tensors, ct_config(scheme))

    for scheme in ("fp8-tensor", "fp8-channel", "fp8-block", "mxfp8", "mxfp4", "nvfp4"):
        ct(f"ct-{scheme}", scheme, weights((192, 256), 1))

    def bad_fp8(tensors):
        key = "model.layers.0.mlp.up_proj.weight_scale"
        tensors[key] = hostile_scales(tensors[key])
        codes = tensors["model.layers.0.mlp.up_proj.weight"].view(np.uint8).copy()
        codes[0, :3] = (0x7F, 0xFF, 0x7E)  # NaN, NaN, the max
        tensors["model.layers.0.mlp.up_proj.weight"] = codes.view(ml_dtypes.float8_e4m3fn)

    ct("ct-fp8-channel-hostile", "fp8-channel", weights((64, 96), 2), bad_fp8)

    def bad_nvfp4(tensors):
        key = "model.layers.0.mlp.up_proj.weight_scale"
        scale = tensors[key].astype(np.float32)
        scale.flat[3], scale.flat[5], scale.flat[9] = np.nan, 0.0, 448.0
        tensors[key] = scale.astype(ml_dtypes.float8_e4m3fn)
        tensors["model.layers.0.mlp.up_proj.weight_global_scale"] = np.array(
            [3.3e-38], np.float32)  # tiny: products overflow to inf

    ct("ct-nvfp4-hostile", "nvfp4", weights((32, 64), 3), bad_nvfp4)

    def bad_mx(tensors):
        key = "model.layers.0.mlp.up_proj.weight_scale"
        grid = tensors[key].copy()
        grid.flat[0], grid.flat[1], grid.flat[2] = 255, 0, 254  # NaN, 2^-127, 2^127
        tensors[key] = grid

    ct("ct-mxfp4-hostile", "mxfp4", weights((16, 128), 4), bad_mx)
    ct("ct-mxfp8-hostile", "mxfp8", weights((16, 128), 5), bad_mx)

    w = weights((300, 200), 6)  # ragged 128 x 128 tiles
    made["deepseek"] = write_layout(tmp_path / "ds", deepseek_fp8_tensors(
        "model.layers.0.mlp.up_proj.weight", w), deepseek_config())
    tensors = deepseek_fp8_tensors("model.layers.0.mlp.up_proj.weight", w)
    tensors["model.layers.0.mlp.up_proj.weight_scale_inv"] = hostile_scales(
        tensors["model.layers.0.mlp.up_proj.weight_scale_inv"])
    made["deepseek-hostile"] = write_layout(tmp_path / "dsh", tensors, deepseek_config())
    stacked = weights((3, 130, 256), 7)  # experts: tiles never cross two matrices
    per = [deepseek_fp8_tensors("w", m) for m in stacked]
    made["deepseek-stacked"] = write_layout(tmp_path / "dss", {
        "model.layers.0.mlp.experts.up_proj.weight": np.stack([p["w"] for p in per]),
        "model.layers.0.mlp.experts.up_proj.weight_scale_inv": np.stack(
            [p["w_scale_inv"] for p in per])}, deepseek_config())

    made["modelopt"] = nvfp4_modelopt(tmp_path / "mo", weights((48, 64), 8)).path
    made["modelopt-experts"] = nvfp4_modelopt(
        tmp_path / "moe", weights((4, 32, 64), 9), per_matrix_global=True,
        key="model.layers.0.mlp.experts.down_proj.weight").path
    made["gptoss"] = mxfp4_gptoss(tmp_path / "go", {
        "model.layers.0.mlp.experts.gate_up_proj": weights((2, 24, 96), 11)}).path
    return made


@pytest.fixture(scope="module")
def every_layout(tmp_path_factory):
    found = {}
    for name, folder in folders(tmp_path_factory.mktemp("raw")).items():
        qs = [q for q in scan(folder) if q.raw_reader is not None and not q.problems]
        found[name] = qs
    return found


def chunks(q, elements=4096):
    return list(Pass(q, None, None).chunks(elements))


def formula(raw, tile) -> np.ndarray:
    """RawChunk's values by its documented formula, in numpy (float64 steps); ``tile``:
    the rows and columns one multiplier covers."""
    codes = np.asarray(raw.codes, dtype=np.uint8)
    if raw.packing:
        low, high = codes & 0x0F, codes >> 4
        first, second = (low, high) if raw.packing == 1 else (high, low)
        codes = np.stack([first, second], axis=-1).reshape(codes.shape[0], -1)
    t = np.asarray(raw.table, dtype=np.float64)[codes]
    grid = np.asarray(raw.grid, dtype=np.float64)
    tr, tc = tile
    g = np.repeat(np.repeat(grid, tr, axis=0), tc, axis=1)[:codes.shape[0], :codes.shape[1]]
    with np.errstate(over="ignore", invalid="ignore"):
        return (((t * g) * raw.mul) / raw.div).astype(np.float32)


def test_every_layout_with_a_raw_reader_is_covered(every_layout):
    layouts_seen = {q.layout for qs in every_layout.values() for q in qs}
    assert {"deepseek-fp8", "compressed-tensors-fp8", "compressed-tensors-mx",
            "compressed-tensors-nvfp4", "modelopt-nvfp4", "gptoss-mxfp4"} <= layouts_seen
    assert all(every_layout.values()), [k for k, v in every_layout.items() if not v]


def test_the_raw_formula_is_the_readers_dequantization_to_the_bit(every_layout):
    for name, qs in every_layout.items():
        for q in qs:
            for r0, r1, _ in chunks(q):
                raw = q.raw_reader(r0, r1)
                if raw is None:
                    continue
                with np.errstate(over="ignore", invalid="ignore"):
                    want = q.read(slice(r0, r1), slice(0, q.matrix[1]))
                p = Pass(q, None, None)
                got = formula(raw, (r1 - r0 if p.spanning else p.tile[0], p.tile[1]))
                assert got.shape == want.shape, name
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) or \
                    np.array_equal(got, want, equal_nan=True), (name, q.key, r0)


def same_figures(fast, slow):
    (fv, fc), (sv, sc) = fast, slow
    assert (fv.count, fv.zeros, fv.nonfinite, fv.amax) == (sv.count, sv.zeros,
                                                           sv.nonfinite, sv.amax)
    assert fv.rms == pytest.approx(sv.rms, rel=1e-12, abs=0)
    assert fc == sc


@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built")
@pytest.mark.parametrize("elements", [1 << 20, 2048])
def test_the_kernels_figures_are_the_numpy_passes(every_layout, monkeypatch, elements):
    for qs in every_layout.values():
        for q in qs:
            for pow2 in (False, True):
                fast = measure(q, elements, pow2)
                monkeypatch.setenv(native.ENV, "numpy")
                slow = measure(q, elements, pow2)
                monkeypatch.delenv(native.ENV)
                same_figures(fast, slow)


@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built")
def test_the_hostile_fixtures_reach_the_kernel_with_what_they_plant(every_layout):
    v, c = measure(every_layout["ct-fp8-channel-hostile"][0])
    assert v.nonfinite > 0 and c.at_max >= 1
    v, _ = measure(every_layout["ct-nvfp4-hostile"][0])
    assert v.nonfinite > 0
    v, _ = measure(every_layout["deepseek-hostile"][0])
    assert v.nonfinite > 0 and v.zeros > 0


@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built")
def test_the_kernel_counts_a_random_chunk_as_numpy_does():
    """code_stats against a direct numpy count, many multipliers repeated and not (the
    multiplier table flushes when half full), bytes and both nibble orders, FP4 blocks
    along rows (counted a byte at a time, ragged last block) and taller tiles."""
    from fmtcli.inputs.layouts.base import FP4_TABLE, RawChunk, byte_table

    for packing, table, tile, top, below, low in (
            (0, byte_table("float8_e4m3fn"), (3, 5), 448.0, 416.0, 208.0),
            (1, FP4_TABLE, (1, 16), 6.0, 4.0, 2.0), (2, FP4_TABLE, (2, 4), 6.0, 4.0, 2.0),
            (2, FP4_TABLE, (1, 6), 6.0, 4.0, 2.0), (1, FP4_TABLE, (37, 160), 6.0, 4.0, 1.0)):
        rows, cols = 37, 160
        codes = RNG.integers(0, 256, (rows, cols // 2 if packing else cols), dtype=np.uint8)
        shape = (-(-rows // tile[0]), -(-cols // tile[1]))
        for distinct in (3, 10_000):
            grid = RNG.choice(RNG.random(distinct) * 4, shape)
            grid.flat[0], grid.flat[-1] = np.inf, np.nan  # one tile: NaN alone
            raw = RawChunk(codes, packing, table, grid, 1.5, 3.0)
            tiles, vals = stored_counts(raw, rows, cols, tile, top, below, low)
            x = formula(raw, tile)
            finite = x[np.isfinite(x)]
            assert vals[0] == x.size and vals[1] == np.count_nonzero(x == 0)
            assert vals[2] == x.size - finite.size
            assert vals[3] == (np.abs(finite).max() if finite.size else 0)
            assert vals[4] == pytest.approx(float(np.sum(finite.astype(np.float64) ** 2)),
                                            rel=1e-12)
            unpacked = formula(RawChunk(codes, packing, table, np.ones(shape)), tile)
            mag = np.abs(unpacked.astype(np.float64))
            mag[~np.isfinite(mag)] = 0
            padded = np.zeros((shape[0] * tile[0], shape[1] * tile[1]))
            padded[:rows, :cols] = mag
            view = padded.reshape(shape[0], tile[0], shape[1], tile[1])
            inside = np.zeros_like(padded, dtype=bool)
            inside[:rows, :cols] = True
            inside = inside.reshape(view.shape)
            assert np.array_equal(tiles[0], view.max(axis=(1, 3)))
            assert np.array_equal(tiles[1], ((view >= top) & inside).sum(axis=(1, 3)))
            assert np.array_equal(tiles[2], ((view == below) & inside).sum(axis=(1, 3)))
            assert np.array_equal(tiles[3], ((view != 0) & inside).sum(axis=(1, 3)))
            assert np.array_equal(tiles[4], inside.sum(axis=(1, 3)))
            far = np.where(view > 0, 2 * top - view, 0).max(axis=(1, 3))
            assert np.array_equal(tiles[5], far)
            assert np.array_equal(tiles[6], ((view == low) & inside).sum(axis=(1, 3)))


@pytest.mark.skipif(not native.built(), reason="the compiled kernel is not built")
@pytest.mark.parametrize("budget", [1 << 21, 4096])
def test_the_layout_checks_block_figures_are_the_float_readings(every_layout, budget):
    """mx-scale-rule's per-block figures (layout_blocks.block_figures) from the stored
    codes by the kernel equal those from the float element reading (sampled or whole)."""
    from dataclasses import replace

    from fmtcli.audit.layout_blocks import block_figures

    seen = 0
    for qs in every_layout.values():
        for q in qs:
            fast = block_figures(q, budget)
            slow = block_figures(replace(q, raw_reader=None), budget)
            if fast is None:
                assert slow is None
                continue
            seen += 1
            for field in ("top", "at_max", "size", "scale"):
                assert np.array_equal(getattr(fast, field), getattr(slow, field),
                                      equal_nan=True), (q.layout, field)
            assert (fast.sampled, fast.at_next, fast.at_low) == (
                slow.sampled, slow.at_next, slow.at_low)
    assert seen >= 8
