"""``--capture DIR --capture-steps S1,S2``: the tensors of chosen steps as safetensors.

For each captured step of the baseline run (seed ``seed``), one file
``DIR/step-000100.safetensors`` holds, for every quantized Linear, the inputs of its GEMMs
as FP32 before any cast: ``layers.3.mlp.fc1.input`` (the activation, tokens x in),
``layers.3.mlp.fc1.weight`` (the FP32 master weight, out x in) and
``layers.3.mlp.fc1.grad_output`` (the gradient of the Linear's output, tokens x out,
divided by the loss scale: the true gradient), so that ``fmt quantize``, ``fmt
scale-search`` and ``fmt loss-scale`` can be run on real training tensors.  The weight is
the one the step's forward pass used (before its update).

Files are written by the project's one safetensors writer (``engine.writers``: to a
temporary beside the target, renamed when complete).  Every target is checked before
training starts: an existing file is replaced only with ``force``; ``DIR`` is created if it
does not exist (its parent must).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fmtcli.base.errors import Param, UsageError, shown
from fmtcli.engine.writers import check_target, write_safetensors


def step_file(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step:06d}.safetensors")


@dataclass
class Capture:
    """The planned captures; ``written`` the files done so far."""

    folder: str
    steps: tuple[int, ...]
    force: bool = False
    written: list[str] = field(default_factory=list)

    @classmethod
    def plan(cls, folder: str, steps, force: bool = False) -> Capture:
        """Check the folder and every target now, before any training; create the folder."""
        steps = tuple(sorted(set(int(s) for s in steps)))
        if not steps:
            raise UsageError(Param("capture_dir", folder) + " needs steps to capture",
                             "name them with " + Param("capture_steps", "S1,S2"))
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise UsageError(Param("capture_dir", folder) + " is not a directory")
        parent = os.path.dirname(os.path.abspath(folder))
        if not os.path.isdir(parent):
            raise UsageError("the parent of " + Param("capture_dir", folder)
                             + f", {shown(parent)}, is not a directory")
        for step in steps:  # before the folder is made: nothing written on a refusal
            target = step_file(folder, step)
            if os.path.lexists(target) and not force:
                raise UsageError(f"{shown(target)} exists",
                                 "pass " + Param("force", True) + " to replace it")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as error:
            raise UsageError(f"cannot create {shown(folder)} ({error.strerror or error})"
                             ) from None
        for step in steps:
            check_target(step_file(folder, step), [], force)
        return cls(folder, steps, force)

    def write(self, step: int, tensors: dict) -> str:
        """The step's tensors (name -> float32 CPU torch tensor), in model order."""
        arrays = {name: tensor.numpy() for name, tensor in _ordered(tensors)}
        path = step_file(self.folder, step)
        write_safetensors(path, arrays, {"producer": "fmt train", "step": str(step)})
        self.written.append(path)
        return path


def _ordered(tensors: dict):
    """By layer in the order first seen, then input, weight, grad_output."""
    rank = {"input": 0, "weight": 1, "grad_output": 2}
    layers: list[str] = []
    for name in tensors:
        layer = name.rpartition(".")[0]
        if layer not in layers:
            layers.append(layer)
    return sorted(tensors.items(), key=lambda item: (layers.index(item[0].rpartition(".")[0]),
                                                     rank.get(item[0].rpartition(".")[2], 3)))
