"""The matrix view of an N-D tensor: one definition, used by every command that blocks.

docs/quantize.md ("How an N-D tensor is blocked"): trailing size-1 axes dropped; 4+ axes
(conv weights O x I x kh x kw) and 3 axes whose last is shorter than 32 (conv1d O x I x K)
are the first axis by the rest; otherwise all leading axes by the last.  Before this view,
a conv weight O x I x K x 1 was blocked along its last stored axis, one value a block:
block 128 reported ~150 dB ("lossless"), mxfp8 saturated ~14% of the values (mx-floor on
single values), ``--out`` was larger than its input, and nothing said so.

The references here reshape the data themselves (``x.reshape(O, -1)``) and run the
independent oracle on that matrix.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import invoke, json_of, run_fmt, strict_loads
from oracle import assert_matches_reference, ref_quantize
from peer_behaviour import sum_order

from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming.stream import KERNEL_AXIS, matrix_shape, short_rows_text

#: docs/quantize.md's table, and the edges of the rule
VIEWS = [
    ((), (1, 1)),
    ((4096,), (1, 4096)),
    ((4096, 1), (1, 4096)),
    ((1, 4096), (1, 4096)),
    ((1024, 4096), (1024, 4096)),
    ((256, 128, 64, 1), (256, 8192)),
    ((64, 1, 512, 1), (64, 512)),
    ((256, 128, 3, 3), (256, 1152)),
    ((256, 128, 1, 1), (256, 128)),
    ((16, 8, 3, 3, 3), (16, 216)),
    ((128, 64, 3), (128, 192)),
    ((128, 64, 3, 1), (128, 192)),
    ((64, 1, 31), (64, 31)),
    ((8, 2048, 512), (16384, 512)),
    ((8, 16, 32), (128, 32)),  # a last axis of 32 and up: stacked matrices
    ((128, 64, 1), (128, 64)),
    ((10, 1, 1, 1), (1, 10)),
]


@pytest.mark.parametrize(("shape", "view"), VIEWS, ids=str)
def test_the_matrix_view_of_every_shape(shape, view):
    assert matrix_shape(shape) == view
    assert view[0] * view[1] == int(np.prod(shape))


def test_the_kernel_axis_threshold_is_the_mx_block():
    assert KERNEL_AXIS == 32
    assert matrix_shape((4, 4, KERNEL_AXIS - 1)) == (4, 4 * (KERNEL_AXIS - 1))
    assert matrix_shape((4, 4, KERNEL_AXIS)) == (16, KERNEL_AXIS)


CONV_SHAPES = [(256, 128, 64, 1), (64, 1, 512, 1)]


def conv_weight(shape, seed: int = 3) -> np.ndarray:
    """A conv weight of N(0, 0.02^2) values with a few large ones."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    w.reshape(-1)[:: 9973] *= 12
    return w


def source(x, name="w") -> TensorSource:
    return TensorSource(name, None, x.shape, str(x.dtype), lambda: x)


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=str)
def test_conv_weights_are_blocked_per_output_channel(shape):
    """block 128 on O x I x K x 1 is 128-value blocks of each output channel's I*K
    weights: the statistics of the oracle on x.reshape(O, -1), not one value a block."""
    w = conv_weight(shape)
    stats = quantize([source(w)], [build_scheme(block=128)], workers=1).to_dict()
    tensor = stats["tensors"][0]
    assert tensor["matrix"] == [shape[0], w.size // shape[0]]
    s = tensor["schemes"][0]
    m = w.reshape(shape[0], -1)
    xq, scales, saturated, _ = ref_quantize(m, (1, 128))
    assert_matches_reference(s, m, xq, saturated=saturated, what=str(shape))
    assert s["blocks"]["count"] == scales.size == w.size // 128
    assert 25 < s["sqnr_db"] < 40  # E4M3's ~31 dB, not a "lossless" 150 dB


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=str)
def test_recipes_block_conv_weights_as_matrices(shape):
    """mxfp8 (1x32, E8M0 mx-floor) and NVFP4 (1x16) on the matrix view: blocks of 32 and
    16 values, mx-floor saturating a few blocks' largest values, not 14% of all values;
    NVFP4 blocks of FP4 flush some values, not every block wholly."""
    w = conv_weight(shape)
    doc = quantize([source(w)], [build_scheme(recipe="mxfp8"), build_scheme(recipe="nvfp4")],
                   workers=1).to_dict()
    mx, nv = doc["tensors"][0]["schemes"]
    assert mx["blocks"]["count"] == w.size // 32 and nv["blocks"]["count"] == w.size // 16
    assert mx["saturated"] / mx["count"] < 0.02
    assert nv["blocks"]["flushed_fraction_quantiles"]["max"] < 1.0
    assert nv["sqnr_db"] > 15


def test_out_of_a_conv_weight_is_smaller_than_its_input(tmp_path):
    """Codes (1 byte) and one float32 scale per 128 values: about a quarter of the float32
    input (one scale per value made it larger than the input)."""
    w = conv_weight((256, 128, 64, 1))
    path, out = tmp_path / "w.npy", tmp_path / "q.safetensors"
    np.save(path, w)
    doc = json_of("quantize", path, "--block", "128", "--compare", "none", "--out", out)
    assert doc["tensors"][0]["matrix"] == [256, 8192]
    assert out.stat().st_size < 0.3 * path.stat().st_size
    from safetensors.numpy import load_file

    arrays = load_file(str(out))
    assert arrays["w.scales"].shape == (256, 64)
    assert arrays["w.codes"].shape == w.shape
    header_length = int.from_bytes(out.read_bytes()[:8], "little")
    metadata = json.loads(out.read_bytes()[8:8 + header_length])["__metadata__"]
    described = json.loads(metadata["w"])
    assert described["matrix"] == [256, 8192] and described["tile"] == [1, 128]


def test_out_npy_of_a_conv_weight_holds_x_q_in_its_shape(tmp_path):
    w = conv_weight((64, 1, 512, 1))
    path, out = tmp_path / "w.npy", tmp_path / "xq.npy"
    np.save(path, w)
    json_of("quantize", path, "--block", "128", "--compare", "none", "--out", out)
    xq = np.load(out)
    ref, _, _, _ = ref_quantize(w.reshape(64, -1), (1, 128))
    assert xq.shape == w.shape and np.array_equal(xq.reshape(64, -1), ref)


def test_blocks_down_the_first_axis_of_a_conv_weight():
    """--axis 0 runs blocks down the view's columns: across output channels."""
    w = conv_weight((256, 16, 3, 1))
    s = quantize([source(w)], [build_scheme(block=64, axis=0)], workers=1).to_dict()
    m = w.reshape(256, -1)
    xq, scales, saturated, _ = ref_quantize(m, (64, 1))
    stats = s["tensors"][0]["schemes"][0]
    assert_matches_reference(stats, m, xq, saturated=saturated)
    assert stats["blocks"]["count"] == scales.size == 4 * 48


def test_a_column_vector_is_one_row():
    """N x 1 is N values in one row: blocks run along it, not one value a block."""
    x = conv_weight((1024, 1))
    stats = quantize([source(x)], [build_scheme(block=128)], workers=1).to_dict()
    s = stats["tensors"][0]["schemes"][0]
    assert stats["tensors"][0]["matrix"] == [1, 1024] and s["blocks"]["count"] == 8


# -- the note: blocks shorter than asked -----------------------------------------------------

@pytest.mark.slow
def test_short_rows_are_named_once_per_run(tmp_path):
    """A checkpoint whose rows are shorter than the block: one Note line for the run (not
    per tensor, not per chunk), naming how many tensors and one of them."""
    rng = np.random.default_rng(4)
    path = tmp_path / "cnn.npz"
    np.savez(path, **{"conv.weight": (rng.standard_normal((512, 64, 3)) * 0.1).astype(np.float32),
                      "dw.weight": (rng.standard_normal((64, 1, 3)) * 0.1).astype(np.float32),
                      "fc.weight": (rng.standard_normal((64, 256)) * 0.1).astype(np.float32)})
    done = run_fmt("quantize", path, "--block", "256", "--chunk", "4096", "--json")
    assert done.returncode == 0
    strict_loads(done.stdout.decode())
    notes = [line for line in done.stderr.decode().splitlines() if line.startswith("Note:")]
    short = [line for line in notes if "shorter than a block" in line]
    assert len(short) == 1, notes
    assert "2 of 3 tensors have rows shorter than a block of 256" in short[0]
    assert "'" in short[0] and "matrix view 512 x 192" in short[0]


def test_no_note_where_every_row_holds_a_block(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, conv_weight((64, 32, 4, 1)))  # rows of 128
    result = invoke("quantize", path, "--block", "128", "--recipe", "mxfp8", "--json")
    assert result.exit_code == 0
    assert "shorter than a block" not in result.stderr


def test_the_note_names_one_tensor_by_its_view(tmp_path):
    path = tmp_path / "dw.npy"
    np.save(path, conv_weight((64, 1, 3)))
    result = invoke("quantize", path, "--recipe", "nvfp4", "--json")
    assert result.exit_code == 0
    assert ("Note: nvfp4: block 16: the rows of " in result.stderr
            and "(matrix view 64 x 3) hold 3 values, fewer than a block of 16" in result.stderr)
    assert "BlockNote" not in result.stderr  # said as it is


def test_short_rows_of_tiles_and_of_blocks_down_the_columns():
    sources = [source(np.zeros((8, 64), np.float32), "a")]
    assert "block 128" in short_rows_text(sources, [build_scheme(block=128)])
    assert "tile 128x128" in short_rows_text(sources, [build_scheme(tile="128x128")])
    assert short_rows_text(sources, [build_scheme(block=64)]) is None
    assert short_rows_text(sources, [build_scheme(block=8, axis=0)]) is None
    assert "fewer than a block of 16" in short_rows_text(sources,
                                                         [build_scheme(block=16, axis=0)])
    from fmtcli.numerics.schemes import Granularity

    assert short_rows_text(sources, [build_scheme(per=Granularity.ROW)]) is None


def test_scale_search_lists_the_note(tmp_path):
    path = tmp_path / "dw.npy"
    np.save(path, conv_weight((64, 1, 3)))
    doc = json_of("scale-search", path, "--block", "32")
    assert any("hold 3 values, fewer than a block of 32" in note
               for note in doc["notes"]), doc["notes"]


# -- every path blocks the same view ---------------------------------------------------------

COUNTS = ("count", "nonzero", "flushed", "saturated", "median_rel_error", "p99_rel_error",
          "max_abs_error", "scales", "blocks")


def test_the_engine_paths_agree_on_a_conv_weight(tmp_path):
    """The compiled kernel and numpy: the same document; small chunks on two workers: the
    same counts, quantiles and scales (sums agree to ~1e-7 between chunkings) on
    O x I x K x 1, whose chunks are whole rows of the view."""
    w = conv_weight((128, 32, 64, 1))
    path = tmp_path / "w.npy"
    np.save(path, w)
    args = ("quantize", path, "--per", "tensor", "--recipe", "mxfp8", "--json")
    base = json_of(*args)
    assert base["tensors"][0]["matrix"] == [128, 2048]
    numpy_path = json_of(*args, env={"FMTCLI_KERNEL": "numpy"})
    if sum_order() is None:  # numpy >= 2.3 sums by one pairwise tree, as the kernel does
        assert numpy_path == base
    else:  # numpy 1.26-2.2 sums in blocks of 8192 (peer_behaviour): sums' last digits differ
        for a, b in zip(numpy_path["tensors"][0]["schemes"], base["tensors"][0]["schemes"]):
            assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS}
            assert a["sqnr_db"] == pytest.approx(b["sqnr_db"], rel=1e-6)
    chunked = json_of(*args, "--chunk", "4096", "--workers", "2")
    for a, b in zip(chunked["tensors"][0]["schemes"], base["tensors"][0]["schemes"]):
        assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS}
        assert a["sqnr_db"] == pytest.approx(b["sqnr_db"], rel=1e-6)


@pytest.mark.slow
def test_dask_tasks_block_the_same_view(tmp_path, scheduler):
    path = tmp_path / "w.npy"
    np.save(path, conv_weight((128, 32, 64, 1)))
    args = ("quantize", path, "--block", "128", "--recipe", "nvfp4", "--chunk", "8192")
    remote = json_of(*args, "--dask", scheduler)
    assert {k: v for k, v in remote.items() if k != "dask"} == json_of(*args)


@pytest.mark.slow
def test_compare_reads_conv_weights_through_the_view(tmp_path):
    w = conv_weight((64, 8, 5, 1))
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, w)
    np.save(b, w * np.float32(1.5))
    doc = json_of("compare", a, b, "--chunk", "1024")  # chunks of whole rows of 40
    assert doc["tensors"][0]["count"] == w.size and doc["tensors"][0]["differ"] == w.size
