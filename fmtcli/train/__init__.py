"""``fmt train``: does the loss under a low-precision recipe track a BF16 baseline?

A seeded small decoder-only transformer (``model``) is trained on bytes of real text
(``data``: the Python standard library's own source files, or a file the user names) once
per recipe, every block Linear's three GEMMs with emulated quantization of their inputs
(``gemm``: the casts of ``casts``/``recipes``), FP32 master weights and AdamW state
(``loop``).  The result (``results``) holds the loss curves, the gap of each recipe's final
smoothed loss to the BF16 baseline with the baseline's own seed-to-seed spread, divergence,
and what each recipe did to the tensors per layer and role (``tensor_stats``).
``capture`` writes chosen steps' activations, weights and gradients as safetensors.

torch is an optional extra (``pip install 'fmtcli[torch]'``): nothing here imports it
until a run is asked for, and without it ``train`` raises one UsageError.
"""

from __future__ import annotations

from fmtcli.base.lazy import lazy_exports

_EXPORTS = {
    "train": "loop",
    "DEFAULT_RECIPES": "loop",
    "TrainSettings": "results",
    "TrainResult": "results",
    "RecipeRun": "results",
    "TensorRecord": "results",
    "get_recipe": "recipes",
    "parse_recipes": "recipes",
    "RECIPE_NAMES": "recipes",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = sorted(_EXPORTS)
