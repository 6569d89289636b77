"""Write the files that the README's and the manual's examples run on.

    python examples/make_example_files.py [DIR]    # default: TMPDIR/fmt-examples
    cd DIR && fmt quantize model.safetensors --recipe mxfp4 --key '*weight'

Every example in README.md and docs/*.md that names a file runs in a directory holding
these (tests/docs/test_console_examples.py writes them with this script and checks each
example's output against the page), all from fixed seeds with numpy and fmtcli's own
.safetensors writer (no other package):

- ``model.safetensors``: a small checkpoint shaped like a real one: an int64
  ``embeddings.position_ids`` (skipped by every command), an embedding (1000x64), an
  attention weight (64x64) with one outlier of 4.0, and a bias;
- ``bert.safetensors``: 86 tensors shaped like a small BERT (six encoder layers; one block
  of layer 3's ``intermediate.dense.weight`` holds an outlier of 30 beside values of 1e-9);
- ``model-fp8.safetensors``, ``bert-fp8.safetensors``: the same after an E4M3 round trip
  with one amax scale per row, each tensor in its own dtype (``fmt compare``'s examples);
- ``logits.npy``, ``logits-fp8.npy``: the logits of a small LM head (64 tokens, a
  vocabulary of 512) with its float32 weights and with those weights round-tripped;
- ``model-deepseek-fp8/``: ``model.safetensors`` as DeepSeek-V3 stores FP8 weights
  (``fmt audit``'s examples): each 2-D weight float8_e4m3fn beside a float32
  ``weight_scale_inv`` per 128 x 128 block (amax / 448; DeepSeek-V3's
  ``README_WEIGHTS.md``), the rest as it is, and a ``config.json`` saying so.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

from fmtcli.engine.writers import write_safetensors

BERT_ROLES = ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
              "output.dense")
BERT_LAYERS, BERT_HIDDEN = 6, 64
BERT_TROUBLE = "encoder.layer.3.intermediate.dense.weight"


def _float32(tensors: dict) -> dict:
    """float64 arrays as float32 (as checkpoints store them), the rest as they are; in the
    order ``safetensors.numpy.save_file`` would write them (wider dtypes first, then by
    name), which is the order fmt reports them in."""
    tensors = {k: v.astype(np.float32) if v.dtype == np.float64 else v
               for k, v in tensors.items()}
    return dict(sorted(tensors.items(), key=lambda item: (-item[1].dtype.itemsize, item[0])))


def model_tensors() -> dict[str, np.ndarray]:
    """``model.safetensors``'s tensors (seed 2024), float64 where float."""
    rng = np.random.default_rng(2024)
    tensors = {
        "embeddings.position_ids": np.arange(512, dtype=np.int64)[None, :],
        "embeddings.word_embeddings.weight": (rng.standard_normal((1000, 64)) * 0.05),
        "layer.0.attention.query.weight": rng.standard_normal((64, 64)) * 0.1,
        "layer.0.attention.query.bias": rng.standard_normal(64) * 0.01,
    }
    tensors["layer.0.attention.query.weight"][3, 7] = 4.0  # an outlier
    return tensors


def bert_tensors() -> dict[str, np.ndarray]:
    """``bert.safetensors``'s tensors (seed 11): word embeddings, six layers of attention,
    feed-forward and LayerNorm weights and biases, a pooler; float64 where float."""
    rng = np.random.default_rng(11)
    tensors = {"embeddings.position_ids": np.arange(512, dtype=np.int64)[None, :],
               "embeddings.word_embeddings.weight":
                   rng.standard_normal((500, BERT_HIDDEN)) * 0.05}
    for layer in range(BERT_LAYERS):
        for role in BERT_ROLES:
            prefix = f"encoder.layer.{layer}.{role}"
            if role.endswith("LayerNorm"):
                tensors[f"{prefix}.weight"] = 1 + rng.standard_normal(BERT_HIDDEN) * 0.02
            else:
                tensors[f"{prefix}.weight"] = rng.standard_normal(
                    (BERT_HIDDEN, BERT_HIDDEN)) * 0.05
            tensors[f"{prefix}.bias"] = rng.standard_normal(BERT_HIDDEN) * 0.01
    tensors["pooler.dense.weight"] = rng.standard_normal((BERT_HIDDEN, BERT_HIDDEN)) * 0.05
    trouble = tensors[BERT_TROUBLE]
    trouble[0, :6] = 1e-9
    trouble[0, 10] = 30.0
    return tensors


def write_bert(directory: Path, name: str = "bert.safetensors") -> Path:
    """``bert.safetensors`` (or ``name``) in ``directory``; its path."""
    path = Path(directory) / name
    write_safetensors(str(path), _float32(bert_tensors()))
    return path


def fp8_rows(w: np.ndarray) -> np.ndarray:
    """w after E4M3 with one amax scale per row (x_q = cast(x * scale) / scale, scale =
    448 / amax), in w's dtype (float32 for float64)."""
    x = w.astype(np.float32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, np.float32(448) / np.where(amax > 0, amax, 1), 1)
    scale = scale.astype(np.float32)
    x_q = (x * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / scale
    return x_q.astype(np.float32 if w.dtype == np.float64 else w.dtype)


def deepseek_fp8(tensors: dict, tile: int = 128) -> dict:
    """DeepSeek-V3's FP8 layout of ``tensors``: each 2-D float weight as float8_e4m3fn
    codes (``w / scale_inv`` per ``tile`` x ``tile`` block, scale_inv = block amax / 448)
    and its float32 ``<name>_scale_inv`` grid; the rest as it is."""
    out = {}
    for name, w in tensors.items():
        if w.ndim != 2 or w.dtype.kind != "f" or not name.endswith(".weight"):
            out[name] = w
            continue
        x = w.astype(np.float32)
        grid = np.ones((-(-x.shape[0] // tile), -(-x.shape[1] // tile)), np.float32)
        codes = np.empty(x.shape, ml_dtypes.float8_e4m3fn)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                rows, cols = slice(i * tile, (i + 1) * tile), slice(j * tile, (j + 1) * tile)
                amax = np.abs(x[rows, cols]).max()
                grid[i, j] = amax / np.float32(448) if amax > 0 else 1
                codes[rows, cols] = (x[rows, cols] / grid[i, j]).astype(codes.dtype)
        out[name], out[name + "_scale_inv"] = codes, grid
    return out


def write_example_files(directory: Path) -> list[Path]:
    """Every example file in ``directory`` (created if need be); their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = _float32(model_tensors())
    bert = _float32(bert_tensors())
    files = {"model.safetensors": model, "bert.safetensors": bert}
    for name, tensors in list(files.items()):
        files[name.replace(".", "-fp8.", 1)] = {
            k: fp8_rows(v) if v.dtype.kind == "f" else v for k, v in tensors.items()}
    paths = []
    for name, tensors in files.items():
        write_safetensors(str(directory / name), tensors)
        paths.append(directory / name)
    rng = np.random.default_rng(16)
    hidden = rng.standard_normal((64, 64)).astype(np.float32)
    head = (rng.standard_normal((512, 64)) * 0.3).astype(np.float32)
    for name, logits in (("logits.npy", hidden @ head.T),
                         ("logits-fp8.npy", hidden @ fp8_rows(head).T)):
        np.save(directory / name, logits)
        paths.append(directory / name)
    folder = directory / "model-deepseek-fp8"
    folder.mkdir(exist_ok=True)
    write_safetensors(str(folder / "model.safetensors"), deepseek_fp8(model))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
        "activation_scheme": "dynamic"}}, indent=2) + "\n")
    paths += [folder / "model.safetensors", folder / "config.json"]
    return paths


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    directory = Path(argv[0]) if argv else Path(tempfile.gettempdir()) / "fmt-examples"
    paths = write_example_files(directory)
    print(f"wrote {len(paths)} example files to {directory}:")
    for path in paths:
        print(f"  {path.relative_to(directory).as_posix():36} {path.stat().st_size:>9,} bytes")
    print(f"then: cd {directory} && fmt quantize model.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
