"""The streamed passes of ``fmt audit``: each quantized tensor's figures, on forked workers.

``measured(q)`` reads one tensor (``stats.measure``) and decodes its scales;
``measure_all`` runs the passes on ``workers`` forked processes
(``streaming.parallel.run_tasks``): a tensor of at least two chunks per worker has its
chunks spread over them (``stats.measure(workers=...)``, merged in chunk order), the
others go one per worker (tensor i on worker i % workers), each writing its figures into
one row of shared memory, merged back in checkpoint order.  A
tensor is measured by one process whatever the count, so the figures do not depend on
it.  A tensor a worker cannot read is measured again here, where its error becomes a
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
    s = np.asarray(scales, dtype=np.float64)
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


def _chunks(q, chunk_elements: int) -> int:
    """How many chunks ``q``'s pass reads; 0 where one group spans a matrix (read in one
    process)."""
    from fmtcli.audit.stats import Pass

    run = Pass(q, None, None)
    return 0 if run.spanning else sum(1 for _ in run.chunks(chunk_elements))


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


def measure_all(quantized: list, chunk_elements: int, workers: int) -> dict[int, tuple]:
    """index -> (values, codes) of every readable tensor of ``quantized`` measured on
    ``workers`` forked workers (empty with one worker: ``measured`` reads each in turn)."""
    from fmtcli.streaming import parallel

    readable = [i for i, q in enumerate(quantized) if not q.problems]
    if workers <= 1 or not readable or not parallel.can_fork():
        return {}
    found = {}
    big = [i for i in readable if _chunks(quantized[i], chunk_elements) >= 2 * workers]
    for i in big:  # one at a time, its chunks on the workers
        q = quantized[i]
        try:
            scales, _ = _scales(q)
            found[i] = measure(q, chunk_elements, floor_to_max(q, scales), workers)
        except (FmtError, ValueError):
            pass  # measured again in ``measured``, for its message
    todo = [i for i in readable if i not in found and i not in big]
    if len(todo) <= 1:
        return found
    rows = parallel.shared_array((len(todo), COLUMNS), np.float64)

    def task(item: int, worker: int) -> int:
        q = quantized[todo[item]]
        try:
            scales, _ = _scales(q)
            values, codes = measure(q, chunk_elements, floor_to_max(q, scales))
        except (FmtError, ValueError):
            rows[item, 0] = 2  # measured again in the parent, for its message
            return 0
        rows[item] = _row(values, codes)
        return q.size

    parallel.run_tasks(task, len(todo), workers)
    found.update({i: _figures(rows[k]) for k, i in enumerate(todo) if rows[k, 0] == 1})
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
