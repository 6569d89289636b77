"""A checkpoint shaped like a small BERT, written for the report's tests and examples (not a
test module itself).

``bert_like(directory)`` writes ``bert.safetensors``: an int64 ``position_ids`` (skipped), the
word embeddings, six encoder layers of attention, feed-forward and LayerNorm tensors (weights
and biases: 72 tensors with keys up to 49 characters, as sentence-transformers' MiniLM has),
and a pooler, from a fixed seed.  Layer 3's ``intermediate.dense.weight`` holds an outlier of
30 and a few values of 1e-9 in its first block, so that block flushes values under block
scaling and the tensor leads ``--sort flushed``.  The generator is
``examples/make_example_files.py``'s, which writes the docs' example files, so the tests and
the manual use one checkpoint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "make_example_files.py"


def example_files_module():
    """``examples/make_example_files.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_example_files", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXAMPLES = example_files_module()
TROUBLE = _EXAMPLES.BERT_TROUBLE


def bert_like(directory: Path, name: str = "bert.safetensors") -> Path:
    """Write the checkpoint into ``directory``; its path."""
    return _EXAMPLES.write_bert(Path(directory), name)
