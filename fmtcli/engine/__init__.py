"""The quantization engine that ``fmt quantize``, scale-search, kv and compare share (layer 4).

``x_q = cast(x * scale) / scale`` over whole tensors, in chunks, on forked workers or in one
CUDA kernel.  It imports no analysis; ``fmtcli.quantize`` (the analysis) is its main user.

- ``run``         -- ``quantize_tensor`` (one tensor under every scheme) and
  ``quantize_totals`` (each scheme's total over many, for searches); ``plan_schemes``;
- ``first_pass``  -- the amax or |x| histogram a tensor-spanning scale needs first;
- ``chunk_pass``  -- ``ChunkPass``: every chunk under every plan, merged in chunk order;
- ``chunk``       -- ``ChunkKernel``: one chunk under one scheme (numpy path);
- ``chunk_native`` -- the same chunk by the compiled kernel (``numerics.native``);
- ``chunk_parts`` -- plans, tile amax, scales, per-block facts;
- ``results``, ``scales`` -- the frozen results (``to_dict()``) and the scales' summary;
- ``writers``     -- ``--out`` files; ``ranking`` -- the worst tensors;
- ``cuda``        -- where each scheme runs; ``cuda_kernel`` + ``quantize_stats.cu`` and
  ``torch_cuda`` -- the fused kernel and the torch API it needs.
"""
