"""Attention, the article's first half: exact attention computed block by block.

- ``softmax`` -- the online softmax of one query (``fmt softmax``): the running max, the
  running sum and the rescaling, block by block, with every operation rounded to a chosen
  format, beside the exact softmax-weighted average; ``softmax_inputs``: its inputs (the
  article's example, random draws, ``--scores``/``--values`` lists and files).
- ``accuracy`` -- standard and blockwise (online-softmax) attention of whole tensors in a
  format, FP8 emulated as FP8 kernels do (scaled Q, K, V, P cast before P V, float32
  accumulators, optional Hadamard transform), against a float64 reference; ``quantized``:
  Q, K, V as the kernel sees them (the Hadamard transform, the cast or the scaled cast);
- ``io_model`` -- HBM bytes and FLOPs of standard attention vs FlashAttention (Dao et al.
  2022, Theorem 2, with Algorithm 1's blocks); ``timing`` -- torch's SDPA backends timed
  on a CUDA GPU; ``report`` -- ``analyse_attention``, all of ``fmt attention`` in one call.

The names below load on first use (PEP 562, as ``fmtcli`` does), so importing one module of
this package does not import the others.
"""

from __future__ import annotations

# io_model is also a module's name: importing the module (as fmt attention does) sets the
# package's attribute io_model to the module, and the lazy lookup below is never asked.
# The function is bound here instead (io_model.py imports only the standard library,
# fmtcli.base.errors and .limits)..
from fmtcli.attention.io_model import io_model as io_model
from fmtcli.base.lazy import lazy_exports

_EXPORTS = {
    "SoftmaxBlock": "softmax", "SoftmaxTrace": "softmax", "online_softmax": "softmax",
    "softmax_reference": "softmax", "article_example": "softmax_inputs",
    "random_inputs": "softmax_inputs", "read_numbers": "softmax_inputs",
    "AccuracyRow": "accuracy", "attention_accuracy": "accuracy",
    "reference_attention": "accuracy", "standard_attention": "accuracy",
    "flash_attention": "accuracy", "quantize_inputs": "quantized", "random_qkv": "accuracy",
    "random_orthogonal_hadamard": "quantized", "walsh_hadamard": "quantized",
    "IoModel": "io_model", "io_model": "io_model", "TimingRow": "timing",
    "time_sdpa": "timing", "AttentionResult": "report", "AttentionSettings": "report",
    "analyse_attention": "report", "load_qkv": "report",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
