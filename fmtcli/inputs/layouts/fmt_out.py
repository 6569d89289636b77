"""fmt's own ``--out`` layout: what ``fmt quantize X --out q.safetensors`` (or ``q.npz``)
writes, read back as the dequantized values the engine computed.

Definition (this project: ``fmtcli/engine/writers.py`` ``write_codes`` and
``fmtcli/quantize/outputs.py`` ``Output.done``): for every tensor ``<key>``

- ``<key>.codes``: the raw element codes in the tensor's own shape, unsigned integers of
  the format's width (uint8 for formats of up to 8 bits, FP4/FP6 included; uint16 for
  bfloat16/float16; ``numerics.codes``'s bit layout, which is ml_dtypes' where it has the
  format);
- ``<key>.scales``: float32 (float64 where float32 cannot hold them), one per tile of the
  tensor's matrix view (``numerics.granularity.matrix_shape``), the grid
  ``ceil(rows / tile_rows) x ceil(columns / tile_columns)``, in fmt's *quantization*
  direction: ``x_q = decode(codes) / scales`` (an NVFP4 block whose scale is inf decodes
  to 0, as the engine makes it);
- metadata: ``"fmtcli": "x_q = decode(codes) / scales"`` and, per ``<key>``, a JSON string
  ``{"scheme": Scheme.to_dict(), "tile": [rows, cols], "shape": [...], "matrix": [rows,
  cols]}``.  A .safetensors file keeps it in its header's ``__metadata__``
  (``inputs.safetensorsfile.read_metadata``); a .npz file, which has no header, in the
  member ``__metadata__``: the UTF-8 bytes (uint8) of the same JSON object.

Detection is strict, so that a checkpoint that merely has tensors named ``*.codes`` /
``*.scales`` stays plain data: the codes an unsigned integer dtype, the scales float32 or
float64 in the same file, and that file's metadata carrying the ``fmtcli`` marker and an
entry for ``<key>``.  A .npz written before its metadata member existed is not claimed (its
format cannot be known).  Once claimed, what does not fit -- an entry that is not the JSON
above, an unknown format, codes of the wrong dtype or shape, a scale grid of the wrong
shape -- is a problem (``Quantized.problems``): ``read`` refuses it in one line and ``fmt
audit`` reports it.  The logical key is ``<key>``; the dequantized values equal the
engine's ``x_q`` to the bit (the float64 quotient of two float32 values rounds to the
float32 quotient).
"""

from __future__ import annotations

import json
import os

import numpy as np

from fmtcli.base.errors import DataError, FmtError, shown
from fmtcli.inputs.layouts.base import Checkpoint, Quantized, block_scales
from fmtcli.numerics.granularity import ScaleGroup, matrix_shape

NAME = "fmt-out"
DESCRIPTION = ("fmt quantize --out: <key>.codes (element codes) + <key>.scales (one per "
               "tile), x = decode(codes) / scales")
REFERENCE = "fmtcli/engine/writers.py write_codes; fmtcli/quantize/outputs.py Output.done"

MARKER_KEY, MARKER = "fmtcli", "x_q = decode(codes) / scales"
#: The .npz member holding the metadata (.safetensors: its header's ``__metadata__``);
#: ``engine.writers`` writes both with these names.
NPZ_METADATA = "__metadata__"
MAX_METADATA_BYTES = 64 << 20
CODE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
SCALE_DTYPES = ("float32", "float64")
SCALE_BITS = {"float32": 32, "e8m0": 8, "e4m3+fp32": 8}


def claim(checkpoint: Checkpoint) -> list[Quantized]:
    found = []
    metadata: dict[str, dict | None] = {}
    for key, codes in checkpoint.tensors.items():
        if not key.endswith(".codes") or codes.dtype not in CODE_DTYPES:
            continue
        name = key[: -len(".codes")]
        scales = checkpoint.get(name + ".scales")
        if (scales is None or scales.dtype not in SCALE_DTYPES or scales.source != codes.source
                or codes.opener is None or scales.opener is None):
            continue
        if codes.source not in metadata:
            metadata[codes.source] = _metadata(checkpoint, codes.source)
        found_meta = metadata[codes.source]
        if found_meta is None or name not in found_meta:
            continue
        extra = {}
        member = checkpoint.get(NPZ_METADATA)
        if member is not None and member.source == codes.source:
            extra["metadata"] = member
        found.append(_quantized(name, codes, scales, found_meta[name], extra))
    return found


def _metadata(checkpoint: Checkpoint, path: str) -> dict | None:
    """The metadata of fmt's ``--out`` file ``path`` (names -> strings), or None where it
    has none or no ``fmtcli`` marker; never raises."""
    try:
        if path.lower().endswith(".safetensors"):
            from fmtcli.inputs.safetensorsfile import read_metadata

            found = read_metadata(path)
        else:
            found = _npz_metadata(checkpoint, path)
    except (FmtError, OSError, ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or found.get(MARKER_KEY) != MARKER:
        return None
    return found


def _npz_metadata(checkpoint: Checkpoint, path: str) -> dict | None:
    """A .npz's ``__metadata__`` member (uint8 UTF-8 JSON), bounded; None without one."""
    member = checkpoint.get(NPZ_METADATA)
    if member is None or member.source != path:  # another file's: read this file's own
        from fmtcli.inputs.files import read_file

        member = next((s for s in read_file(path) if s.key == NPZ_METADATA), None)
    if (member is None or member.dtype != "uint8" or len(member.shape) != 1
            or member.size > MAX_METADATA_BYTES or member.opener is None):
        return None
    found = json.loads(np.asarray(member.stored()).tobytes().decode("utf-8"))
    return found if isinstance(found, dict) else None


def _description(text) -> tuple[dict | None, str | None]:
    """The entry of one tensor: (its JSON object, None) or (None, what is wrong)."""
    try:
        entry = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        entry = None
    ok = (isinstance(entry, dict) and isinstance(entry.get("scheme"), dict)
          and isinstance(entry["scheme"].get("format"), str)
          and all(isinstance(entry.get(k), list) and all(type(n) is int and n >= 0
                                                         for n in entry[k])
                  for k in ("tile", "shape", "matrix"))
          and len(entry["tile"]) == 2 and min(entry["tile"]) >= 1)
    if not ok:
        return None, ("its metadata entry is not fmt's {scheme, tile, shape, matrix} "
                      "description")
    return entry, None


def _expected_code_dtype(spec) -> str:
    from fmtcli.numerics.codes import encode

    if spec.ml_dtype is not None:
        return {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}[spec.ml_dtype.itemsize]
    return encode(np.zeros(1), spec).dtype.name


def _checked(name, codes, scales, text) -> tuple[dict | None, object, list[str]]:
    """The tensor's description, its format and the problems found (none: readable)."""
    entry, problem = _description(text)
    if entry is None:
        return None, None, [problem]
    try:
        from fmtcli.numerics.formats import get_format

        spec = get_format(entry["scheme"]["format"])
    except FmtError:
        return entry, None, [f"its metadata names an unknown format "
                             f"{entry['scheme']['format'][:40]!r}"]
    problems = []
    shape, tile = tuple(entry["shape"]), tuple(entry["tile"])
    if tuple(codes.shape) != shape:
        problems.append(f"{codes.key} has shape {list(codes.shape)}, its metadata says "
                        f"{list(shape)}")
    elif list(matrix_shape(shape)) != entry["matrix"]:
        problems.append(f"its metadata's matrix view {entry['matrix']} is not that of "
                        f"{list(shape)}")
    want = _expected_code_dtype(spec)
    if codes.dtype != want:
        problems.append(f"{codes.key} is {codes.dtype}; codes of {spec.name} are {want}")
    rows, cols = matrix_shape(tuple(codes.shape))
    grid = (-(-rows // tile[0]), -(-cols // tile[1]))
    if tuple(scales.shape) != grid:
        problems.append(f"{scales.key} has shape {list(scales.shape)}, not {list(grid)} (one "
                        f"per {tile[0]}x{tile[1]} tile of the {rows}x{cols} matrix view)")
    return entry, spec, problems


def _group(scheme: dict, tile: tuple[int, int]) -> ScaleGroup:
    """What one scale covers, from the scheme as written (the tile where it says less)."""
    try:
        kind = scheme.get("granularity")
        if kind == "block":
            return ScaleGroup("block", block=int(scheme["block"]), axis=int(scheme["axis"]))
        if kind in ("tensor", "row", "column"):
            return ScaleGroup(kind)
    except (FmtError, KeyError, TypeError, ValueError):
        pass
    return ScaleGroup("tile", tile=tile)


def _facts(entry: dict | None, spec, codes, scales) -> dict:
    facts = {"scale_direction": "quantization (x = code / scale)",
             "config_scheme": None, "nominal_bits": None, "scale_rule": None,
             "metadata_file": os.path.basename(codes.source)}
    if entry is None:
        return facts
    scheme, tile = entry["scheme"], entry["tile"]
    per_scale = max(1, tile[0] * tile[1])
    facts.update(config_scheme=scheme.get("label"), tile=list(tile), scheme=scheme,
                 scale_rule=f"{scheme.get('scale_rule')} (margin {scheme.get('margin')})")
    # what the file stores by design for this shape: the codes' width and one scale per
    # tile of the matrix view (a ragged edge tile costs a whole scale)
    code_bits = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}.get(codes.dtype, 0)
    rows, cols = matrix_shape(tuple(codes.shape))
    tiles = -(-rows // tile[0]) * -(-cols // tile[1])
    facts["nominal_bits"] = code_bits + (64 if scales.dtype == "float64" else 32) * tiles / max(
        1, rows * cols)
    if spec is not None:
        scale_bits = SCALE_BITS.get(scheme.get("scale_format"), 32)
        facts["scheme_bits"] = spec.bits + scale_bits / per_scale
    return facts


def _quantized(name, codes, scales, text, extra) -> Quantized:
    entry, spec, problems = _checked(name, codes, scales, text)
    shape = tuple(codes.shape)
    tile = tuple(entry["tile"]) if entry is not None else (1, 1)
    rows, cols = matrix_shape(shape)
    cache: dict = {}

    def load() -> dict:
        if not cache:
            cache["codes"] = np.asarray(codes.stored()).reshape(rows, cols)
            cache["grid"] = np.asarray(scales.stored()).reshape(scales.shape)
        return cache

    def decoded(r0: int, r1: int) -> np.ndarray:
        from fmtcli.numerics.codes import decode

        block = load()["codes"][r0:r1]
        if spec.bits < 8 * block.itemsize and (block >> spec.bits).any():
            raise DataError(f"{shown(codes.source + ':' + codes.key)}: codes beyond "
                            f"{spec.name}'s {spec.bits} bits (corrupt file?)")
        return decode(block, spec)

    def elements_reader(r0: int, r1: int) -> np.ndarray:
        return decoded(r0, r1).astype(np.float32)

    def rows_reader(r0: int, r1: int) -> np.ndarray:
        values = decoded(r0, r1)
        per = block_scales(load()["grid"], np.arange(r0, r1), rows, tile, cols)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = (values / per.astype(np.float64)).astype(np.float32)
        out[np.isinf(per)] = 0  # the engine's dead NVFP4 blocks (scale inf): 0
        return out

    group = _group(entry["scheme"], tile) if entry is not None else ScaleGroup("tile",
                                                                                 tile=tile)
    return Quantized(NAME, name, codes.source, shape,
                     spec.name if spec is not None else "unknown", scales.dtype, group,
                     {"codes": codes, "scales": scales, **extra}, rows_reader,
                     _facts(entry, spec, codes, scales), elements_reader,
                     lambda: load()["grid"], problems)
