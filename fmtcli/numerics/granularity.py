"""What one scale covers: the one vocabulary of every analysis.

A tensor is seen as a matrix (rows = the product of all dimensions but the last, columns =
the last; a 1-D tensor is one row), and each granularity is a *tile* of it that shares one
scale (``tile_shape``; ``numerics.tiles`` computes the amax and the scaled cast per tile):

    tensor       all rows x all columns
    row          1 x all columns             (one scale per row)
    column       all rows x 1                (one scale per column)
    block N      1 x N along the last axis, or N x 1 with ``axis=0``
    tile RxC     R x C  (DeepSeek-V3: 128x128 for weights, 1x128 for activations)
    head         all rows x D of a (tokens, heads x D) matrix: one scale per KV head
    token-head   1 x D of it: one scale per token and head

The kinds are ``base.choices.Granularity`` (its values are the spellings: ``tensor``,
``token-head``); a ``ScaleGroup`` is a kind with its size.  Its text form (``parse``,
``spelling``) is ``block:N`` and ``tile:RxC`` for the sized kinds.  Each command takes the
kinds it has: quantize's ``--per``/``--block``/``--tile``, attention's
``--scale-granularity`` (tensor, or blocks of ``--block-q``/``--block-k`` rows), dot's
``--scale-granularity`` (tensor, row, block:N), kv's ``--granularity`` (tensor, head,
token-head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fmtcli.base.choices import Granularity
from fmtcli.base.errors import Message, Param, UsageError

#: The largest block or tile side ``parse`` takes.
MAX_SIDE = 1 << 20
#: The kinds whose tile is a KV head's (they need the head's width).
HEAD_KINDS = (Granularity.HEAD, Granularity.TOKEN_HEAD)


@dataclass(frozen=True)
class ScaleGroup:
    """One granularity: its ``kind`` and, for ``block``, its length ``block`` and ``axis``
    (-1: along the last axis, 0: along the first); for ``tile``, its ``tile`` (rows,
    columns).  Sizes of other kinds are dropped (two groups are equal when they cover the
    same values)."""

    kind: Granularity
    block: int | None = None
    axis: int = -1
    tile: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        kind = Granularity(self.kind)
        object.__setattr__(self, "kind", kind)
        if kind is not Granularity.BLOCK:
            object.__setattr__(self, "block", None)
            object.__setattr__(self, "axis", -1)
        elif self.block is None or self.block < 1:
            raise UsageError(Param("block", self.block) + ": a block size must be >= 1")
        elif self.axis not in (0, -1):
            raise UsageError(Param("axis", self.axis) + ": the block axis must be -1 (last) "
                             "or 0 (first)")
        if kind is not Granularity.TILE:
            object.__setattr__(self, "tile", None)
        elif self.tile is None or min(self.tile) < 1:
            raise UsageError(f"tile sides must be >= 1, got {self.tile[0]}x{self.tile[1]}")
        else:
            object.__setattr__(self, "tile", (int(self.tile[0]), int(self.tile[1])))

    @classmethod
    def parse(cls, text: str, kinds=tuple(Granularity), default_block: int = 128,
              param: str = "granularity", message: Message | str | None = None
              ) -> ScaleGroup:
        """``tensor``, ``row``, ``column``, ``block`` (``default_block``), ``block:N``,
        ``block:N,axis=0``, ``tile:RxC``, ``head`` or ``token-head``, among ``kinds``;
        anything else is a UsageError: ``message``, or one naming ``param`` and the kinds."""
        value = text.strip().lower()
        name, sized, size = value.partition(":")
        try:
            kind = Granularity(name)
        except ValueError:
            kind = None
        group = None
        if kind in kinds:
            if kind is Granularity.BLOCK:
                length, _, axis = (size if sized else str(default_block)).partition(",")
                if _side(length) and axis in ("", "axis=0"):
                    group = cls(kind, int(length), 0 if axis else -1)
            elif kind is Granularity.TILE:
                rows, _, cols = size.partition("x")
                if _side(rows) and _side(cols):
                    group = cls(kind, tile=(int(rows), int(cols)))
            elif not sized:
                group = cls(kind)
        if group is None:
            choices = ", ".join({"block": "block:N", "tile": "tile:RxC"}.get(k.value, k.value)
                                for k in kinds)
            raise UsageError(message or Param(param, text) + f": one of {choices}")
        return group

    @property
    def spelling(self) -> str:
        """The text ``parse`` reads back: ``tensor``, ``block:32``, ``tile:128x128`` ..."""
        if self.kind is Granularity.BLOCK:
            return f"block:{self.block}" + (",axis=0" if self.axis == 0 else "")
        if self.kind is Granularity.TILE:
            return f"tile:{self.tile[0]}x{self.tile[1]}"
        return self.kind.value

    @property
    def label(self) -> str:
        """A table's header: 'per-tensor', 'block 128', 'block 32 (axis 0)', 'tile 1x128'."""
        if self.kind is Granularity.BLOCK:
            return f"block {self.block}" + (" (axis 0)" if self.axis == 0 else "")
        if self.kind is Granularity.TILE:
            return f"tile {self.tile[0]}x{self.tile[1]}"
        return f"per-{self.kind.value}"

    def tile_shape(self, rows: int, cols: int, ndim: int = 2,
                   head_dim: int | None = None) -> tuple[int, int]:
        """The (rows, columns) of the tile that shares one scale in a rows x cols matrix,
        clipped to it.  A 1-D tensor (``ndim`` 1, one row): blocks run along its only axis.
        ``head`` and ``token-head`` take the matrix as (tokens, heads x ``head_dim``)."""
        kind = self.kind
        if kind is Granularity.TENSOR:
            shape = (rows, cols)
        elif kind is Granularity.ROW:
            shape = (1, cols)
        elif kind is Granularity.COLUMN:
            shape = (rows, 1)
        elif kind is Granularity.BLOCK:
            shape = (1, self.block) if self.axis == -1 or ndim <= 1 else (self.block, 1)
        elif kind is Granularity.TILE:
            shape = self.tile
        else:
            if head_dim is None or head_dim < 1 or cols % head_dim:
                raise UsageError(f"granularity {kind.value!r} needs the width of a head "
                                 f"dividing the {cols} columns, got "
                                 + Param("head_dim", head_dim))
            shape = (rows if kind is Granularity.HEAD else 1, head_dim)
        return max(1, min(shape[0], rows)), max(1, min(shape[1], cols))


def _side(text: str) -> bool:
    """A block or tile side as ``parse`` takes it: digits, 1 to MAX_SIDE."""
    return text.isdigit() and 0 < int(text) <= MAX_SIDE


#: In a 3-D tensor, a last axis shorter than this is a conv1d weight's kernel axis
#: (O x I x K: Whisper's K = 3, wav2vec2's feature extractor 10/3/2, Mamba's 4, Conformer's
#: depthwise 31); from this length up the tensor is stacked matrices (experts E x O x I,
#: heads x seq x dim).  32 is the MX recipes' block: a kernel axis could not fill one.
KERNEL_AXIS = 32


def view_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its trailing size-1 axes (at least one axis kept, none for a
    scalar): an O x I x K x 1 conv weight is blocked as O x I x K, an N x 1 column as N."""
    shape = tuple(int(n) for n in shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the matrix view every command blocks a tensor by.

    Trailing size-1 axes are dropped first (``view_shape``): a scalar is 1 x 1, a vector
    (or an N x 1 column) one row, a matrix itself.  A tensor of 4 or 5 (or more) axes is a
    convolution weight O x I x kh x kw (x kd): its first axis by the rest, O x I*kh*kw,
    the view of per-output-channel scales (a trailing kw = 1 changes nothing).  A 3-D
    tensor is a conv1d weight O x I x K, read the same way, when its last axis is shorter
    than ``KERNEL_AXIS``; else stacked matrices (E x O x I: all leading axes by the last).
    Blocks and rows run along the columns; the view is a reshape of the C-order data."""
    shape = tuple(int(n) for n in shape)
    view = view_shape(shape)
    if len(view) <= 1:
        return 1, (view[0] if view else 1)
    if len(shape) >= 4 or (len(view) == 3 and view[-1] < KERNEL_AXIS):
        return view[0], math.prod(view[1:])
    return math.prod(view[:-1]), view[-1]
