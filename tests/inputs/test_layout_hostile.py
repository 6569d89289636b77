"""Hostile inputs for the quantized-layout readers, ``fmt audit``, ``fmt compare`` and
``fmt quantize`` (``--out DIR --layout``): a few hundred broken or odd checkpoints.

Every layout (``inputs.layouts.READERS``) is written healthy from its definition in a few
lines (the layouts' docstrings cite them: DeepSeek-V3 README_WEIGHTS.md, ModelOpt's
``nvfp4_tensor.py``, gpt-oss's ``weights.py``, compressed-tensors 0.20.1's compressors,
vLLM's ``kv_cache.py``, fmt's own ``--out``), then broken one way at a time: codes cut short,
empty, 1-D, 5-D, a zero-size axis claiming 2^40 columns; scales NaN, inf, negative, zero,
subnormal, E8M0 byte 255, float8 NaN, int64, bool, empty, one value for a million rows, of
the wrong shape or missing; global scales the same; ``weight_shape`` lies; unicode and very
long names; configs that are not JSON, not an object, nested 100 000 deep, 17 MB, or with
wrong types everywhere.  What each case must do (``settled``): ``layouts.scan`` never
raises; every claimed tensor either reads (float32, its matrix view's shape) or refuses in
one ``DataError`` line; ``audit_sources`` gives a result (a broken layout is a failed
check) or one ``DataError`` line; the dequantized input streams or refuses the same way.
Through the CLI (fresh processes, 60 s each): exit 0/1/2, never 70 or a traceback, stdout
strict JSON with ``--json`` where there is any, and nothing written where the run fails.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import run_fmt_each, strict_loads

from fmtcli.base.errors import DataError
from fmtcli.inputs import layouts
from fmtcli.inputs.tensors import load_path

CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
         "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
         "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
         "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}
F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


class Raw:
    """A header entry written verbatim: dtype code, shape, bytes (a shape the bytes need
    not hold)."""

    def __init__(self, code: str, shape, blob: bytes = b""):
        self.code, self.shape, self.blob = code, list(shape), blob


def write_st(path, tensors: dict, metadata: dict | None = None) -> Path:
    """A .safetensors file of ``{name: array or Raw}`` (written by hand: any name, any
    dtype safetensors names, any shape a Raw claims)."""
    header: dict = {} if metadata is None else {"__metadata__": metadata}
    offset, blobs = 0, []
    for name, arr in tensors.items():
        if isinstance(arr, Raw):
            code, shape, blob = arr.code, arr.shape, arr.blob
        else:
            arr = np.ascontiguousarray(arr)
            code, shape, blob = CODES[arr.dtype.name], list(arr.shape), arr.tobytes()
        header[name] = {"dtype": code, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return Path(path)


# -- healthy layouts, from their definitions --------------------------------------------------

RNG = np.random.default_rng(24)


def f8(*shape) -> np.ndarray:
    return (RNG.standard_normal(shape) * 100).clip(-440, 440).astype(F8)


def packed(*shape) -> np.ndarray:
    return RNG.integers(0, 256, shape, dtype=np.uint8)


def e8m0(*shape, centre: int = 120) -> np.ndarray:
    return RNG.integers(centre - 4, centre + 4, shape).astype(np.uint8)


def positive(*shape, dtype=np.float32, size: float = 1e-3) -> np.ndarray:
    return (RNG.uniform(0.5, 2.0, shape) * size).astype(dtype)


M = "model.layers.0.mlp.down_proj"
CT = {"quant_method": "compressed-tensors"}


def ct_config(fmt: str, **weights) -> dict:
    return {**CT, "format": fmt, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": weights}}}


def deepseek():
    return ({f"{M}.weight": f8(256, 192), f"{M}.weight_scale_inv": positive(2, 2)},
            {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
            {"codes": f"{M}.weight", "scales": f"{M}.weight_scale_inv"})


def deepseek_ue8m0():
    tensors, config, roles = deepseek()
    tensors[roles["scales"]] = e8m0(2, 2)
    return tensors, {**config, "scale_fmt": "ue8m0"}, roles


def modelopt():
    return ({f"{M}.weight": packed(64, 32), f"{M}.weight_scale": positive(64, 4, size=100,
                                                                           dtype=F8),
             f"{M}.weight_scale_2": np.array(1e-4, dtype=np.float32),
             f"{M}.input_scale": np.array(0.01, dtype=np.float32)},
            {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
            {"codes": f"{M}.weight", "scales": f"{M}.weight_scale",
             "global": f"{M}.weight_scale_2"})


def gptoss():
    base = "model.layers.0.mlp.experts.gate_up_proj"
    return ({f"{base}_blocks": packed(2, 8, 2, 16), f"{base}_scales": e8m0(2, 8, 2)},
            {"quant_method": "mxfp4"},
            {"codes": f"{base}_blocks", "scales": f"{base}_scales"})


def ct_fp8_channel():
    return ({f"{M}.weight": f8(64, 96), f"{M}.weight_scale": positive(64, 1, dtype=BF16)},
            ct_config("float-quantized", num_bits=8, type="float", strategy="channel"),
            {"codes": f"{M}.weight", "scales": f"{M}.weight_scale"})


def ct_fp8_block():
    return ({f"{M}.weight": f8(200, 130), f"{M}.weight_scale": positive(2, 2)},
            ct_config("float-quantized", num_bits=8, type="float", strategy="block",
                      block_structure=[128, 128]),
            {"codes": f"{M}.weight", "scales": f"{M}.weight_scale"})


def ct_mxfp8():
    return ({f"{M}.weight": f8(64, 64), f"{M}.weight_scale": e8m0(64, 2)},
            ct_config("mxfp8-quantized", num_bits=8, type="float", strategy="group",
                      group_size=32),
            {"codes": f"{M}.weight", "scales": f"{M}.weight_scale"})


def ct_mxfp4():
    return ({f"{M}.weight_packed": packed(64, 32), f"{M}.weight_scale": e8m0(64, 2)},
            ct_config("mxfp4-pack-quantized", num_bits=4, type="float", strategy="group",
                      group_size=32),
            {"codes": f"{M}.weight_packed", "scales": f"{M}.weight_scale"})


def ct_nvfp4():
    return ({f"{M}.weight_packed": packed(64, 32),
             f"{M}.weight_scale": positive(64, 4, size=100, dtype=F8),
             f"{M}.weight_global_scale": np.array([1e4], dtype=np.float32)},
            ct_config("nvfp4-pack-quantized", num_bits=4, type="float",
                      strategy="tensor_group", group_size=16),
            {"codes": f"{M}.weight_packed", "scales": f"{M}.weight_scale",
             "global": f"{M}.weight_global_scale"})


def ct_pack():
    return ({f"{M}.weight_packed": RNG.integers(-2**31, 2**31, (64, 8), dtype=np.int32),
             f"{M}.weight_scale": positive(64, 2, dtype=BF16),
             f"{M}.weight_shape": np.array([64, 64], dtype=np.int64)},
            ct_config("pack-quantized", num_bits=4, type="int", strategy="group",
                      group_size=32, symmetric=True),
            {"codes": f"{M}.weight_packed", "scales": f"{M}.weight_scale",
             "shape": f"{M}.weight_shape"})


def kv():
    attn = "model.layers.0.self_attn"
    return ({f"{attn}.k_scale": np.array(0.02, dtype=np.float32),
             f"{attn}.v_scale": positive(8), f"{attn}.q_proj.weight":
             RNG.standard_normal((16, 16)).astype(np.float32)},
            {**CT, "kv_cache_scheme": {"type": "float", "num_bits": 8}},
            {"scales": f"{attn}.v_scale", "codes": f"{attn}.k_scale"})


def fmt_out():
    """fmt quantize --out's layout (fmt_out.py's docstring): per-tensor E4M3 codes."""
    codes = f8(64, 48).view(np.uint8)
    entry = {"scheme": {"format": "float8_e4m3fn", "granularity": "tensor", "label": "t"},
             "tile": [64, 48], "shape": [64, 48], "matrix": [64, 48]}
    tensors = {"w.codes": codes, "w.scales": np.array([[3.5]], dtype=np.float32)}
    meta = {"fmtcli": "x_q = decode(codes) / scales", "w": json.dumps(entry)}
    return tensors, None, {"codes": "w.codes", "scales": "w.scales", "metadata": meta}


LAYOUTS = {f.__name__: f for f in (deepseek, deepseek_ue8m0, modelopt, gptoss, ct_fp8_channel,
                                   ct_fp8_block, ct_mxfp8, ct_mxfp4, ct_nvfp4, ct_pack, kv,
                                   fmt_out)}


def write_case(folder: Path, tensors: dict, config, roles: dict,
               extra: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_st(folder / "model.safetensors", tensors, roles.get("metadata"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    if "hf_quant" not in (extra or {}) and isinstance(config, dict) and config.get(
            "quant_method") == "modelopt":
        (folder / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": config}))
    for name, text in (extra or {}).items():
        (folder / ("hf_quant_config.json" if name == "hf_quant" else name)).write_text(text)
    return folder


# -- what every case must do -------------------------------------------------------------------

def one_line(error: Exception) -> str:
    """The message of a refusal: one line (a key's own control characters aside: the
    command line escapes them), bounded."""
    text = str(error)
    bare = text.replace(CONTROL_PREFIX, "")
    # (a 5000-character key may appear whole: the command line's Error line cuts it)
    assert text and "\n" not in bare and "\r" not in bare and len(text) < 20_000, text[:500]
    return text


def read_or_refuse(function, *args):
    """``function(*args)``, or None where it refuses in one DataError line."""
    try:
        return function(*args)
    except DataError as error:
        one_line(error)
        return None


def settled(folder: Path) -> dict:
    """Every reading of ``folder`` ends in values or one DataError line (never another
    exception); what was found, for the case's own assertions."""
    from fmtcli.audit import audit_sources

    found = {"refused": None, "quantized": [], "audit": None}
    try:
        sources = load_path(str(folder), as_stored=True)
    except DataError as error:
        found["refused"] = one_line(error)
        return found
    config = layouts.read_config(str(folder))
    assert config is None or isinstance(config, dict)
    scan = layouts.scan(sources, config)
    for q in scan.quantized:
        assert all(isinstance(p, str) and "\n" not in p.replace(CONTROL_PREFIX, "")
                   for p in q.problems), q.problems
        json.dumps(q.describe(), default=str)
        rows, cols = q.matrix
        found["quantized"].append(q)
        block = read_or_refuse(q.read, slice(0, rows), slice(0, cols))
        if block is not None:
            assert block.dtype == np.float32 and block.shape == (rows, cols)
            assert not q.problems
        if q.elements_reader is not None and not q.problems:
            values = read_or_refuse(q.elements_reader, 0, rows)
            assert values is None or values.shape == (rows, cols)
        if q.scales_reader is not None and not q.problems:
            read_or_refuse(q.scales_reader)
    try:
        result = audit_sources(sources, config, path=str(folder), workers=1)
    except DataError as error:
        found["audit"] = one_line(error)
    else:
        text = json.dumps(result.to_dict(), default=str)
        assert "Traceback" not in text
        found["audit"] = result
    try:
        dequantized = load_path(str(folder))
    except DataError as error:
        one_line(error)
        return found
    from fmtcli.streaming.stream import ChunkReader  # noqa: F401  (imported: exists)

    for source in dequantized:
        if source.quantized is not None:
            rows, cols = source.quantized.matrix
            read_or_refuse(source.quantized.read, slice(0, min(rows, 7)), slice(0, cols))
    return found


def failed_checks(found: dict) -> list[str]:
    result = found["audit"]
    if result is None or isinstance(result, str):
        return []
    return [c.name for t in result.tensors for c in t.checks if c.verdict.value == "fail"]


@pytest.fixture(autouse=True)
def quiet_notes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", RuntimeWarning)  # numpy's: would reach the user
        yield


# -- the breakages, by role ------------------------------------------------------------------

def _with(tensors: dict, key: str, value) -> dict:
    return {**tensors, key: value}


def _scale_values(arr: np.ndarray, value: float) -> np.ndarray:
    """``arr`` with its first element replaced by ``value`` in its own storage (E8M0 bytes
    by their code: NaN -> 255, 0 -> 0, negative -> 0x80, tiny -> 1)."""
    out = np.array(arr, copy=True)
    flat = out.reshape(-1)
    if out.dtype == np.uint8:
        flat[0] = 255 if math.isnan(value) else 254 if math.isinf(value) else (
            0 if value == 0 else 128 if value < 0 else 1)
    else:
        flat[0] = np.asarray(value).astype(out.dtype)
    return out


def scales_valued(value: float):
    def mutate(tensors, roles):
        return _with(tensors, roles["scales"], _scale_values(tensors[roles["scales"]], value))
    mutate.__name__ = f"scales_{value!r}"
    return mutate


def all_scales(value: float):
    def mutate(tensors, roles):
        arr = np.array(tensors[roles["scales"]], copy=True)
        for i in range(arr.size):
            arr.reshape(-1)[i:i + 1] = _scale_values(arr.reshape(-1)[i:i + 1], value)
        return _with(tensors, roles["scales"], arr)
    mutate.__name__ = f"all_scales_{value!r}"
    return mutate


def codes_truncated(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], arr[..., :-1] if arr.ndim else arr)


def codes_half_rows(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], arr[: max(1, arr.shape[0] // 2)] if arr.ndim else arr)


def codes_no_rows(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], arr[:0] if arr.ndim else np.zeros(0, arr.dtype))


def codes_no_columns(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], arr[..., :0] if arr.ndim else np.zeros((1, 0),
                                                                                 arr.dtype))


def codes_1d(tensors, roles):
    return _with(tensors, roles["codes"], tensors[roles["codes"]].reshape(-1))


def codes_scalar(tensors, roles):
    return _with(tensors, roles["codes"], tensors[roles["codes"]].reshape(-1)[:1].reshape(()))


def codes_5d(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], arr.reshape((1, 1, 1) + arr.shape))


def all_5d(tensors, roles):
    out = dict(tensors)
    for role in ("codes", "scales"):
        arr = tensors[roles[role]]
        out[roles[role]] = arr.reshape((1,) * max(0, 5 - arr.ndim) + arr.shape)
    return out


def codes_huge_empty(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], Raw(CODES[arr.dtype.name], [0, 1 << 40]))


def codes_huge_empty_lead(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], Raw(CODES[arr.dtype.name],
                                              [1 << 40, 0] + list(arr.shape[1:])))


def scales_huge_empty(tensors, roles):
    arr = tensors[roles["scales"]]
    return _with(tensors, roles["scales"], Raw(CODES[arr.dtype.name], [1 << 40, 0]))


def codes_float32(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], np.zeros(arr.shape, dtype=np.float32))


def codes_int8(tensors, roles):
    arr = tensors[roles["codes"]]
    return _with(tensors, roles["codes"], np.zeros(arr.shape, dtype=np.int8))


def scales_one(tensors, roles):
    arr = tensors[roles["scales"]]
    return _with(tensors, roles["scales"], arr.reshape(-1)[:1].copy())


def scales_scalar(tensors, roles):
    arr = tensors[roles["scales"]]
    return _with(tensors, roles["scales"], arr.reshape(-1)[:1].reshape(()).copy())


def scales_empty(tensors, roles):
    arr = tensors[roles["scales"]]
    return _with(tensors, roles["scales"], arr.reshape(-1)[:0].copy())


def scales_transposed(tensors, roles):
    arr = tensors[roles["scales"]]
    if arr.ndim >= 2:
        return _with(tensors, roles["scales"], np.ascontiguousarray(np.swapaxes(arr, -1, -2)))
    return _with(tensors, roles["scales"], np.concatenate([arr.reshape(-1)] * 2))


def scales_extra_column(tensors, roles):
    arr = tensors[roles["scales"]]
    wide = arr.reshape(arr.shape[:-1] + (-1,)) if arr.ndim else arr.reshape(1, 1)
    return _with(tensors, roles["scales"], np.concatenate([wide, wide[..., :1]], axis=-1))


def scales_half(tensors, roles):
    arr = tensors[roles["scales"]]
    if arr.ndim == 0 or arr.shape[-1] < 2:
        return _with(tensors, roles["scales"], arr.reshape(-1)[:0].copy())
    return _with(tensors, roles["scales"], np.ascontiguousarray(arr[..., : arr.shape[-1] // 2]))


def scales_dtype(dtype):
    def mutate(tensors, roles):
        arr = tensors[roles["scales"]]
        return _with(tensors, roles["scales"], np.ones(arr.shape, dtype=dtype))
    mutate.__name__ = f"scales_{np.dtype(dtype).name}"
    return mutate


def scales_missing(tensors, roles):
    return {k: v for k, v in tensors.items() if k != roles["scales"]}


def codes_missing(tensors, roles):
    return {k: v for k, v in tensors.items() if k != roles["codes"]}


def unicode_names(tensors, roles):
    prefix = "模型.\u202e слой.🙂\u0000x."
    return {prefix + k: v for k, v in tensors.items()}


def long_names(tensors, roles):
    prefix = "a" * 5000 + "."
    return {prefix + k: v for k, v in tensors.items()}


CONTROL_PREFIX = "\x1b[31mred\x1b[0m.\r\n."


def control_names(tensors, roles):
    return {CONTROL_PREFIX + k: v for k, v in tensors.items()}


MUTATIONS = [codes_truncated, codes_half_rows, codes_no_rows, codes_no_columns, codes_1d,
             codes_scalar, codes_5d, all_5d, codes_huge_empty, codes_huge_empty_lead,
             scales_huge_empty, codes_float32, codes_int8, scales_one, scales_scalar,
             scales_empty, scales_transposed, scales_extra_column, scales_half,
             scales_dtype(np.int64), scales_dtype(np.bool_), scales_dtype(np.float64),
             scales_dtype(np.int32), scales_missing, codes_missing, unicode_names,
             long_names, control_names,
             scales_valued(float("nan")), scales_valued(float("inf")), scales_valued(-1.0),
             scales_valued(0.0), scales_valued(1e-45), scales_valued(3e38),
             all_scales(float("nan")), all_scales(0.0), all_scales(float("inf")),
             all_scales(-0.5)]


def _some_slow(pairs: list[tuple], ids: list[str], quick_every: int = 4) -> list:
    """The pairs as parameters, a third quick (a diagonal of the cross product: every row
    and column of it in the quick subset), the rest marked slow (the whole suite: < 20 s)."""
    return [pytest.param(*pair, id=name, marks=() if i % quick_every == 0 else pytest.mark.slow)
            for i, (pair, name) in enumerate(zip(pairs, ids))]


MUTATION_CASES = _some_slow(
    [(layout, m) for layout in LAYOUTS for m in MUTATIONS],
    [f"{layout}-{m.__name__}" for layout in LAYOUTS for m in MUTATIONS])


@pytest.mark.parametrize(("layout", "mutation"), MUTATION_CASES)
def test_a_broken_part_reads_refuses_or_fails_a_check(tmp_path, layout, mutation):
    tensors, config, roles = LAYOUTS[layout]()
    broken = mutation(tensors, roles)
    found = settled(write_case(tmp_path / "case", broken, config, roles))
    assert found["refused"] or found["audit"] is not None


# -- configs broken every way ----------------------------------------------------------------

def _qc(entry) -> str:
    return json.dumps({"architectures": ["X"], "quantization_config": entry})


BAD_CONFIGS = {
    "not-json": "{\"quantization_config\": {",
    "not-utf8": b"{\"quantization_config\": {\"quant_method\": \"\xff\xfe\"}}".decode("latin-1"),
    "a-list": "[1, 2, 3]",
    "null": "null",
    "a-string": "\"fp8\"",
    "nested-deep": "[" * 100_000 + "]" * 100_000,
    "nested-900": _qc({"x": json.loads("[" * 900 + "]" * 900)}),
    "entry-list": _qc([{"quant_method": "fp8"}]),
    "entry-string": _qc("compressed-tensors"),
    "nan-literal": "{\"quantization_config\": {\"weight_block_size\": [NaN, Infinity], "
                   "\"group_size\": -Infinity, \"global\": NaN}}",
    "duplicate-keys": "{\"quantization_config\": {\"quant_method\": \"fp8\"}, "
                      "\"quantization_config\": {\"quant_method\": \"modelopt\"}}",
    "block-zero": _qc({"quant_method": "fp8", "weight_block_size": [0, 128]}),
    "block-huge": _qc({"quant_method": "fp8", "weight_block_size": [1 << 40, 1]}),
    "block-negative": _qc({"quant_method": "fp8", "weight_block_size": [-128, 128]}),
    "block-strings": _qc({"quant_method": "fp8", "weight_block_size": ["128", "128"]}),
    "block-floats": _qc({"quant_method": "fp8", "weight_block_size": [128.0, 0.5]}),
    "block-bools": _qc({"quant_method": "fp8", "weight_block_size": [True, True]}),
    "block-three": _qc({"quant_method": "fp8", "weight_block_size": [1, 1, 1]}),
    "block-one": _qc({"quant_method": "fp8", "weight_block_size": [1, 1],
                      "scale_fmt": "ue8m0"}),
    "lists-for-strings": _qc({"quant_method": ["fp8"], "fmt": ["e4m3"], "scale_fmt": ["ue8m0"],
                              "quant_algo": ["NVFP4"], "format": ["pack-quantized"],
                              "kv_cache_scheme": ["float"]}),
    "numbers-for-strings": _qc({"quant_method": 8, "quant_algo": 4, "format": 16,
                                "scale_fmt": 0, "kv_cache_scheme": 8}),
    "groups-list": _qc({**CT, "format": "pack-quantized", "config_groups": [{"weights": {}}]}),
    "groups-junk": _qc({**CT, "format": "nvfp4-pack-quantized", "config_groups": {
        "a": None, "b": [], "c": {"weights": [], "targets": "Linear", "format": 3},
        "d": {"weights": {"num_bits": "4", "group_size": "16", "strategy": ["group"],
                          "block_structure": "128x128", "symmetric": "no"},
              "targets": [None, 1, "re:(", "re:.*"]}}}),
    "group-size-zero": _qc({**CT, "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 0,
                                           "strategy": "group"}}}}),
    "group-size-negative": _qc({**CT, "format": "nvfp4-pack-quantized", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": -16}}}}),
    "group-size-huge": _qc({**CT, "format": "mxfp4-pack-quantized", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"group_size": 1 << 62,
                                                 "block_structure": [1 << 40, 1]}}}}),
    "num-bits-zero": _qc({**CT, "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 0, "group_size": 32}}}}),
    "num-bits-64": _qc({**CT, "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 64, "group_size": 32}}}}),
    "num-bits-2": _qc({**CT, "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["re:.*"], "weights": {"num_bits": 2, "group_size": 32}}}}),
    "strategy-lies": _qc({**CT, "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"strategy": "block", "block_structure": [1, 1],
                                           "group_size": 1}}}}),
    "modelopt-group-zero": _qc({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                "group_size": 0}),
    "modelopt-group-seven": _qc({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                 "group_size": 7}),
    "modelopt-group-bool": _qc({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                "group_size": True}),
    "kv-scheme-junk": _qc({**CT, "kv_cache_scheme": {"type": ["float"], "num_bits": "8",
                                                     "strategy": {"a": 1}}}),
    "says-nvfp4": _qc({"quant_method": "modelopt", "quant_algo": "NVFP4"}),
    "says-fp8-deepseek": _qc({"quant_method": "fp8", "weight_block_size": [128, 128]}),
    "says-mxfp4": _qc({**CT, "format": "mxfp4-pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}}),
    "says-gptoss": _qc({"quant_method": "mxfp4"}),
    "says-unknown": _qc({"quant_method": "awq", "bits": 4, "group_size": 128}),
    "empty-object": _qc({}),
}


CONFIG_LAYOUTS = ["deepseek", "modelopt", "gptoss", "ct_fp8_block", "ct_mxfp4", "ct_nvfp4",
                  "ct_pack", "kv"]
CONFIG_CASES = _some_slow(
    [(layout, c, f) for layout in CONFIG_LAYOUTS for c in BAD_CONFIGS
     for f in ("config.json", "hf_quant")],
    [f"{layout}-{c}-{f}" for layout in CONFIG_LAYOUTS for c in BAD_CONFIGS
     for f in ("config", "hf_quant_config")], quick_every=9)


@pytest.mark.parametrize(("layout", "config", "file"), CONFIG_CASES)
def test_a_broken_or_lying_config_is_a_hint_never_a_crash(tmp_path, layout, config, file):
    """config.json, or ModelOpt's hf_quant_config.json (its entry "quantization")."""
    tensors, _, roles = LAYOUTS[layout]()
    text = BAD_CONFIGS[config]
    if file == "hf_quant":
        text = text.replace('"quantization_config"', '"quantization"')
    folder = write_case(tmp_path / "case", tensors, None, roles, {file: text})
    found = settled(folder)
    assert found["refused"] is None
    assert found["quantized"], "the tensors alone name the layout"


def test_a_17_mb_config_is_not_read(tmp_path):
    tensors, config, roles = deepseek()
    blob = _qc({**config, "padding": "x" * (17 << 20)})
    folder = write_case(tmp_path / "case", tensors, None, roles, {"config.json": blob,
                                                                  "hf_quant": blob})
    assert layouts.read_config(str(folder)) is None
    assert settled(folder)["quantized"]


# -- the parts each layout reads beyond codes and scales --------------------------------------

SHAPE_LIES = {"wider": [64, 65], "narrower": [64, 63], "taller": [65, 64], "zero": [0, 64],
              "negative": [-1, 64], "huge-rows": [1 << 62, 64], "huge-columns": [64, 1 << 62],
              "eight-axes": [1] * 6 + [64, 64], "nine-axes": [1] * 7 + [64, 64],
              "one-axis": [4096], "empty": [], "float": np.array([64.0, 64.0]),
              "matrix": np.array([[64, 64]]), "bool": np.array([True, True]),
              "int8": np.array([64, 64], dtype=np.int8), "uint8": np.array([64, 64],
                                                                            dtype=np.uint8),
              "int32-max": np.array([2**31 - 1, 64], dtype=np.int32),
              "uint64-max": np.array([2**64 - 1, 64], dtype=np.uint64)}


@pytest.mark.parametrize("lie", list(SHAPE_LIES))
@pytest.mark.parametrize("config", [True, False], ids=["config", "no-config"])
def test_weight_shape_lies_are_problems(tmp_path, lie, config):
    tensors, cfg, roles = ct_pack()
    value = SHAPE_LIES[lie]
    tensors[roles["shape"]] = (value if isinstance(value, np.ndarray)
                               else np.array(value, dtype=np.int64))
    found = settled(write_case(tmp_path / "case", tensors, cfg if config else None, roles))
    (q,) = found["quantized"]
    if lie in ("eight-axes", "narrower", "uint8", "int8"):  # true shapes: 63 int4 columns
        return  # fill 8 words too; [1]*6 + [64, 64] is 64 x 64 with leading ones
    assert q.problems, (lie, q.shape)
    if q.problems:
        assert "structure" in failed_checks(found)


GLOBALS = {"nan": np.array([np.nan], np.float32), "inf": np.array([np.inf], np.float32),
           "zero": np.array([0.0], np.float32), "negative": np.array([-1e4], np.float32),
           "subnormal": np.array([1e-45], np.float32), "huge": np.array([3e38], np.float32),
           "inverted": None, "two": np.array([1e4, 1e4], np.float32),
           "empty": np.zeros(0, np.float32), "int64": np.array([10000]),
           "bool": np.array([True]), "float8": np.array([400.0]).astype(F8),
           "bfloat16": np.array([1e4]).astype(BF16), "complex": "skip",
           "five-d": np.full((1, 1, 1, 1, 1), 1e4, np.float32), "missing": "missing"}


@pytest.mark.parametrize("value", list(GLOBALS))
@pytest.mark.parametrize("layout", ["modelopt", "ct_nvfp4"])
def test_a_broken_global_scale_reads_refuses_or_fails_a_check(tmp_path, layout, value):
    tensors, config, roles = LAYOUTS[layout]()
    glob = GLOBALS[value]
    if isinstance(glob, str):
        del tensors[roles["global"]]
    elif glob is None:
        tensors[roles["global"]] = (1 / tensors[roles["global"]]).astype(np.float32)
    else:
        tensors[roles["global"]] = glob
    found = settled(write_case(tmp_path / "case", tensors, config, roles))
    (q,) = [q for q in found["quantized"] if "codes" in q.parts]
    if value in ("nan", "inf", "zero", "negative", "huge", "missing", "empty", "inverted",
                 "subnormal", "bool"):
        assert failed_checks(found) or any(
            c.verdict.value == "warn" for t in found["audit"].tensors for c in t.checks), value


def test_one_scale_for_a_million_rows(tmp_path):
    """A per-tensor scale read for 10^6 rows; a block grid of one element for them is a
    problem; neither reads the whole tensor into a scale grid of its size."""
    rows = 1_000_000
    codes = np.zeros((rows, 2), dtype=np.uint8).view(F8)
    one = np.array([0.5], np.float32)
    found = settled(write_case(tmp_path / "ct", {"m.weight": codes, "m.weight_scale": one},
                               None, {}))
    (q,) = found["quantized"]
    assert q.layout == "compressed-tensors-fp8" and not q.problems
    assert q.read(slice(rows - 3, rows), slice(0, 2)).shape == (3, 2)
    found = settled(write_case(tmp_path / "ds", {"m.weight": codes,
                                                 "m.weight_scale_inv": one.reshape(1, 1)},
                               None, {}))
    (q,) = found["quantized"]
    assert q.layout == "deepseek-fp8" and q.problems
    found = settled(write_case(tmp_path / "gpt", {
        "e_blocks": np.zeros((rows, 1, 16), np.uint8), "e_scales": np.full((1, 1), 127,
                                                                            np.uint8)},
        None, {}))
    (q,) = found["quantized"]
    assert q.problems


# -- names, shards and keys that belong to two tensors ----------------------------------------

def test_a_key_repeated_across_shards_is_read_once(tmp_path):
    tensors, config, roles = deepseek()
    folder = tmp_path / "case"
    folder.mkdir()
    write_st(folder / "a.safetensors", tensors)
    other = dict(tensors)
    other[roles["scales"]] = positive(3, 3)  # the second file's grid is of the wrong shape
    write_st(folder / "b.safetensors", other)
    found = settled(folder)
    assert len(found["quantized"]) == 1 and not found["quantized"][0].problems


def test_weight_in_one_shard_scales_in_another_of_a_plain_folder(tmp_path):
    tensors, config, roles = ct_nvfp4()
    folder = tmp_path / "case"
    folder.mkdir()
    write_st(folder / "a.safetensors", {roles["codes"]: tensors[roles["codes"]]})
    write_st(folder / "b.safetensors", {k: v for k, v in tensors.items()
                                        if k != roles["codes"]})
    found = settled(folder)
    assert [q.layout for q in found["quantized"]] == ["compressed-tensors-nvfp4"]


def test_an_index_whose_shards_repeat_a_key(tmp_path):
    tensors, config, roles = modelopt()
    folder = tmp_path / "case"
    folder.mkdir()
    write_st(folder / "model-00001-of-00002.safetensors", tensors)
    write_st(folder / "model-00002-of-00002.safetensors", {roles["scales"]: np.zeros(
        (3,), np.float32), "extra": np.ones(4, np.float32)})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in tensors}
    weight_map["extra"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": weight_map}))
    (folder / "config.json").write_text(_qc(config))
    found = settled(folder)
    (q,) = found["quantized"]
    assert q.parts["scales"].shape == (64, 4) and not q.problems


KEY_TWICE = {
    # m.weight_scale: the DeepSeek codes of its own _scale_inv, and ModelOpt's block scales
    "deepseek-codes-and-modelopt-scale": {
        "m.weight": packed(64, 32), "m.weight_scale": positive(64, 4, size=100, dtype=F8),
        "m.weight_scale_2": np.array(1e-4, np.float32),
        "m.weight_scale_scale_inv": positive(1, 1)},
    # m.weight_scale: ModelOpt's (uint8 m.weight) and compressed-tensors NVFP4's
    "modelopt-and-ct-nvfp4-share-a-scale": {
        "m.weight": packed(64, 32), "m.weight_packed": packed(64, 32),
        "m.weight_scale": positive(64, 4, size=100, dtype=F8),
        "m.weight_scale_2": np.array(1e-4, np.float32),
        "m.weight_global_scale": np.array([1e4], np.float32)},
    # m.weight: DeepSeek's codes (with _scale_inv) and compressed-tensors FP8's
    "deepseek-and-ct-fp8-share-a-weight": {
        "m.weight": f8(256, 192), "m.weight_scale_inv": positive(2, 2),
        "m.weight_scale": positive(1)},
    # e_scales: gpt-oss scales of e_blocks and a weight of its own (as e_scales_blocks' base)
    "gptoss-scales-and-blocks": {
        "e_blocks": packed(4, 2, 16), "e_scales": e8m0(4, 2),
        "e_scales_blocks": packed(4, 2, 16), "e_scales_scales": e8m0(4, 2)},
    # the MX reader's scale of one weight is the packed weight of the next module
    "mx-scale-is-a-packed-weight": {
        "a.weight_packed": packed(64, 32), "a.weight_scale": e8m0(64, 2),
        "a.weight_scale.weight_packed": packed(64, 1), "a.weight_scale.weight_scale": e8m0(
            64, 1)},
    # fmt_out's scales of w are the codes of w.scales
    "fmt-out-scales-are-codes": {"w.codes": f8(4, 4).view(np.uint8),
                                 "w.scales": np.ones((1, 1), np.float32),
                                 "w.scales.codes": np.zeros((1, 1), np.uint8),
                                 "w.scales.scales": np.ones((1, 1), np.float32)},
    # KV scales named as a module's weight scale
    "kv-and-ct": {"layers.0.self_attn.k_scale": np.array(0.1, np.float32),
                  "layers.0.self_attn.weight": f8(8, 8),
                  "layers.0.self_attn.weight_scale": np.array([0.1], np.float32)},
    "bare-names": {"weight": f8(4, 32), "weight_scale": e8m0(4, 1),
                   "weight_packed": packed(4, 16), "input_scale": np.array(1.0, np.float32),
                   "blocks": packed(1, 16), "scales": e8m0(1), "_blocks": packed(1, 16),
                   "_scales": e8m0(1), ".codes": np.zeros(1, np.uint8),
                   ".scales": np.ones(1, np.float32), "k_scale": np.ones(1, np.float32)},
}


@pytest.mark.parametrize("case", list(KEY_TWICE))
def test_a_key_that_two_layouts_want_is_claimed_once(tmp_path, case):
    meta = {"fmtcli": "x_q = decode(codes) / scales", "w": json.dumps(
        {"scheme": {"format": "float8_e4m3fn", "granularity": "tensor"}, "tile": [4, 4],
         "shape": [4, 4], "matrix": [4, 4]}), "w.scales": json.dumps(
        {"scheme": {"format": "uint8"}, "tile": [1, 1], "shape": [1, 1], "matrix": [1, 1]})}
    found = settled(write_case(tmp_path / "case", KEY_TWICE[case], None, {"metadata": meta}))
    claimed = [(p.source, p.key) for q in found["quantized"] for p in q.parts.values()
               if p.key != "__metadata__"]
    assert len(claimed) == len(set(claimed)), claimed


# -- other containers: .npz (big-endian scales), .pt, symlinks ---------------------------------

def test_big_endian_npz_scales_read_as_their_values(tmp_path):
    folder = tmp_path / "case"
    folder.mkdir()
    words = RNG.integers(-2**31, 2**31, (4, 2), dtype=np.int32)
    scale = np.array([[0.5], [0.25], [2.0], [1.5]], dtype=">f4")
    np.savez(folder / "m.npz", **{"m.weight_packed": words.astype(">i4"),
                                  "m.weight_scale": scale,
                                  "m.weight_shape": np.array([4, 16], dtype=">i8")})
    (folder / "config.json").write_text(_qc(ct_config("pack-quantized", num_bits=4,
                                                      strategy="channel")))
    found = settled(folder)
    (q,) = found["quantized"]
    assert not q.problems
    fields = (words.astype(np.int64)[:, :, None] >> (4 * np.arange(8))) & 15
    expected = (fields.reshape(4, 16) - 8) * scale.astype(np.float64)
    np.testing.assert_array_equal(q.dequantize(), expected.astype(np.float32))


def test_npz_members_with_layout_names(tmp_path):
    folder = tmp_path / "case"
    folder.mkdir()
    np.savez(folder / "m.npz", **{"a_blocks": packed(2, 16), "a_scales": np.array(
        [127, 255], np.uint8), "layers.0.self_attn.k_scale": np.array([-1.0, np.nan],
                                                                       dtype=">f4"),
        "w.codes": np.zeros((2, 2), np.uint8), "w.scales": np.ones((1, 1), ">f4"),
        "__metadata__": np.frombuffer(b"\xff\xfe not json", np.uint8)})
    found = settled(folder)
    assert {q.layout for q in found["quantized"]} == {"gptoss-mxfp4", "kv-scales"}
    assert "kv-scale" in " ".join(failed_checks(found)) or failed_checks(found)


def test_torch_files_with_layout_names(tmp_path):
    torch = pytest.importorskip("torch")
    folder = tmp_path / "case"
    folder.mkdir()
    torch.save({"m.weight": torch.randn(256, 192).to(torch.float8_e4m3fn),
                "m.weight_scale_inv": torch.full((2, 2), float("nan")),
                "c.weight": torch.randn(8, 8).to(torch.float8_e4m3fn),
                "c.weight_scale": torch.ones(8, 1, dtype=torch.complex64),
                "b.weight_scale_inv": torch.ones(2, 2, dtype=torch.bool),
                "b.weight": torch.zeros(128, 128).to(torch.float8_e4m3fn)},
               folder / "m.pt")
    found = settled(folder)
    assert [q.key for q in found["quantized"]] == ["m.weight"]
    assert "scale-finite" in failed_checks(found) or failed_checks(found)


def test_symlink_loops_and_links_to_devices(tmp_path):
    tensors, config, roles = deepseek()
    folder = write_case(tmp_path / "case", tensors, config, roles)
    os.symlink(".", folder / "loop")
    (folder / "sub").mkdir()
    os.symlink("..", folder / "sub" / "up")
    os.symlink("self.safetensors", folder / "self.safetensors")
    os.symlink("/dev/zero", folder / "zero.safetensors")
    found = settled(folder)
    assert found["refused"] or [q.layout for q in found["quantized"]] == ["deepseek-fp8"]


FMT_OUT_METADATA = {
    "entry-not-json": "{",
    "entry-a-list": "[]",
    "entry-nested": "[" * 50_000 + "]" * 50_000,
    "tile-zero": {"tile": [0, 0]},
    "tile-negative": {"tile": [-1, 48]},
    "tile-huge": {"tile": [1 << 62, 1 << 62]},
    "tile-floats": {"tile": [1.5, 48]},
    "shape-lies": {"shape": [64, 49]},
    "shape-huge": {"shape": [1 << 40, 48]},
    "matrix-lies": {"matrix": [48, 64]},
    "format-unknown": {"scheme": {"format": "float9_e9m9"}},
    "format-list": {"scheme": {"format": ["float8_e4m3fn"]}},
    "format-fp4": {"scheme": {"format": "float4_e2m1fn", "granularity": "tensor"}},
    "format-int4": {"scheme": {"format": "int4", "granularity": "tensor"}},
    "format-bf16": {"scheme": {"format": "bfloat16", "granularity": "tensor"}},
    "granularity-junk": {"scheme": {"format": "float8_e4m3fn", "granularity": "block",
                                    "block": "x", "axis": None}},
    "marker-missing": "drop-marker",
}


@pytest.mark.parametrize("case", list(FMT_OUT_METADATA))
def test_fmt_out_metadata_broken(tmp_path, case):
    tensors, _, roles = fmt_out()
    entry = json.loads(roles["metadata"]["w"])
    change = FMT_OUT_METADATA[case]
    meta = dict(roles["metadata"])
    if change == "drop-marker":
        del meta["fmtcli"]
    elif isinstance(change, str):
        meta["w"] = change
    else:
        meta["w"] = json.dumps({**entry, **change, "scheme": {**entry["scheme"],
                                                               **change.get("scheme", {})}})
    found = settled(write_case(tmp_path / "case", tensors, None, {**roles, "metadata": meta}))
    if change == "drop-marker":
        assert not found["quantized"]
    elif not case.startswith("format-") and case not in ("tile-huge", "granularity-junk"):
        (q,) = found["quantized"]  # (a tile larger than the matrix covers it: one scale)
        assert q.problems, case


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), 1e-45])
def test_fmt_out_scales_zero_inf_nan(tmp_path, scale):
    tensors, _, roles = fmt_out()
    tensors["w.scales"] = np.array([[scale]], np.float32)
    found = settled(write_case(tmp_path / "case", tensors, None, roles))
    (q,) = found["quantized"]
    values = q.dequantize()
    if scale == float("inf"):
        assert not values.any()  # the engine's dead blocks
    elif scale in (0.0, 1e-45) or math.isnan(scale):
        assert failed_checks(found)


# -- through the command line -------------------------------------------------------------------

def _case(tmp: Path, layout: str, *mutations, config=..., extra=None, name="in") -> Path:
    tensors, cfg, roles = LAYOUTS[layout]()
    for mutation in mutations:
        tensors = mutation(tensors, roles)
    return write_case(tmp / name, tensors, cfg if config is ... else config, roles, extra)


def _plain_model(tmp: Path, names=("model.layers.0.mlp.up_proj.weight",)) -> Path:
    folder = tmp / "plain"
    write_st(folder / "model.safetensors", {n: RNG.standard_normal((32, 64)).astype(
        np.float32) for n in names}) if folder.mkdir(parents=True) is None else None
    return folder


def _inf_model(tmp: Path) -> Path:
    """A plain weight holding NaN and inf, named as the layouts' weight (fmt compare's REF)."""
    folder = tmp / "inf"
    if folder.exists():
        return folder
    folder.mkdir()
    weight = RNG.standard_normal((64, 64)).astype(np.float32)
    weight[0, :5], weight[1, 0] = np.nan, np.inf
    write_st(folder / "model.safetensors", {f"{M}.weight": weight})
    return folder


def _finite_twin(tmp: Path) -> Path:
    """``_inf_model``'s weight with its NaN and inf replaced by 0 (a layout can hold it)."""
    folder = tmp / "finite"
    if not folder.exists():
        folder.mkdir()
        weight = load_path(str(_inf_model(tmp)))[0].array()
        write_st(folder / "model.safetensors", {f"{M}.weight": np.where(
            np.isfinite(weight), weight, np.float32(0))})
    return folder


def _written(tmp: Path, source: Path, *options) -> Path:
    """``fmt quantize SOURCE --out DIR OPTIONS`` (in process): DIR."""
    from cli_helpers import succeeds

    out = tmp / f"written-{len(list(tmp.iterdir()))}"
    succeeds("quantize", source, "--out", out, *options)
    return out


def _half_broken(tmp: Path) -> Path:
    """A healthy plain linear weight first, then a layout whose scale grid is half its size
    (the failure comes after the first tensor is written)."""
    tensors, config, roles = ct_mxfp4()
    first = {"model.layers.0.mlp.up_proj.weight": RNG.standard_normal((64, 64)).astype(
        np.float32)}
    return write_case(tmp / "half", {**first, **scales_half(tensors, roles)}, config, roles)


def _odd_npz(tmp: Path) -> Path:
    path = tmp / "odd.npz"
    np.savez(path, **{"s": np.array(["abc"]), "c.weight_scale": np.ones((2, 1), np.complex64),
                      "c.weight": np.zeros((2, 32), np.uint8), "k_scale": np.ones(1, ">f4")})
    return path


def _symlinked(tmp: Path) -> Path:
    folder = _case(tmp, "ct_mxfp4")
    os.symlink(".", folder / "loop")
    os.symlink("self.safetensors", folder / "self.safetensors")
    return folder


CLI_CASES = {
    # fmt audit: a failed check (exit 1) or a report (exit 0), strict JSON either way
    "audit-empty-codes": lambda t: ["audit", _case(t, "modelopt", codes_no_rows), "--json"],
    "audit-empty-columns": lambda t: ["audit", _case(t, "ct_nvfp4", codes_no_columns)],
    "audit-e8m0-255": lambda t: ["audit", _case(t, "gptoss", all_scales(float("nan"))),
                                 "--json"],
    "audit-float8-nan": lambda t: ["audit", _case(t, "ct_nvfp4", scales_valued(
        float("nan"))), "--json"],
    "audit-5d": lambda t: ["audit", _case(t, "deepseek", all_5d), "--json"],
    "audit-global-subnormal": lambda t: ["audit", _case(t, "ct_nvfp4", lambda x, r: _with(
        x, r["global"], GLOBALS["subnormal"])), "--json"],
    "audit-global-huge": lambda t: ["audit", _case(t, "modelopt", lambda x, r: _with(
        x, r["global"], GLOBALS["huge"])), "--json"],
    "audit-kv-negative": lambda t: ["audit", _case(t, "kv", all_scales(-0.5)), "--json"],
    "audit-shape-lie": lambda t: ["audit", write_case(t / "in", {
        **ct_pack()[0], f"{M}.weight_shape": np.array([1 << 62, 64])}, None, {}), "--json"],
    "audit-control-names": lambda t: ["audit", _case(t, "modelopt", control_names)],
    "audit-long-names": lambda t: ["audit", _case(t, "ct_fp8_block", long_names), "--all"],
    "audit-unicode-json": lambda t: ["audit", _case(t, "ct_mxfp8", unicode_names), "--json"],
    "audit-odd-npz": lambda t: ["audit", _odd_npz(t), "--json"],
    "audit-config-900": lambda t: ["audit", _case(t, "deepseek", extra={
        "config.json": BAD_CONFIGS["nested-900"]}), "--json"],
    "audit-config-nan": lambda t: ["audit", _case(t, "ct_nvfp4", config=None, extra={
        "config.json": BAD_CONFIGS["nan-literal"]}), "--json"],
    "audit-config-junk": lambda t: ["audit", _case(t, "ct_pack", config=None, extra={
        "config.json": BAD_CONFIGS["groups-junk"], "hf_quant": "[" * 100_000}), "--json"],
    "audit-says-nvfp4-holds-fp8": lambda t: ["audit", _case(t, "ct_fp8_channel", extra={
        "config.json": BAD_CONFIGS["says-nvfp4"]}), "--json"],
    "audit-symlinks": lambda t: ["audit", _symlinked(t), "--json"],
    "audit-key-twice": lambda t: ["audit", write_case(
        t / "in", KEY_TWICE["modelopt-and-ct-nvfp4-share-a-scale"], None, {}), "--json"],
    "audit-bare-names": lambda t: ["audit", write_case(t / "in", KEY_TWICE["bare-names"],
                                                       None, {}), "--json"],
    "audit-no-such-key": lambda t: ["audit", _case(t, "deepseek"), "--key", "nothing*"],
    # fmt compare: a side with an unreadable layout is one Error line
    "compare-grid-wrong": lambda t: ["compare", _case(t, "deepseek", name="a"),
                                     _case(t, "deepseek", scales_extra_column, name="b")],
    "compare-global-nan": lambda t: ["compare", _case(t, "ct_nvfp4", name="a"), _case(
        t, "ct_nvfp4", lambda x, r: _with(x, r["global"], GLOBALS["nan"]), name="b"),
        "--json"],
    "compare-scales-nan": lambda t: ["compare", _case(t, "gptoss", name="a"), _case(
        t, "gptoss", all_scales(float("nan")), name="b"), "--json"],
    "compare-5d-self": lambda t: ["compare", _case(t, "deepseek", all_5d, name="a"),
                                  _case(t, "deepseek", all_5d, name="b"), "--json"],
    # (--layout refuses the NaN/inf weight itself: its finite twin's layout is TEST)
    "compare-inf-ref-vs-its-layout": lambda t: ["compare", _inf_model(t), _written(
        t, _finite_twin(t), "--recipe", "nvfp4", "--layout", "compressed-tensors")],
    "compare-plain-vs-empty": lambda t: ["compare", _plain_model(t), _case(
        t, "modelopt", codes_no_rows)],
    # fmt quantize: the dequantized input, or one Error line
    "quantize-shape-lie": lambda t: ["quantize", _case(t, "ct_pack", lambda x, r: _with(
        x, r["shape"], np.array([65, 64]))), "--json"],
    "quantize-long-names-broken": lambda t: ["quantize", _case(
        t, "ct_mxfp8", scales_one, long_names), "--json"],
    "quantize-control-names-broken": lambda t: ["quantize", _case(
        t, "deepseek", scales_extra_column, control_names), "--json"],
    "quantize-kv-only": lambda t: ["quantize", write_case(t / "in", {
        "layers.0.self_attn.k_scale": np.array(0.1, np.float32)}, None, {}), "--json"],
    "quantize-5d": lambda t: ["quantize", _case(t, "deepseek", all_5d), "--json"],
    "quantize-global-inf": lambda t: ["quantize", _case(t, "modelopt", lambda x, r: _with(
        x, r["global"], GLOBALS["inf"])), "--json"],
    # fmt quantize --out: nothing written where it fails
    "out-npz-of-broken": lambda t: ["quantize", _case(t, "ct_mxfp4", scales_half), "--out",
                                    t / "out.safetensors"],
    "layout-ct-of-broken": lambda t: ["quantize", _case(t, "ct_pack", lambda x, r: _with(
        x, r["shape"], np.array([64, 1 << 40]))), "--per", "tensor", "--out", t / "out",
        "--layout", "compressed-tensors"],
    "layout-deepseek-of-5d": lambda t: ["quantize", _case(t, "deepseek", all_5d),
                                        "--recipe", "deepseek", "--out", t / "out",
                                        "--layout", "deepseek-fp8", "--json"],
    "layout-deepseek-of-nan-scales": lambda t: ["quantize", _case(t, "deepseek", all_scales(
        float("nan"))), "--recipe", "deepseek", "--out", t / "out", "--layout",
        "deepseek-fp8", "--json"],
    "layout-modelopt-of-ct-nvfp4": lambda t: ["quantize", _case(t, "ct_nvfp4"), "--recipe",
                                              "nvfp4", "--out", t / "out", "--layout",
                                              "modelopt-nvfp4", "--json"],
    "out-fails-midway": lambda t: ["quantize", _half_broken(t), "--out", t / "o.safetensors"],
    "out-npz-fails-midway": lambda t: ["quantize", _half_broken(t), "--out", t / "o.npz"],
    "out-npy-fails-midway": lambda t: ["quantize", _half_broken(t), "--key", f"{M}.weight",
                                       "--out", t / "o.npy"],
    "layout-fails-midway": lambda t: ["quantize", _half_broken(t), "--per", "tensor", "--out",
                                      t / "dir", "--layout", "compressed-tensors"],
    "layout-into-a-file": lambda t: ["quantize", _case(t, "ct_fp8_channel"), "--per",
                                     "tensor", "--out", _case(t, "kv", name="k") /
                                     "model.safetensors", "--layout", "compressed-tensors"],
    "layout-modelopt-unicode": lambda t: ["quantize", _plain_model(t, (
        "模型.\u202e.🙂.weight", "x" * 3000 + ".weight")), "--recipe", "nvfp4", "--out",
        t / "out", "--layout", "modelopt-nvfp4", "--json"],
    "layout-ct-of-nvfp4-nan": lambda t: ["quantize", _case(t, "ct_nvfp4", all_scales(
        float("nan"))), "--recipe", "nvfp4", "--out", t / "out", "--layout",
        "compressed-tensors", "--json"],
}


def snapshot(args) -> dict | None:
    """What --out's folder holds before the run (names, sizes, times), None without --out."""
    if "--out" not in args:
        return None
    parent = Path(args[args.index("--out") + 1]).parent
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in parent.rglob("*")
            if p.is_file()}


def judged(result, args, before: dict | None = None) -> None:
    """What every CLI case must do: exit 0, 1 or 2 (70 is a bug), no traceback, strict
    JSON on stdout wherever there is any with --json, one Error line where stdout is
    empty and it failed, and nothing written by a failed --out."""
    stderr = result.stderr.decode("utf-8", "replace") if isinstance(
        result.stderr, bytes) else result.stderr
    stdout = result.stdout.decode("utf-8", "replace") if isinstance(
        result.stdout, bytes) else result.stdout
    exception = getattr(result, "exception", None)  # CliRunner's (FMT_TRACEBACK=1)
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    code = getattr(result, "returncode", getattr(result, "exit_code", None))
    assert code in (0, 1, 2), (code, stderr[-2000:])
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-2000:]
    if "--json" in args and stdout.strip():
        strict_loads(stdout)
    if code and not stdout.strip():
        errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1, stderr[-2000:]
        assert len(errors[0]) < 2500
    if before is not None:
        out = Path(args[args.index("--out") + 1])
        if code:  # nothing written, nothing left behind
            assert snapshot(args) == before, sorted(set(snapshot(args)) ^ set(before))
            assert sorted(p.name for p in out.parent.iterdir()) == sorted(
                {Path(p).relative_to(out.parent).parts[0] for p in before}), list(
                out.parent.iterdir())


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_in_process(tmp_path, case):
    """The CLI cases through CliRunner (FMT_TRACEBACK=1: a bug raises here)."""
    from cli_helpers import invoke

    args = [str(a) for a in CLI_CASES[case](tmp_path)]
    before = snapshot(args)
    result = invoke(*args, "--workers", "1")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    judged(result, args, before)


@pytest.fixture(scope="module")
def fresh_runs(request, tmp_path_factory) -> dict:
    """case -> (args, what --out's folder held before, the run) of each CLI case this
    session runs as a user runs it: each case written in a folder of its own, then every
    command through ``cli_helpers.run_fmt_each`` (one interpreter, each command in a child
    forked from it, default workers; numpy and ml_dtypes imported once before the forks,
    ml_dtypes' import being most of a small command's time; fmt's own modules imported by
    each child as ``python -m fmtcli`` imports them); 60 s a command at most, in all.
    A case whose folder cannot be written maps to that exception (its test raises it; the
    other cases still run)."""
    chosen = {item.callspec.params["case"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_cli_fresh_process"}
    cases, unwritten = {}, {}
    for case in (case for case in CLI_CASES if case in chosen):
        try:
            args = [str(a) for a in CLI_CASES[case](tmp_path_factory.mktemp(case))]
        except Exception as error:  # raised again by the case's own test
            unwritten[case] = error
            continue
        cases[case] = args, snapshot(args)
    names = list(cases)
    ran = run_fmt_each([cases[case][0] for case in names], timeout=60 * max(1, len(names)),
                       preload=("numpy", "ml_dtypes"))
    return {**unwritten, **{
        case: (*cases[case], subprocess.CompletedProcess(cases[case][0], code, out, err))
        for case, (code, out, err) in zip(names, ran)}}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_fresh_process(fresh_runs, case):
    """The CLI cases as a user runs them (a fresh process each, default workers)."""
    if isinstance(fresh_runs[case], Exception):
        raise fresh_runs[case]  # writing this case's folder failed
    args, before, result = fresh_runs[case]
    judged(result, args, before)
    if "--json" not in args:  # tables at the default 80 columns, nothing cut with "…"
        from cli_helpers import assert_fits

        assert_fits(result.stdout.decode("utf-8", "replace"), 80)


# -- odd but valid shapes read as their plain 2-D selves -----------------------------------

LEADS = {"one-lead": (1,), "four-d": (1, 1), "five-d": (1, 1, 1)}


@pytest.mark.parametrize("lead", list(LEADS))
@pytest.mark.parametrize("layout", [n for n in LAYOUTS if n not in ("kv", "fmt_out")])
def test_leading_ones_read_as_the_matrix_itself(tmp_path, layout, lead):
    """Leading axes of size one change the matrix view (a 4-D tensor is O x rest) but not
    a value; every row chunk of the view reads the same as the whole."""
    tensors, config, roles = LAYOUTS[layout]()
    flat = settled(write_case(tmp_path / "flat", tensors, config, roles))
    (q2,) = [q for q in flat["quantized"] if "codes" in q.parts]
    shaped = dict(tensors)
    for role in ("codes", "scales"):
        arr = tensors[roles[role]]
        shaped[roles[role]] = arr.reshape(LEADS[lead] + arr.shape)
    if "shape" in roles:
        shaped[roles["shape"]] = np.array(list(LEADS[lead]) + [64, 64])
    found = settled(write_case(tmp_path / "shaped", shaped, config, roles))
    (q,) = [q for q in found["quantized"] if "codes" in q.parts]
    if q.problems:  # refused in one line (compressed-tensors FP8/MX: rows of the last axis)
        return
    whole = q.dequantize()
    np.testing.assert_array_equal(whole.reshape(q2.shape), q2.dequantize())
    rows, cols = q.matrix
    pieces = [q.read(slice(r, r + 1), slice(0, cols)) for r in range(rows)]
    np.testing.assert_array_equal(np.concatenate(pieces).reshape(q.shape), whole)


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt-nvfp4"])
def test_a_nan_weight_exported_as_nvfp4_is_refused(tmp_path, layout):
    """NaN and inf in a weight: fmt's own --out records the engine's x_q with its NaN; a
    --layout folder (a model loaders serve) is refused in one line naming the tensor, and
    nothing is written (tests/commands/test_layout_out_edges.py has every layout)."""
    from cli_helpers import assert_data_error, invoke, succeeds

    source = _inf_model(tmp_path)
    succeeds("quantize", source, "--recipe", "nvfp4", "--out", tmp_path / "x.npy")
    assert np.isnan(np.load(tmp_path / "x.npy")).any()
    assert_data_error(invoke("quantize", source, "--recipe", "nvfp4", "--out",
                             tmp_path / "dir", "--layout", layout),
                      f"{M}.weight", "6 NaN or infinite values", "nothing written")
    assert not (tmp_path / "dir").exists()


# -- every layout broken, through compare and quantize in process ------------------------------

COMMAND_MUTATIONS = [codes_truncated, codes_no_rows, codes_1d, all_5d, scales_one,
                     scales_extra_column, scales_dtype(np.int64), scales_missing,
                     unicode_names, all_scales(float("nan")), all_scales(0.0),
                     scales_valued(3e38)]
COMMAND_CASES = _some_slow(
    [(layout, m, command) for layout in LAYOUTS for m in COMMAND_MUTATIONS
     for command in ("compare", "quantize")],
    [f"{command}-{layout}-{m.__name__}" for layout in LAYOUTS for m in COMMAND_MUTATIONS
     for command in ("compare", "quantize")], quick_every=7)


@pytest.mark.parametrize(("layout", "mutation", "command"), COMMAND_CASES)
def test_compare_and_quantize_of_a_broken_layout(tmp_path, layout, mutation, command):
    """``fmt compare HEALTHY BROKEN --json`` and ``fmt quantize BROKEN --json``: a result
    or one Error line (FMT_TRACEBACK=1: a bug raises)."""
    from cli_helpers import invoke

    broken = _case(tmp_path, layout, mutation, name="broken")
    args = (["compare", _case(tmp_path, layout, name="healthy"), broken] if command ==
            "compare" else ["quantize", broken, "--format", "float8_e4m3fn", "--block", "16"])
    args = [str(a) for a in args] + ["--json"]
    result = invoke(*args, "--workers", "1")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    judged(result, args)


def test_audit_of_standard_input_reads_no_config(tmp_path, monkeypatch):
    """Numbers on stdin have no folder: the current directory's config.json is not theirs
    (it named fp8, and the plain numbers failed config-quantized)."""
    from cli_helpers import invoke

    (tmp_path / "config.json").write_text(_qc({"quant_method": "fp8"}))
    monkeypatch.chdir(tmp_path)
    result = invoke("audit", "-", "--json", input="1 2 3\n")
    judged(result, ["audit", "-", "--json"])
    assert result.exit_code == 0, result.stdout[-800:]
    assert strict_loads(result.stdout)["config"] is None


def test_modelopt_hf_quant_config_beside_a_bare_file_name(tmp_path, monkeypatch):
    """``cd folder && fmt audit model.safetensors``: the file's folder is the current one,
    and its hf_quant_config.json names the scheme (it was not looked for)."""
    tensors, _, roles = modelopt()
    write_case(tmp_path / "m", tensors, None, roles, {"hf_quant": json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
                                                             "group_size": 16}})})
    monkeypatch.chdir(tmp_path / "m")
    (q,) = layouts.scan(load_path("model.safetensors", as_stored=True)).quantized
    assert (q.facts["config_scheme"], q.facts["config_file"]) == ("NVFP4",
                                                                   "hf_quant_config.json")


# -- zero points and group indices -----------------------------------------------------------

EXTRAS = {
    "g_idx-out-of-range": ("g_idx", np.full(64, 7, np.int32)),
    "g_idx-negative": ("g_idx", np.full(64, -1, np.int64)),
    "g_idx-float-nan": ("g_idx", np.full(64, np.nan, np.float32)),
    "g_idx-short": ("g_idx", np.zeros(63, np.int32)),
    "g_idx-bool": ("g_idx", np.zeros(64, np.bool_)),
    "g_idx-2d": ("g_idx", np.zeros((8, 8), np.int32)),
    "zero-float": ("zero", np.full((64, 2), np.nan, np.float32)),
    "zero-wrong-shape": ("zero", np.zeros((64, 3), np.int8)),
    "zero-packed-wrong": ("zero", np.zeros((7, 2), np.int32)),
    "zero-huge": ("zero", np.full((64, 2), 2**62, np.int64)),
    "zero-bool": ("zero", np.ones((64, 2), np.bool_)),
    "zero-uint64": ("zero", np.full((64, 2), 2**64 - 1, np.uint64)),
}
EXTRA_NAMES = {"g_idx": "weight_g_idx", "zero": "weight_zero_point"}


@pytest.mark.parametrize("case", list(EXTRAS))
@pytest.mark.parametrize("layout", ["ct_pack", "ct_fp8_channel", "ct_nvfp4"])
def test_zero_points_and_group_indices(tmp_path, layout, case):
    tensors, config, roles = LAYOUTS[layout]()
    role, value = EXTRAS[case]
    if layout == "ct_fp8_channel" and role == "zero":
        value = value[:, :1]
    tensors[f"{M}.{EXTRA_NAMES[role]}"] = value
    found = settled(write_case(tmp_path / "case", tensors, config, roles))
    (q,) = found["quantized"]
    if case in ("g_idx-out-of-range", "g_idx-negative", "g_idx-float-nan") and (
            layout == "ct_pack"):
        with pytest.raises(DataError):
            q.dequantize()


def test_an_unindexed_duplicate_in_an_earlier_shard_does_not_hide_the_weight(tmp_path):
    """The index names the scale (in shard 2) first, then the weight (in shard 1); shard 2
    also holds a tensor of the weight's name the index does not name (skipped, unreadable):
    the indexed weight is the one read, with its scales (it was hidden, read as plain FP8
    codes without scales)."""
    tensors, config, roles = deepseek()
    folder = tmp_path / "case"
    folder.mkdir()
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write_st(folder / one, {roles["codes"]: tensors[roles["codes"]]})
    write_st(folder / two, {roles["scales"]: tensors[roles["scales"]],
                            roles["codes"]: np.zeros((2, 2), np.float32)})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {roles["scales"]: two, roles["codes"]: one}}))
    (folder / "config.json").write_text(_qc(config))
    found = settled(folder)
    (q,) = found["quantized"]
    assert q.layout == "deepseek-fp8" and q.parts["codes"].source.endswith(one)
    assert not failed_checks(found)


def _torch_of(arr):
    torch = pytest.importorskip("torch")
    arr = np.ascontiguousarray(arr)
    views = {"bfloat16": (np.uint16, torch.bfloat16), "float8_e4m3fn": (
        np.uint8, torch.float8_e4m3fn), "float8_e8m0fnu": (np.uint8, getattr(
            torch, "float8_e8m0fnu", None))}
    if arr.dtype.name in views:
        raw, dtype = views[arr.dtype.name]
        if dtype is None:
            pytest.skip("this torch has no float8_e8m0fnu")
        return torch.from_numpy(arr.view(raw).copy()).view(dtype)
    return torch.from_numpy(arr.copy())


@pytest.mark.parametrize("layout", [n for n in LAYOUTS if n != "fmt_out"])
def test_every_layout_in_a_torch_file_reads_as_in_safetensors(tmp_path, layout):
    """The same tensors saved by torch.save (weights_only loading) read to the same values."""
    torch = pytest.importorskip("torch")
    tensors, config, roles = LAYOUTS[layout]()
    base = settled(write_case(tmp_path / "st", tensors, config, roles))
    folder = tmp_path / "pt"
    folder.mkdir()
    torch.save({k: _torch_of(v) for k, v in tensors.items()}, folder / "model.pt")
    (folder / "config.json").write_text(_qc(config))
    found = settled(folder)
    assert [q.layout for q in found["quantized"]] == [q.layout for q in base["quantized"]]
    for q, b in zip(found["quantized"], base["quantized"]):
        rows, cols = q.matrix
        np.testing.assert_array_equal(q.read(slice(0, rows), slice(0, cols)),
                                      b.read(slice(0, rows), slice(0, cols)))


KV_METADATA = {"bfloat16": {"format": "bfloat16", "checkpoint_factor": "1"},
               "float32": {"format": "float32", "checkpoint_factor": "x"},
               "unknown": {"format": "float9", "checkpoint_factor": "1"},
               "long": {"format": "f" * 5000, "checkpoint_factor": "1"},
               "int8": {"format": "int8", "checkpoint_factor": "1"},
               "fnuz": {"format": "float8_e4m3fnuz", "checkpoint_factor": "2"}}


@pytest.mark.parametrize("case", list(KV_METADATA))
def test_kv_scales_under_odd_file_metadata(tmp_path, case):
    """fmt kv --out's metadata naming a format that is not FP8 (bfloat16: a covered amax of
    ~1e38 x scale, infinite for big scales), unknown, or 5000 characters long."""
    from cli_helpers import invoke

    tensors, config, roles = kv()
    tensors[roles["codes"]] = np.array(3e38, np.float32)
    folder = write_case(tmp_path / "case", tensors, config, {"metadata": KV_METADATA[case]})
    found = settled(folder)
    assert {q.layout for q in found["quantized"]} == {"kv-scales"}
    result = invoke("audit", folder, "--json", "--workers", "1")
    judged(result, ["audit", "--json"])


@pytest.mark.parametrize("layout", ["modelopt", "ct_nvfp4"])
def test_a_config_group_wider_than_the_rows_is_one_scale_per_row(tmp_path, layout):
    """group_size 2^16 (ModelOpt's bound) or 2^20 (compressed-tensors'): one scale per row
    of 64 values, read without a 2^16-wide scale array per row."""
    tensors, config, roles = LAYOUTS[layout]()
    size = 1 << 16 if layout == "modelopt" else 1 << 20
    rows = 20_000
    tensors[roles["codes"]] = packed(rows, 32)
    tensors[roles["scales"]] = positive(rows, 1, size=100, dtype=F8)
    if layout == "modelopt":
        config = {**config, "group_size": size}
    else:
        config = ct_config("nvfp4-pack-quantized", num_bits=4, type="float",
                           strategy="tensor_group", group_size=size)
    folder = write_case(tmp_path / "case", tensors, config, roles)
    (q,) = layouts.scan(load_path(str(folder), as_stored=True),
                        layouts.read_config(str(folder))).quantized
    assert not q.problems and q.group.block == size
    values = q.read(slice(0, rows), slice(0, 64))
    assert values.shape == (rows, 64)


def _zoo(tmp: Path) -> Path:
    """Every layout, broken a different way, side by side in one file (prefixed names)."""
    tensors, ways = {}, [codes_truncated, scales_extra_column, all_scales(float("nan")),
                         scales_one, codes_no_rows, all_5d, scales_valued(3e38)]
    for i, (name, make) in enumerate(LAYOUTS.items()):
        if name == "fmt_out":
            continue
        made, _, roles = make()
        broken = ways[i % len(ways)](made, roles)
        tensors.update({f"zoo{i}.{k}": v for k, v in broken.items()})
    folder = tmp / "zoo"
    folder.mkdir()
    write_st(folder / "model.safetensors", tensors)
    return folder


def test_audit_of_a_zoo_is_the_same_on_one_and_two_workers(tmp_path):
    """Eleven layouts broken seven ways in one file: fmt audit --json gives the same
    document on one worker and on two (forked; a tensor a worker cannot read is measured
    again in the parent)."""
    from cli_helpers import invoke

    folder = _zoo(tmp_path)
    found = settled(folder)
    assert len({q.layout for q in found["quantized"]}) >= 8
    docs = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    for workers in ("1", str(min(2, cores))):
        result = invoke("audit", folder, "--json", "--workers", workers)
        judged(result, ["audit", "--json"])
        docs.append(strict_loads(result.stdout))
    assert docs[0] == docs[1]
