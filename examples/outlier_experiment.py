"""The article's outlier experiment with the fmtcli library: one FP8 scale per tensor vs one
per block of 128 values.

1,024 values of typical size 0.001 plus one outlier of 100, cast to E4M3 (OCP, max 448):
scaling the whole tensor so that 100 maps to 448 flushes about 16% of the small values and
leaves a median relative error of about 14%; a scale per block of 128 isolates the outlier
and brings the median error down to about 2%.  Exits 1 if the figures disagree.
"""

import sys

from fmtcli.inputs.tensors import example_tensor
from fmtcli.numerics.formats import get_format
from fmtcli.numerics.schemes import Granularity, Scheme
from fmtcli.quantize import quantize

e4m3 = get_format("float8_e4m3fn")
per_tensor = Scheme(e4m3, Granularity.TENSOR)
per_block = Scheme(e4m3, Granularity.BLOCK, block=128)
result = quantize([example_tensor()], [per_tensor, per_block])
tensor_stats, block_stats = result.tensors[0].schemes

print("x_q = cast(x * scale) / scale, E4M3, 1,025 values (1,024 of size ~0.001, one of 100)")
print(f"{'':12s} {'flushed':>8s} {'median rel error':>17s} {'SQNR':>8s}")
for name, stats in (("per tensor", tensor_stats), ("block 128", block_stats)):
    print(f"{name:12s} {stats.flushed_fraction:8.1%} {stats.median_rel_error:17.1%} "
          f"{stats.sqnr_db:6.1f}dB")

problems = []
if not 0.15 <= tensor_stats.flushed_fraction <= 0.17:
    problems.append(f"per-tensor flushed {tensor_stats.flushed_fraction:.1%}, article: 16%")
if not 0.13 <= tensor_stats.median_rel_error <= 0.15:
    problems.append(f"per-tensor median {tensor_stats.median_rel_error:.1%}, article: 14%")
if not 0.015 <= block_stats.median_rel_error <= 0.03:
    problems.append(f"block-128 median {block_stats.median_rel_error:.1%}, article: ~2%")
for problem in problems:
    print(f"MISMATCH: {problem}", file=sys.stderr)
if problems:
    sys.exit(1)
print("As the article says: per-block scales rescue the small values.")
