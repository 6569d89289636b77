"""``fmt quantize --dask``: the statistics of a Dask cluster's run equal the local engine's.

A small LocalCluster (2 worker processes of one thread) scans generated Hugging Face
sharded checkpoints; the JSON must equal the local run's key for key (sums included: the
chunks merge in chunk order), apart from the ``dask`` key that says where it ran.  Tasks
are made small (``task_bytes``) so that large tensors are split across tasks and their
first pass (per-tensor scales) runs as tasks too.  A worker killed mid-scan must change
nothing.  Refusals: one ``Error:`` line, exit 2 or 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_usage_error, invoke, json_of

pytestmark = pytest.mark.slow

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def write_sharded(folder, seed: int = 0):
    """An HF model folder: three shards, an index, float32/bfloat16/float16 tensors of very
    different ranges (one whose rows span 2**-12 .. 2**12: per-tensor scaling flushes it),
    a 1-D norm, and an int64 tensor (skipped)."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((192, 256)) * np.exp2(rng.integers(-12, 12, (192, 1)))
    shards = {
        "model-00001-of-00003.safetensors": {
            "model.embed.weight": (rng.standard_normal((384, 512)) * 0.02).astype(np.float32),
            "model.layers.0.attn.q.weight":
                (rng.standard_normal((128, 256)) * 1e-3).astype(ml_dtypes.bfloat16),
            "model.layers.0.norm.weight": (1 + rng.standard_normal(256) * 1e-3).astype(np.float32),
            "model.position_ids": np.arange(64, dtype=np.int64)},
        "model-00002-of-00003.safetensors": {
            "model.layers.1.attn.q.weight": wide.astype(np.float16),
            "model.layers.1.norm.weight": np.ones(256, np.float32),
            "model.layers.1.mlp.up.weight": (rng.standard_normal((512, 384)) * 1e-2).astype(np.float32)},
        "model-00003-of-00003.safetensors": {
            "lm_head.weight": (rng.standard_normal((384, 512)) * 0.05).astype(np.float32)},
    }
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for name, tensors in shards.items():
        safetensors_numpy.save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_sharded(tmp_path_factory.mktemp("dask") / "model")


def without_where(doc: dict) -> dict:
    """The document less the ``dask`` key (where it ran), which a local run lacks."""
    assert "dask" in doc
    return {k: v for k, v in doc.items() if k != "dask"}


def scan_both(checkpoint, address, options, task_bytes=1 << 16):
    """(local document, Dask document) of the library's quantize under one scheme and the
    per-tensor comparison, with chunks of 4096 values and tasks of ``task_bytes``."""
    from fmtcli.base.choices import Granularity, RoundingMode, ScaleRule
    from fmtcli.inputs.tensors import load_inputs
    from fmtcli.numerics.formats import get_format
    from fmtcli.numerics.schemes import build_scheme, comparison_schemes
    from fmtcli.quantize import quantize
    from fmtcli.quantize.distributed import quantize_on_dask

    kinds = {"format": get_format, "per": Granularity, "scale_rule": ScaleRule,
             "rounding": RoundingMode}
    options = {k: kinds[k](v) if k in kinds else v for k, v in options.items()}
    sources = load_inputs([str(checkpoint)])
    schemes = comparison_schemes(build_scheme(**options), "tensor")
    local = quantize(sources, schemes, chunk_elements=4096, worst_blocks=4)
    remote, where = quantize_on_dask(sources, schemes, address, chunk_elements=4096,
                                     worst_blocks=4, task_bytes=task_bytes)
    return local, remote, where


SCHEMES = [
    {"format": "float8_e4m3fn", "block": 32},
    {"format": "float8_e5m2", "tile": "16x16"},
    {"recipe": "nvfp4"},
    {"recipe": "mxfp4"},
    {"format": "float8_e4m3fn", "per": "row", "scale_rule": "pow2-ceil"},
    {"format": "float8_e4m3fn", "per": "column"},
    {"format": "float8_e4m3fn", "per": "tensor", "scale_rule": "percentile",
     "percentile": 99.9},
    {"format": "float8_e4m3fn", "block": 32, "rounding": "stochastic"},
]


@pytest.mark.parametrize("options", SCHEMES, ids=lambda o: "-".join(map(str, o.values())))
def test_identical_statistics_on_a_sharded_checkpoint(checkpoint, scheduler, options):
    from fmtcli.render.jsonsafe import dumps

    local, remote, where = scan_both(checkpoint, scheduler, options)
    # large tensors were split: more tasks than the 8 tensors, several per tensor
    assert where["workers"] == 2 and where["tasks"] > 10
    assert dumps(remote.to_dict()) == dumps(local.to_dict())  # every figure, bit for bit


def test_whole_small_tensors_batched(checkpoint, scheduler):
    """With the default task size every tensor here is small: few tasks, same result."""
    from fmtcli.render.jsonsafe import dumps

    local, remote, where = scan_both(checkpoint, scheduler, {"block": 64},
                                     task_bytes=1 << 30)
    assert where["tasks"] == 1
    assert dumps(remote.to_dict()) == dumps(local.to_dict())


def test_cli_json_and_table_equal_the_local_run(checkpoint, scheduler):
    args = ("quantize", checkpoint, "--block", "32", "--chunk", "4096", "--worst-blocks", "2")
    local = json_of(*args)
    remote = json_of(*args, "--dask", scheduler)
    assert remote["dask"]["scheduler"] == scheduler and remote["dask"]["workers"] == 2
    assert without_where(remote) == local
    # the table is the local one; where it ran is a note on stderr
    table_local, table_remote = invoke(*args), invoke(*args, "--dask", scheduler)
    assert table_remote.exit_code == 0, table_remote.stderr
    assert table_remote.stdout == table_local.stdout
    assert f"Note: running on Dask: scheduler {scheduler}, 2 workers" in table_remote.stderr


def test_local_cluster_from_the_command_line(checkpoint):
    pytest.importorskip("distributed")
    args = ("quantize", checkpoint, "--recipe", "deepseek", "--chunk", "4096")
    remote = json_of(*args, "--dask", "local:2")
    assert remote["dask"]["dask"] == "local:2" and remote["dask"]["workers"] == 2
    assert without_where(remote) == json_of(*args)


def test_a_worker_killed_mid_scan_changes_nothing(tmp_path):
    """SIGKILL one worker process while the scan's tasks are out: Dask reruns them (its
    nanny starts a new worker), and the report is the local one."""
    distributed = pytest.importorskip("distributed")
    from fmtcli.inputs.tensors import load_inputs
    from fmtcli.numerics.schemes import build_scheme, comparison_schemes
    from fmtcli.quantize import quantize
    from fmtcli.quantize.distributed import quantize_on_dask
    from fmtcli.render.jsonsafe import dumps

    folder = write_sharded(tmp_path / "model", seed=3)
    sources = load_inputs([str(folder)])
    from fmtcli.numerics.formats import get_format

    schemes = comparison_schemes(build_scheme(format=get_format("float8_e4m3fn"), block=32),
                                 "tensor")
    local = quantize(sources, schemes, chunk_elements=1024)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")
    try:
        with distributed.Client(cluster) as client:
            pids = client.run(os.getpid)
        killed = []

        def kill_one(done, total):
            if not killed:
                assert done < total  # mid-scan: work is still out
                victim = sorted(pids.values())[0]
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        remote, _ = quantize_on_dask(sources, schemes, cluster.scheduler_address,
                                     chunk_elements=1024, task_bytes=1 << 13,
                                     progress=kill_one)
        with distributed.Client(cluster) as client:
            after = client.run(os.getpid)
    finally:
        cluster.close()
    assert killed and killed[0] not in after.values()  # the process did die
    assert dumps(remote.to_dict()) == dumps(local.to_dict())


# -- refusals ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dask_one") / "x.npy"
    np.save(path, np.linspace(-1, 1, 1000, dtype=np.float32))
    return path


@pytest.mark.parametrize("address, fragment", [
    ("local:0", "1 <= N"), ("local:x", "local:N"), ("local:", "local:N"),
    ("bogus", "not a scheduler address"), ("tcp://host", "not a scheduler address"),
    ("tcp://h:99999", "not a scheduler address"), ("http://h:1", "not a scheduler address"),
])
def test_bad_addresses(one_file, address, fragment):
    assert_usage_error(invoke("quantize", one_file, "--dask", address), "--dask", fragment)


@pytest.mark.parametrize("options, fragments", [
    (("--out", "y.npz"), ("cannot write --out",)),
    (("--device", "cuda"), ("CPU engine", "--device cuda")),
    (("--backend", "torch"), ("CPU engine", "--backend torch")),
    (("--workers", "2"), ("--workers", "local:N")),
])
def test_options_it_cannot_honour(one_file, tmp_path, options, fragments):
    os.chdir(tmp_path)
    assert_usage_error(invoke("quantize", one_file, "--dask", "local:2", *options), *fragments)
    assert not (tmp_path / "y.npz").exists()


def test_needs_files_the_workers_can_read(tmp_path):
    assert_usage_error(invoke("quantize", "--dask", "local:2"), "--dask needs FILE")
    text = tmp_path / "x.txt"
    text.write_text("1 2 3 4\n")
    pytest.importorskip("distributed")
    assert_usage_error(invoke("quantize", text, "--dask", "local:2"),
                       "x.txt", "not a .safetensors, .npy")


def test_unreachable_scheduler_is_one_line_quickly(one_file, monkeypatch):
    pytest.importorskip("distributed")
    from fmtcli.quantize import distributed

    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT", 1.0)
    assert_data_error(invoke("quantize", one_file, "--dask", "tcp://127.0.0.1:9"),
                      "--dask 'tcp://127.0.0.1:9'", "no scheduler answered within 1 s")


def test_without_distributed_it_names_the_install(one_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    assert_usage_error(invoke("quantize", one_file, "--dask", "local:2"),
                       "not installed", "pip install 'fmtcli[dask]'")
