"""Run independent chunk tasks on several cores: forked workers writing to shared memory.

numpy work made of many short passes holds the GIL too often for threads to scale (measured
on 2 cores: 1.3x at best, often none); processes scale.  Workers are forked after all
imports, so they start in milliseconds and share the parent's memory copy-on-write.  Tasks
return nothing: they write into arrays made by ``shared_array`` (anonymous shared maps),
which the parent reads after the workers exit.  Nothing is pickled but a worker's FmtError
(its parameters travel with it).

Where ``os.fork`` does not exist, or with one worker, the tasks run in this process.
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import time
from collections.abc import Callable

import numpy as np

from fmtcli.base.choices import cores_available
from fmtcli.base.errors import DataError, FmtError

_ERROR_BYTES = 4096


def shared_array(shape, dtype, fill=0) -> np.ndarray:
    """A zero-filled (or ``fill``-ed) array in memory that forked workers share."""
    dtype = np.dtype(dtype)
    count = math.prod(shape) if isinstance(shape, tuple) else int(shape)
    if not can_fork():
        return np.full(shape, fill, dtype=dtype)
    buffer = mmap.mmap(-1, max(1, count * dtype.itemsize))
    arr = np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
    if fill:
        arr.fill(fill)
    return arr


def work_array(shape, dtype, shared: bool) -> np.ndarray:
    """A zero-filled array for task results: ``shared_array`` where forked workers write
    it, else ordinary memory (a fresh shared map costs a page fault per page on first
    touch, which for the many small tensors of a checkpoint cost more than their work)."""
    return shared_array(shape, dtype) if shared else np.zeros(shape, dtype)


def can_fork() -> bool:
    return hasattr(os, "fork") and hasattr(os, "waitpid")


MAX_DEFAULT_WORKERS = 8  # past ~8 processes the chunks' memory traffic, not cores, limits


def default_workers() -> int:
    """One worker per core the process may use (at most ``MAX_DEFAULT_WORKERS``)."""
    return min(MAX_DEFAULT_WORKERS, cores_available())


def _pidfds(pids: list[int]) -> dict[int, int]:
    """Descriptors that become readable when a child exits (Linux >= 5.3), where available."""
    if not hasattr(os, "pidfd_open"):
        return {}
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except OSError:
            pass
    return fds


def _wait_for_exit(fds: list[int], timeout: float) -> None:
    """Sleep until a child exits (or ``timeout`` seconds pass, for progress updates)."""
    if not fds:
        time.sleep(0.002)
        return
    import select

    select.select(fds, [], [], timeout)


def _error_bytes(error: BaseException) -> bytes:
    """How a worker's exception reaches the parent (at most ``_ERROR_BYTES - 1`` bytes): a
    FmtError pickled whole, so its parameters and suggestion come too, where it fits and
    reads back; else its kind (``fmt`` or ``other``) and text."""
    if isinstance(error, FmtError):
        try:
            data = b"pickle:" + pickle.dumps(error)
            if len(data) < _ERROR_BYTES and isinstance(pickle.loads(data[7:]), FmtError):
                return data
        except Exception:  # an attribute that does not pickle: its text, as below
            pass
    kind = "fmt" if isinstance(error, FmtError) else "other"
    return f"{kind}:{error}".encode("utf-8", "replace")[:_ERROR_BYTES - 1]


def run_tasks(task: Callable[[int, int], int], count: int, workers: int,
              progress: Callable[[int], None] | None = None) -> None:
    """Run ``task(item, worker)`` for item in range(count); item i goes to worker i % workers.

    ``task`` returns how many elements it processed; ``progress(total_so_far)`` is called
    from this process while the work runs.  An exception in a worker is re-raised here (as
    a DataError carrying its message: a FmtError's parameters and suggestion too).
    """
    workers = max(1, min(workers, count))
    if workers == 1 or not can_fork():
        done = 0
        for item in range(count):
            done += task(item, 0)
            if progress:
                progress(done)
        return
    counters = shared_array(workers, np.int64)
    errors = shared_array((workers, _ERROR_BYTES), np.uint8)
    pids = []
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:  # child: do its share, report through shared memory, never return
            status = 0
            try:
                for item in range(worker, count, workers):
                    counters[worker] += task(item, worker)
            except BaseException as error:
                text = _error_bytes(error)
                errors[worker, :len(text)] = np.frombuffer(text, dtype=np.uint8)
                status = 1
            finally:
                os._exit(status)
        pids.append(pid)
    failed = []
    remaining = set(pids)
    pidfds = _pidfds(pids)
    while remaining:
        for pid in list(remaining):
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                remaining.discard(pid)
                if os.waitstatus_to_exitcode(status) != 0:
                    failed.append(pids.index(pid))
        if progress:
            progress(int(counters.sum()))
        if remaining:
            _wait_for_exit([pidfds[pid] for pid in remaining if pid in pidfds], 0.1)
    for fd in pidfds.values():
        os.close(fd)
    if failed:
        raw = bytes(errors[failed[0]]).rstrip(b"\0")
        if raw.startswith(b"pickle:"):  # a FmtError: its parameters said as the CLI says them
            error = pickle.loads(raw[len(b"pickle:"):])
            raise DataError(error.parts, error.suggestion_parts)
        kind, _, message = raw.decode("utf-8", "replace").partition(":")
        if kind == "fmt":
            raise DataError(message)
        raise RuntimeError(f"a worker process failed: {message or 'killed'}")
