"""``fmt audit`` edge cases of the layout readers: a bad ModelOpt global scale, a folder
of KV scales alone, the name of compressed-tensors' integer layout.

Each CLI case runs in a fresh process (``run_fmt_each``: one interpreter, a forked child per
command), at 80 columns and as ``--json`` (parsed strictly).
"""

from __future__ import annotations

from pathlib import Path

import layout_fixtures as lf
import numpy as np
import pytest
from cli_helpers import assert_fits, run_fmt_each, strict_loads
from oracle import read_safetensors, write_safetensors

KEY = "model.layers.0.mlp.down_proj.weight"


def _tamper(folder: Path, edit) -> Path:
    """The folder's model.safetensors rewritten with ``edit(tensors)`` applied."""
    path = folder / "model.safetensors"
    tensors, metadata = read_safetensors(path)
    tensors = {k: np.array(v) for k, v in tensors.items()}
    edit(tensors)
    write_safetensors(path, tensors, metadata or None)
    return folder


def _failed(doc: dict) -> list[tuple[str, str]]:
    return [(c["name"], c["evidence"]) for t in doc["tensors"] for c in t["checks"]
            if c["verdict"] == "fail"]


# -- 2: a ModelOpt weight_scale_2 that is NaN, inf, 0 or negative -----------------------------

BAD_GLOBALS = {"nan": np.nan, "inf": np.inf, "zero": 0.0, "negative": -1e-3}


def _bad_modelopt(root: Path, name: str, value: float) -> Path:
    w = lf.linear_init(0, (64, 128))
    folder = lf.nvfp4_modelopt(root / f"modelopt-{name}", w, key=KEY).path

    def edit(t):
        t[KEY + "_scale_2"] = np.array(value, np.float32)
    return _tamper(folder, edit)


def _bad_ct_nvfp4(root: Path) -> Path:
    stem = KEY[: -len(".weight")]
    tensors = lf.ct_tensors(stem, lf.linear_init(0, (64, 128)), "nvfp4")
    tensors[stem + ".weight_global_scale"] = np.array([np.nan], np.float32)
    return lf.write_layout(root / "ct-nan", tensors, lf.ct_config("nvfp4"))


@pytest.mark.slow  # ten fresh commands
def test_a_bad_modelopt_global_scale_is_one_failed_check(tmp_path):
    """As compressed-tensors' NVFP4 reader refuses a bad weight_global_scale: one failed
    check, ``structure``, naming the tensor and its value; the values are not read (no
    second failure from NaN values); ``fmt quantize`` refuses it in one Error line."""
    folders = {name: _bad_modelopt(tmp_path, name, v) for name, v in BAD_GLOBALS.items()}
    commands = [["audit", f, "--json"] for f in folders.values()]
    commands += [["audit", f] for f in folders.values()]
    commands += [["audit", _bad_ct_nvfp4(tmp_path), "--json"],
                 ["quantize", folders["nan"], "--json"]]
    done = run_fmt_each(commands)
    n = len(folders)
    for value, (code, out, err) in zip(BAD_GLOBALS.values(), done[:n]):
        assert code == 1, err.decode()
        failed = _failed(strict_loads(out.decode()))
        assert failed == [("structure", f"{KEY}_scale_2 holds {float(np.float32(value))!r}, "
                                        "not a positive number")], failed
    for code, out, _ in done[n:2 * n]:
        text = out.decode()
        assert code == 1 and "FAIL structure" in text and "values-finite" not in text
        assert_fits(text, 80)
    code, out, _ = done[2 * n]  # compressed-tensors' NVFP4: the same check, the same words
    (ct,) = _failed(strict_loads(out.decode()))
    assert code == 1 and ct[0] == "structure" and ct[1].endswith("holds nan, not a positive "
                                                                 "number")
    code, out, err = done[-1]
    lines = err.decode().splitlines()
    assert code == 1 and out == b"" and lines[-1].startswith("Error: ")
    assert lines[-1].endswith(f"{KEY}_scale_2 holds nan, not a positive number"), lines
    assert "Traceback" not in err.decode()


def test_a_bad_modelopt_global_scale_is_a_problem_of_the_reader(tmp_path):
    """The reader itself (in-process, fast): the problem, and no value read."""
    from fmtcli.base.errors import DataError
    from fmtcli.inputs import layouts
    from fmtcli.inputs.tensors import load_path

    for name, value in BAD_GLOBALS.items():
        folder = _bad_modelopt(tmp_path, name, value)
        (q,) = layouts.scan(load_path(str(folder), as_stored=True)).quantized
        assert q.layout == "modelopt-nvfp4" and len(q.problems) == 1, q.problems
        assert "_scale_2 holds" in q.problems[0]
        with pytest.raises(DataError, match="not a positive number"):
            q.read(slice(0, 1), slice(0, 128))
    healthy = lf.nvfp4_modelopt(tmp_path / "healthy", lf.linear_init(0, (64, 128)), key=KEY)
    (q,) = layouts.scan(load_path(str(healthy.path), as_stored=True)).quantized
    assert q.problems == []


# -- 4: compressed-tensors' int8 (int-quantized) has its own layout name ------------------------

def test_an_int8_compressed_tensors_file_is_not_named_fp8(tmp_path):
    """int-quantized int8 weights: ``compressed-tensors-int8`` (table at 80 columns and
    JSON), while FP8 files keep ``compressed-tensors-fp8`` (a stable JSON key)."""
    stem, w = KEY[: -len(".weight")], lf.linear_init(0, (64, 128))
    folders = {scheme: lf.write_layout(tmp_path / scheme, lf.ct_tensors(stem, w, scheme),
                                       lf.ct_config(scheme))
               for scheme in ("int8-naive", "fp8-channel")}
    done = run_fmt_each([["audit", folders["int8-naive"], "--json"],
                         ["audit", folders["int8-naive"]],
                         ["audit", folders["fp8-channel"], "--json"]])
    (c1, out1, e1), (c2, out2, e2), (c3, out3, e3) = done
    assert c1 == c2 == c3 == 0, (e1, e2, e3)
    doc = strict_loads(out1.decode())
    assert doc["layouts"] == ["compressed-tensors-int8"]
    assert [(t["layout"], t["element"]) for t in doc["tensors"]] == [
        ("compressed-tensors-int8", "int8")]
    table = out2.decode()
    assert "compressed-tensors-int8" in table and "-fp8" not in table
    assert_fits(table, 80)
    assert strict_loads(out3.decode())["layouts"] == ["compressed-tensors-fp8"]


# -- 3: a folder of KV scales alone ---------------------------------------------------------

def test_a_folder_of_kv_scales_alone(tmp_path):
    """fmt audit checks the scales (0-d as vLLM stores them, and per head); a command that
    reads data says what it found (scales without codes), not "hold no tensors"; beside a
    weight they are skipped with that reason and the weight is used."""
    from safetensors.numpy import save_file as write

    folder = tmp_path / "kv"
    folder.mkdir()
    scales = {k: np.asarray(v, np.float32) for k, v in
              {**lf.kv_tensors(0), **lf.kv_tensors(1, heads=4, seed=1)}.items()}
    write(scales, str(folder / "model.safetensors"))
    weight = tmp_path / "w.safetensors"
    write_safetensors(weight, {"model.layers.0.mlp.up_proj.weight": lf.linear_init(0, (16, 64))})
    done = run_fmt_each([["audit", folder, "--json"], ["audit", folder],
                         ["quantize", folder], ["quantize", folder, weight, "--json"]])
    (c1, out1, e1), (c2, out2, e2), (c3, out3, e3), (c4, out4, e4) = done
    assert c1 == c2 == 0, (e1, e2)
    doc = strict_loads(out1.decode())
    assert doc["layouts"] == ["kv-scales"] and len(doc["tensors"]) == 4
    assert {t["shape"] == [] for t in doc["tensors"]} == {True, False}
    assert_fits(out2.decode(), 80)
    lines = e3.decode().splitlines()
    assert c3 == 1 and out3 == b"" and len(lines) == 1, lines
    assert lines[0].startswith("Error: nothing to quantize") and "no tensors" not in lines[0]
    assert "a scale without codes (kv-scales; fmt audit checks it)" in lines[0]
    assert c4 == 0, e4.decode()
    result = strict_loads(out4.decode())
    assert "model.layers.0.mlp.up_proj.weight" in [t["key"] for t in result["tensors"]]
    assert sorted(t["key"] for t in result["skipped"]) == sorted(scales)
    assert {t["reason"] for t in result["skipped"]} == {
        "a scale without codes (kv-scales; fmt audit checks it)"}
