"""``--out`` under hostile targets (issue 9, item 12): a directory, a place where no file can be
created, a path under a file, a symbolic link; a write or rename failing midway, or a bug
midway.  Nothing is left behind (the temporary ``.fmtcli-*`` is removed), no target is
touched that should not be, and a refusal is one ``Error:`` line.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from cli_helpers import assert_data_error, assert_error, assert_usage_error, invoke

import fmtcli.engine.writers as output


def leftovers(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), ".fmtcli-*"))


def injected_bug(*args, **kwargs):
    raise RuntimeError("injected bug\nwith a second line")


@pytest.fixture
def data(tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(-3, 3, 256, dtype=np.float32))
    return tmp_path / "x.npy"


def test_out_onto_a_directory_is_refused_even_with_force(data, tmp_path):
    (tmp_path / "outdir.npy").mkdir()
    message = assert_usage_error(invoke("quantize", data, "--out", tmp_path / "outdir.npy",
                                        "--force"))
    assert "is a directory" in message
    assert leftovers(tmp_path) == [] and os.listdir(tmp_path / "outdir.npy") == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_out_where_no_file_can_be_created_is_refused():
    message = assert_error(invoke("quantize", "--out", "/proc/self/x.npy"), (1, 2))
    assert "/proc/self" in message


def test_out_under_a_file_is_refused(data, tmp_path):
    (tmp_path / "afile").write_text("keep")
    assert "not a directory" in assert_usage_error(
        invoke("quantize", data, "--out", tmp_path / "afile" / "x.npy"))
    assert (tmp_path / "afile").read_text() == "keep"


def test_out_through_a_symlink_needs_force_and_replaces_the_link_only(data, tmp_path):
    (tmp_path / "target.npy").write_bytes(b"precious")
    os.symlink(tmp_path / "target.npy", tmp_path / "link.npy")
    assert "symbolic link" in assert_usage_error(
        invoke("quantize", data, "--out", tmp_path / "link.npy"))
    result = invoke("quantize", data, "--out", tmp_path / "link.npy", "--force",
                    "--compare", "none")
    assert result.exit_code == 0, result.stderr
    assert not os.path.islink(tmp_path / "link.npy")
    assert np.load(tmp_path / "link.npy").shape == (256,)
    assert (tmp_path / "target.npy").read_bytes() == b"precious"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
def test_a_write_failing_midway_removes_its_temporary(data, tmp_path, monkeypatch, suffix):
    (tmp_path / f"old{suffix}").write_bytes(b"old")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "_reserve", disk_full)  # the .npy's blocks, allocated first
    monkeypatch.setattr(output, "_write_safetensors", disk_full)
    monkeypatch.setattr(output.np, "savez", disk_full)
    message = assert_data_error(invoke("quantize", data, "--out", tmp_path / f"old{suffix}",
                                    "--force"))
    assert "No space left on device" in message
    assert leftovers(tmp_path) == []
    assert (tmp_path / f"old{suffix}").read_bytes() == b"old"


def test_a_failing_rename_removes_its_temporary(data, tmp_path, monkeypatch):
    def refuse(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output.os, "replace", refuse)
    assert "Permission denied" in assert_data_error(
        invoke("quantize", data, "--out", tmp_path / "q.npz"))
    assert leftovers(tmp_path) == [] and not (tmp_path / "q.npz").exists()


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_a_bug_midway_still_removes_the_temporary(data, tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(output, "_write_safetensors", injected_bug)
    monkeypatch.setattr(output.NpyWriter, "write", injected_bug)
    result = invoke("quantize", data, "--out", tmp_path / f"q{suffix}")
    assert isinstance(result.exception, RuntimeError)
    assert leftovers(tmp_path) == [] and not (tmp_path / f"q{suffix}").exists()


def test_reserving_the_npy_blocks_fails_cleanly_on_a_full_disk(tmp_path, monkeypatch):
    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.os, "posix_fallocate", no_space)
    with pytest.raises(output.DataError, match="No space left"):
        output.NpyWriter(str(tmp_path / "q.npy"), (4, 4))
    assert leftovers(tmp_path) == []
