"""bfloat16 read as its bit patterns: no ``import ml_dtypes`` to load or quantize it.

``import ml_dtypes`` costs 1.4-2.6 s from release 0.7.0 (issue 22, item 2b;
benchmarks/RESULTS.md), so the loaders map bfloat16 as uint16 words tagged ``bfloat16``
(``storage.BFLOAT16_BITS``).  The compiled kernel must take every 16-bit kind as stored,
whichever file it came from; the numpy path must widen the bits exactly; results must be
those of ml_dtypes' own bfloat16 arrays, to the bit; and a fresh process that loads and
quantizes a bfloat16 file must not import ml_dtypes unless the work needs a bfloat16 value
or a narrow float (``array()``, the ml_dtypes backend, float8 data).
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from engine_helpers import Spy

from fmtcli.base.dtypes import ITEMSIZES, TABLE, bits_of
from fmtcli.inputs import storage
from fmtcli.inputs.source import TensorSource
from fmtcli.inputs.tensors import load_path
from fmtcli.numerics import native
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming import stream
from fmtcli.streaming.stream import ChunkReader

BF16 = np.dtype(ml_dtypes.bfloat16)


def sample(shape=(64, 256), seed=3) -> np.ndarray:
    """bfloat16 values over its whole range: subnormals, zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 12, shape))).astype(BF16)
    x.reshape(-1)[::97] = 0
    x.reshape(-1)[1::101] = -0.0
    return x


def every_pattern() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_the_bits_widen_to_ml_dtypes_float32_exactly_on_every_pattern():
    bits = every_pattern()
    want = bits.view(BF16).astype(np.float32).view(np.uint32)
    for order in ("=", ">"):
        stored = bits.astype(storage.BFLOAT16_BITS.newbyteorder(order))
        got = stream.widen(np.ascontiguousarray(stored).astype(storage.BFLOAT16_BITS),
                           np.float32)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want)
        assert np.array_equal(stream.widen_bfloat16_bits(stored).view(np.uint32), want)
    assert stream.widen(bits.view(storage.BFLOAT16_BITS), np.float64).dtype == np.float64


def test_the_tag_names_bfloat16_and_as_values_is_ml_dtypes_view():
    tagged = storage.BFLOAT16_BITS
    assert storage.dtype_name(tagged) == "bfloat16" == storage.dtype_name(tagged.newbyteorder(">"))
    assert storage.unusable_reason(tagged, 4) is None
    assert storage.dtype_name(np.uint16) == "uint16" and bits_of(np.dtype(np.uint16)) is None
    assert bits_of(BF16) is None
    for order in ("=", ">"):
        x = sample((4, 8)).astype(BF16.newbyteorder(order))
        stored = x.view(tagged.newbyteorder(order))
        values = storage.as_values(stored)
        assert values.dtype == x.dtype and np.shares_memory(values, x)
        assert np.array_equal(values.astype(np.float32), x.astype(np.float32))
    plain = np.zeros(3, np.float32)
    assert storage.as_values(plain) is plain


def test_itemsizes_are_those_of_the_dtypes():
    for t in TABLE:
        assert ITEMSIZES[t.name] == storage.itemsize(t.name) == storage.numpy_dtype(t.name).itemsize
        stored = storage.stored_dtype(t.name)
        assert stored.itemsize == t.itemsize and storage.dtype_name(stored) == t.name


def test_kind_of_the_tagged_bits_is_bfloat16_and_the_cache_keeps_them_apart():
    """A tagged dtype equals (and hashes as) plain uint16: asked in either order, plain
    uint16 is no kind and the tagged words are bfloat16; big-endian words are no kind."""
    native._KIND_OF.clear()
    assert native.kind_of(np.uint16) is None
    assert native.kind_of(storage.BFLOAT16_BITS) == native.KINDS["bfloat16"]
    native._KIND_OF.clear()
    assert native.kind_of(storage.BFLOAT16_BITS) == native.KINDS["bfloat16"]
    assert native.kind_of(np.uint16) is None
    assert native.kind_of(storage.BFLOAT16_BITS.newbyteorder(">")) is None
    assert native.kind_of(np.dtype(np.int16, metadata=dict(storage.BFLOAT16_BITS.metadata))) is None
    view, kind = native.values(np.zeros(4, storage.BFLOAT16_BITS))
    assert kind == 1 and view.dtype == np.uint16


def write(kind: str, x: np.ndarray, folder) -> str:
    """``x`` saved as a ``kind`` file (npy, npz, npz-compressed, safetensors, pt)."""
    if kind == "npy":
        path = folder / "x.npy"
        np.save(path, x)
    elif kind.startswith("npz"):
        path = folder / f"{kind}.npz"
        (np.savez_compressed if kind == "npz-compressed" else np.savez)(path, w=x)
    elif kind == "safetensors":
        from safetensors.numpy import save_file

        path = folder / "x.safetensors"
        save_file({"w": x}, str(path))
    else:
        torch = pytest.importorskip("torch")
        path = folder / "x.pt"
        dtype = torch.bfloat16 if x.dtype == BF16 else torch.float16
        carrier = torch.int16
        tensor = torch.from_numpy(x.view(np.int16).copy()).view(carrier).view(dtype)
        torch.save({"w": tensor}, str(path))
    return str(path)


FILES = ["npy", "npz", "npz-compressed", "safetensors", "pt"]
KINDS = {"bfloat16": BF16, "float16": np.dtype(np.float16)}


@pytest.fixture
def spy(monkeypatch):
    if native.module() is None:
        pytest.skip("the compiled kernel is not built or turned off")
    found = Spy(native._compiled)
    monkeypatch.setattr(native, "_compiled", found)
    return found


def schemes():
    return [build_scheme(block=32), build_scheme(),
            build_scheme(block=16, format=get_format("float8_e5m2"))]


@pytest.mark.parametrize("kind", FILES)
@pytest.mark.parametrize("name", list(KINDS))
def test_every_16_bit_kind_takes_the_native_path_from_every_file(name, kind, tmp_path, spy):
    """float16 and bfloat16 from .npy, .npz (stored and compressed), .safetensors and
    torch files: every chunk goes to the kernel as stored, with its kind, and the results
    are those of ml_dtypes' (numpy's) own array of the same values, to the bit."""
    x = sample().astype(KINDS[name])
    source = load_path(write(kind, x, tmp_path))[0]
    assert source.dtype == name
    got = quantize([source], schemes(), workers=1).to_dict()
    assert spy.kinds and set(spy.kinds) == {native.KINDS[name]}
    spy.kinds.clear()
    want = quantize([TensorSource(source.source, source.key, x.shape, name, lambda: x)],
                    schemes(), workers=1).to_dict()
    assert spy.kinds and set(spy.kinds) == {native.KINDS[name]}
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_bfloat16_file_reads_as_values_and_as_widened_chunks(order, tmp_path):
    """``array()`` is ml_dtypes' bfloat16 (what the commands that want values read);
    ``stored()`` its bits; chunks read as float32 are the exact values, in either byte
    order, through the file (preadv) and through memory (a compressed member)."""
    x = sample((8, 16))
    big = x.astype(BF16.newbyteorder(order))
    for kind in ("npy", "npz-compressed"):
        source = load_path(write(kind, big, tmp_path))[0]
        assert source.array().dtype == big.dtype
        assert np.array_equal(source.array().astype(np.float32), x.astype(np.float32))
        assert bits_of(source.stored().dtype) == "bfloat16"
        reader = ChunkReader(source)
        try:
            chunk = reader.read(slice(2, 6), slice(0, 16))
            assert chunk.dtype == np.float32
            assert np.array_equal(chunk.view(np.uint32),
                                  x[2:6].astype(np.float32).view(np.uint32))
            if native.module() is not None and order == "<":
                raw = reader.read(slice(0, 8), slice(0, 16), as_stored=True)
                assert bits_of(raw.dtype) == "bfloat16" and raw.dtype.isnative
                assert np.array_equal(raw.view(np.uint16), x.view(np.uint16))
        finally:
            reader.close()


def test_the_numpy_path_gives_the_kernels_results(tmp_path, monkeypatch):
    """``FMTCLI_KERNEL=numpy``: the chunks are widened from the bits; same statistics as
    the kernel's (tests/engine/test_native.py's rule: to the bit with numpy >= 2.3)."""
    if np.lib.NumpyVersion(np.__version__) < "2.3.0" or not native.built():
        pytest.skip("numpy before 2.3 sums in another order, or no kernel to compare")
    source = load_path(write("npy", sample(), tmp_path))[0]
    kernel = quantize([source], schemes(), workers=1).to_dict()
    monkeypatch.setenv(native.ENV, "numpy")
    plain = quantize([source], schemes(), workers=1).to_dict()
    assert json.dumps(kernel, sort_keys=True) == json.dumps(plain, sort_keys=True)


PROBE = """
import sys
from fmtcli.inputs.tensors import load_path
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
sources = load_path(sys.argv[1])
schemes = [build_scheme(block=32), build_scheme(),
           *(build_scheme(format=get_format(name)) for name in sys.argv[2:])]
quantize(sources, schemes, workers=1)
after_quantize = "ml_dtypes" in sys.modules
sources[0].array()
print(after_quantize, "ml_dtypes" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["npy", "npz", "safetensors", "pt"])
def test_a_fresh_process_quantizes_bfloat16_without_importing_ml_dtypes(kind, tmp_path):
    """Loading and quantizing a bfloat16 file (e4m3, e5m2, bfloat16 itself as formats)
    leaves ml_dtypes unloaded; asking for the values (``array()``) loads it.  One process
    quantizes with every format at once (an import is never undone, so none of them alone
    loads ml_dtypes either): one interpreter start per kind, not one per format."""
    path = write(kind, sample(), tmp_path)
    done = subprocess.run([sys.executable, "-c", PROBE, path, "float8_e5m2", "bfloat16"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout


@pytest.mark.slow
def test_the_cli_quantizes_bfloat16_safetensors_without_importing_ml_dtypes(tmp_path):
    """``fmt quantize FILE --json`` on a bfloat16 .safetensors, in a fresh process as a
    user runs it."""
    path = write("safetensors", sample(), tmp_path)
    code = ("import atexit, sys; atexit.register(lambda: sys.stderr.write("
            "'ML_DTYPES=%s\\n' % ('ml_dtypes' in sys.modules))); "
            "from fmtcli.cli import main; sys.argv = ['fmt'] + sys.argv[1:]; main()")
    done = subprocess.run([sys.executable, "-c", code, "quantize", path, "--block", "32",
                           "--json"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)
    assert "ML_DTYPES=False" in done.stderr
