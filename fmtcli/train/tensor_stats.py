"""What a recipe's casts did to the tensors during training, per layer and role.

``TensorStats`` holds one ``casts.CastCount`` per (layer, role) -- role ``activation``,
``weight`` or ``grad_output`` -- summed over the steps (``gemm`` adds to them), and for
gradients cast to float16 the underflow counts of Micikevicius et al. (2018, §3.2: the
gradients FP16 cannot hold): the nonzero gradients whose magnitude is at most half FP16's
smallest subnormal, 2^-25, which round-to-nearest flushes to zero -- once as the GEMM sees
them (times the loss scale) and once as the true gradients (without it).  These are the
statistics Transformer Engine's debug features log (underflows %, overflows %, scale
ranges), here for any recipe on any device.
"""

from __future__ import annotations

from fmtcli.train.casts import CastCount
from fmtcli.train.results import ROLES, TensorRecord

#: FP16's smallest subnormal over two: nonzero magnitudes at or below it flush to zero
#: (the tie at 2^-25 rounds to the even neighbour, zero).
FP16_FLUSH = 2.0**-25


class TensorStats:
    """The counts of one run, in the order the layers were first seen."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], CastCount] = {}
        self.formats: dict[tuple[str, str], str] = {}
        self.order: list[str] = []
        # layer -> [nonzero, flushed as the GEMM sees them, flushed without the loss scale]
        self.fp16: dict[str, list[int]] = {}

    def count(self, layer: str, role: str, format: str) -> CastCount:
        key = (layer, role)
        if key not in self.counts:
            self.counts[key] = CastCount()
            self.formats[key] = format
            if layer not in self.order:
                self.order.append(layer)
        return self.counts[key]

    def underflow(self, layer: str, dy, loss_scale: float, format: str) -> None:
        """Count ``dy`` (the scaled gradient a GEMM receives) against FP16's flush point,
        with the loss scale and without it; only where the gradient is cast to float16."""
        if format != "float16":
            return
        import torch

        a = dy.detach().abs()
        nonzero = a != 0
        scaled = int(torch.count_nonzero(nonzero & (a <= FP16_FLUSH)))
        true = int(torch.count_nonzero(nonzero & (a <= FP16_FLUSH * loss_scale)))
        row = self.fp16.setdefault(layer, [0, 0, 0])
        row[0] += int(torch.count_nonzero(nonzero))
        row[1] += scaled
        row[2] += true

    def records(self) -> tuple[TensorRecord, ...]:
        """One record per (layer, role) seen, layers in model order, roles in ``ROLES`` order."""
        out = []
        for layer in self.order:
            for role in ROLES:
                count = self.counts.get((layer, role))
                if count is not None:
                    out.append(self._record(layer, role, count))
        return tuple(out)

    def _record(self, layer: str, role: str, count: CastCount) -> TensorRecord:
        figures = count.to_dict()
        scaled = unscaled = None
        row = self.fp16.get(layer)
        if role == "grad_output" and row is not None and row[0]:
            scaled, unscaled = row[1] / row[0], row[2] / row[0]
        return TensorRecord(
            layer=layer, role=role, format=self.formats[(layer, role)],
            elements=count.elements, nonzero=count.nonzero, flushed=count.flushed,
            saturated=count.saturated, amax_min=figures["amax_min"],
            amax_max=figures["amax_max"], scale_min=figures["scale_min"],
            scale_max=figures["scale_max"], steps=count.steps,
            fp16_underflow_scaled=scaled, fp16_underflow_unscaled=unscaled)
