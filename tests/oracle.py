"""The independent oracle of the quantization tests (not a test module itself).

- a brute-force reference of scaled quantization written with numpy and ml_dtypes only
  (pad to whole tiles, amax per tile, scale rule, clip to +-max, cast, divide), NVFP4's
  two-level scaling from its definition;
- the statistics of a quantization computed from that reference in float64, and the
  assertions that compare the engine's reported statistics with them;
- a small .safetensors writer and reader that follow the published layout byte by byte
  (8-byte little-endian header length, JSON header, data), with knobs to corrupt it.

Nothing here imports fmtcli: the reference must be able to disagree with it.  The command
line helpers (invoke, strict JSON, error assertions) are in tests/cli_helpers.py.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

# Resolution of the reported quantiles (one histogram bin relative to its lower edge); the
# tests read it from the JSON too and check that both agree.
REL_RES = 2.0 ** -7

FORMATS = {  # name -> (ml_dtypes type, max, mantissa bits)
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 3),
    "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 2),
    "float6_e2m3fn": (ml_dtypes.float6_e2m3fn, 7.5, 3),
    "float6_e3m2fn": (ml_dtypes.float6_e3m2fn, 28.0, 2),
    "float4_e2m1fn": (ml_dtypes.float4_e2m1fn, 6.0, 1),
}


def as_float(value) -> float:
    """A JSON statistic back to a float ('nan', 'inf' and '-inf' are strings in --json)."""
    return float(value)


# -- .safetensors --------------------------------------------------------------------------

ST_CODES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
            np.dtype(np.float64): "F64", np.dtype(ml_dtypes.bfloat16): "BF16",
            np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
            np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8",
            np.dtype(np.bool_): "BOOL"}


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None, *,
                      header_length: int | None = None, entries: dict | None = None,
                      truncate_to: int | None = None) -> Path:
    """Write ``{name: array}`` in the safetensors layout.

    ``entries`` replaces/extends header entries verbatim (to corrupt them);
    ``header_length`` overrides the 8-byte length prefix; ``truncate_to`` cuts the file.
    """
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset, blobs = 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        blob = arr.tobytes()
        header[name] = {"dtype": ST_CODES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    header.update(entries or {})
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    data = struct.pack("<Q", len(raw) if header_length is None else header_length) + raw
    data += b"".join(blobs)
    if truncate_to is not None:
        data = data[:truncate_to]
    Path(path).write_bytes(data)
    return Path(path)


def read_safetensors(path: Path) -> tuple[dict, dict]:
    """(arrays, metadata) of a .safetensors file, read by the layout alone."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    metadata = header.pop("__metadata__", {})
    codes = {v: k for k, v in ST_CODES.items()}
    codes.update({"U16": np.dtype(np.uint16), "U32": np.dtype(np.uint32)})
    arrays = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        blob = raw[8 + length + begin:8 + length + end]
        arrays[name] = np.frombuffer(blob, dtype=codes[entry["dtype"]]).reshape(entry["shape"])
    return arrays, metadata


# -- the reference quantizer ------------------------------------------------------------------

def matrix_view(x: np.ndarray) -> np.ndarray:
    """The matrix view docs/quantize.md defines ("How an N-D tensor is blocked"): trailing
    size-1 axes dropped; a vector is one row; 4+ axes (conv weights O x I x kh x kw) and 3
    axes whose last is shorter than 32 (conv1d O x I x K) are the first axis by the rest;
    otherwise all leading axes by the last."""
    shape = list(x.shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape.pop()
    if len(shape) <= 1:
        return x.reshape(1, -1) if x.size else x.reshape(1, 0)
    if x.ndim >= 4 or (len(shape) == 3 and shape[-1] < 32):
        return x.reshape(shape[0], -1)
    return x.reshape(-1, shape[-1])


def ref_scale(amax, fmt: str = "float8_e4m3fn", rule: str = "amax", margin: int = 0):
    """Scale per tile, written from the documented rules (float64 math, float32 result)."""
    fmax = FORMATS[fmt][1]
    emax = math.floor(math.log2(fmax))
    a = np.asarray(amax, dtype=np.float64)
    good = np.isfinite(a) & (a > 0)
    ap = np.where(good, a, 1.0)
    if rule == "amax":
        s = fmax / ap
    elif rule == "pow2-floor":
        s = 2.0 ** np.floor(np.log2(fmax / ap))
    elif rule == "pow2-ceil":
        s = 2.0 ** np.ceil(np.log2(fmax / ap))
    elif rule == "pow2-nearest":
        s = 2.0 ** np.rint(np.log2(fmax / ap))
    elif rule in ("mx-floor", "mx-ceil", "mx-rceil"):
        if rule == "mx-floor":
            x_exp = np.floor(np.log2(ap)) - emax
        elif rule == "mx-ceil":
            x_exp = np.ceil(np.log2(ap)) - emax
        else:
            x_exp = np.ceil(np.log2(ap / fmax))
        s = 2.0 ** -np.clip(x_exp, -127, 127)
    else:
        raise ValueError(rule)
    s = s * 2.0 ** -margin
    out = np.where(good, s, 1.0)
    out = np.where(np.isinf(a), np.nan if rule.startswith("mx") else 0.0, out)
    out = np.where(np.isnan(a), np.nan, out)
    return out.astype(np.float32)


def beyond_max(xs: np.ndarray, fmt: str) -> np.ndarray:
    """Which scaled values round (nearest-even, unbounded exponent) past the format's max."""
    _, fmax, mbits = FORMATS[fmt]
    ulp = 2.0 ** (math.floor(math.log2(fmax)) - mbits)
    mid = fmax + ulp / 2
    odd = int(round(fmax / ulp)) % 2 == 1  # a tie at mid rounds up when max is odd
    a = np.abs(xs.astype(np.float64))
    return (a >= mid) if odd else (a > mid)


def cast(xs: np.ndarray, fmt: str) -> np.ndarray:
    """Saturating nearest-even cast: clip to +-max first, then ml_dtypes' cast (NaN stays)."""
    dtype, fmax, _ = FORMATS[fmt]
    with np.errstate(invalid="ignore"):
        clipped = np.clip(xs, -fmax, fmax)
    return clipped.astype(dtype).astype(np.float32)


def tiles(m: np.ndarray, tile: tuple[int, int]):
    """(padded 4-D view, (tr, tc)) of a 2-D array, the tile clipped to the matrix."""
    rows, cols = m.shape
    tr, tc = min(tile[0], rows), min(tile[1], cols)
    p = np.pad(m, ((0, (-rows) % tr), (0, (-cols) % tc)))
    return p.reshape(p.shape[0] // tr, tr, p.shape[1] // tc, tc), (tr, tc)


def ref_quantize(x, tile: tuple[int, int], fmt: str = "float8_e4m3fn", rule: str = "amax",
                 margin: int = 0, overflow: str = "saturate"):
    """Brute-force ``x_q = cast(x * scale) / scale`` with one scale per tile of the matrix view.

    Returns (x_q with x's shape, float32 scale grid, saturated count, overflowed count).
    """
    x = np.asarray(x, dtype=np.float32)
    m = matrix_view(x)
    rows, cols = m.shape
    t, (tr, tc) = tiles(m, tile)
    with np.errstate(invalid="ignore"):
        amax = np.abs(t).max(axis=(1, 3))  # NaN propagates
    scale = ref_scale(amax, fmt, rule, margin)
    s4 = scale[:, None, :, None]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        xs = (t * s4).astype(np.float32)
        big = beyond_max(xs, fmt) & np.isfinite(xs)
        r = cast(xs, fmt)
        if overflow == "ieee":
            r = np.where(big, np.float32(np.nan), r)  # the FP8 formats here have no inf
        xq = (r / s4).astype(np.float32)
    real = np.zeros(t.shape, bool)  # the tensor's own elements (not the padding)
    real.reshape(t.shape[0] * tr, t.shape[2] * tc)[:rows, :cols] = True
    n_beyond = int(np.count_nonzero(big & real))
    xq = xq.reshape(t.shape[0] * tr, t.shape[2] * tc)[:rows, :cols].reshape(x.shape)
    saturated = 0 if overflow == "ieee" else n_beyond
    overflowed = n_beyond if overflow == "ieee" else 0
    return xq, scale, saturated, overflowed


def ref_nvfp4(x, block: int = 16):
    """NVFP4 from its definition: E2M1 elements in 1x16 blocks; the block's decode scale
    d = e4m3(amax_b / 6 * g) with the float32 tensor scale g = 6 * 448 / amax_tensor;
    elements cast(x * g / d), decoded as code * d / g (a block with d = 0 decodes to 0)."""
    x = np.asarray(x, dtype=np.float32)
    m = matrix_view(x)
    rows, cols = m.shape
    t, (tr, tc) = tiles(m, (1, block))
    amax_t = float(np.abs(m).max())
    g = np.float32(1.0) if not (amax_t > 0 and math.isfinite(amax_t)) else \
        np.float32(6.0 * 448.0) / np.float32(amax_t)
    amax = np.abs(t).max(axis=(1, 3)).astype(np.float32)
    decode = cast((amax / np.float32(6.0) * g).astype(np.float32), "float8_e4m3fn")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = np.where(amax == 0, np.float32(1), (g / decode)).astype(np.float32)
        s4 = scale[:, None, :, None]
        xs = (t * s4).astype(np.float32)
        r = cast(xs, "float4_e2m1fn")
        xq = (r / s4).astype(np.float32)
    xq = np.where(np.isinf(s4), np.float32(0), xq)
    xq = xq.reshape(t.shape[0] * tr, t.shape[2] * tc)[:rows, :cols].reshape(x.shape)
    return xq, scale


def ref_stats(x, xq) -> dict:
    """Statistics of a quantization by their definitions, in float64."""
    x = np.asarray(x, dtype=np.float32).reshape(-1).astype(np.float64)
    xq = np.asarray(xq, dtype=np.float32).reshape(-1).astype(np.float64)
    finite_in = np.isfinite(x)
    nonzero = finite_in & (x != 0)
    pairs = finite_in & np.isfinite(xq)
    err = xq[pairs] - x[pairs]
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(np.isfinite(xq[nonzero]),
                       np.abs(xq[nonzero] - x[nonzero]) / np.abs(x[nonzero]), np.inf)
    rel.sort()
    n = rel.size

    def quantile(q):
        return float(rel[max(1, math.ceil(q * n)) - 1]) if n else math.nan

    sum_err2 = float(np.sum(err ** 2))
    sum_x2 = float(np.sum(x[pairs] ** 2))
    # a finite input whose result is inf or NaN: an unbounded error (metrics' docstring)
    unbounded = bool(np.any(finite_in & ~np.isfinite(xq)))
    return {
        "count": x.size,
        "nonzero": int(nonzero.sum()),
        "nonfinite_inputs": int((~finite_in).sum()),
        "flushed": int(np.count_nonzero(nonzero & (xq == 0))),
        "nan_produced": int(np.count_nonzero(np.isnan(xq) & ~np.isnan(x))),
        "max_abs_error": math.inf if unbounded else
        float(np.abs(err).max()) if err.size else math.nan,
        "rmse": math.inf if unbounded else
        math.sqrt(sum_err2 / err.size) if err.size else math.nan,
        "bias": math.nan if unbounded else float(err.mean()) if err.size else math.nan,
        "sqnr_db": -math.inf if unbounded else
        (10 * math.log10(sum_x2 / sum_err2)) if sum_err2 > 0 and sum_x2 > 0
        else (math.inf if sum_x2 > 0 else math.nan),
        "median_rel_error": quantile(0.5),
        "p99_rel_error": quantile(0.99),
    }


def assert_quantile(reported, true: float, res: float = REL_RES, what: str = "") -> None:
    """``reported`` is the lower edge of the histogram bin holding ``true``: with one bin of
    slack either way (float32 vs float64 relative errors near a bin edge)."""
    r = as_float(reported)
    if true == 0 or math.isinf(true) or math.isnan(true) or true == 1.0:
        assert r == true or (math.isnan(r) and math.isnan(true)), (what, r, true)
        return
    assert r / (1 + res) * (1 - 1e-7) <= true < r * (1 + res) ** 2 * (1 + 1e-7), (what, r, true)


def assert_close(a, b, rel: float = 1e-5, what: str = "") -> None:
    a, b = as_float(a), as_float(b)
    if math.isnan(b):
        assert math.isnan(a), (what, a, b)
    elif math.isinf(b):
        assert a == b, (what, a, b)
    else:
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-30), (what, a, b)


def assert_matches_reference(stats: dict, x, xq, saturated: int | None = None,
                             overflowed: int | None = None, what: str = "") -> None:
    """Compare one scheme's reported statistics with the reference's."""
    ref = ref_stats(x, xq)
    for key in ("count", "nonzero", "flushed", "nan_produced"):
        assert stats[key] == ref[key], (what, key, stats[key], ref[key])
    if "nonfinite_inputs" in stats:
        assert stats["nonfinite_inputs"] == ref["nonfinite_inputs"], what
    if saturated is not None:
        assert stats["saturated"] == saturated, (what, stats["saturated"], saturated)
    if overflowed is not None:
        assert stats["overflowed"] == overflowed, (what, stats["overflowed"], overflowed)
    if ref["nonzero"]:
        assert math.isclose(stats["flushed_fraction"], ref["flushed"] / ref["nonzero"],
                            rel_tol=1e-12), what
    for key in ("max_abs_error", "rmse", "sqnr_db"):
        assert_close(stats[key], ref[key], 1e-5, f"{what} {key}")
    # the bias is a mean of signed errors that nearly cancel: compare it on the rmse's scale
    if not math.isnan(ref["bias"]):
        assert abs(as_float(stats["bias"]) - ref["bias"]) <= 1e-5 * max(ref["rmse"], 1e-30), \
            (what, stats["bias"], ref["bias"])
    res = stats.get("rel_error_resolution", REL_RES)
    assert_quantile(stats["median_rel_error"], ref["median_rel_error"], res, f"{what} median")
    assert_quantile(stats["p99_rel_error"], ref["p99_rel_error"], res, f"{what} p99")


def assert_scales_match(summary: dict, scale_grid: np.ndarray, what: str = "") -> None:
    s = np.asarray(scale_grid, dtype=np.float32).reshape(-1)
    finite = s[~np.isnan(s)]
    assert summary["count"] == s.size, (what, summary, s.size)
    if finite.size:
        assert float(summary["min"]) == float(finite.min()), (what, summary["min"], finite.min())
        assert float(summary["max"]) == float(finite.max()), (what, summary["max"], finite.max())
        assert summary["distinct"] == np.unique(finite).size, (what, summary["distinct"])


def heavy_tailed(rng: np.random.Generator, shape, spread: float = 2.5) -> np.ndarray:
    """Values whose magnitudes span many decades (so per-tensor FP8 flushes some)."""
    mag = np.exp(rng.normal(0.0, spread, size=shape))
    return (rng.standard_normal(shape) * mag).astype(np.float32)
