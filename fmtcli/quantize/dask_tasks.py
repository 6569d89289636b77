"""What a Dask worker runs for ``fmt quantize --dask`` (``distributed``), and what travels.

A task is a list of items over tensors that every worker reads from their files
(``MappedTensor``: a path and an offset): a whole small tensor
(``engine.run.quantize_tensor``), a large tensor's share of its first pass
(``engine.first_pass.first_pass_partials``) or its chunks ``first .. stop - 1``
(``engine.chunk_pass.ChunkPass``, sent back as ``ChunkPass.part``).  Only small
accumulators travel, their integer arrays as their nonzero entries (``sparse``), never
values nor scale grids.  Every part is a pure function of (file, byte range, plans), so a
task that Dask reruns elsewhere gives the same part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fmtcli.base.errors import FmtError, Param, UsageError, shown
from fmtcli.engine.chunk import ChunkKernel
from fmtcli.engine.chunk_pass import ChunkPass
from fmtcli.engine.first_pass import first_pass_partials
from fmtcli.engine.results import SchemeRun
from fmtcli.engine.run import quantize_tensor
from fmtcli.inputs.tensors import TensorSource, numpy_dtype
from fmtcli.numerics.backends import Backend, Device
from fmtcli.numerics.schemes import Scheme
from fmtcli.streaming.stream import ChunkReader, chunk_slices, keep_freed_memory, matrix_shape

# -- what travels: small arrays as their nonzero entries ------------------------------------

def sparse(array: np.ndarray | None):
    """An integer array as (shape, flat indices of its nonzero entries, their values)."""
    if array is None:
        return None
    flat = np.ascontiguousarray(array).reshape(-1)
    keys = np.flatnonzero(flat)
    return array.shape, keys, flat[keys]


def dense(packed) -> np.ndarray | None:
    if packed is None:
        return None
    shape, keys, values = packed
    out = np.zeros(math.prod(shape), values.dtype if values.size else np.int64)
    out[keys] = values
    return out.reshape(shape)


def pack_run(run: SchemeRun):
    """A ``SchemeRun`` without its dense histograms, and those as sparse arrays."""
    blocks = None if run.blocks is None else replace(run.blocks, fractions=None)
    light = replace(run, acc=replace(run.acc, hist=None), exponents=None, blocks=blocks)
    return (light, sparse(run.acc.hist), sparse(run.exponents),
            None if run.blocks is None else sparse(run.blocks.fractions))


def unpack_run(packed) -> SchemeRun:
    light, hist, exponents, fractions = packed
    blocks = None if light.blocks is None else replace(light.blocks,
                                                       fractions=dense(fractions))
    acc = replace(light.acc, hist=None if hist is None else dense(hist))
    return replace(light, acc=acc, exponents=dense(exponents), blocks=blocks)


# -- the worker side --------------------------------------------------------------------------

@dataclass(frozen=True)
class MappedTensor:
    """What a worker needs to read a tensor: its name (for messages and the stochastic
    rounding seed), shape and dtype, and where its bytes lie (an absolute path, an offset)
    and in which byte order ('=' native, or '>' / '<': a big-endian .npy stays big-endian)."""

    source: str
    key: str | None
    shape: tuple[int, ...]
    dtype: str
    path: str
    offset: int
    byteorder: str = "="

    def open(self) -> TensorSource:
        from fmtcli.inputs.npyfile import memory_map

        stored = numpy_dtype(self.dtype).newbyteorder(self.byteorder)

        def opener():
            return memory_map(self.path, stored, self.offset, self.shape or (1,))

        return TensorSource(self.source, self.key, self.shape, self.dtype, opener)


@dataclass(frozen=True)
class Options:
    """The options every task shares."""

    schemes: tuple[Scheme, ...]
    seed: int
    chunk_elements: int
    worst: int
    backend: Backend
    device: Device = Device.CPU


def run_items(items: list, options: Options) -> list:
    """A task: each item is ``('whole', tensor)``, ``('amax', tensor, plans, first, stop)``
    or ``('chunks', tensor, plans, first, stop)``; returns one small result per item."""
    keep_freed_memory()
    try:
        return [_run_item(item, options) for item in items]
    except FmtError as error:  # the same error, its parameters and suggestion, no traceback
        raise type(error)(error.parts, error.suggestion_parts) from None


def _run_item(item: tuple, options: Options):
    kind, tensor = item[0], item[1]
    source = tensor.open()
    if kind == "whole":
        runs, _ = quantize_tensor(source, list(options.schemes), seed=options.seed,
                                  chunk_elements=options.chunk_elements, workers=1,
                                  backend=options.backend, device=options.device,
                                  worst=options.worst)
        return [pack_run(run) for run in runs]
    plans, first, stop = item[2:]
    for plan in plans:  # as the engine makes them: writable, in native byte order (Dask's
        if plan.scales is not None:  # transport may hand back read-only '<f4' views)
            plan.scales = np.array(plan.scales, plan.scales.dtype.newbyteorder("="))
    reader = ChunkReader(source)
    try:
        rows, cols = matrix_shape(source.shape)
        chunks = chunk_slices(rows, cols, plans, options.chunk_elements)
        if kind == "amax":
            partial, hists = first_pass_partials(reader, chunks[first:stop], plans, 1)
            return partial, sparse(hists)
        kernels = [ChunkKernel(p, options.seed, options.backend, options.device, source.name,
                               options.worst) for p in plans]
        work = ChunkPass(plans, kernels, rows, cols, chunks, 1, options.worst, False)
        for index in range(first, stop):
            work.task(reader, index, 0)
        part = work.part(first, stop)
        part["hists"], part["fractions"] = sparse(part["hists"]), sparse(part["fractions"])
        part["scales"] = [None if s is None else (s[0], sparse(s[1])) for s in part["scales"]]
        return part
    finally:
        reader.close()



def mapped(source: TensorSource, address: str = "...") -> MappedTensor:
    """Where a tensor's bytes lie in its file (a memory map's file and offset), or a usage
    error: workers read files, so data that is not stored as is (text, stdin, .pt, a
    compressed .npz member, a Fortran-order .npy) cannot go to them."""
    import os

    if source.quantized is not None:  # its values are computed here, from several parts
        raise UsageError(Param("dask", address) + f": {shown(source.name)} is an "
                         f"already-quantized tensor ({source.quantized.layout}), dequantized "
                         "from its codes and scales on this machine; the workers read "
                         "tensors as stored", "run on this machine alone")
    reader = ChunkReader(source)
    try:
        if reader.path is None:
            raise UsageError(Param("dask", address) + ": the workers read tensors from files, "
                             f"as stored: {shown(source.name)} is not a .safetensors, .npy "
                             "or uncompressed .npz tensor in C order",
                             "convert it, or run on this machine alone")
        return MappedTensor(source.source, source.key, tuple(source.shape), source.dtype,
                            os.path.abspath(reader.path), int(reader.offset),
                            reader.source_dtype.byteorder if not reader.source_dtype.isnative
                            else "=")
    finally:
        reader.close()

