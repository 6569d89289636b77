"""``fmt quantize --out DIR --layout L``: the scheme's result as a checkpoint folder in an
ecosystem's layout (compressed-tensors, DeepSeek-V3 FP8, ModelOpt NVFP4), which fmt's own
layout readers (``inputs.layouts``) and the ecosystem's loaders read back.

What gets quantized: the linear layers' weights, as the exporters pick them by default --
2-D tensors whose name ends in ``weight``, floating point, except embeddings, the output
head and MoE routers (compressed-tensors' presets target ``Linear`` modules and
llm-compressor's recipes ignore ``lm_head`` and, for MoE models, the router ``gate``;
ModelOpt excludes ``lm_head`` and routers; DeepSeek-V3 keeps ``embed``, ``head`` and
``gate`` in bfloat16).  Norms and biases are 1-D and stacked tensors (3-D) are left alone.
Every other tensor is copied as it is stored (its dtype and bytes kept).  The skipped 2-D
weights' modules are the config's ``ignore`` / ``exclude_modules``.

The values: a second pass of the engine over each quantized weight under the written
scheme (``engine.run.quantize_tensor`` keeping its codes, the same seed, product and
backend as the run), so the codes are exactly the engine's; ``layout_tensors`` says how
its scales become the layout's (x = code * d, d = fl32(1 / s)) and why the dequantized
values are within one float32 ulp of the engine's ``x_q`` (equal for power-of-two scales).

The folder: ``model.safetensors`` (streamed: one weight's codes in memory at a time),
``config.json`` (the input folder's own, when the input is a Hugging Face folder, with
``quantization_config`` set; else that entry alone) and, for ModelOpt,
``hf_quant_config.json``.  Written in a temporary folder beside DIR and renamed into place;
an existing DIR is replaced only with ``force``, and only when it holds nothing but the
files this writes.

A weight holding NaN or inf is refused (``refuse_nonfinite``: one line naming it, nothing
written): the layouts cannot store either, and the engine's rule for such a tile gives it a
NaN or zero scale.  fmt's own ``--out`` (no ``--layout``) keeps recording x_q with its NaN,
as docs/quantize.md's edge cases say: that file is an analysis record that fmt reads back;
a layout folder is a model that loaders serve without looking.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from fmtcli.base.choices import OutLayout
from fmtcli.base.dtypes import SAFETENSORS_CODES
from fmtcli.base.errors import DataError, Note, Param, UsageError, shown
from fmtcli.engine.first_pass import apply_first_pass, first_pass_partials
from fmtcli.engine.run import plan_schemes, quantize_tensor
from fmtcli.engine.writers import (
    OUT_SUFFIXES,
    SafetensorsStream,
    among,
    codes_of,
    creation_mode,
    output_names,
)
from fmtcli.inputs.layouts.base import json_object
from fmtcli.inputs.source import TensorSource
from fmtcli.numerics.schemes import Scheme, for_tensor
from fmtcli.quantize import layout_tensors as lt
from fmtcli.streaming import roles
from fmtcli.streaming.parallel import shared_array
from fmtcli.streaming.stream import (
    CHUNK_ELEMENTS,
    ChunkReader,
    chunk_slices,
    matrix_shape,
    tile_of,
    view_shape,
)

MODEL = "model.safetensors"
WRITTEN = (MODEL, "config.json", "hf_quant_config.json")


class LayoutNote(Note):
    """What ``--layout`` quantized and what it copied (said once)."""


@dataclass(frozen=True)
class LayoutPlan:
    """What a layout run writes: ``directory``, ``layout``, ``scheme`` (as the run applies
    it), ``names`` (each source's tensor name), ``quantized`` (whether each is), the
    modules left unquantized (``ignored``) and the input folder's ``config.json``."""

    directory: str
    layout: OutLayout
    scheme: Scheme
    sources: tuple[TensorSource, ...]
    names: tuple[str, ...]
    quantized: tuple[bool, ...]
    ignored: tuple[str, ...]
    config: dict | None


def is_linear_weight(name: str, source: TensorSource) -> bool:
    """A usable linear layer's weight (``streaming.roles.is_linear_weight``: 2-D,
    ``*weight``, not an embedding, an output head or a router)."""
    return source.skipped is None and roles.is_linear_weight(name, source.shape)


def check_directory(path: str, inputs: list[str], force: bool) -> None:
    """Refuse a DIR that is a file name, a file, a link, an input or a folder holding an
    input, or a non-empty folder (without ``force``; with it, one holding other files than
    ``WRITTEN``) -- before any work."""
    shown_path = Param("out", path)
    if os.path.splitext(path)[1].lower() in OUT_SUFFIXES or (
            os.path.lexists(path) and not os.path.isdir(path)):
        raise UsageError(shown_path + " is a file: a layout is written as a checkpoint "
                         "folder", "give a directory")
    if os.path.islink(path):
        raise UsageError(shown_path + " is a symbolic link", "give a directory")
    if among(path, inputs, inside=True):
        raise UsageError(shown_path + " holds an input; refusing to replace it")
    if os.path.isdir(path) and os.listdir(path):
        if not force:
            raise UsageError(f"{shown(path)} is not empty",
                             "pass " + Param("force", True) + " to replace it")
        other = sorted(set(os.listdir(path)) - set(WRITTEN))
        if other or any(not os.path.isfile(os.path.join(path, n)) for n in os.listdir(path)):
            raise UsageError(f"{shown(path)} holds more than a checkpoint fmt writes "
                             f"({shown((other or os.listdir(path))[0])}); refusing to replace "
                             "it", "give a new directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError("the directory of " + shown_path + f", {shown(parent)}, does not exist")
    os.rmdir(_temporary_folder(path))  # can we create a folder there at all?


def _temporary_folder(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    try:
        return tempfile.mkdtemp(prefix=".fmtcli-", dir=parent)
    except OSError as error:
        raise DataError(f"cannot write {shown(path)}: cannot create a folder in "
                        f"{shown(parent)} ({error.strerror or error})") from None


def plan_layout(directory: str, layout: OutLayout | str, scheme: Scheme,
                sources: list[TensorSource], inputs: list[str],
                chosen: list[TensorSource] | None = None) -> LayoutPlan:
    """What ``write_layout`` will write: every tensor of ``sources`` (the whole input),
    the linear weights among ``chosen`` (``--key``'s tensors; None: all) quantized.
    Refuses (one line) a scheme the layout cannot hold, a weight it cannot hold, an input
    with no linear weight, or a target among the inputs' files."""
    layout = OutLayout(layout)
    lt.check_scheme(layout, scheme)
    names = output_names(sources)
    picked = {(s.source, s.key) for s in (sources if chosen is None else chosen)}
    quantized = tuple(is_linear_weight(n, s) and (s.source, s.key) in picked
                      for n, s in zip(names, sources))
    if not any(quantized):
        raise UsageError("nothing for " + Param("layout", layout.value) + " to quantize: "
                         "no linear weight (a 2-D floating-point tensor named *weight, not "
                         "an embedding or lm_head)")
    if among(directory, [source.source for source in sources], inside=True):
        raise UsageError(Param("out", directory) + " holds an input; refusing to replace it")
    for name, source, q in zip(names, sources, quantized):
        if q:
            lt.check_tensor(layout, scheme, name, source.shape)
    ignored = sorted({n[: -len(".weight")] for n, s, q in zip(names, sources, quantized)
                      if not q and len(s.shape) == 2 and n.endswith(".weight")})
    folder = inputs[0] if len(inputs) == 1 and os.path.isdir(inputs[0]) else None
    return LayoutPlan(directory, layout, scheme, tuple(sources), tuple(names), quantized,
                      tuple(ignored), json_object(folder, "config.json"))


def write_layout(plan: LayoutPlan, *, seed: int = 0, chunk_elements: int = CHUNK_ELEMENTS,
                 workers: int | None = None, backend="numpy", device="cpu",
                 on_tensor=None) -> dict:
    """Write the folder (module docstring); what was written (the JSON's ``output``)."""
    options = dict(seed=seed, chunk_elements=chunk_elements, workers=workers,
                   backend=backend, device=device)
    folder = _temporary_folder(plan.directory)
    try:
        with open(os.path.join(folder, MODEL), "wb") as handle:
            _write_model(handle, plan, options, on_tensor)
        _write_configs(folder, plan)
        _commit_folder(folder, plan.directory)
    except OSError as error:
        shutil.rmtree(folder, ignore_errors=True)
        raise DataError(f"cannot write {shown(plan.directory)} "
                        f"({error.strerror or error})") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    count = sum(plan.quantized)
    name = lt.check_scheme(plan.layout, plan.scheme)
    warnings.warn(f"layout {plan.layout.value} ({name}): {count:,} linear weight"
                  f"{'s' if count != 1 else ''} quantized, {len(plan.names) - count:,} "
                  "tensors copied as they are", LayoutNote, stacklevel=2)
    return {"path": plan.directory, "scheme": plan.scheme.label,
            "content": f"{plan.layout.value} checkpoint ({name})",
            "layout": plan.layout.value, "config_scheme": name, "quantized": count,
            "copied": len(plan.names) - count,
            "files": [f for f in WRITTEN if os.path.exists(os.path.join(plan.directory, f))]}


def _write_model(handle, plan: LayoutPlan, options: dict, on_tensor) -> None:
    """model.safetensors, streamed (``engine.writers.SafetensorsStream``): the header
    first, from every tensor's name, dtype and shape, then each tensor's bytes as it is
    made (one weight's codes in memory at a time)."""
    entries = [entry for name, source, quantized in zip(plan.names, plan.sources,
                                                        plan.quantized)
               for entry in _entries(name, source, quantized, plan)]
    stream = SafetensorsStream(handle, entries, {"format": "pt", "producer": "fmtcli"})
    for name, source, quantized in zip(plan.names, plan.sources, plan.quantized):
        if on_tensor:
            on_tensor(source.name)
        for member, data in _members(name, source, quantized, plan, options):
            stream.write(member, data)
    stream.close()


def _entries(name: str, source: TensorSource, quantized: bool, plan: LayoutPlan):
    """(member name, safetensors dtype code, shape) of one source's tensors, before any
    is made: a copied tensor as stored; a quantized weight's as ``layout_tensors`` makes
    them, its scale grid one scale per tile of the scheme the engine applies to it."""
    if not quantized:
        code = SAFETENSORS_CODES.get(source.dtype)
        if code is None:
            raise DataError(f"{shown(source.name)}: {source.dtype} has no safetensors type; "
                            "it cannot be copied into " + Param("layout", plan.layout.value))
        return [(name, code, tuple(source.shape))]
    rows, cols = matrix_shape(source.shape)
    scheme = for_tensor(plan.scheme, source.key, len(view_shape(source.shape)))
    tr, tc = tile_of(scheme, source.shape)
    return lt.layout_entries(plan.layout, plan.scheme, name, (rows, cols),
                             (-(-rows // tr), -(-cols // tc)))


def _members(name: str, source: TensorSource, quantized: bool, plan: LayoutPlan,
             options: dict):
    """(member name, array) of one source's tensors, in ``_entries``' order."""
    if not quantized:
        yield name, np.asarray(source.stored())
        return
    codes, grid, g, nonfinite = engine_codes(source, plan.scheme, options)
    refuse_nonfinite(source, nonfinite, plan.layout)
    for member, _, data in lt.layout_tensors(plan.layout, plan.scheme, name, codes, grid, g):
        yield member, data


def engine_codes(source: TensorSource, scheme: Scheme, options: dict):
    """The engine's codes (uint8, the matrix's shape) and scale grid of one tensor under
    ``scheme``, NVFP4's tensor scale (None for other schemes) and the count of its NaN and
    inf values."""
    rows, cols = matrix_shape(source.shape)
    spec = scheme.format
    codes = shared_array((rows, cols), np.uint8)
    codes_of(np.zeros(1, np.float32), spec)  # ml_dtypes imported here, not in every worker

    def sink(rs, cs, block, codes=codes, spec=spec):
        codes[rs, cs] = codes_of(block, spec)

    runs, kept = quantize_tensor(source, [scheme], keep=0, keep_mode="codes", sink=sink,
                                 **options)
    grid, _ = kept
    g = tensor_scale(source, scheme, options["chunk_elements"]) if lt.is_nvfp4(scheme) \
        else None
    return np.array(codes), np.asarray(grid), g, runs[0].acc.nonfinite_inputs


def refuse_nonfinite(source: TensorSource, count: int, layout: OutLayout) -> None:
    """Refuse a weight holding NaN or inf (``count`` of them): no layout here can store
    one (E4M3 has no inf, FP4 neither inf nor NaN), and the engine's rule for such a tile
    (a NaN or zero scale, x_q NaN: docs/quantize.md, Edge cases) would put NaN scales into
    a checkpoint that loaders run without looking.  fmt's own ``--out`` records x_q as it
    is (NaN included) because it is an analysis record; a layout is a model to serve."""
    if count:
        many = count != 1
        raise DataError(f"{shown(source.name)} holds {count:,} NaN or infinite "
                        f"value{'s' if many else ''}, which "
                        + Param("layout", OutLayout(layout).value) + " cannot store (the "
                        f"scales covering {'them' if many else 'it'} would be NaN or inf); "
                        "nothing written",
                        "repair the tensor, or leave it out: " + Param("key", "PATTERN")
                        + " picks the weights to quantize, the rest are copied as stored")


def tensor_scale(source: TensorSource, scheme: Scheme, chunk_elements: int) -> float:
    """NVFP4's float32 tensor scale ``g`` as the engine's first pass sets it."""
    plans = plan_schemes(source, [scheme])
    rows, cols = matrix_shape(source.shape)
    reader = ChunkReader(source)
    try:
        partial, hists = first_pass_partials(
            reader, chunk_slices(rows, cols, plans, chunk_elements), plans, 1)
    finally:
        reader.close()
    apply_first_pass(plans, partial, hists)
    return float(plans[0].tensor_scale)


def _write_configs(folder: str, plan: LayoutPlan) -> None:
    """config.json (the input's, ``quantization_config`` set) and ModelOpt's
    hf_quant_config.json."""
    config = dict(plan.config or {})
    config["quantization_config"] = lt.quantization_config(plan.layout, plan.scheme,
                                                           list(plan.ignored))
    _write_json(os.path.join(folder, "config.json"), config)
    if plan.layout is OutLayout.MODELOPT_NVFP4:
        _write_json(os.path.join(folder, "hf_quant_config.json"),
                    {"producer": lt.producer(),
                     "quantization": lt.modelopt_quantization(list(plan.ignored))})


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")


def _commit_folder(folder: str, directory: str) -> None:
    """Give the folder and its files the modes new ones get, then rename it into place
    (an existing DIR, checked beforehand, is moved aside and removed after)."""
    os.chmod(folder, creation_mode(0o777))
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), creation_mode())
    old = None
    if os.path.isdir(directory):
        old = tempfile.mkdtemp(prefix=".fmtcli-old-", dir=os.path.dirname(folder))
        os.rename(directory, os.path.join(old, "replaced"))
    try:
        os.rename(folder, directory)
    except OSError:
        if old is not None:  # put the old folder back
            os.rename(os.path.join(old, "replaced"), directory)
            os.rmdir(old)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
