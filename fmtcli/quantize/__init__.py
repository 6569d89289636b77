"""The quantize engine: scaled quantization of whole tensors and its statistics.

``x_q = cast(x * scale) / scale`` for every block, tile, row or tensor scale of a scheme
(``fmtcli.numerics.schemes``), streamed in chunks over worker processes, or in one fused CUDA
kernel.  The rooms:

- ``engine``  -- ``quantize`` (many tensors, a total, ``--out``), ``quantize_tensor`` and
  ``quantize_totals`` (the totals alone, for searches);
- ``stream``  -- the chunk grid and reader (shared with scale-search and loss-scale);
- ``chunk``   -- the arithmetic of one chunk under one scheme;
- ``metrics`` -- the mergeable error accumulator (exact histogram quantiles);
- ``results`` -- the frozen result objects (``to_dict()`` for JSON);
- ``parallel`` -- forked workers writing into shared memory;
- ``writers`` -- ``--out`` files (.npy values, .npz/.safetensors codes and scales);
- ``cuda``    -- where each scheme runs (the one GPU decision); ``cuda_kernel`` and
  ``torch_cuda`` -- the fused kernel (``quantize_stats.cu``) and the torch API it needs.
"""

from fmtcli.engine.results import QuantizeResult, ScaleSummary, SchemeStats, TensorResult
from fmtcli.engine.run import quantize, quantize_tensor, quantize_totals
from fmtcli.streaming.stream import CHUNK_ELEMENTS

__all__ = ["CHUNK_ELEMENTS", "QuantizeResult", "ScaleSummary", "SchemeStats", "TensorResult",
           "quantize", "quantize_tensor", "quantize_totals"]
