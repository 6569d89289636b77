"""The module paths of fmtcli before its layer folders (version 0.1's flat layout), still
importable: ``import fmtcli.tensors`` gives a stand-in that forwards every name to
``fmtcli.inputs.tensors`` and warns once (DeprecationWarning) that the path has moved.
docs/python-api.md lists the current paths; these go in a later release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {  # old dotted path -> where it lives now (a module split in two: its parts, in order)
    "fmtcli.arithmetic.exactsum": "fmtcli.numerics.exactsum",
    "fmtcli.attention.exact": "fmtcli.attention.reference fmtcli.numerics.exactsum",
    "fmtcli.backends": "fmtcli.numerics.backends",
    "fmtcli.checkpoints": "fmtcli.inputs.checkpoints",
    "fmtcli.choices": "fmtcli.base.choices",
    "fmtcli.conformance": "fmtcli.check_backends",
    "fmtcli.csvout": "fmtcli.render.csvout",
    "fmtcli.dtypes": "fmtcli.base.dtypes",
    "fmtcli.errors": "fmtcli.base.errors",
    "fmtcli.fates": "fmtcli.numerics.fates",
    "fmtcli.formats": "fmtcli.numerics.formats",
    "fmtcli.jsonsafe": "fmtcli.render.jsonsafe",
    "fmtcli.lazy": "fmtcli.base.lazy",
    "fmtcli.literals": "fmtcli.numerics.literals",
    "fmtcli.lossscale": "fmtcli.loss_scale",
    "fmtcli.npyfile": "fmtcli.inputs.npyfile",
    "fmtcli.plaintable": "fmtcli.render.plaintable",
    "fmtcli.quantize.blocks": "fmtcli.streaming.blocks",
    "fmtcli.quantize.chunk": "fmtcli.engine.chunk",
    "fmtcli.quantize.cuda": "fmtcli.engine.cuda",
    "fmtcli.quantize.cuda_kernel": "fmtcli.engine.cuda_kernel",
    "fmtcli.quantize.engine": "fmtcli.engine.run fmtcli.quantize.run fmtcli.engine.chunk_pass",
    "fmtcli.quantize.metrics": "fmtcli.streaming.metrics",
    "fmtcli.quantize.native": "fmtcli.numerics.native",
    "fmtcli.quantize.parallel": "fmtcli.streaming.parallel",
    "fmtcli.quantize.ranking": "fmtcli.engine.ranking",
    "fmtcli.quantize.results": "fmtcli.engine.results fmtcli.engine.scales",
    "fmtcli.quantize.roles": "fmtcli.streaming.roles",
    "fmtcli.quantize.stream": "fmtcli.streaming.stream",
    "fmtcli.quantize.torch_cuda": "fmtcli.engine.torch_cuda",
    "fmtcli.quantize.writers": "fmtcli.engine.writers",
    "fmtcli.render_arithmetic": "fmtcli.render.arithmetic",
    "fmtcli.render_attention": "fmtcli.render.attention",
    "fmtcli.render_compare": "fmtcli.render.compare",
    "fmtcli.render_dot": "fmtcli.render.dot",
    "fmtcli.render_kv": "fmtcli.render.kv",
    "fmtcli.render_softmax": "fmtcli.render.softmax",
    "fmtcli.rounding": "fmtcli.numerics.rounding",
    "fmtcli.scalesearch": "fmtcli.scale_search",
    "fmtcli.scaling": "fmtcli.numerics.scaling",
    "fmtcli.schemes": "fmtcli.numerics.schemes",
    "fmtcli.tensors": "fmtcli.inputs.tensors",
    "fmtcli.textparse": "fmtcli.inputs.textparse",
}


class _Forward(importlib.abc.Loader):
    """Makes the old name a module whose attributes are the new module's."""

    def __init__(self, new: str) -> None:
        self.new = new.replace(" ", ", ")
        self.targets = new.split()

    def create_module(self, spec):
        return None  # the default: a fresh module object named by the old path

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(f"{module.__name__} has moved to {self.new}; import it from there",
                      DeprecationWarning, stacklevel=4)
        targets = [importlib.import_module(name) for name in self.targets]

        def forward(name: str):
            for target in targets:
                if hasattr(target, name):
                    return getattr(target, name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        module.__getattr__ = forward
        module.__dir__ = lambda: sorted({n for t in targets for n in dir(t)})
        module.__doc__ = f"Moved to {self.new} (this path forwards to it)."


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        new = MOVED.get(name)
        return importlib.util.spec_from_loader(name, _Forward(new)) if new else None


def install() -> None:
    """Put the finder on sys.meta_path once (fmtcli's ``__init__`` calls it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
