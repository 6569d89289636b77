"""Input files of every kind fmt reads, written for the tests (not a test module itself).

``write_input(kind, tmp_path)`` writes the same two float32 arrays as .npy, .npz (all or one
key), .safetensors (float32 or bfloat16), a torch .pt, text (spaces, commas, JSON), standard
input or a directory of .npy files, and returns what the command line needs to read them back
together with the arrays it must find.  .safetensors go through oracle's hand-written writer.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from oracle import write_safetensors


def save(path: Path, x: np.ndarray) -> Path:
    """``x`` as a .npy file at ``path``; the path (to pass on the command line)."""
    np.save(path, x)
    return path


INPUT_KINDS = ["npy", "npz", "npz-key", "safetensors", "safetensors-bf16", "pt", "txt", "csv",
               "json", "stdin", "directory"]


def gradient_like(rng, shape) -> np.ndarray:
    """float32 values whose magnitudes span 2**-40 .. 2**6 (random signs), some zeros."""
    mag = np.exp2(rng.uniform(-40, 6, size=shape))
    x = (np.where(rng.random(shape) < 0.5, -1.0, 1.0) * mag).astype(np.float32)
    x.reshape(-1)[::17] = 0.0
    return x


def text_of(x: np.ndarray, sep: str) -> str:
    """Exact decimal text of float32 values (they parse back to the same float32)."""
    rows = np.atleast_2d(x)
    return "\n".join(sep.join(repr(float(v)) for v in row) for row in rows) + "\n"


def write_input(kind: str, tmp_path: Path, seed: int = 5):
    """(command-line arguments, the float32 arrays they hold in order, stdin text)."""
    rng = np.random.default_rng(seed)
    a = gradient_like(rng, (12, 40))
    b = gradient_like(rng, (30,))
    if kind == "npy":
        return [save(tmp_path / "a.npy", a)], [a], None
    if kind == "npz":
        np.savez(tmp_path / "ab.npz", a=a, b=b)
        return [tmp_path / "ab.npz"], [a, b], None
    if kind == "npz-key":
        np.savez(tmp_path / "ab.npz", a=a, b=b)
        return [tmp_path / "ab.npz", "--key", "b"], [b], None
    if kind == "safetensors":
        write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": b})
        return [tmp_path / "m.safetensors"], [a, b], None
    if kind == "safetensors-bf16":
        h = a.astype(ml_dtypes.bfloat16)
        write_safetensors(tmp_path / "h.safetensors", {"h": h})
        return [tmp_path / "h.safetensors"], [h.astype(np.float32)], None
    if kind == "pt":
        torch = pytest.importorskip("torch")
        torch.save({"w": torch.from_numpy(a.copy())}, tmp_path / "w.pt")
        return [tmp_path / "w.pt"], [a], None
    if kind == "txt":
        (tmp_path / "a.txt").write_text(text_of(a, " "))
        return [tmp_path / "a.txt"], [a], None
    if kind == "csv":
        (tmp_path / "a.csv").write_text(text_of(a, ","))
        return [tmp_path / "a.csv"], [a], None
    if kind == "json":
        (tmp_path / "a.json").write_text(json.dumps([[float(v) for v in row] for row in a]))
        return [tmp_path / "a.json"], [a], None
    if kind == "stdin":
        return ["-"], [b], text_of(b, " ")
    if kind == "directory":
        d = tmp_path / "dir"
        d.mkdir()
        save(d / "1_a.npy", a)
        save(d / "2_b.npy", b)
        (d / "notes.md").write_text("not a tensor")
        return [d], [a, b], None
    raise ValueError(kind)


def facenet_weights() -> Path:
    """The folder of MTCNN's weights in the installed facenet-pytorch wheel (located, not
    imported: the package's own imports need torchvision).  ``pip install --no-deps
    facenet-pytorch`` (its pinned dependencies would replace torch and numpy)."""
    spec = importlib.util.find_spec("facenet_pytorch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("facenet-pytorch is not installed (pip install --no-deps facenet-pytorch)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not (folder / "pnet.pt").is_file():
        pytest.skip("facenet-pytorch installed without its data/ weights")
    return folder
