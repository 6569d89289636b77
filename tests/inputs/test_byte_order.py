"""Big-endian inputs give exactly what the same values stored little-endian give.

A .npy or .npz written on (or for) a big-endian machine stores '>f2', '>f4', '>f8', or
bfloat16 as '>V2' (``np.save`` of ``x.astype(bfloat16.newbyteorder('>'))``; .safetensors
is little-endian by definition, and torch's files are read by torch).  Every reader of a
file is run on twin files -- the same values, one little-endian, one big-endian, under the
same name in two folders -- and must print the same bytes: the numpy and compiled chunk
kernels, the torch backend, ``--out`` (whose values are also checked against the input),
Dask's workers, and every other command that reads a tensor file.  Before the readers
swapped bytes (``quantize.stream.ChunkReader``), '>f2' came out all NaN on the kernel's
16-bit path, '>f8' was read as float32, '>V2' was skipped as "void16", and Dask's workers
mapped every big-endian tensor as little-endian.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import invoke, strict_loads

pytestmark = pytest.mark.slow

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = ["f2", "f4", "f8", "bf16"]
CONTAINERS = ["npy", "npz", "npz-compressed"]
KERNELS = {"numpy": {"FMTCLI_KERNEL": "numpy"}, "native": {"FMTCLI_KERNEL": None}}


def stored(code: str, order: str) -> np.dtype:
    """The dtype ``code`` in byte order ``order`` ('<' or '>')."""
    return BF16.newbyteorder(order) if code == "bf16" else np.dtype(order + code)


def values(seed: int = 1) -> np.ndarray:
    """16 x 256 float32 values spanning five decades, a zero and a subnormal of float16."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 256)) * np.array([[10.0 ** (i % 5 - 2)] for i in range(16)])
    x = x.astype(np.float32)
    x[0, 0], x[1, 1] = 0.0, 3e-6
    return x


def write_twins(root) -> dict[str, str]:
    """Folders ``le`` and ``be`` holding the same files, one little- one big-endian."""
    x = values()
    folders = {}
    for order, name in (("<", "le"), (">", "be")):
        folder = root / name
        folder.mkdir()
        folders[name] = str(folder)
        for code in DTYPES:
            dt = stored(code, order)
            a = x.astype(dt)
            np.save(folder / f"{code}.npy", a)
            np.savez(folder / f"{code}.npz", w=a, v=x[:4, :64].astype(dt))
            np.savez_compressed(folder / f"{code}-compressed.npz", w=a)
            np.savez(folder / f"{code}-kv.npz", **{
                "layers.0.k": x.reshape(16, 4, 64).astype(dt),
                "layers.0.v": x[::-1].reshape(16, 4, 64).astype(dt)})
            np.savez(folder / f"{code}-dot.npz", a=x.reshape(64, 64).astype(dt),
                     b=x[::-1].reshape(64, 64)[:, :32].astype(dt))
            np.savez(folder / f"{code}-qkv.npz", q=x[:, :32].astype(dt),
                     k=x[::-1, 32:64].astype(dt), v=x[:, 64:96].astype(dt))
            np.save(folder / f"{code}-vec.npy", x[2, :64].astype(dt))
    return folders


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return write_twins(tmp_path_factory.mktemp("byte_order"))


def file_name(code: str, container: str) -> str:
    return {"npy": f"{code}.npy", "npz": f"{code}.npz",
            "npz-compressed": f"{code}-compressed.npz"}[container]


def run_in(folder: str, args, env=None):
    """``fmt ARGS`` with ``folder`` as the working directory (file names are relative, so
    the twins' outputs name the same files)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        return invoke(*args, env=env)
    finally:
        os.chdir(before)


def same_output(twins, *args, env=None) -> str:
    """Both twins' runs of ``fmt ARGS`` succeed with the same stdout; that stdout."""
    le, be = run_in(twins["le"], args, env), run_in(twins["be"], args, env)
    assert le.exit_code == 0, (le.exit_code, le.stderr[-500:])
    assert be.exit_code == 0, (be.exit_code, be.stderr[-500:])
    assert be.stdout == le.stdout
    return le.stdout


def test_the_twins_differ_in_byte_order_only(twins):
    for code in DTYPES:
        le = np.load(os.path.join(twins["le"], f"{code}.npy"), allow_pickle=False)
        with open(os.path.join(twins["be"], f"{code}.npy"), "rb") as handle:
            header = handle.read(128)
        assert (b"'>V2'" if code == "bf16" else f"'>{code}'".encode()) in header
        assert le.dtype.isnative


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("code", DTYPES)
def test_quantize_reads_big_endian_as_little_endian(twins, code, container, kernel):
    name = file_name(code, container)
    env = KERNELS[kernel]
    doc = strict_loads(same_output(twins, "quantize", name, "--json", env=env))
    for tensor in doc["tensors"]:  # per-tensor and block 128 (the default comparison)
        assert tensor["dtype"] == ("bfloat16" if code == "bf16" else np.dtype(code).name)
        assert all(s["nan_produced"] == 0 and s["sqnr_db"] > 20 for s in tensor["schemes"])
    same_output(twins, "quantize", name, "--recipe", "mxfp8", "--recipe", "nvfp4",
                "--per", "tensor", "--json", env=env)


@pytest.mark.parametrize("code", DTYPES)
def test_big_endian_float64_stays_float64(twins, code):
    """'>f8' is float64 data: its errors are float64's, not those of a float32 copy."""
    doc = strict_loads(same_output(twins, "quantize", f"{code}.npy", "--product", "exact",
                                   "--json"))
    assert doc["tensors"][0]["dtype"] == ("bfloat16" if code == "bf16" else np.dtype(code).name)


@pytest.mark.parametrize("code", DTYPES)
def test_the_torch_backend(twins, code):
    pytest.importorskip("torch")
    same_output(twins, "quantize", f"{code}.npy", "--backend", "torch", "--block", "32",
                "--json")


@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("suffix", ["npy", "npz", "safetensors"])
def test_out_writes_the_same_file(twins, code, suffix, tmp_path):
    """--out of a big-endian input holds what the little-endian twin's holds: x_q as
    float32 (.npy), or codes and scales (.npz, .safetensors)."""
    written = {}
    for side in ("le", "be"):
        target = tmp_path / f"{side}.{suffix}"
        result = run_in(twins[side], ("quantize", f"{code}.npy", "--block", "32", "--out",
                                      str(target)))
        assert result.exit_code == 0, result.stderr[-500:]
        written[side] = target.read_bytes()
    assert written["be"] == written["le"]
    if suffix == "npy":
        x = values().astype(stored(code, "<")).astype(np.float32)
        x_q = np.load(tmp_path / "be.npy")
        assert x_q.dtype == np.float32 and x_q.shape == x.shape
        rel = np.abs(x_q - x) / np.maximum(np.abs(x), 1e-30)
        assert np.median(rel[x != 0]) < 0.05  # E4M3 of blocks of 32: a few percent


@pytest.mark.parametrize("command", [
    ("scale-search", "{code}.npy", "--json"),
    ("scale-search", "{code}.npz", "--block", "32", "--json"),
    ("loss-scale", "{code}.npy", "--json"),
    ("compare", "{code}.npy", "{code}-compressed.npz", "--json"),
    ("compare", "{code}.npz", "{code}.npz", "--json"),
    ("kv", "{code}-kv.npz", "--json"),
    ("dot", "{code}-dot.npz", "--json"),
    ("attention", "{code}-qkv.npz", "--json"),
    ("sum", "{code}-vec.npy", "--json"),
    ("softmax", "--scores", "{code}-vec.npy", "--values", "{code}-vec.npy", "--json"),
], ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("code", DTYPES)
def test_every_reader_of_a_file(twins, code, command):
    same_output(twins, *(part.format(code=code) for part in command))


def test_compare_of_the_twins_finds_no_difference(twins):
    """The big-endian file against its little-endian twin: the same values."""
    for code in DTYPES:
        result = invoke("compare", os.path.join(twins["le"], f"{code}.npy"),
                        os.path.join(twins["be"], f"{code}.npy"), "--json")
        assert result.exit_code == 0, result.stderr
        pair = strict_loads(result.stdout)["tensors"][0]
        assert pair["differ"] == 0, pair


@pytest.mark.parametrize("chunk", ["1024", "1048576"])  # a tensor's chunks, or whole
def test_dask_workers_read_big_endian(twins, scheduler, chunk):
    for code in DTYPES:
        doc = strict_loads(same_output(twins, "quantize", f"{code}.npz", "--dask",
                                       scheduler, "--chunk", chunk, "--json"))
        local = strict_loads(run_in(twins["le"], ("quantize", f"{code}.npz", "--chunk",
                                                  chunk, "--json")).stdout)
        assert {k: v for k, v in doc.items() if k != "dask"} == local
