"""Per-block facts, worst blocks and groups by role (issue 11), checked against brute force.

The reference quantizes with tests/oracle.py (numpy and ml_dtypes only), then counts per
block what the engine must report: blocks with a flushed value, blocks with a saturated
value, the flushed fraction of each block, floor(log2) of each scale, the worst blocks; and
groups against the statistics of their tensors quantized as one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracle import matrix_view, ref_quantize, tiles

from fmtcli.base.choices import Granularity, ScaleRule
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming.blocks import FRACTION_RESOLUTION, log2_histogram
from fmtcli.streaming.roles import role_of


def source(x: np.ndarray, key: str | None = None, name: str = "t.npy") -> TensorSource:
    return TensorSource(name, key, x.shape, str(x.dtype), lambda: x)


def data(seed: int = 0, shape=(48, 1000)) -> np.ndarray:
    """Heavy-tailed rows with zeros and outliers: blocks that flush, blocks that do not."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.normal(0, 3, shape))).astype(np.float32)
    x[3, 10:40] = 0
    x[7, 5] = 3e4  # an outlier: its block flushes its small neighbours
    return x


def reference_facts(x, tile, rule="amax", margin=0):
    """(flushed per block, sizes, saturated-any per block, scales) by brute force."""
    xq, scale, _, _ = ref_quantize(x, tile, rule=rule, margin=margin)
    m, q = matrix_view(x), matrix_view(xq)
    t, (tr, tc) = tiles(m, tile)
    tq, _ = tiles(q, tile)
    flushed = np.count_nonzero((tq == 0) & (t != 0), axis=(1, 3))
    real = np.zeros(t.shape, bool)
    real.reshape(t.shape[0] * tr, t.shape[2] * tc)[:m.shape[0], :m.shape[1]] = True
    sizes = real.sum(axis=(1, 3))
    s4 = scale[:, None, :, None]
    with np.errstate(over="ignore", invalid="ignore"):
        xs = (t * s4).astype(np.float32)
    saturated = ((np.abs(xs) > 448 + 16) & real).any(axis=(1, 3))  # past the E4M3 midpoint
    return flushed, sizes, saturated, scale


def floor_log2_counts(scale: np.ndarray) -> dict[int, int]:
    s = scale[np.isfinite(scale) & (scale > 0)].astype(np.float64)
    values, counts = np.unique(np.floor(np.log2(s)).astype(int), return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


@pytest.mark.parametrize("tile, build", [
    ((1, 128), dict(block=128)), ((1, 32), dict(block=32)),
    ((16, 16), dict(tile="16x16")), ((1, 1000), dict(per=Granularity.ROW)),
    ((1, 128), dict(block=128, scale_rule=ScaleRule.POW2_CEIL)),
])
def test_block_facts_equal_brute_force(tile, build):
    x = data()
    rule = build.get("scale_rule", ScaleRule.AMAX).value
    flushed, sizes, saturated, scale = reference_facts(x, tile, rule)
    stats = quantize([source(x)], [build_scheme(**build)]).tensors[0].schemes[0]
    blocks = stats.blocks
    assert blocks.count == flushed.size
    assert blocks.flushing == int(np.count_nonzero(flushed))
    assert blocks.saturating == int(np.count_nonzero(saturated))
    assert stats.scale_log2_histogram == floor_log2_counts(scale)
    fractions = np.sort((flushed / sizes).reshape(-1))
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
        true = fractions[max(1, math.ceil(q * fractions.size)) - 1]
        got = dict(blocks.flushed_fraction_quantiles)[name]
        assert got <= true <= got * (1 + FRACTION_RESOLUTION) or got == true == 0, name


def test_saturating_blocks_are_seen_when_the_scale_rule_clips():
    """pow2-ceil rounds the scale up, so a block's largest values may pass max: the blocks
    that saturate are counted (and the data was built so that some do)."""
    stats = quantize([source(data())], [build_scheme(block=128, scale_rule=ScaleRule.POW2_CEIL)]
                     ).tensors[0].schemes[0]
    assert stats.saturated > 0 and 0 < stats.blocks.saturating <= stats.saturated


@pytest.mark.parametrize("chunk, workers", [(1024, 1), (4096, 2), (1 << 18, 2)])
def test_block_facts_do_not_depend_on_chunks_or_workers(chunk, workers):
    x = data(1)
    scheme = build_scheme(block=128)
    base = quantize([source(x)], [scheme], worst_blocks=5).to_dict()
    other = quantize([source(x)], [scheme], chunk_elements=chunk, workers=workers,
                     worst_blocks=5).to_dict()
    assert other["tensors"][0]["schemes"][0]["blocks"] == base["tensors"][0]["schemes"][0]["blocks"]
    assert other["worst_blocks"] == base["worst_blocks"]


def test_schemes_whose_scales_span_the_tensor_have_no_block_facts():
    stats = quantize([source(data())], [build_scheme(per=Granularity.TENSOR)]
                     ).tensors[0].schemes[0]
    assert stats.blocks is None
    assert sum(stats.scale_log2_histogram.values()) == 1  # its one scale


def test_the_worst_blocks_are_those_that_flush_most():
    x = data(2)
    flushed, sizes, _, scale = reference_facts(x, (1, 128))
    result = quantize([source(x, "w")], [build_scheme(block=128)], worst_blocks=4)
    worst = result.worst_blocks
    assert len(worst) == 4
    order = sorted(zip((-flushed).reshape(-1).tolist(), range(flushed.size)))
    top = [divmod(i, flushed.shape[1]) for _, i in order[:4]]
    counts = [int(flushed[r, c]) for r, c in top]
    assert [w.flushed for w in worst] == counts
    assert all(w.tensor == "t.npy:w" and w.scheme == "block 128" for w in worst)
    for w in worst:  # each reported block is what it says
        assert flushed[w.row, w.column] == w.flushed and sizes[w.row, w.column] == w.size
        assert w.scale == pytest.approx(float(scale[w.row, w.column]), rel=1e-7)
        block = matrix_view(x)[w.row, w.column * 128:(w.column + 1) * 128]
        assert w.amax == float(np.abs(block).max())
        assert w.max_rel_error == 1.0 if w.flushed else w.max_rel_error < 1.0


def test_the_worst_blocks_span_tensors_and_keep_their_order():
    a, b = data(3, (8, 256)), data(4, (8, 256))
    result = quantize([source(a, "a"), source(b, "b")], [build_scheme(block=128)],
                      worst_blocks=3)
    keys = [(-w.flushed, -w.max_rel_error) for w in result.worst_blocks]
    assert keys == sorted(keys)
    assert {w.tensor for w in result.worst_blocks} <= {"t.npy:a", "t.npy:b"}
    assert quantize([source(a, "a")], [build_scheme(block=128)]).worst_blocks == ()


# -- groups by role ----------------------------------------------------------------------

@pytest.mark.parametrize("name, role", [
    ("encoder.layer.0.attention.self.query.weight", "encoder.layer.*.attention.self.query.weight"),
    ("model.layers.31.mlp.down_proj.weight", "model.layers.*.mlp.down_proj.weight"),
    ("h.11.attn.c_attn.bias", "h.*.attn.c_attn.bias"),
    ("conv1.weight", "conv1.weight"), ("fc2.bias", "fc2.bias"),
    ("blocks.0.3.norm", "blocks.*.*.norm"), ("3.weight", "*.weight"), ("a.1b.c", "a.1b.c"),
])
def test_roles_replace_layer_indices_only(name, role):
    assert role_of(name) == role


def test_a_group_is_its_tensors_quantized_as_one():
    """Three layers' query weights merge into one group whose statistics equal those of
    their rows stacked into one tensor (blocks along the last axis are the same blocks)."""
    rng = np.random.default_rng(5)
    layers = [(rng.standard_normal((16, 256)) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32)
              for _ in range(3)]
    sources = [source(w, f"layer.{i}.q.weight") for i, w in enumerate(layers)]
    sources.insert(1, source(rng.standard_normal(64).astype(np.float32), "embed.weight"))
    scheme = build_scheme(block=128)
    result = quantize(sources, [scheme])
    assert [(g.pattern, g.count) for g in result.groups] == [("layer.*.q.weight", 3),
                                                             ("embed.weight", 1)]
    group = result.groups[0].schemes[0]
    stacked = quantize([source(np.concatenate(layers), "all")], [scheme]).tensors[0].schemes[0]
    for key in ("count", "nonzero", "flushed", "saturated", "median_rel_error",
                "p99_rel_error", "max_abs_error"):
        assert getattr(group, key) == getattr(stacked, key), key
    assert group.rmse == pytest.approx(stacked.rmse, rel=1e-6)  # float32 chunk sums
    assert group.blocks == stacked.blocks
    assert group.scale_log2_histogram == stacked.scale_log2_histogram
    assert result.groups[0].tensors == tuple(f"t.npy:layer.{i}.q.weight" for i in range(3))


def test_groups_are_in_the_json():
    x = data()
    doc = quantize([source(x, "layer.0.w"), source(x, "layer.1.w")],
                   [build_scheme(block=128)], worst_blocks=2).to_dict()
    (group,) = doc["groups"]
    assert group["pattern"] == "layer.*.w" and group["count"] == 2
    assert group["tensors"] == ["t.npy:layer.0.w", "t.npy:layer.1.w"]
    stats = group["schemes"][0]
    assert stats["count"] == 2 * x.size
    assert set(stats["blocks"]) >= {"count", "flushing", "flushing_fraction", "saturating",
                                    "saturating_fraction", "flushed_fraction_quantiles"}
    assert all(isinstance(k, str) for k in stats["scale_log2_histogram"])
    assert len(doc["worst_blocks"]) == 2
    assert set(doc["worst_blocks"][0]) == {"scheme", "tensor", "block", "amax", "scale",
                                           "size", "flushed", "max_rel_error"}


def test_log2_histogram_keeps_nonzero_bins_in_order():
    counts = np.zeros(2201, np.int64)
    counts[1100 - 3] = 2
    counts[1100 + 8] = 5
    assert log2_histogram(counts) == {-3: 2, 8: 5}


def test_a_tensor_smaller_than_a_block_is_one_block_and_the_total_keeps_block_facts():
    """A bias of 64 values under blocks of 128 has one scale: one block, whose facts are the
    tensor's; the checkpoint's total then still has per-block facts."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    b = (rng.standard_normal(64) * 1e-4).astype(np.float32)
    b[0] = 1.0  # its scale makes three of the small values flush
    result = quantize([source(w, "l.0.w"), source(b, "l.0.b")], [build_scheme(block=128)])
    bias = result.tensors[1].schemes[0]
    assert bias.blocks.count == 1 and bias.blocks.flushing == int(bias.flushed > 0)
    assert dict(bias.blocks.flushed_fraction_quantiles)["max"] <= bias.flushed / 64
    total = result.total[0].blocks
    assert total is not None
    assert total.count == result.tensors[0].schemes[0].blocks.count + 1


@pytest.mark.parametrize("data_seed", [0, 9])
def test_a_scheme_s_statistics_do_not_depend_on_the_schemes_beside_it(data_seed):
    """The sum of x**2 is shared by the schemes of a chunk: whichever scheme reaches it
    first, it is summed the same way (it once followed the first scheme's knowledge of
    max|x|, so SQNR changed in its 8th digit with --compare)."""
    x = data(data_seed)
    block = build_scheme(block=128)
    alone = quantize([source(x)], [block]).tensors[0].schemes[0]
    beside = quantize([source(x)], [build_scheme(per=Granularity.TENSOR), block]
                      ).tensors[0].schemes[1]
    assert beside.to_dict() == alone.to_dict()


def test_many_worst_blocks_asked_for_cost_no_more_than_the_blocks_there_are():
    """Rows kept per chunk are bounded by its blocks: asking for a million worst blocks of a
    small tensor keeps its blocks, each once, in order."""
    x = data(6, (32, 512))
    result = quantize([source(x)], [build_scheme(block=128)], worst_blocks=1_000_000,
                      chunk_elements=4096)
    assert len(result.worst_blocks) == 32 * 4
    assert len({(w.row, w.column) for w in result.worst_blocks}) == 32 * 4
    keys = [(-w.flushed, -w.max_rel_error) for w in result.worst_blocks]
    assert keys == sorted(keys)


def test_worst_blocks_of_a_block_scheme_before_a_tile_spanning_every_row():
    # Building the results once overwrote the tensor's row count with the worst-block rows
    # found, so the next scheme's one-block check raised "truth value of an array".
    x = data()  # 48 rows: a 64 x 4 tile spans every row, which makes its scales global
    result = quantize([source(x)], [build_scheme(block=128), build_scheme(tile="64x4")],
                      worst_blocks=3)
    assert len(result.quantized[0].schemes) == 2
    assert [w.scheme for w in result.worst_blocks] == ["block 128"] * 3
