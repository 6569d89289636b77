"""The streamed passes of ``fmt audit``: each quantized tensor's figures, on forked workers.

``measured(q)`` reads one tensor (``stats.measure``) and decodes its scales;
``measure_all`` runs the passes on ``workers`` forked processes
(``streaming.parallel.run_tasks``, one fork for the whole checkpoint): every tensor's
chunks are tasks spread over them, each writing its chunk's figures into one row of
shared memory, merged back per tensor in chunk order, so the figures do not depend on
the count.  A tensor a worker cannot read is measured again here, where its error becomes a
failed check with its message.  Scales are decoded again here for the checks, one tensor
at a time (a model's scales together could be gigabytes).
"""

from __future__ import annotations

import numpy as np

from fmtcli.audit.checks import Measured, is_mx
from fmtcli.audit.stats import CodeStats, ValueStats, measure
from fmtcli.base.choices import CHUNK_ELEMENTS
from fmtcli.base.errors import FmtError

#: the columns of a worker's row: done (1) or failed (2), the values' five, has codes, the
#: codes' seven
COLUMNS = 14


def floor_to_max(q, scales) -> bool:
    """Whether ``q``'s scales are powers of two floored towards the format's max (fmt's
    ``pow2-floor``, DeepSeek's UE8M0: a group's amax lands in (max/2, max], 224 after
    rounding), not to the amax's binade as MX's rule does ([2^emax, 2^(emax+1)))."""
    if scales is None or is_mx(q):
        return False
    s = np.asarray(scales).reshape(-1)
    head = s[:4096].astype(np.float64)  # most layouts show a non-power of two at once
    head = head[np.isfinite(head) & (head > 0)]
    if head.size and not np.all(np.frexp(head)[0] == 0.5):
        return False
    s = s.astype(np.float64)
    s = s[np.isfinite(s) & (s > 0)]
    return bool(s.size) and bool(np.all(np.frexp(s)[0] == 0.5))


def _scales(q):
    """(decoded scales or None, the error reading them or None)."""
    if q.scales_reader is None:
        return None, None
    try:
        return q.scales_reader(), None
    except (FmtError, ValueError) as error:
        return None, str(error)


def measured(q, chunk_elements: int = CHUNK_ELEMENTS, figures=None) -> Measured | None:
    """The streamed figures and decoded scales of ``q`` (``figures``: its (values, codes)
    from a worker); None where its problems forbid reading it; an error reading it becomes
    ``scales_error`` (a failed check)."""
    if q.problems:
        return None
    scales, scales_error = _scales(q)
    if figures is not None:
        return Measured(*figures, scales, scales_error)
    try:
        values, codes = measure(q, chunk_elements, floor_to_max(q, scales))
    except (FmtError, ValueError) as error:
        return Measured(None, None, scales, scales_error or str(error))
    return Measured(values, codes, scales, scales_error)


def _row(values: ValueStats, codes: CodeStats | None) -> list[float]:
    head = [1, values.count, values.amax, values.rms, values.zeros, values.nonfinite]
    if codes is None:
        return head + [0] * 8
    return head + [1, codes.groups, codes.clipping, codes.lowest, codes.zero_groups,
                   codes.at_max, codes.elements, codes.top]


def _figures(row: np.ndarray) -> tuple[ValueStats, CodeStats | None]:
    n = [int(v) for v in row]
    values = ValueStats(n[1], float(row[2]), float(row[3]), n[4], n[5])
    if not n[6]:
        return values, None
    return values, CodeStats(n[7], n[8], n[9], n[10], n[11], n[12], float(row[13]))


#: (tensor, chunk) tasks of one ``measure_all`` batch at most (their rows in shared memory)
TASK_BATCH = 1 << 16


def _tasks(quantized: list, readable: list[int], chunk_elements: int):
    """index -> (empty pass, power_of_two) of every readable tensor whose scales decode,
    and the tasks: (index, (r0, r1, matrix end)) per chunk, or (index, None) for a tensor
    whose group spans a matrix (read whole, in one process)."""
    from fmtcli.audit.stats import new_pass

    runs, tasks = {}, []
    for i in readable:
        q = quantized[i]
        try:
            scales, _ = _scales(q)
            pow2 = floor_to_max(q, scales)
        except (FmtError, ValueError):
            continue  # measured in ``measured``, for its message
        runs[i] = (new_pass(q, pow2), pow2)
        run = runs[i][0]
        tasks += [(i, None)] if run.spanning else [(i, c) for c in run.chunks(chunk_elements)]
    return runs, tasks


def measure_all(quantized: list, chunk_elements: int, workers: int) -> dict[int, tuple]:
    """index -> (values, codes) of every readable tensor of ``quantized`` measured on
    ``workers`` forked workers (empty with one worker: ``measured`` reads each in turn).

    One fork of the workers serves every tensor: the tasks are the tensors' chunks (whole
    scale groups each) in checkpoint order, task k on worker k % workers, each writing its
    chunk's ``Pass.state`` into a row of shared memory; a tensor's rows are merged in
    chunk order, the sums one process would form.  A tensor whose group spans a matrix is
    one task.  A tensor a worker cannot read is left to ``measured``."""
    from fmtcli.audit.stats import STATE, new_pass
    from fmtcli.streaming import parallel

    readable = [i for i, q in enumerate(quantized) if not q.problems]
    if workers <= 1 or not readable or not parallel.can_fork():
        return {}
    runs, tasks = _tasks(quantized, readable, chunk_elements)
    found, failed = {}, set()
    for start in range(0, len(tasks), TASK_BATCH):
        batch = tasks[start:start + TASK_BATCH]
        rows = parallel.shared_array((len(batch), COLUMNS), np.float64)

        def task(item: int, worker: int, batch=batch, rows=rows) -> int:
            i, chunk = batch[item]
            q, pow2 = quantized[i], runs[i][1]
            try:
                if chunk is None:
                    rows[item] = _row(*measure(q, chunk_elements, pow2))
                    return q.size
                one = new_pass(q, pow2)
                one.add(*chunk)
                rows[item, 1:1 + STATE] = one.state()
            except (FmtError, ValueError):
                rows[item, 0] = 2  # measured again in the parent, for its message
                return 0
            rows[item, 0] = 1
            return (chunk[1] - chunk[0]) * one.cols

        parallel.run_tasks(task, len(batch), workers)
        for k, (i, chunk) in enumerate(batch):
            if rows[k, 0] != 1:
                failed.add(i)
            elif chunk is None:
                found[i] = _figures(rows[k])
            else:
                runs[i][0].merge(rows[k, 1:1 + STATE])  # in chunk order
    for i, (run, _) in runs.items():
        if i not in failed and i not in found:
            found[i] = (run.values(), run.codes())
    return found


#: bytes of one tensor's layout checks as JSON in shared memory; a longer list is run
#: again in the parent.  Tensors go to the workers in batches of ``CHECK_BATCH``.
CHECK_BYTES = 1 << 16
CHECK_BATCH = 256


def layout_checks_all(quantized: list, scan, workers: int) -> dict[int, list]:
    """index -> the layout checks (``layout_checks.CHECKS``, ``None``s dropped) of every
    readable tensor, run on ``workers`` forked workers, tensor i on worker i % workers,
    each writing its checks as JSON into shared memory (empty with one worker: the parent
    runs them in turn).  The checks read samples of the tensor (nibble order, the MX scale
    rule), so they cost as much as a share of the pass and run beside it."""
    import json

    from fmtcli.audit import checks as generic
    from fmtcli.audit import layout_checks
    from fmtcli.audit.check import Check, Verdict
    from fmtcli.streaming import parallel

    readable = [i for i, q in enumerate(quantized) if not q.problems]
    if workers <= 1 or len(readable) < 2 or not parallel.can_fork():
        return {}
    found: dict[int, list] = {}
    for start in range(0, len(readable), CHECK_BATCH):
        batch = readable[start:start + CHECK_BATCH]
        slots = parallel.shared_array((len(batch), CHECK_BYTES), np.uint8)

        def task(item: int, worker: int, batch=batch, slots=slots) -> int:
            q = quantized[batch[item]]
            listed = [generic.run_check(check, q, scan) for check in layout_checks.CHECKS]
            text = json.dumps([c.to_dict() for c in listed if c is not None]).encode()
            if len(text) < CHECK_BYTES:  # else left empty: run again in the parent
                slots[item, :len(text)] = np.frombuffer(text, dtype=np.uint8)
            return 1

        parallel.run_tasks(task, len(batch), workers)
        for k, i in enumerate(batch):
            raw = bytes(slots[k]).rstrip(b"\0")
            if raw:
                found[i] = [Check(c["name"], Verdict(c["verdict"]), c["evidence"],
                                  c["figures"]) for c in json.loads(raw)]
    return found
