"""``fmt kv``'s inputs: K and V tensors found by name (or ``--k``/``--v``) and put in
(tokens, heads, dim) float32 by ``--layout``; the built-in synthetic example."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.inputs.tensors import TensorSource

AXES = ("layers", "batch", "tokens", "heads", "dim")
DEFAULT_LAYOUT = "tokens,heads,dim"
K_NAMES, V_NAMES = {"k", "key", "keys", "k_cache"}, {"v", "value", "values", "v_cache"}
_INDEX = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


def parse_layout(layout: str) -> tuple[str, ...]:
    axes = tuple(a.strip() for a in layout.split(","))
    unknown = [a for a in axes if a not in AXES]
    if unknown or len(set(axes)) != len(axes) or not {"heads", "dim"} <= set(axes):
        raise UsageError(Param("layout", layout) + f": axes from {', '.join(AXES)}, each once, "
                         "with heads and dim (e.g. tokens,heads,dim)")
    return axes


def _to_tokens_heads_dim(x: np.ndarray, axes: tuple[str, ...], name: str) -> np.ndarray:
    """(tokens, heads, dim) float32, every axis but heads and dim merged into tokens."""
    if x.ndim != len(axes):
        raise DataError(f"{shown(name)}: {x.ndim} axes, but the layout names {len(axes)} "
                        f"({','.join(axes)}): give --layout")
    order = [axes.index(a) for a in axes if a not in ("heads", "dim")]
    x = np.transpose(x, order + [axes.index("heads"), axes.index("dim")])
    x = np.ascontiguousarray(x.reshape(-1, x.shape[-2], x.shape[-1]), dtype=np.float32)
    if not x.size:
        raise DataError(f"{shown(name)}: empty")
    if not x.any():
        raise DataError(f"{shown(name)}: every value is 0 (no scale to choose, no error to "
                        "measure)")
    if not np.isfinite(x).all():  # an amax of inf or NaN makes no scale
        raise DataError(f"{shown(name)}: {int((~np.isfinite(x)).sum()):,} value(s) inf or "
                        "NaN (or beyond float32)")
    return x


def stream_of(source: TensorSource, kind: str | None = None
              ) -> tuple[int | None, str] | None:
    """(layer index or None, 'k' or 'v') from a tensor's name (``layers.3.k``,
    ``model.layers.3.self_attn.v_cache``; a .npy file's name without its suffix); with
    ``kind`` (``--k``/``--v`` files) every tensor is of that stream, its layer from its
    name."""
    name = source.key if source.key is not None else re.sub(r"\.npy$", "", source.source)
    name = name.rsplit("/", 1)[-1]
    last = name.rsplit(".", 1)[-1].lower()
    if kind is None:
        kind = "k" if last in K_NAMES else "v" if last in V_NAMES else None
    if kind is None:
        return None
    index = _INDEX.search(name)
    return (int(index.group(1)) if index else None), kind


class KvStreams(Mapping):
    """(layer, 'k'/'v') -> (tokens, heads, dim) float32, each made from its tensor when it is
    asked for and not kept: one stream in memory at a time (and the one before it while
    the next is made), not every K and V of a dump at once.  ``loaders``: key -> a
    function making the array (``kv_streams`` checks each once when it is found)."""

    def __init__(self, loaders: dict) -> None:
        self.loaders = dict(sorted(loaders.items()))

    def __getitem__(self, key) -> np.ndarray:
        return self.loaders[key]()

    def __iter__(self):
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)


def _loader(source: TensorSource, axes: tuple[str, ...], layer: int | None = None):
    """A function making ``source``'s (layer ``layer`` of a layers axis) stream."""
    def load() -> np.ndarray:
        data = np.asarray(source.array())
        if layer is None:
            return _to_tokens_heads_dim(data, axes, source.name)
        part = np.moveaxis(data, axes.index("layers"), 0)[layer]
        return _to_tokens_heads_dim(part, tuple(a for a in axes if a != "layers"),
                                    source.name)
    return load


def kv_streams(sources: list[TensorSource], layout: str = DEFAULT_LAYOUT,
               kind: str | None = None, out: KvStreams | None = None,
               names: dict | None = None) -> KvStreams:
    """(layer, 'k'/'v') -> (tokens, heads, dim) float32 of every K and V tensor (every
    tensor is of stream ``kind`` when given), added to ``out``'s when given; ``names``, when
    given, gets (layer, 'k'/'v') -> the tensor's name, for errors.  The arrays are made when
    read (``KvStreams``); each new one is made once here, so that a bad tensor (NaN, all
    zero, the wrong axes) is refused before any analysis."""
    names = {} if names is None else names
    axes = parse_layout(layout)
    loaders = {} if out is None else dict(out.loaders)
    new = []
    for source in sources:
        found = stream_of(source, kind)
        if found is None or source.skipped:
            continue
        layer, stream = found
        if "layers" in axes:
            if layer is not None:
                raise DataError(f"{shown(source.name)}: the layout has a layers axis, but "
                                "the name gives a layer too")
            if len(source.shape) != len(axes):  # _to_tokens_heads_dim's words
                raise DataError(f"{shown(source.name)}: {len(source.shape)} axes, but the "
                                f"layout names {len(axes)} ({','.join(axes)}): give --layout")
            for i in range(source.shape[axes.index("layers")]):
                if (i, stream) in loaders:
                    raise DataError(f"{shown(source.name)}: a second {stream.upper()} of "
                                    f"layer {i}")
                loaders[(i, stream)] = _loader(source, axes, i)
                names[(i, stream)] = f"{source.name}[{i}]"
                new.append((i, stream))
            continue
        key = (0 if layer is None else layer, stream)
        if key in loaders:
            raise DataError(f"{shown(source.name)}: a second {stream.upper()} of layer {key[0]}")
        loaders[key] = _loader(source, axes)
        names[key] = source.name
        new.append(key)
    if not loaders:
        skipped = [f"{shown(s.name)}: {s.skipped}" for s in sources
                   if s.skipped and stream_of(s, kind)]
        if skipped:
            raise DataError("no usable K or V tensor", "; ".join(skipped[:4]))
        names = ", ".join(shown(s.name) for s in sources[:4])
        raise DataError(f"no K or V tensor in {names or 'the inputs'} (names ending in "
                        ".k/.key/.k_cache or .v/.value/.v_cache)")
    for key in new:  # each checked once, then let go
        loaders[key]()
    return KvStreams(loaders)


def example_kv(layers: int = 2, tokens: int = 512, heads: int = 4, dim: int = 64,
               seed: int = 16) -> dict[tuple[int, str], np.ndarray]:
    """Synthetic K and V with the shape of real ones: K with a few outlier channels (the
    same dims in every token, as rotary keys have) and heads of different magnitudes; V
    heavy-tailed (Student's t, 3 degrees of freedom) and small."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(layers):
        k = rng.standard_normal((tokens, heads, dim))
        k *= (2.0 ** np.arange(heads))[None, :, None]  # heads of 1x, 2x, 4x, 8x magnitude
        channels = rng.choice(dim, 2, replace=False)
        k[:, :, channels] *= 30.0 * (layer + 1)
        v = rng.standard_t(3, (tokens, heads, dim)) * 0.05
        out[(layer, "k")] = k.astype(np.float32)
        out[(layer, "v")] = v.astype(np.float32)
    return out
