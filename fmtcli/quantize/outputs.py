"""``fmt quantize --out``: one scheme's results of every tensor, written as it runs.

``.npy``: the dequantized values ``x_q = cast(x * scale) / scale`` of the single tensor,
written chunk by chunk into the file (``writers.NpyWriter``: a temporary, renamed when
done); ``.npz`` / ``.safetensors``: each tensor's element codes (the rounded ``x * scale``
on the format's grid) and its scale grid, gathered in shared memory and written at the end
(``writers.write_codes``).  The path is checked beforehand (``writers.check_target``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fmtcli.base.errors import Param, UsageError
from fmtcli.engine.writers import NpyWriter, codes_of, output_names, write_codes
from fmtcli.inputs.tensors import TensorSource
from fmtcli.numerics.scaling import Product
from fmtcli.numerics.schemes import Scheme
from fmtcli.streaming.parallel import shared_array
from fmtcli.streaming.stream import matrix_shape


class Output:
    """What ``--out`` writes in one run: scheme ``keep`` of ``schemes`` (an index; None
    without ``--out``), to ``path``, as values (``.npy``) or codes and scales.

    Per tensor: ``sink(source)`` gives the ``sink(row_slice, col_slice, array)`` that the
    engine calls in its workers (None: nothing to keep), ``done(source, runs, kept)`` takes
    the tensor's scale grid once it ran, ``abort()`` removes a half-written ``.npy``;
    ``finish()`` writes the codes file and says what was written (the JSON's ``output``)."""

    def __init__(self, path: str | None, out_scheme: int, schemes: list[Scheme],
                 usable: list[TensorSource]) -> None:
        self.path, self.schemes = path, schemes
        self.keep = None if path is None else range(len(schemes))[out_scheme]
        self.to_npy = path is not None and path.lower().endswith(".npy")
        if self.to_npy and len(usable) != 1:
            raise UsageError(Param("out", path) + ": a .npy holds one tensor and there are "
                             f"{len(usable)}",
                             "write .npz or .safetensors")
        # the codes file's member names (distinct per tensor)
        self.names = {} if path is None else dict(zip(map(id, usable), output_names(usable)))
        self.coded: list[tuple] = []
        self.writer: NpyWriter | None = None
        self.codes: np.ndarray | None = None

    @property
    def keep_mode(self) -> str:
        """What the engine keeps of the written scheme: "values" (x_q) or "codes"."""
        return "values" if self.to_npy else "codes"

    def sink(self, source: TensorSource) -> Callable | None:
        """Open this tensor's destination; the engine's ``sink`` for it (None: no ``--out``)."""
        self.writer = self.codes = None
        if self.keep is None:
            return None
        if self.to_npy:
            wide = (source.dtype == "float64"
                    and self.schemes[self.keep].product is Product.EXACT)  # x_q in float64
            self.writer = NpyWriter(self.path, source.shape, np.float64 if wide else np.float32)
            return self.writer.write
        rows, cols = matrix_shape(source.shape)
        spec = self.schemes[self.keep].format
        codes = shared_array((rows, cols), codes_of(np.zeros(1, np.float32), spec).dtype)
        self.codes = codes

        def sink(rs, cs, block, codes=codes, spec=spec):
            codes[rs, cs] = codes_of(block, spec)

        return sink

    def abort(self) -> None:
        """The tensor failed: remove what its ``.npy`` writer had written."""
        if self.writer is not None:
            self.writer.abort()

    def done(self, source: TensorSource, runs: list, kept) -> None:
        """The tensor ran: close its ``.npy``, or keep its codes and ``kept`` scale grid
        (``quantize_tensor``'s (grid, tile)) for the codes file."""
        if self.writer is not None:
            self.writer.close()
        elif self.codes is not None:
            grid, tile = kept
            applied = runs[self.keep].scheme
            self.coded.append((self.names[id(source)],
                               np.array(self.codes).reshape(source.shape), grid,
                               {"scheme": applied.to_dict(), "tile": list(tile),
                                "shape": list(source.shape),
                                "matrix": list(matrix_shape(source.shape))}))
        self.writer = self.codes = None

    def finish(self) -> dict | None:
        """Write the codes file (where codes were kept); what ``--out`` wrote (None: no
        ``--out``): its path, the scheme's label and the content."""
        if self.coded:
            write_codes(self.path, self.coded)
        if self.path is None:
            return None
        return {"path": self.path, "scheme": self.schemes[self.keep].label,
                "content": "dequantized values" if self.to_npy else "codes and scales"}
