"""Scale-out: ``fmt quantize --dask ADDRESS``, the engine's work as tasks on a Dask cluster.

A checkpoint too large for one machine is scanned by the workers of a Dask distributed
cluster (an existing scheduler, ``tcp://host:8786``, or ``local:N``: a ``LocalCluster`` of N
worker processes here).  Scheduling, retries and data movement are Dask's; the work is the
engine's own, so the report is the one machine's, number for number:

- A task is a byte range of the tensors: the chunks ``first .. stop - 1`` of a large tensor
  (about ``TASK_BYTES`` of data), or a batch of whole small tensors.  Workers read the bytes
  themselves, from paths every worker sees (a shared filesystem): a task carries a file
  name and an offset, and only small accumulators come back (per-chunk records of sums,
  sparse integer histograms, scale summaries), never values nor scale grids.
- A whole small tensor is ``engine.run.quantize_tensor`` on one process.  A large
  tensor's chunks run through ``engine.chunk_pass.ChunkPass`` (the engine's per-chunk
  function) and come back as ``ChunkPass.part`` (``dask_tasks``: what a worker runs); the
  client takes each in (``absorb``) and merges them in chunk order (``runs``), exactly as
  the engine merges its forked workers: counts, extrema, histograms (hence quantiles) and
  the float64 sums are bit-identical to a local run.
- Scales that span a tensor (per-tensor, per-column, percentile, NVFP4's tensor scale) need
  the engine's first pass: it runs as tasks too (``first_pass.first_pass_partials``: maxima and
  histograms, exact in any order), the client sets the scales (``apply_first_pass``) and
  then submits the tensor's chunk tasks.
- ``quantize.run.quantize`` does everything else (totals, groups, worst blocks, in checkpoint
  order), with a ``run_tensor`` that waits for each tensor's runs from the cluster.

A worker lost mid-run changes nothing: Dask reruns its tasks elsewhere, and every part is
a pure function of (file, byte range, plans).  Progress counts the bytes of completed tasks.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fmtcli.base.choices import cores_available
from fmtcli.base.errors import DataError, FmtError, Param, UsageError
from fmtcli.engine.chunk import Plan
from fmtcli.engine.chunk_pass import ChunkPass
from fmtcli.engine.first_pass import apply_first_pass, needs_first_pass
from fmtcli.engine.results import QuantizeResult
from fmtcli.engine.run import plan_schemes, with_product
from fmtcli.inputs.tensors import TensorSource, numpy_dtype
from fmtcli.numerics.backends import Backend, Device, resolve
from fmtcli.numerics.schemes import Scheme
from fmtcli.quantize.dask_tasks import (
    MappedTensor,
    Options,
    dense,
    mapped,
    run_items,
    unpack_run,
)
from fmtcli.quantize.run import quantize
from fmtcli.streaming.stream import CHUNK_ELEMENTS, chunk_slices, matrix_shape

INSTALL = "pip install 'fmtcli[dask]'"
TASK_BYTES = 64 << 20  # data per task: long enough to hide a task's ~1 ms of overhead
TASK_TENSORS = 256  # whole tensors per task at most (each costs ~1 ms however small)
CONNECT_TIMEOUT = 10.0  # seconds to reach a scheduler
_ADDRESS = re.compile(r"(?:(tcp|tls)://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})")


def require_distributed(address: str = "..."):
    """The ``distributed`` module, or a usage error naming the install command."""
    try:
        import distributed
    except ImportError:
        raise UsageError(Param("dask", address) + " needs Dask distributed, which is not "
                         "installed", INSTALL) from None
    return distributed


def parse_address(address: str) -> tuple[str, int | None]:
    """``('local', N)`` for ``local:N``, or ``(scheduler address, None)`` for
    ``[tcp://|tls://]HOST:PORT`` (``tcp://`` added when no protocol is given)."""
    text = address.strip()
    if text.lower().startswith("local:"):
        count = text[len("local:"):]
        most = cores_available()  # more processes than cores only compete for them
        if not (count.isdigit() and 1 <= int(count) <= most):
            raise UsageError(Param("dask", address) + ": local:N starts N worker processes "
                             f"here, 1 <= N <= {most} (the cores available; e.g. "
                             f"local:{most})")
        return "local", int(count)
    match = _ADDRESS.fullmatch(text)
    if match is None or not 1 <= int(match[3]) <= 65535:
        raise UsageError(Param("dask", address) + ": not a scheduler address "
                         "(tcp://HOST:PORT) nor local:N")
    return (text if match[1] else f"tcp://{text}"), None


def connect(address: str, timeout: float | None = None):
    """(client, cluster or None, where): a client of the scheduler at ``address``, or of a
    ``LocalCluster`` it starts (``local:N``: N processes of one thread, no dashboard);
    ``where`` says where the work runs (``dask``, ``scheduler``, ``workers``, ``threads``)."""
    kind, count = parse_address(address)
    distributed = require_distributed(address)
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    cluster = None
    if kind == "local":
        cluster = distributed.LocalCluster(n_workers=count, threads_per_worker=1,
                                           processes=True, dashboard_address=":0",
                                           silence_logs=logging.ERROR)
        client = distributed.Client(cluster)
    else:
        try:
            client = distributed.Client(kind, timeout=timeout)
        except (OSError, TimeoutError) as error:
            raise DataError(Param("dask", address) + ": no scheduler answered within "
                            f"{timeout:g} s ({type(error).__name__})") from None
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (OSError, TimeoutError):
            client.close()
            raise DataError(Param("dask", address) + ": the scheduler has no workers (none "
                            f"came within {timeout:g} s)") from None
    workers = client.scheduler_info().get("workers", {})
    where = {"dask": address, "scheduler": client.scheduler.address,
             "workers": len(workers),
             "threads": sum(w.get("nthreads", 0) for w in workers.values())}
    return client, cluster, where


# -- the client side --------------------------------------------------------------------------

@dataclass
class _Tensor:
    """One usable tensor on the client: its plans, chunks and the parts still out."""

    source: TensorSource
    mapped: MappedTensor
    nbytes: int
    plans: list[Plan]
    chunks: list
    ranges: list[tuple[int, int]]  # the chunk ranges of its tasks ([] : one 'whole' item)
    passes: int
    order: int  # in the checkpoint: earlier tensors' tasks go first
    waiting: int = 0  # tasks of the current pass not yet in
    maxima: list = field(default_factory=list)  # first pass: per task, maxima per plan
    hists: np.ndarray | None = None
    work: ChunkPass | None = None
    runs: list | None = None


class DaskScan:
    """The tasks of one ``quantize`` run on a cluster, submitted at once in checkpoint
    order (earlier tensors first), and their results gathered as they complete.

    ``run_tensor`` (``quantize.run.quantize``'s hook) waits for one tensor's runs, taking in
    whatever else completes meanwhile: a first pass's last part submits that tensor's
    chunk tasks; a finished tensor's runs wait until ``quantize`` asks for them."""

    def __init__(self, sources: list[TensorSource], options: Options,
                 progress: Callable[[int, int], None] | None = None,
                 task_bytes: int = TASK_BYTES, address: str = "...") -> None:
        self.options, self.progress, self.task_bytes = options, progress, task_bytes
        self.distributed = require_distributed()
        self.client = self.futures = None
        self.token = uuid.uuid4().hex[:8]
        self.tasks = 0
        self.tensors: dict[int, _Tensor] = {}
        self.total = 0
        self.done = 0.0
        schemes = list(options.schemes)
        for order, source in enumerate(sources):
            rows, cols = matrix_shape(source.shape)
            plans = plan_schemes(source, schemes)
            chunks = chunk_slices(rows, cols, plans, options.chunk_elements)
            nbytes = source.size * numpy_dtype(source.dtype).itemsize
            ranges = []
            if nbytes > task_bytes and len(chunks) > 1:
                pieces = min(len(chunks), -(-nbytes // task_bytes))
                bounds = np.linspace(0, len(chunks), pieces + 1).round().astype(int)
                ranges = [(int(a), int(b)) for a, b in zip(bounds, bounds[1:]) if b > a]
            passes = 2 if ranges and any(needs_first_pass(p) for p in plans) else 1
            self.tensors[id(source)] = _Tensor(source, mapped(source, address), nbytes, plans,
                                               chunks, ranges, passes, order)
            self.total += nbytes
        self.meta: dict = {}  # future key -> (kind, tensors, or tensor and chunk range)

    def start(self, client) -> None:
        """Submit every task that needs nothing else first (whole tensors in batches of
        about ``task_bytes`` or ``TASK_TENSORS``, large tensors' first passes or chunk
        passes)."""
        self.client, self.futures = client, self.distributed.as_completed()
        batch, batch_bytes = [], 0
        for tensor in self.tensors.values():
            if not tensor.ranges:
                batch.append(tensor)
                batch_bytes += tensor.nbytes
                if batch_bytes >= self.task_bytes or len(batch) >= TASK_TENSORS:
                    self._submit_whole(batch)
                    batch, batch_bytes = [], 0
                continue
            if batch:
                self._submit_whole(batch)
                batch, batch_bytes = [], 0
            self._submit_ranges(tensor, "amax" if tensor.passes == 2 else "chunks")
        if batch:
            self._submit_whole(batch)

    def _submit(self, items: list, kind: str, order: int, meta) -> None:
        self.tasks += 1
        future = self.client.submit(run_items, items, self.options, pure=False,
                                    key=f"fmt-{kind}-{self.token}-{self.tasks}",
                                    priority=-order)
        self.meta[future.key] = meta
        self.futures.add(future)

    def _submit_whole(self, batch: list[_Tensor]) -> None:
        for tensor in batch:
            tensor.waiting = 1
        self._submit([("whole", t.mapped) for t in batch], "whole", batch[0].order,
                     ("whole", batch))

    def _submit_ranges(self, tensor: _Tensor, kind: str) -> None:
        tensor.waiting = len(tensor.ranges)
        for first, stop in tensor.ranges:
            self._submit([(kind, tensor.mapped, tensor.plans, first, stop)], kind,
                         tensor.order, (kind, tensor, first, stop))

    def _share(self, tensor: _Tensor, first: int, stop: int) -> float:
        """The bytes a task over chunks ``first .. stop - 1`` stands for in the progress
        (each pass over a tensor counts its bytes once, divided among the passes)."""
        chunk_values = [(rs.stop - rs.start) * (cs.stop - cs.start)
                        for rs, cs in tensor.chunks[first:stop]]
        return tensor.nbytes * sum(chunk_values) / (tensor.source.size * tensor.passes)

    def _take(self) -> None:
        """Wait for the next task to complete and take its result in."""
        try:
            future = next(self.futures)
        except StopIteration:
            raise RuntimeError("a tensor's results never came from the cluster") from None
        meta = self.meta.pop(future.key)
        try:
            result = future.result()
        except FmtError:
            raise
        except self.distributed.KilledWorker as error:
            raise DataError(f"a Dask task killed every worker that ran it ({error})") from None
        except ImportError as error:  # a worker without fmtcli (or another version of it)
            raise DataError(f"a Dask worker cannot run fmtcli's tasks ({error})",
                            "install the same fmtcli on every worker") from None
        finally:
            future.release()
        kind = meta[0]
        if kind == "whole":
            for tensor, packed in zip(meta[1], result):
                tensor.runs = [unpack_run(p) for p in packed]
                tensor.waiting = 0
                self.done += tensor.nbytes
        else:
            tensor, first, stop = meta[1:]
            self.done += self._share(tensor, first, stop)
            tensor.waiting -= 1
            if kind == "amax":
                self._take_maxima(tensor, *result[0])
            else:
                self._take_part(tensor, result[0])
        if self.progress:
            self.progress(min(int(self.done), self.total), self.total)

    def _take_maxima(self, tensor: _Tensor, maxima: list, hists) -> None:
        tensor.maxima.append(maxima)
        if hists is not None:
            found = dense(hists)
            tensor.hists = found if tensor.hists is None else tensor.hists + found
        if tensor.waiting:
            return
        partial = [np.concatenate(found) for found in zip(*tensor.maxima)]
        apply_first_pass(tensor.plans, partial, tensor.hists)
        tensor.maxima, tensor.hists = [], None
        self._submit_ranges(tensor, "chunks")

    def _take_part(self, tensor: _Tensor, part: dict) -> None:
        if tensor.work is None:
            rows, cols = matrix_shape(tensor.source.shape)
            tensor.work = ChunkPass(tensor.plans, [], rows, cols, tensor.chunks, 1,
                                    self.options.worst, False, grids=False)
        part["hists"], part["fractions"] = dense(part["hists"]), dense(part["fractions"])
        part["scales"] = [None if s is None else (s[0], dense(s[1])) for s in part["scales"]]
        tensor.work.absorb(part)
        if not tensor.waiting:
            tensor.runs, tensor.work = tensor.work.runs(), None

    def run_tensor(self, source: TensorSource, schemes, **_options):
        """``quantize.run.quantize``'s ``run_tensor``: this tensor's runs, once they are in."""
        tensor = self.tensors[id(source)]
        while tensor.runs is None:
            self._take()
        runs, tensor.runs = tensor.runs, []
        return runs, None

    def cancel(self) -> None:
        """Cancel what is still running (after an error)."""
        pending = [] if self.futures is None else list(self.futures.futures)
        if pending:
            self.client.cancel(pending)


def check_options(address: str, backend: Backend | str = Backend.AUTO,
                  device: Device | str = Device.AUTO, out: str | None = None) -> None:
    """The address, and the options a Dask run cannot honour, as usage errors (before
    anything starts)."""
    parse_address(address)
    where = Param("dask", address)
    if out is not None:
        raise UsageError(where + " sends back statistics only: it cannot write " + Param("out", out)
                         + " (written on this machine, chunk by chunk)",
                         "run on this machine alone to write it")
    if Device(device) is Device.CUDA:
        raise UsageError(where + ": the workers run the CPU engine, not " + Param("device", "cuda"),
                         "run on one GPU machine alone")
    if Backend(backend) is Backend.TORCH:
        raise UsageError(where + ": the workers run the CPU engine (numpy or ml_dtypes casts), "
                         "not " + Param("backend", "torch"))


def quantize_on_dask(sources: list[TensorSource], schemes: list[Scheme], address: str, *,
                     seed: int = 0, chunk_elements: int = CHUNK_ELEMENTS,
                     progress: Callable[[int, int], None] | None = None,
                     on_tensor: Callable[[str], None] | None = None,
                     backend: Backend | str = Backend.NUMPY,
                     device: Device | str = Device.CPU, product=None, worst_blocks: int = 0,
                     task_bytes: int = TASK_BYTES, timeout: float | None = None,
                     connected: Callable[[dict], None] | None = None,
                     include_buffers: bool = False) -> tuple[QuantizeResult, dict]:
    """``quantize.run.quantize`` on the Dask cluster at ``address`` (``local:N`` or a scheduler):
    the same ``QuantizeResult``, and ``where`` it ran (``connect``).  Options as
    ``quantize``'s (no ``out``; CPU casts only).  ``task_bytes``: the data a task reads.
    ``timeout``: seconds to reach the scheduler and find a worker (``CONNECT_TIMEOUT``).
    ``connected(where)`` is called once the cluster is up, before any work."""
    check_options(address, backend, device)
    require_distributed(address)
    schemes = with_product(schemes, product)
    if worst_blocks < 0:
        raise UsageError(Param("worst_blocks", worst_blocks) + ": must be >= 0")
    usable = [s for s in sources if s.skipped is None]
    for scheme in schemes:  # backend/rounding/format refusals, before the cluster starts
        resolve(backend, Device.CPU, scheme.format, scheme.rounding)
    cast = resolve(backend, Device.CPU, schemes[0].format)[0] if schemes else Backend.NUMPY
    options = Options(tuple(schemes), seed, chunk_elements, worst_blocks, cast)
    # every tensor readable by the workers and planned, before the cluster starts
    scan = DaskScan(usable, options, progress, task_bytes, address)
    client, cluster, where = connect(address, timeout)
    try:
        if connected:
            connected(where)
        scan.start(client)
        result = quantize(sources, schemes, seed=seed, chunk_elements=chunk_elements,
                          on_tensor=on_tensor, worst_blocks=worst_blocks,
                          run_tensor=scan.run_tensor, include_buffers=include_buffers)
        where = dict(where, tasks=scan.tasks)
    except BaseException:
        scan.cancel()
        raise
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return result, where
