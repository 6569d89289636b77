"""How the engine's tests run one in-memory tensor through ``fmtcli.quantize.quantize``
(no files, no command line): ``source`` wraps an array as a ``TensorSource``, ``stats`` gives one
scheme's JSON statistics, ``heavy`` the data whose mx-floor blocks keep a value past E4M3's max."""

from __future__ import annotations

import numpy as np

from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize


def source(x, key=None, name="mem") -> TensorSource:
    x = np.asarray(x)
    return TensorSource(name, key, x.shape, str(x.dtype), lambda: x)


def stats(x, workers=1, **kwargs) -> dict:
    """The JSON statistics of one scheme on one in-memory tensor."""
    scheme = build_scheme(**kwargs)
    result = quantize([source(x)], [scheme], workers=workers)
    return result.tensors[0].schemes[0].to_dict()


def heavy(n=4096, seed=5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(
        -6, 6, n).astype(np.float32)
    x[::97] = 500  # mx-floor leaves 500 past E4M3's 448 in its block
    return x


class Spy:
    """The compiled module with its ``quantize_chunk`` calls recorded (the ``kind`` each
    chunk came as); everything else passes through."""

    def __init__(self, module) -> None:
        self.module, self.kinds = module, []

    def __getattr__(self, name):
        return getattr(self.module, name)

    def quantize_chunk(self, *args, **kwargs):
        self.kinds.append(kwargs.get("kind", 0))
        return self.module.quantize_chunk(*args, **kwargs)
