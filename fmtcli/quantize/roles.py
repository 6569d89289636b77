"""Roles of a checkpoint's tensors: the names with their layer indices replaced by ``*``.

A transformer repeats the same tensors in every layer (``encoder.layer.0.attention.self.
query.weight`` ... ``encoder.layer.5...``); a report by role merges them into one row,
``encoder.layer.*.attention.self.query.weight`` x6.  A layer index is a part of the dotted
name made of digits only (``h.11.mlp``, ``layers.3.``, ``blocks.0``), so digits inside a word
(``conv1``, ``fc2``, ``c_attn``) stay: they name different tensors, not copies.
"""

from __future__ import annotations

import re

_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def role_of(name: str) -> str:
    """The name with every all-digit dotted part replaced by ``*``."""
    return _INDEX.sub("*", name)


def roles_in_order(names: list[str]) -> dict[str, list[int]]:
    """Role -> indices of the names that have it, roles in order of first appearance."""
    out: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        out.setdefault(role_of(name), []).append(i)
    return out
