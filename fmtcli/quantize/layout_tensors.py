"""The tensors and configs of ``fmt quantize --out DIR --layout L``: fmt's codes and scales
said in an ecosystem's layout.

fmt's engine stores ``x_q = cast(x * s) / s`` (``s`` a *quantization* scale); every layout
here stores a *dequantization* scale ``d`` and its readers compute ``x = code * d``.  The
codes written are the engine's own (its cast of ``x * s``), the scales ``d = fl32(1 / s)``
(float32); where ``s`` is a power of two that is exact, otherwise ``code * d`` is within one
float32 ulp of the engine's ``code / s`` (the two roundings differ).

Layouts, each from its own definition:

- ``deepseek-fp8`` (DeepSeek-V3 ``README_WEIGHTS.md``, ``inference/kernel.py``
  ``weight_dequant``): ``<m>.weight`` float8_e4m3fn, ``<m>.weight_scale_inv`` float32, one
  per R x C tile (``ceil(O/R) x ceil(I/C)``); ``config.json`` ``quantization_config`` =
  ``{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [R, C],
  "activation_scheme": "dynamic"}`` (+ ``"scale_fmt": "ue8m0"`` where every scale is a
  power of two: DeepSeek-V3.1).
- ``compressed-tensors`` FP8 (compressed-tensors 0.20.1,
  ``compressors/naive_quantized/base.py``; ``quantization/quant_args.py`` strategies;
  ``ModelCompressor.update_config`` writes the config): ``<m>.weight`` float8_e4m3fn and
  ``<m>.weight_scale`` float32 of shape [1] (strategy ``tensor``), [O, 1] (``channel``),
  [O, I/N] (``group``, group_size N) or [ceil(O/R), ceil(I/C)] (``block``,
  block_structure [R, C]); ``x = code * weight_scale``.  A weight-only FP8 scheme is what
  the library itself calls ``naive-quantized`` (``float-quantized`` needs an activation
  scheme: ``FloatQuantizationCompressor.can_compress``), so that is the format written.
- ``compressed-tensors`` NVFP4 (``compressors/nvfp4/base.py``, ``helpers.py``):
  ``<m>.weight_packed`` uint8 [O, I/2], two E2M1 codes a byte, the lower-indexed element in
  the low nibble; ``<m>.weight_scale`` float8_e4m3fn [O, I/16]; ``<m>.weight_global_scale``
  float32 [1] = 448 * 6 / amax (``quantization/utils/helpers.py`` ``generate_gparam``:
  fmt's tensor scale ``g`` itself); ``x = code * (weight_scale / weight_global_scale)``.
- ``modelopt-nvfp4`` (nvidia-modelopt 0.47.0's unified Hugging Face export:
  ``torch/export/unified_export_hf.py``, ``quant_utils.py`` ``get_quant_config`` /
  ``process_layer_quant_config``, ``convert_hf_config.py``
  ``convert_hf_quant_config_format``; ``torch/quantization/qtensor/nvfp4_tensor.py``):
  ``<m>.weight`` uint8 packed as above, ``<m>.weight_scale`` float8_e4m3fn [O, I/16],
  ``<m>.weight_scale_2`` float32 [] = amax / (6 * 448), here ``fl32(1 / g)``;
  ``x = code * weight_scale * weight_scale_2``; ``hf_quant_config.json`` ``{"producer":
  ..., "quantization": {"quant_algo": "W4A16_NVFP4", "group_size": 16, "exclude_modules":
  [...], "kv_cache_quant_algo": null}}`` (weights only: ModelOpt's ``NVFP4`` also
  quantizes the activations, with an ``input_scale`` per layer) and, in ``config.json``,
  what ``convert_hf_quant_config_format`` makes of it (``config_groups`` of the weights,
  ``ignore``, ``quant_algo``, ``producer``, ``"quant_method": "modelopt"``).  The producer
  is said as fmtcli, not modelopt.

NVFP4's block scale ``d`` is recovered from the engine's per-block scale ``S = g / d``
(float32) and ``g`` (the engine's first pass): ``d = e4m3(g / S)``, checked by
``fl32(g / d) == S``.  A block whose ``d`` underflowed (``S`` infinite) or whose values are
all 0 (``S`` 1) stores ``d = 0`` (compressed-tensors) or 1.0 (ModelOpt's own rule for an
all-zero block); its codes are 0 either way.

Nothing that decodes to NaN is written: E4M3 codes of NaN (``--overflow ieee`` past 448),
and scales that are NaN or inf (or a global scale not positive) are refused in one line
(``refuse_nan_codes``, ``refuse_nonfinite_scales``), the folder left unwritten.
"""

from __future__ import annotations

import numpy as np

from fmtcli.base.choices import Granularity, OutLayout, ScaleRule
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.numerics.scaling import MX_RULES
from fmtcli.numerics.schemes import ScaleFormat, Scheme

CT_VERSION = "0.20.1"  # the compressed-tensors release whose config format is written
NVFP4_GROUP = 16
#: ModelOpt's name of NVFP4 weights without activation quantization (its "NVFP4" is W4A4,
#: whose layers carry an input_scale fmt has no figure for)
MODELOPT_ALGO = "W4A16_NVFP4"
#: the rules whose scales are powers of two (DeepSeek's ``scale_fmt: ue8m0``): fmt's pow2
#: rules and the MX rules (``numerics.scaling.MX_RULES``)
POWER_OF_TWO_RULES = (ScaleRule.POW2_FLOOR, ScaleRule.POW2_CEIL, ScaleRule.POW2_NEAREST,
                      *MX_RULES)


def is_nvfp4(scheme: Scheme) -> bool:
    return (scheme.format.name == "float4_e2m1fn" and scheme.scale_format is
            ScaleFormat.E4M3_FP32 and scheme.granularity is Granularity.BLOCK
            and scheme.block == NVFP4_GROUP and scheme.axis == -1)


def weight_tile(scheme: Scheme) -> tuple[int, int] | None:
    """The tile a 2-D weight gets under ``scheme`` (``--tile`` or the deepseek recipe's)."""
    if scheme.granularity is not Granularity.TILE:
        return None
    return scheme.weight_tile or scheme.tile


def check_scheme(layout: OutLayout, scheme: Scheme) -> str:
    """Refuse a scheme the layout cannot hold; the layout's scheme name (the config's
    ``format`` / ``quant_algo``)."""
    layout = OutLayout(layout)
    fp8 = scheme.format.name == "float8_e4m3fn" and scheme.scale_format is ScaleFormat.FLOAT32
    if layout is OutLayout.MODELOPT_NVFP4:
        if not is_nvfp4(scheme):
            raise _mismatch(layout, scheme, Param("recipe", "nvfp4"))
        return MODELOPT_ALGO
    if layout is OutLayout.DEEPSEEK_FP8:
        if not (fp8 and weight_tile(scheme)):
            raise _mismatch(layout, scheme, Param("tile", "128x128"))
        return "fp8"
    if is_nvfp4(scheme):
        return "nvfp4-pack-quantized"
    g = scheme.granularity
    if not fp8 or g is Granularity.COLUMN or (g is Granularity.BLOCK and scheme.axis != -1):
        raise _mismatch(layout, scheme, Param("per", "row") + ", " + Param("block", 128)
                        + ", " + Param("tile", "128x128") + ", " + Param("per", "tensor")
                        + " or " + Param("recipe", "nvfp4"))
    return "naive-quantized"


def _mismatch(layout: OutLayout, scheme: Scheme, hint) -> UsageError:
    return UsageError(Param("layout", layout.value) + f" cannot hold {scheme.format.name} "
                      f"{scheme.label} ({scheme.scale_format.value} scales)", "use " + hint)


def check_tensor(layout: OutLayout, scheme: Scheme, name: str, shape) -> None:
    """Refuse a weight the layout cannot hold under ``scheme`` (groups must divide its rows:
    compressed-tensors' ``_process_group`` and NVFP4's packing)."""
    cols = shape[-1]
    group = NVFP4_GROUP if is_nvfp4(scheme) else (
        scheme.block if scheme.granularity is Granularity.BLOCK else 1)
    if cols % group:
        raise UsageError(f"{shown(name)} has {cols} columns, not a multiple of {group}, "
                         "which " + Param("layout", OutLayout(layout).value)
                         + " needs for groups of " + f"{group}")


def dequantization_scales(grid: np.ndarray) -> np.ndarray:
    """fmt's quantization scales ``s`` (x_q = code / s) as the float32 dequantization
    scales ``d = fl32(1 / s)`` the layouts store (x = code * d)."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        return (1.0 / np.asarray(grid, dtype=np.float64)).astype(np.float32)


def nvfp4_block_scales(grid: np.ndarray, g: float, name: str) -> np.ndarray:
    """The E4M3 block scales ``d`` (as float32 values) behind the engine's per-block
    scales ``S = fl32(g / d)`` (module docstring)."""
    import ml_dtypes

    s = np.asarray(grid, dtype=np.float32)
    g32 = np.float32(g)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = (np.float64(g32) / s.astype(np.float64)).astype(ml_dtypes.float8_e4m3fn)
        d = d.astype(np.float32)
        again = (g32 / d).astype(np.float32)
    found = np.isfinite(s) & (again == s) & np.isfinite(d)
    # the engine's dead blocks (s = inf: x_q = 0) store 0; a NaN block (a NaN in the
    # weight: x_q NaN) would store E4M3's NaN, which layout_tensors refuses (layout_out
    # refuses a weight holding NaN or inf before it gets here)
    d = np.where(found, d, np.where(np.isnan(s), np.float32(np.nan), np.float32(0)))
    lost = ~found & np.isfinite(s) & (s != 1)
    if lost.any():  # not a scale the engine's NVFP4 rule gives: a bug, said in one line
        raise DataError(f"{shown(name)}: NVFP4 block scale {float(s[lost][0])!r} is not "
                        f"{float(g32)!r} / an E4M3 value")
    return d


def e4m3_bytes(values: np.ndarray) -> np.ndarray:
    """float32 values on float8_e4m3fn's grid as their code bytes (``engine.writers
    .codes_of``, the one values-to-codes step of fmt's writers)."""
    from fmtcli.engine.writers import codes_of
    from fmtcli.numerics.formats import get_format

    return codes_of(np.asarray(values, dtype=np.float32), get_format("float8_e4m3fn"))


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes (one a byte, low 4 bits) two a byte: element 2j in the low nibble,
    element 2j + 1 in the high one (compressed-tensors' and ModelOpt's order)."""
    nibbles = np.asarray(codes, dtype=np.uint8) & 0x0F
    return np.ascontiguousarray(nibbles[..., 0::2] | (nibbles[..., 1::2] << 4))


def module_of(key: str) -> str:
    """``model.layers.0.mlp.up_proj.weight`` -> ``model.layers.0.mlp.up_proj.``."""
    return key[: -len("weight")]


def layout_entries(layout: OutLayout, scheme: Scheme, key: str, matrix: tuple[int, int],
                   grid_shape: tuple[int, int]) -> list[tuple[str, str, tuple[int, ...]]]:
    """One weight's stored tensors before they are made: (name, safetensors dtype code,
    shape) each, for a ``matrix`` (rows, columns) weight whose engine scale grid has
    ``grid_shape`` (the header ``engine.writers.SafetensorsStream`` writes first)."""
    layout, m = OutLayout(layout), module_of(key)
    rows, cols = matrix
    grid_shape = tuple(grid_shape)
    if is_nvfp4(scheme):
        packed = (rows, cols // 2)
        if layout is OutLayout.MODELOPT_NVFP4:
            return [(key, "U8", packed), (m + "weight_scale", "F8_E4M3", grid_shape),
                    (m + "weight_scale_2", "F32", ())]
        return [(m + "weight_packed", "U8", packed), (m + "weight_scale", "F8_E4M3", grid_shape),
                (m + "weight_global_scale", "F32", (1,))]
    if layout is OutLayout.DEEPSEEK_FP8:
        return [(key, "F8_E4M3", matrix), (key + "_scale_inv", "F32", grid_shape)]
    scale = (1,) if scheme.granularity is Granularity.TENSOR else grid_shape
    return [(key, "F8_E4M3", matrix), (m + "weight_scale", "F32", scale)]


def layout_tensors(layout: OutLayout, scheme: Scheme, key: str, codes: np.ndarray,
                   grid: np.ndarray, g: float | None) -> list[tuple[str, str, np.ndarray]]:
    """One weight's stored tensors: (name, safetensors dtype code, array) each, as
    ``layout_entries`` names them.  ``codes``: the engine's element codes (uint8, the
    matrix's shape); ``grid``: its scales ``s`` per tile; ``g``: NVFP4's tensor scale."""
    layout = OutLayout(layout)
    entries = layout_entries(layout, scheme, key, codes.shape, np.shape(grid))
    if is_nvfp4(scheme):
        d = nvfp4_block_scales(grid, g, key)
        if layout is OutLayout.MODELOPT_NVFP4:
            # ModelOpt stores 1.0 for an all-zero block (its codes are 0 either way)
            arrays = [pack_fp4(codes), e4m3_bytes(np.where(d == 0, np.float32(1), d)),
                      np.array(1.0 / np.float64(np.float32(g)), dtype=np.float32)]
        else:
            arrays = [pack_fp4(codes), e4m3_bytes(d), np.array([g], dtype=np.float32)]
    else:
        arrays = [codes, dequantization_scales(grid)]
        refuse_nan_codes(layout, key, codes)
    for (name, _, _), array in zip(entries[1:], arrays[1:]):
        refuse_nonfinite_scales(layout, key, name, array)
    return [(name, code, array.reshape(shape))
            for (name, code, shape), array in zip(entries, arrays)]


def refuse_nan_codes(layout: OutLayout, key: str, codes: np.ndarray) -> None:
    """Refuse E4M3 codes of NaN (0x7F, 0xFF) among finite inputs: what ``--overflow ieee``
    makes of a value past 448 (float8_e4m3fn has no inf).  A checkpoint holding them
    decodes to NaN wherever a loader reads it; nothing is written."""
    found = int(np.count_nonzero((np.asarray(codes) & 0x7F) == 0x7F))
    if found:
        raise DataError(f"{shown(key)}: {found:,} value{'s' if found != 1 else ''} "
                        "overflowed to float8_e4m3fn's NaN, which would be stored in the "
                        + Param("layout", layout.value) + " checkpoint; nothing written",
                        "drop " + Param("overflow", "ieee") + ": the default, saturate, "
                        "clips to 448; or use a scale rule that keeps |x * scale| <= 448")


def refuse_nonfinite_scales(layout: OutLayout, key: str, name: str, array: np.ndarray
                            ) -> None:
    """Refuse a stored scale that is NaN, inf or (a global scale) not positive: the last
    guard before a checkpoint whose blocks decode to NaN (``layout_out`` refuses NaN and
    inf inputs first, which is what makes one)."""
    values = np.asarray(array)
    if values.dtype == np.uint8:  # E4M3 bytes: 0x7F / 0xFF are NaN
        bad = (values & 0x7F) == 0x7F
    else:
        bad = ~np.isfinite(values)
        if name.endswith(("_global_scale", "_scale_2")):
            bad |= values <= 0
    found = int(np.count_nonzero(bad))
    if found:
        raise DataError(f"{shown(key)}: {found:,} of {values.size:,} values of {shown(name)} "
                        "would be NaN, inf or not positive in the "
                        + Param("layout", layout.value) + " checkpoint; nothing written")


def _ct_weights(scheme: Scheme) -> dict:
    """compressed-tensors' ``QuantizationArgs`` of the weights, as ``model_dump`` writes it."""
    if is_nvfp4(scheme):
        return {"dynamic": False, "group_size": NVFP4_GROUP, "num_bits": 4,
                "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group",
                "symmetric": True, "type": "float"}
    args = {"dynamic": False, "group_size": None, "num_bits": 8, "symmetric": True,
            "type": "float"}
    g = scheme.granularity
    if g is Granularity.TENSOR:
        args["strategy"] = "tensor"
    elif g is Granularity.ROW:
        args["strategy"] = "channel"
    elif g is Granularity.BLOCK:
        args.update(strategy="group", group_size=scheme.block)
    else:
        args.update(strategy="block", block_structure=list(weight_tile(scheme)))
    return dict(sorted(args.items()))


def quantization_config(layout: OutLayout, scheme: Scheme, ignored: list[str]) -> dict:
    """``config.json``'s ``quantization_config`` for the layout; ``ignored``: the module
    names of the 2-D weights left unquantized (lm_head, embeddings)."""
    layout = OutLayout(layout)
    name = check_scheme(layout, scheme)
    if layout is OutLayout.DEEPSEEK_FP8:
        config = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                  "weight_block_size": list(weight_tile(scheme))}
        if scheme.scale_rule in POWER_OF_TWO_RULES:
            config["scale_fmt"] = "ue8m0"
        return config
    if layout is OutLayout.MODELOPT_NVFP4:  # convert_hf_quant_config_format's W4A16_NVFP4
        group = {"targets": ["Linear"], "weights": {"dynamic": False, "group_size": NVFP4_GROUP,
                                                    "num_bits": 4, "type": "float"}}
        return {"config_groups": {"group_0": group}, "ignore": ignored, "producer": producer(),
                "quant_algo": name, "quant_method": "modelopt"}
    group = {"format": name, "input_activations": None, "output_activations": None,
             "targets": ["Linear"], "weights": _ct_weights(scheme)}
    return {"config_groups": {"group_0": group}, "format": name,
            "global_compression_ratio": None, "ignore": ignored, "kv_cache_scheme": None,
            "moe_sparsity_config": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "sparsity_config": {},
            "transform_config": {}, "version": CT_VERSION}


def modelopt_quantization(ignored: list[str]) -> dict:
    """ModelOpt's ``hf_quant_config.json`` ``quantization`` entry for NVFP4 weights alone
    (``quant_utils.process_layer_quant_config``)."""
    return {"exclude_modules": ignored, "group_size": NVFP4_GROUP,
            "kv_cache_quant_algo": None, "quant_algo": MODELOPT_ALGO}


def producer() -> dict:
    from fmtcli import __version__

    return {"name": "fmtcli", "version": __version__}
