"""``fmt quantize``: scaled quantization of whole tensors and its statistics (the public door).

``x_q = cast(x * scale) / scale`` for every block, tile, row or tensor scale of a scheme
(``fmtcli.numerics.schemes``), streamed in chunks over worker processes, or in one fused CUDA
kernel.  This analysis's rooms:

- ``run``         -- ``quantize``: many tensors, their total and groups by role, worst blocks;
- ``outputs``     -- ``--out`` (.npy values, .npz/.safetensors codes and scales);
- ``distributed`` -- ``--dask``: the same work as tasks on a Dask cluster (``dask_tasks``:
  what a worker runs).

The engine it runs on is ``fmtcli.engine`` (shared with scale-search, kv and compare):
``engine.run.quantize_tensor`` and ``quantize_totals`` (one tensor; totals alone, for
searches), ``engine.chunk`` (one chunk under one scheme), ``engine.chunk_pass`` and
``engine.first_pass`` (a tensor's passes), ``engine.results`` (the frozen results),
``engine.cuda`` (where each scheme runs) and the fused kernel.
"""

from fmtcli.engine.results import QuantizeResult, SchemeStats, TensorResult
from fmtcli.engine.run import quantize_tensor, quantize_totals
from fmtcli.engine.scales import ScaleSummary
from fmtcli.quantize.run import quantize
from fmtcli.streaming.stream import CHUNK_ELEMENTS

__all__ = ["CHUNK_ELEMENTS", "QuantizeResult", "ScaleSummary", "SchemeStats", "TensorResult",
           "quantize", "quantize_tensor", "quantize_totals"]
