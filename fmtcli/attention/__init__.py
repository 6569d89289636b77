"""Attention, the article's first half: exact attention computed block by block.

- ``softmax`` -- the online softmax of one query (``fmt softmax``): the running max, the
  running sum and the rescaling, block by block, with every operation rounded to a chosen
  format, beside the exact softmax-weighted average; ``softmax_inputs``: its inputs (the
  article's example, random draws, ``--scores``/``--values`` lists and files).

The names below load on first use (PEP 562, as ``fmtcli`` does), so importing one module of
this package does not import the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SoftmaxBlock": "softmax", "SoftmaxTrace": "softmax", "online_softmax": "softmax",
    "softmax_reference": "softmax", "article_example": "softmax_inputs",
    "random_inputs": "softmax_inputs", "read_numbers": "softmax_inputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fmtcli.attention' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
