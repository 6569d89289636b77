"""The measurements behind ``fmt audit``'s ``clipping`` and ``lowest-codes`` thresholds.

    python scripts/audit_thresholds.py [--rows N]

For each layout (NVFP4, OCP MXFP4, compressed-tensors MXFP4, MXFP8, FP8 per 128x128 tile,
per row, INT4 per group of 128) and each kind of weight (Gaussian, Student-t(3), t(1.5)),
N x 1024 weights are quantized here from the definitions (numpy; the scale per group from
its amax: NVFP4's block scale amax / 6 rounded to E4M3; OCP MX ``2^(floor(log2 amax) -
emax)``; compressed-tensors' MX ``floor(log2 amax) - 2``, +1 where amax's mantissa is >=
1.75; FP8 and INT4 amax / max; DeepSeek's UE8M0 ``2^ceil(log2(amax / 448))``), healthy,
with half-size dequantization scales (the codes doubled and clipped) and with double ones,
and the codes are counted by fmt audit's own streamed pass (``fmtcli.audit.stats.measure``).
Printed: the share of nonzero groups that clip and that use only the lowest codes, as
docs/audit.md's table shows them.

    python scripts/audit_thresholds.py --mx-rule

``mx-scale-rule`` on MXFP4 (block 32) under compressed-tensors' and OCP's rules, uniform
(torch's Linear init), Gaussian and Student-t(3) weights of 128 rows at 64-8192 columns,
healthy and with half-size scales (the E8M0 byte one lower, the codes quantized with it
and clipped at 6), judged by fmt audit's own check (``layout_values.mx_scale_rule``):
the pile-up figure over its bound (largest healthy, least half-size), the flatness and
the verdicts -- docs/audit_layout_checks.md's table.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from fmtcli.audit.stats import measure
from fmtcli.inputs.layouts.base import FP4_VALUES, Quantized
from fmtcli.numerics.granularity import ScaleGroup

FP4 = np.unique(np.abs(FP4_VALUES)).astype(np.float64)


def fp4(v: np.ndarray) -> np.ndarray:
    """Nearest FP4 E2M1 value (ties to the even code), saturating at 6."""
    a = np.minimum(np.abs(v), 6.0)
    i = np.searchsorted((FP4[1:] + FP4[:-1]) / 2, a, side="left")
    return np.sign(v) * FP4[i]


def e4m3(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def ct_mx(amax: np.ndarray) -> np.ndarray:
    exponent = np.floor(np.log2(amax))
    return 2.0 ** (exponent - 2 + (amax / 2.0 ** exponent >= 1.75))


LAYOUTS = {  # name: (element, group (rows, cols), cast, max, scale of a group's amax)
    "NVFP4 (16)": ("float4_e2m1fn", (1, 16), fp4, 6.0,
                   lambda a: e4m3(a / 6)),
    "MXFP4 OCP (32)": ("float4_e2m1fn", (1, 32), fp4, 6.0,
                       lambda a: 2.0 ** (np.floor(np.log2(a)) - 2)),
    "MXFP4 compressed-tensors": ("float4_e2m1fn", (1, 32), fp4, 6.0, ct_mx),
    "MXFP8 (32)": ("float8_e4m3fn", (1, 32), e4m3, 448.0,
                   lambda a: 2.0 ** (np.floor(np.log2(a)) - 8)),
    "FP8 128x128": ("float8_e4m3fn", (128, 128), e4m3, 448.0, lambda a: a / 448),
    "FP8 per row": ("float8_e4m3fn", (1, 1024), e4m3, 448.0, lambda a: a / 448),
    "INT4 group 128": ("int4", (1, 128), np.round, 7.0, lambda a: a / 7),
    # compressed-tensors' symmetric INT4: amax / 7.5, clamped to [-8, 7]
    "INT4 g128 compressed-tensors": ("int4", (1, 128), lambda v: np.clip(np.round(v), -8, 7),
                                     8.0, lambda a: a / 7.5),
    # powers of two floored towards the max (DeepSeek's UE8M0, fmt's pow2-floor)
    "FP8 128x128 UE8M0": ("float8_e4m3fn", (128, 128), e4m3, 448.0,
                          lambda a: 2.0 ** np.ceil(np.log2(a / 448))),
}
FLOOR_TO_MAX = ("FP8 128x128 UE8M0",)
WEIGHTS = {"Uniform (torch's Linear init)": lambda rng, shape: rng.uniform(-1, 1, shape),
           "Gaussian": lambda rng, shape: rng.standard_normal(shape),
           "Student-t(3)": lambda rng, shape: rng.standard_t(3, shape),
           "Student-t(1.5)": lambda rng, shape: rng.standard_t(1.5, shape)}


def codes_of(x: np.ndarray, group: tuple[int, int], cast, top: float, scale_of,
             factor: float) -> tuple[np.ndarray, np.ndarray]:
    """The codes of ``x`` under ``factor`` x each group's scale, and the scales."""
    tr, tc = group
    rows, cols = x.shape
    view = x.reshape(rows // tr, tr, cols // tc, tc)
    amax = np.abs(view).max(axis=(1, 3), keepdims=True)
    scale = scale_of(amax) * factor
    return cast(np.clip(view / scale, -top, top)).reshape(rows, cols), scale


def shares(x: np.ndarray, element: str, group, cast, top, scale_of, factor,
           floor_to_max: bool) -> tuple:
    codes, scale = codes_of(x, group, cast, top, scale_of, factor)
    codes32 = codes.astype(np.float32)
    kind = ScaleGroup("tile", tile=group)
    q = Quantized("test", "w", "f", codes.shape, element, "float32", kind, {},
                  lambda r0, r1: codes32[r0:r1], {}, lambda r0, r1: codes32[r0:r1])
    c = measure(q, power_of_two=floor_to_max)[1]  # as fmt audit decides it
    return c.clipping / c.nonzero_groups, c.lowest / c.nonzero_groups


MX_WIDTHS = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192)
MX_RULES = {"compressed-tensors": ("compressed-tensors-mx", ct_mx),
            "ocp": ("ocp-mx", lambda a: 2.0 ** (np.floor(np.log2(a)) - 2))}


def mx_check(x: np.ndarray, layout: str, scale_of, factor: float):
    """fmt audit's mx-scale-rule on ``x`` quantized to MXFP4 under ``scale_of`` x factor."""
    from fmtcli.audit.layout_values import mx_scale_rule

    codes, scale = codes_of(x, (1, 32), fp4, 6.0, scale_of, factor)
    codes32, grid = codes.astype(np.float32), scale.reshape(x.shape[0], -1)
    q = Quantized(layout, "w", "f", codes.shape, "float4_e2m1fn", "e8m0",
                  ScaleGroup("block", block=32), {}, lambda r0, r1: codes32[r0:r1], {},
                  lambda r0, r1: codes32[r0:r1], lambda: grid)
    return mx_scale_rule(q, None)


def mx_table() -> None:
    print("| rule | weights | healthy: pile-up / bound (max) | verdicts | half-size: "
          "pile-up / bound (min) | verdicts |")
    print("|---|---|---|---|---|---|")
    for rule, (layout, scale_of) in MX_RULES.items():
        for weights in ("Uniform (torch's Linear init)", "Gaussian", "Student-t(3)"):
            cells = []
            for factor, pick in ((1, max), (0.5, min)):
                found = [mx_check(WEIGHTS[weights](np.random.default_rng(i), (128, i))
                                  / np.sqrt(i), layout, scale_of, factor)
                         for i in MX_WIDTHS]  # 1/sqrt(I): where amax sits in its binade
                ratio = pick(c.figures["pile_up"] / c.figures["pile_bound"] for c in found)
                seen = sorted({c.verdict.value for c in found})
                cells.append(f"{ratio:.2f} | {', '.join(seen)}")
            print(f"| {rule} | {weights} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--mx-rule", action="store_true", help="the mx-scale-rule table")
    args = parser.parse_args()
    if args.mx_rule:
        mx_table()
        return
    rows = args.rows
    print("| layout | weights | healthy | half-size scales (codes clip) | double scales |")
    print("|---|---|---|---|---|")
    for weights, draw in WEIGHTS.items():
        x = draw(np.random.default_rng(0), (rows, 1024))
        for name, (element, group, cast, top, scale_of) in LAYOUTS.items():
            cells = [shares(x, element, group, cast, top, scale_of, f, name in FLOOR_TO_MAX)
                     for f in (1, 0.5, 2)]
            text = " | ".join(f"{100 * a:.3g}% / {100 * b:.3g}%" for a, b in cells)
            print(f"| {name} | {weights} | {text} |")


if __name__ == "__main__":
    main()
