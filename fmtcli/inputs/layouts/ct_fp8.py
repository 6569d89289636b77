"""compressed-tensors FP8 weights: ``float-quantized`` and ``naive-quantized``.

Definition (compressed-tensors 0.20.1, read in its source):

- ``compressors/naive_quantized/base.py`` (``NaiveQuantizationCompressor``, and
  ``FloatQuantizationCompressor``, its alias for FP8 weights with quantized inputs):
  a module's ``weight`` is stored as ``quantize(weight, weight_scale)``, cast to the
  scheme's dtype (``float8_e4m3fn`` for 8-bit float weights), same shape as the original;
  ``weight_scale`` is kept as it is, in the weight's own dtype (bfloat16, float16 or
  float32: ``quantization/lifecycle/initialize.py`` ``initialize_qparams``), and
  ``weight_zero_point`` only for an asymmetric scheme.  A static input scheme (the ``FP8``
  preset) adds ``input_scale`` (one value); it is kept here as the part ``input_scale``.
- The shape of ``weight_scale`` by strategy (``initialize_qparams``): ``tensor`` ``[1]``,
  ``channel`` ``[O, 1]``, ``group`` ``[O, ceil(I / group_size)]`` and ``block``
  ``[ceil(O / bh), ceil(I / bw)]`` for ``block_structure`` ``[bh, bw]`` (``[128, 128]``
  in the ``FP8_BLOCK`` preset, ``quantization/quant_scheme.py``; the edge blocks are
  padded with zeros before their amax is taken, ``maybe_pad_tensor_for_block_quant``).
- Dequantization (``quantization/lifecycle/forward_helpers.py`` ``_dequantize``):
  ``x = (code - zero_point) * weight_scale`` -- ``weight_scale`` is a *dequantization*
  scale, computed as ``amax / 448`` for symmetric FP8 (``quantization/utils/helpers.py``
  ``calculate_qparams``: ``max(|min|, |max|) / ((q_max - q_min) / 2)``).  The library
  computes it in the scale's dtype, so with bfloat16 scales its output is the exact
  product rounded to bfloat16; fmt's float32 product of an E4M3 code (4 significant bits)
  and a bfloat16 scale (8) is exact, and for float32 scales it is the exact product
  rounded once to float32 -- equal to the library's float32 output.
- ``config.json``'s ``quantization_config`` (``compressors/model_compressors/
  model_compressor.py`` ``update_config``): ``quant_method`` ``compressed-tensors``,
  ``format`` (``float-quantized``, ``naive-quantized``, or ``mixed-precision`` with a
  ``format`` per group) and ``config_groups`` whose ``weights`` give ``strategy``,
  ``group_size``, ``block_structure``.

The same compressor writes 8-bit *integer* weights (``int-quantized``: the ``W8A8``
preset, ``quantization/quant_scheme.py``, int8 per channel, symmetric): ``weight`` int8,
``weight_scale`` as above, ``x = (q - zero_point) * weight_scale`` with ``weight_scale =
amax / 127.5`` (``calculate_qparams``: ``(q_max - q_min) / 2``); claimed here too, its
element ``int8``, its layout named ``INT_NAME`` (``compressed-tensors-int8``; FP8 files
keep ``compressed-tensors-fp8``) (exact: fmt forms the product in float64 and rounds
once).

Detected from the tensors alone (``weight`` float8_e4m3fn or int8 beside a float ``weight_scale``
of a shape one of the strategies gives); the config picks the strategy where two shapes
coincide and is recorded (``facts["config_scheme"]``).  A ``weight_scale`` of no
strategy's shape is claimed with a problem, so that ``read`` refuses it in one line.
The helpers for ``config.json`` here are shared with ``ct_mx``.
"""

from __future__ import annotations

import math
import re

import numpy as np

from fmtcli.inputs.layouts.base import Checkpoint, Quantized, RawChunk, byte_table
from fmtcli.inputs.layouts.lookup import byte_float_values, per_block, tile_rows
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "compressed-tensors-fp8"
#: the same compressor's int8 weights (``int-quantized``): their own name, not "fp8"
INT_NAME = "compressed-tensors-int8"
DESCRIPTION = ("float8_e4m3fn (or int8) weight x weight_scale (per tensor, channel, group "
               "or block), compressed-tensors float-/naive-/int-quantized")
REFERENCE = ("compressed-tensors 0.20.1: compressors/naive_quantized/base.py; "
             "quantization/lifecycle/forward_helpers.py _dequantize; "
             "quantization/lifecycle/initialize.py initialize_qparams")

FORMATS = ("float-quantized", "naive-quantized", "int-quantized")
ELEMENTS = ("float8_e4m3fn", "int8")
SCALE_DTYPES = ("float32", "bfloat16", "float16", "float64")
DEFAULT_BLOCK = (128, 128)
DIRECTION = "dequantization (x = code * scale)"
RULE = ("weight_scale = amax / 448 per tensor, row, group or block, stored in the weight's "
        "dtype (compressed-tensors calculate_qparams, symmetric)")
INT_RULE = ("weight_scale = amax / 127.5 symmetric, (max - min) / 255 with a zero point "
            "asymmetric, stored in the weight's dtype (compressed-tensors calculate_qparams)")


# -- config.json (shared with ct_mx) -------------------------------------------------------

def config_groups(config: dict | None) -> list[tuple[str | None, dict, list]]:
    """``(format, weights, targets)`` of every config group of a compressed-tensors
    ``quantization_config`` (a group without its own ``format`` takes the top-level one);
    ``[]`` where the config is not compressed-tensors'."""
    if not isinstance(config, dict) or not isinstance(config.get("config_groups"), dict):
        return []
    top = config.get("format") if isinstance(config.get("format"), str) else None
    found = []
    for group in config["config_groups"].values():
        if not isinstance(group, dict):
            continue
        fmt = group.get("format") if isinstance(group.get("format"), str) else top
        weights = group.get("weights") if isinstance(group.get("weights"), dict) else {}
        targets = group.get("targets") if isinstance(group.get("targets"), list) else []
        found.append((fmt, weights, [t for t in targets if isinstance(t, str)]))
    return found


def _targets(module: str, targets: list) -> bool:
    for target in targets:
        if target.startswith("re:"):
            try:
                if re.match(target[3:], module):
                    return True
            except re.error:
                continue
        elif target == module:
            return True
    return False


def config_entry(config: dict | None, module: str, formats: tuple[str, ...]
                 ) -> tuple[str | None, dict]:
    """The config's ``(format, weights)`` for a module: the group among ``formats`` whose
    ``re:`` target matches its name, else the first group among ``formats``; without one,
    the top-level ``format`` (what config.json names the scheme) and ``{}``."""
    groups = [g for g in config_groups(config) if g[0] in formats]
    for fmt, weights, targets in groups:
        if _targets(module, targets):
            return fmt, weights
    if groups:
        return groups[0][0], groups[0][1]
    top = (config or {}).get("format")
    return (top if isinstance(top, str) else None), {}


def module_of(key: str, suffix: str) -> str | None:
    """``model.layers.0.q_proj`` of ``model.layers.0.q_proj.weight`` (``suffix`` its last
    part: ``weight``, ``weight_packed``); None for another name."""
    if key == suffix:
        return ""
    if key.endswith("." + suffix):
        return key[: -len(suffix) - 1]
    return None


def sibling(module: str, name: str) -> str:
    return f"{module}.{name}" if module else name


def siblings(checkpoint: Checkpoint, module: str, roles) -> dict:
    """The parts of ``module`` the checkpoint holds: role -> tensor, for each (role, last
    part of the tensor's name) of ``roles``, in their order."""
    found = {}
    for role, name in roles:
        source = checkpoint.get(sibling(module, name))
        if source is not None:
            found[role] = source
    return found


# -- the scale grid ------------------------------------------------------------------------

def _side(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 20


def _block_of(weights: dict) -> tuple[int, int]:
    size = weights.get("block_structure")
    if (isinstance(size, list) and len(size) == 2
            and all(_side(n) for n in size)):
        return int(size[0]), int(size[1])
    return DEFAULT_BLOCK


def strategies(shape: tuple[int, ...], weights: dict) -> dict[str, tuple]:
    """The strategies' scale shapes for a weight of ``shape`` (leading axes kept), each
    with its tile (rows, columns of the last two axes one scale covers) and ScaleGroup."""
    lead, (height, cols) = tuple(shape[:-2]), tuple(shape[-2:])
    bh, bw = _block_of(weights)
    found = {"tensor": ((1,), (height, cols), ScaleGroup("tensor")),
             "channel": (lead + (height, 1), (1, cols), ScaleGroup("row")),
             "block": (lead + (-(-height // bh), -(-cols // bw)), (bh, bw),
                       ScaleGroup("tile", tile=(bh, bw)))}
    size = weights.get("group_size")
    if _side(size):
        found["group"] = (lead + (height, -(-cols // size)), (1, size),
                          ScaleGroup("block", size))
    return found


def match_strategy(shape: tuple[int, ...], scale_shape: tuple[int, ...], weights: dict,
                   ) -> tuple[str, tuple[int, int], ScaleGroup] | None:
    """The strategy whose scale shape ``scale_shape`` is: the config's first, then
    tensor (any one value), channel (``[O, 1]`` or ``[O]``), block, group (``[O, G]``, G
    dividing the columns: the group size follows).  None when none fits."""
    shape, scale_shape = tuple(shape), tuple(scale_shape)
    table = strategies(shape, weights)
    lead, (height, cols) = shape[:-2], shape[-2:]
    if (len(scale_shape) == len(shape) and scale_shape[:-1] == lead + (height,)
            and "group" not in table and scale_shape[-1] > 1 and cols % scale_shape[-1] == 0):
        size = cols // scale_shape[-1]
        table["group"] = (scale_shape, (1, size), ScaleGroup("block", size))
    fits = {name: (tile, group) for name, (want, tile, group) in table.items()
            if want == scale_shape}
    if math.prod(scale_shape) == 1:
        fits.setdefault("tensor", table["tensor"][1:])
    if scale_shape == lead + (height,):
        fits.setdefault("channel", table["channel"][1:])
    said = weights.get("strategy")
    order = [said if isinstance(said, str) else None, "tensor", "channel", "block", "group"]
    for name in order:
        if name in fits:
            return name, *fits[name]
    return None


def grid_of(scales: np.ndarray, shape: tuple[int, ...], strategy: str) -> np.ndarray:
    """A strategy's scales as the grid ``block_scales`` reads: leading axes, then one
    value per tile of the last two axes."""
    lead = tuple(shape[:-2])
    if strategy == "tensor":
        return np.full(lead + (1, 1), scales.reshape(-1)[0], dtype=scales.dtype)
    if strategy == "channel":
        return scales.reshape(lead + (shape[-2], 1))
    return scales


def scale_problem(key: str, scale_shape, shape, weights: dict) -> str:
    """The one line for a scale tensor of no strategy's shape."""
    table = strategies(tuple(shape), weights)
    said = ", ".join(f"{name} {list(want)}" for name, (want, _, _) in table.items())
    return (f"{key} has shape {list(scale_shape)}: no compressed-tensors strategy's "
            f"({said}) for a weight of {list(shape)}")


# -- the reader ----------------------------------------------------------------------------

def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found = []
    for key, codes in checkpoint.tensors.items():
        module = module_of(key, "weight")
        if (module is None or codes.dtype not in ELEMENTS or len(codes.shape) < 2
                or codes.size == 0):
            continue
        scales = checkpoint.get(sibling(module, "weight_scale"))
        if (scales is None or scales.dtype not in SCALE_DTYPES or codes.opener is None
                or scales.opener is None):
            continue
        found.append(_quantized(checkpoint, module, codes, scales))
    return found


def _quantized(checkpoint: Checkpoint, module: str, codes, scales) -> Quantized:
    shape = tuple(codes.shape)
    fmt, weights = config_entry(checkpoint.config, module, FORMATS)
    parts = {"codes": codes, "scales": scales}
    extras = siblings(checkpoint, module, (("zero_point", "weight_zero_point"),
                                           ("input_scale", "input_scale")))
    parts.update((role, e) for role, e in extras.items() if e.opener is not None)
    problems = [] if matrix_shape(shape) == (math.prod(shape[:-1]), shape[-1]) else [
        f"{codes.key} has shape {list(shape)}: not rows of {shape[-1]} columns"]
    matched = match_strategy(shape, tuple(scales.shape), weights)
    if matched is None:
        problems.append(scale_problem(scales.key, scales.shape, shape, weights))
        strategy, tile, group = "tensor", shape[-2:], ScaleGroup("tensor")
    else:
        strategy, tile, group = matched
    if "zero_point" in parts and tuple(parts["zero_point"].shape) != tuple(scales.shape):
        problems.append(f"{parts['zero_point'].key} has shape "
                        f"{list(parts['zero_point'].shape)}, not its weight_scale's "
                        f"{list(scales.shape)}")
    bits = {"float32": 32, "float64": 64}.get(scales.dtype, 16)
    per = tile[0] * tile[1] if strategy != "tensor" else 0  # a row's scale: 1 x I
    facts = {"scale_direction": DIRECTION, "config_scheme": fmt, "strategy": strategy,
             "nominal_bits": 8.0 + (bits / per if per else 0.0),
             "scale_rule": INT_RULE if codes.dtype == "int8" else RULE,
             "symmetric": "zero_point" not in parts,
             "quant_method": (checkpoint.config or {}).get("quant_method"),
             "tile": list(tile), "zero_point": "zero_point" in parts}
    rows, elements, grid, raw = _readers(parts, shape, strategy, tile)
    name = INT_NAME if codes.dtype == "int8" else NAME
    return Quantized(name, codes.key, codes.source, shape, codes.dtype, scales.dtype,
                     group, parts, rows, facts, elements, grid, problems, raw)


def _readers(parts: dict, shape: tuple[int, ...], strategy: str, tile: tuple[int, int]):
    """(rows_reader, elements_reader, scales_reader) of an FP8 weight whose scale grid
    covers ``tile``s: codes streamed by rows from their memory map, the (small) scale and
    zero-point grids read once."""
    from fmtcli.inputs.layouts.base import values_of

    height = shape[-2]
    cache: dict = {}

    def grids() -> dict:
        if "scale" not in cache:
            cache["scale"] = grid_of(values_of(parts["scales"]), shape, strategy)
            if "zero_point" in parts:
                cache["zero"] = grid_of(values_of(parts["zero_point"]), shape, strategy)
        return cache

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        # the memory map opened per chunk: a map kept open keeps every page read in the RSS
        return byte_float_values(parts["codes"].stored().reshape(matrix_shape(shape))[r0:r1])

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        values, rows = elements_reader(r0, r1), np.arange(r0, r1)
        if "zero" in grids():
            per_block(values, tile_rows(grids()["zero"], rows, height, tile[0]), tile[1],
                      np.subtract)
        return per_block(values, tile_rows(grids()["scale"], rows, height, tile[0]), tile[1])

    def scales_reader() -> np.ndarray:
        return values_of(parts["scales"]).astype(np.float32)

    def raw_reader(r0: int, r1: int) -> RawChunk | None:
        element = parts["codes"].dtype
        if "zero" in grids() or element not in ("float8_e4m3fn", "float8_e5m2"):
            return None  # integers (not sign-magnitude) and zero points: the float path
        stored = parts["codes"].stored().reshape(matrix_shape(shape))[r0:r1]
        grid = tile_rows(grids()["scale"], np.arange(r0, r1, tile[0]), height, tile[0])
        return RawChunk(np.asarray(stored).view(np.uint8), 0, byte_table(element),
                        np.asarray(grid, dtype=np.float64))

    return rows_reader, elements_reader, scales_reader, raw_reader
