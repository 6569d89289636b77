"""Roles of a checkpoint's tensors: the names with their layer indices replaced by ``*``.

A transformer repeats the same tensors in every layer (``encoder.layer.0.attention.self.
query.weight`` ... ``encoder.layer.5...``); a report by role merges them into one row,
``encoder.layer.*.attention.self.query.weight`` x6.  A layer index is a part of the dotted
name made of digits only (``h.11.mlp``, ``layers.3.``, ``blocks.0``), so digits inside a word
(``conv1``, ``fc2``, ``c_attn``) stay: they name different tensors, not copies.  A role is
made of the tensor's key, not its file: the same name in several files of a folder
(``a.pt:w``, ``b.pt:w``) is one role.
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


# Tensors that a state dict holds beside the weights but that no recipe quantizes: running
# statistics of normalisation layers and fixed tables.  By the last dotted part of the name:
# BatchNorm's ``running_mean``/``running_var``/``num_batches_tracked`` (torch.nn, which
# registers them as buffers), Keras' ``moving_mean``/``moving_variance``, and the rotary
# embeddings' ``inv_freq`` (a buffer in Hugging Face's Llama-family models).  Their values
# say nothing about a format's error on weights (a running_var of 5e5 can hold 99% of a
# checkpoint's sum of squares), so totals leave them out unless asked.
BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked", "moving_mean",
                "moving_variance", "inv_freq")


def is_buffer(name: str) -> bool:
    """Whether a tensor name (a checkpoint key) is one of ``BUFFER_NAMES``' buffers: its
    last dotted part is one of them (``bn1.running_var``, ``running_var``)."""
    return name.rsplit(".", 1)[-1] in BUFFER_NAMES


def counted_in_total(names: list[str], include_buffers: bool = False) -> list[int]:
    """Indices of the names a total covers: all with ``include_buffers``, else those that
    are not buffers (``is_buffer``) -- or all, where every one is a buffer."""
    every = list(range(len(names)))
    if include_buffers:
        return every
    return [i for i in every if not is_buffer(names[i])] or every


#: Name parts of 2-D weights that are not a linear layer's: embeddings (any part holding
#: "embed"), output heads or tied tables (a part exactly one of these), MoE routers (a part
#: "gate", "*_gate" or holding "router": DeepSeek-V3 keeps its gate in bfloat16, ModelOpt
#: keeps routers "in original precision", llm-compressor's MoE recipes ignore "mlp.gate").
NOT_LINEAR = ("lm_head", "head", "wte", "wpe", "shared", "gate")


def is_linear_weight(name: str, shape) -> bool:
    """A linear layer's weight by its name and shape: 2-D, named ``*weight``, not an
    embedding, an output head or a router (``NOT_LINEAR``) -- what quantization recipes
    quantize and keep the rest (embeddings, heads, norms, biases) in high precision:
    ``fmt quantize --layout`` and ``fmt audit``'s ``model-bits``."""
    parts = name.lower().split(".")
    return (len(tuple(shape)) == 2 and parts[-1] == "weight"
            and not any("embed" in p or "router" in p or p in NOT_LINEAR
                        or p.endswith("_gate") for p in parts[:-1]))

