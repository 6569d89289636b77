"""Forked workers: small tensors stay in this process (a fork costs more than their work),
large ones are shared out; either way the statistics are the same to the bit, and a
worker's error comes back as one error."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fmtcli.base.choices import Granularity
from fmtcli.base.errors import DataError
from fmtcli.engine import run as engine
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize
from fmtcli.streaming.parallel import run_tasks, shared_array


def source(x):
    return TensorSource("t.npy", None, x.shape, "float32", lambda: x)


def forks(monkeypatch) -> list:
    calls: list = []
    real = os.fork

    def counting():
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "fork", counting)
    return calls


def test_a_small_tensor_is_not_forked_for(monkeypatch):
    calls = forks(monkeypatch)
    x = np.random.default_rng(0).standard_normal((64, 4096)).astype(np.float32)  # 4 chunks
    quantize([source(x)], [build_scheme(block=128)], workers=2, chunk_elements=1 << 16)
    assert calls == []


@pytest.mark.parametrize("workers", [2, 3])
def test_forked_workers_give_the_same_statistics(monkeypatch, workers):
    x = (np.random.default_rng(1).standard_normal((96, 1000))
         * np.exp(np.random.default_rng(2).normal(0, 3, (96, 1000)))).astype(np.float32)
    schemes = [build_scheme(block=128), build_scheme(per=Granularity.TENSOR)]
    one = quantize([source(x)], schemes, workers=1, chunk_elements=8192,
                   worst_blocks=3).to_dict()
    monkeypatch.setattr(engine, "PARALLEL_ELEMENTS", 0)  # fork even for this small tensor
    calls = forks(monkeypatch)
    many = quantize([source(x)], schemes, workers=workers, chunk_elements=8192,
                    worst_blocks=3).to_dict()
    assert len(calls) >= workers  # the first pass (per-tensor) and the main pass fork
    assert many == one


def test_a_worker_s_error_is_raised_here():
    def task(item, worker):
        if item == 3:
            raise DataError("chunk 3 is unreadable")
        return 1

    with pytest.raises(DataError, match="chunk 3 is unreadable"):
        run_tasks(task, 6, 2)


def test_workers_write_into_shared_memory():
    out = shared_array(8, np.int64)

    def task(item, worker):
        out[item] = item * 10 + worker
        return 1

    run_tasks(task, 8, 2)
    assert out.tolist() == [i * 10 + i % 2 for i in range(8)]
