"""A checkpoint shaped like a small BERT, written for the report's tests and examples (not a
test module itself).

``bert_like(directory)`` writes ``bert.safetensors``: an int64 ``position_ids`` (skipped), the
word embeddings, six encoder layers of attention, feed-forward and LayerNorm tensors (weights
and biases: 72 tensors with keys up to 49 characters, as sentence-transformers' MiniLM has),
and a pooler, from a fixed seed.  Layer 3's ``intermediate.dense.weight`` holds an outlier of
30 and a few values of 1e-9 in its first block, so that block flushes values under block
scaling and the tensor leads ``--sort flushed``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROLES = ("attention.self.query", "attention.self.key", "attention.self.value",
         "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
         "output.dense", "output.LayerNorm")
LAYERS = 6
HIDDEN = 64
TROUBLE = "encoder.layer.3.intermediate.dense.weight"


def bert_like(directory: Path, name: str = "bert.safetensors") -> Path:
    """Write the checkpoint into ``directory``; its path."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)
    tensors = {"embeddings.position_ids": np.arange(512, dtype=np.int64)[None, :],
               "embeddings.word_embeddings.weight": rng.standard_normal((500, HIDDEN)) * 0.05}
    for layer in range(LAYERS):
        for role in ROLES[:7]:
            prefix = f"encoder.layer.{layer}.{role}"
            if role.endswith("LayerNorm"):
                tensors[f"{prefix}.weight"] = 1 + rng.standard_normal(HIDDEN) * 0.02
            else:
                tensors[f"{prefix}.weight"] = rng.standard_normal((HIDDEN, HIDDEN)) * 0.05
            tensors[f"{prefix}.bias"] = rng.standard_normal(HIDDEN) * 0.01
    tensors["pooler.dense.weight"] = rng.standard_normal((HIDDEN, HIDDEN)) * 0.05
    trouble = tensors[TROUBLE]
    trouble[0, :6] = 1e-9
    trouble[0, 10] = 30.0
    path = Path(directory) / name
    save_file({k: v.astype(np.float32) if v.dtype == np.float64 else v
               for k, v in tensors.items()}, str(path))
    return path
