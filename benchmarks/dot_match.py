"""Which emulated accumulator best matches the GPU's FP8 GEMM?  torch._scaled_mm (with and
without use_fast_accum) on the codes and scales of fmtcli.arithmetic.dot, against the
emulation at several accumulator widths, with and without FP32 promotion every 128:
||C_gpu - C_emu||_F / ||C_gpu||_F and the fraction of outputs equal to the bit.

    PYTHONPATH=$PWD python3 benchmarks/dot_match.py [M N K] > out.txt   (needs CUDA)
"""

from __future__ import annotations

import sys

import numpy as np

from fmtcli.arithmetic import dot as D
from fmtcli.arithmetic.dot_cuda import scaled_mm_output
from fmtcli.numerics.formats import get_format

WIDTHS = (10, 11, 12, 13, 14, 15, 16, 18, 23)


def main() -> None:
    m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (256, 256, 4096)
    spec = get_format("float8_e4m3fn")
    a, b = D.random_operands(m, n, k, seed=0)
    qa, qb = D.quantize_operands(a, b, spec, "tensor", None)
    ref = D.exact_products(qa, qb)
    for fast in (False, True):
        hw = scaled_mm_output(qa, qb, spec, "tensor", fast).astype(np.float64)
        e = D.error_figures(hw, ref)
        print(f"_scaled_mm use_fast_accum={fast}: vs float64 of the quantized inputs: "
              f"max_rel {e.max_rel_error:.3g}, rel_fro {e.rel_fro_error:.3g}, "
              f"calc_diff {e.calc_diff:.3g}")
        print(f"  {'bits':>4} {'promote':>7} {'rel_fro(gpu-emu)':>17} {'identical':>9} "
              f"{'emu rel_fro':>11}")
        best = None
        for promote in (None, 128):
            for bits in WIDTHS:
                c = D.emulate_gemm(qa, qb, "tensor", None, bits=bits,
                                   promote_every=promote).astype(np.float64)
                gap = float(np.linalg.norm(hw - c) / np.linalg.norm(hw))
                same = float(np.mean(hw == c))
                emu = D.error_figures(c, ref).rel_fro_error
                print(f"  {bits:>4} {str(promote):>7} {gap:>17.3g} {same:>9.1%} {emu:>11.3g}")
                if best is None or gap < best[0]:
                    best = (gap, bits, promote, same)
        print(f"  best match: {best[1]} bits, promote {best[2]}: rel_fro(gpu-emu) "
              f"{best[0]:.3g}, {best[3]:.1%} identical")


if __name__ == "__main__":
    main()
