"""Already-quantized checkpoints: the layout readers, behind one registry.

``READERS`` lists the reader modules in the order they claim tensors (the most specific
first).  Each module defines ``NAME`` (the layout's name, as ``fmt audit`` shows it),
``DESCRIPTION`` (one line), ``REFERENCE`` (the definition it follows, cited) and
``claim(checkpoint) -> list[Quantized]``: the groups of tensors it recognises, by their
names, dtypes and shapes and the folder's ``config.json`` ``quantization_config``.  A
tensor claimed by one reader (a weight with its scales) is not offered to the next.

``scan`` runs the readers over one input's tensors; ``dequantized`` gives the input as
every analysis reads it: each quantized tensor as one float32 tensor of its logical name
(dequantized in chunks), its scale tensors folded into it, the rest as they are.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from fmtcli.base.errors import shown
from fmtcli.inputs.layouts.base import Checkpoint, LayoutNote, Quantized, json_object
from fmtcli.inputs.source import TensorSource

#: The reader modules of this package, in claiming order.
READERS = (
    "fmt_out",
    "deepseek_fp8",
    "modelopt_nvfp4",
    "gptoss_mxfp4",
    "ct_fp8",
    "ct_mx",
    "ct_nvfp4",
    "ct_pack",
    "kv_scales",
)



def reader(name: str):
    """The reader module ``name`` (a ``READERS`` entry), imported on first use."""
    return importlib.import_module(f"fmtcli.inputs.layouts.{name}")


def layout_names() -> list[str]:
    """Every layout's ``NAME``, in claiming order."""
    return [reader(name).NAME for name in READERS]


def read_config(folder: str | None) -> dict | None:
    """``folder/config.json``'s ``quantization_config`` (or ``compression_config``, the
    older compressed-tensors name), or None where the file, the entry or valid JSON is
    missing, or the JSON nests deeper than ``textparse.MAX_JSON_DEPTH`` (a config is a
    hint, never a reason to fail: ``base.json_object``)."""
    config = json_object(folder, "config.json")
    found = config and config.get("quantization_config", config.get("compression_config"))
    return found if isinstance(found, dict) else None


@dataclass(frozen=True)
class Scan:
    """One input's tensors seen through the readers: ``quantized`` (claimed groups, in the
    order of their codes), ``plain`` (every tensor no reader claimed), ``config``."""

    quantized: list[Quantized]
    plain: list[TensorSource]
    config: dict | None

    @property
    def claimed_keys(self) -> set[tuple[str, str]]:
        return {(p.source, p.key) for q in self.quantized for p in q.parts.values()}


def scan(sources: list[TensorSource], config: dict | None = None) -> Scan:
    """Offer ``sources`` (one input's tensors) to every reader in turn."""
    by_file: dict[str, dict[str, TensorSource]] = {}
    for source in sources:
        if source.key is not None:
            by_file.setdefault(source.source, {})[source.key] = source
    tensors = {}
    for readable in (True, False):  # a key repeated across shards: the first file's
        for group in by_file.values():  # that can be read (not a shard's tensor that
            for key, source in group.items():  # its index does not name)
                if (source.opener is not None) == readable:
                    tensors.setdefault(key, source)
    found: list[Quantized] = []
    claimed: set[int] = set()
    for name in READERS:
        free = {k: s for k, s in tensors.items() if id(s) not in claimed}
        if not free:
            break
        for q in reader(name).claim(Checkpoint(free, config)):
            found.append(q)
            claimed.update(id(p) for p in q.parts.values())
    order = {id(s): i for i, s in enumerate(sources)}
    found.sort(key=lambda q: order.get(id(q.parts.get("codes")), 0))
    return Scan(found, [s for s in sources if id(s) not in claimed], config)


def dequantized(sources: list[TensorSource], config: dict | None = None,
                note: bool = True) -> list[TensorSource]:
    """``sources`` with each quantized tensor replaced, at its codes' place, by its
    dequantized float32 tensor, and its scale tensors dropped; a ``LayoutNote`` says so
    once (``note``).  Sources no reader claims are returned as they are."""
    result = scan(sources, config)
    if not result.quantized:
        return sources
    if not result.plain and all("codes" not in q.parts for q in result.quantized):
        return scales_only(result.quantized)
    by_codes = {id(q.parts["codes"]): q for q in result.quantized if "codes" in q.parts}
    kept = {id(s) for s in result.plain}
    out = []
    for source in sources:
        if id(source) in by_codes:
            out.append(by_codes[id(source)].as_source())
        elif id(source) in kept:
            out.append(source)
    if note:
        _say(result.quantized)
    return out


def scales_only(found: list[Quantized]) -> list[TensorSource]:
    """An input of scale tensors alone (KV-cache scales: no codes, no weight) as what it
    holds: each scale a skipped source saying what it is, so that a command says exactly
    what it found ("nothing to quantize (...: a KV-cache scale ...)") instead of "no
    tensors"; ``fmt audit`` reads the input as stored and checks them."""
    from dataclasses import replace

    return [replace(q.parts["scales"], opener=None,
                    skipped=f"a scale without codes ({q.layout}; fmt audit checks it)")
            for q in found]


def _say(found: list[Quantized]) -> None:
    """The one LayoutNote of ``dequantized``: the tensors read as dequantized values, and
    the scale-only groups (KV scales: no codes) left out of the data."""
    import warnings

    coded = [q for q in found if "codes" in q.parts]
    bare = [q for q in found if "codes" not in q.parts]
    files = sorted({q.source for q in found})
    if len(files) == 1:  # one file: its name; shards of a folder: the folder
        where = shown(os.path.basename(files[0]) or files[0])
    else:
        try:
            folder = os.path.commonpath(files)
        except ValueError:  # absolute and relative paths mixed
            folder = os.path.dirname(files[0])
        where = f"{shown(folder or '.')} ({len(files):,} files)"
    said = []
    if coded:
        many = len(coded) != 1
        said.append(f"{len(coded):,} tensor{'s' if many else ''} of {where} "
                    f"{'are' if many else 'is'} already quantized "
                    f"({', '.join(sorted({q.layout for q in coded}))}): read as "
                    f"{'their' if many else 'its'} dequantized float32 values")
    if bare:
        many = len(bare) != 1
        said.append(f"{len(bare):,} scale tensor{'s' if many else ''} without codes "
                    f"({', '.join(sorted({q.layout for q in bare}))}"
                    f"{'' if coded else ' in ' + where}) left out of the data")
    warnings.warn("; ".join(said) + " (fmt audit checks the layout)", LayoutNote,
                  stacklevel=3)
