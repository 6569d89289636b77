"""Reproduce the article's "Lower precision" table and its "will it underflow?" example.

Uses only the fmtcli library (no command line).  Prints plain text and exits with status 1
if any figure disagrees with the article.

    python examples/article_formats.py
"""

from __future__ import annotations

import sys

from fmtcli import ARTICLE_FORMATS, get_format
from fmtcli.numerics.fates import Fate
from fmtcli.underflow import underflow_table

LABELS = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "FP8 E4M3 (OCP, e4m3fn)",
    "float8_e4m3fnuz": "FP8 E4M3 (fnuz)",
    "float8_e5m2": "FP8 E5M2",
}

# The article's figures as printed, each with the format spec that prints a value that way:
# (bits, (largest value, spec), (spacing just above 1, spec)).  FP32's and BF16's cells are
# not legible in the article; "BF16 has the same range as FP32" and FP32's well-known
# figures stand in for them.
ARTICLE = {
    "float32": (32, ("3.4e+38", ".2g"), ("1.2e-07", ".2g")),
    "float16": (16, ("65,504", ",.0f"), ("0.00098", ".5f")),
    "bfloat16": (16, ("3.4e+38", ".2g"), ("0.0078", ".4f")),
    "float8_e4m3fn": (8, ("448", ",.0f"), ("0.125", ".3f")),
    "float8_e4m3fnuz": (8, ("240", ",.0f"), ("0.125", ".3f")),
    "float8_e5m2": (8, ("57,344", ",.0f"), ("0.25", ".2f")),
}

mismatches: list[str] = []


def check(ok: bool, what: str) -> None:
    """Remember a disagreement with the article (reported at the end, exit status 1)."""
    if not ok:
        mismatches.append(what)


def agrees(value: float, printed: tuple[str, str]) -> bool:
    text, spec = printed
    return format(value, spec) == text


def format_table() -> None:
    print("Lower precision: range against precision")
    print(f"{'Format':<24} {'Bits':>4} {'Largest value':>24} {'Spacing just above 1':>22}")
    for name in ARTICLE_FORMATS:
        spec = get_format(name)
        bits, max_printed, eps_printed = ARTICLE[name]
        largest = f"{spec.max:,.0f}" if spec.max < 1e6 else f"{spec.max:.4g}"
        spacing = f"2^-{spec.mantissa_bits} ~ {spec.eps:.3g}"
        print(f"{LABELS[name]:<24} {spec.bits:>4} {largest:>24} {spacing:>22}")
        check(spec.bits == bits, f"{name}: bits {spec.bits} != {bits}")
        check(agrees(spec.max, max_printed),
              f"{name}: largest value {spec.max!r} is not the article's {max_printed[0]}")
        check(agrees(spec.eps, eps_printed),
              f"{name}: spacing above 1 {spec.eps!r} is not the article's {eps_printed[0]}")
    print()


def underflow_example() -> None:
    gradient, loss_scale = 1e-8, 4096.0
    fp16, bf16 = get_format("float16"), get_format("bfloat16")
    result = underflow_table([gradient], [fp16, bf16], [loss_scale])
    row16, row_bf16 = result.rows

    print(f"Try it: will a gradient of {gradient:g} underflow?")
    print(f"  FP16 stores {row16.plain.stored:g} ({row16.plain.fate.value}): anything below half "
          f"its smallest subnormal, {fp16.smallest_subnormal / 2:.3g}, becomes zero")
    print(f"  x {loss_scale:,.0f} = {row16.scaled:.5g}; "
          f"FP16 stores {row16.scaled_store.stored:.5g} ({row16.scaled_store.fate.value}); "
          f"divided back: {row16.recovered:.4g} "
          f"(relative error {row16.recovered_rel_error:.2%}), survives: {row16.survives}")
    print(f"  BF16 stores {row_bf16.plain.stored:.5g} unscaled ({row_bf16.plain.fate.value}, "
          f"relative error {row_bf16.plain.rel_error:.2%}: two or three significant digits)")

    check(row16.plain.stored == 0 and row16.plain.fate is Fate.FLUSHED,
          "FP16 should flush 1e-8 to zero")
    check(row16.scaled_store.fate is Fate.SUBNORMAL,
          "FP16 should hold 1e-8 * 4096 as a subnormal")
    check(f"{row16.scaled_store.stored:.5g}" == "4.0948e-05",
          f"FP16 scaled value {row16.scaled_store.stored!r} is not about 4.0948e-05")
    check(f"{row16.recovered:.4g}" == "9.997e-09",
          f"recovered {row16.recovered!r} is not about 9.997e-09")
    check(row16.survives, "1e-8 should survive in FP16 with a loss scale of 4096")
    check(row_bf16.plain.fate is Fate.ROUNDED and f"{row_bf16.plain.stored:.5g}" == "1.0012e-08",
          f"BF16 stores {row_bf16.plain.stored!r}, not about 1.0012e-08")
    check(1e-4 < row_bf16.plain.rel_error < 1e-2,
          "BF16 should keep 1e-8 to two or three significant digits")


def main() -> int:
    format_table()
    underflow_example()
    if mismatches:
        print()
        for what in mismatches:
            print(f"MISMATCH: {what}", file=sys.stderr)
        return 1
    print()
    print("All figures agree with the article.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
