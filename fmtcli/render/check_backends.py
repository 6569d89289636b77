"""The tables of ``fmt check-backends`` (``check_backends.ConformanceResult``): the
environment it ran against, then one row per (format, backend) with each class of mismatch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from fmtcli.render.fit import Fit
from fmtcli.render.numbers import input_text

if TYPE_CHECKING:
    from fmtcli.check_backends import ConformanceResult


def _case_value_text(value: float) -> str:
    """A value of ``ML_DTYPES_CASES`` as read by eye: ``2^-127``, ``1.25*2^-127``, ``72``."""
    mantissa, exponent = math.frexp(value) if math.isfinite(value) else (0.0, 0)
    if value > 0 and abs(exponent) > 20 and (2 * mantissa * 64).is_integer():
        head = "" if mantissa == 0.5 else f"{2 * mantissa:g}*"
        return f"{head}2^{exponent - 1}"
    return input_text(value)


def render_environment(env) -> Group:
    """What ``check-backends`` ran against: the installed ml_dtypes' answers on the inputs
    where its releases differ, torch's version, and the compiled kernel of ``quantize``."""
    cases = Table(title=f"ml_dtypes {env.ml_dtypes_version} where its releases differ",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("format", "input", "engine", "ml_dtypes", "ml_dtypes does"):
        cases.add_column(header, no_wrap=True, justify="left" if header in (
            "format", "ml_dtypes does") else "right")
    for case in env.ml_dtypes_cases:
        cases.add_row(case.format, f"{_case_value_text(case.input)} ({case.input_dtype})",
                      _case_value_text(case.engine), _case_value_text(case.backend),
                      Text(case.behaviour, style="green" if case.agrees else "bold red"))
    torch = "not installed" if env.torch_version is None else env.torch_version
    lines = [Text(f"torch: {torch}")]
    if env.kernel is not None:
        lines.append(Text(f"compiled kernel of fmt quantize: {env.kernel.text}",
                          style="" if env.kernel.on else "yellow"))
    return Group(Fit(cases), *lines, Text(""))


def render_conformance(result: ConformanceResult) -> Group | Fit:
    """The environment, then one row per (format, backend): agreement, then each mismatch
    class with an example."""
    table = Table(title="Backends against fmtcli's engine (nearest-even, IEEE overflow)",
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption="kinds: value = a real difference; nan_payload = both NaN, other "
                          "bits; sign_of_zero = +0 against -0", caption_justify="left")
    for header in ("format", "backend", "inputs", "verdict", "class", "kind", "count",
                   "example: input -> engine | backend"):
        table.add_column(header, justify="right" if header in ("inputs", "count") else "left")
    for report in result.reports:
        if report.error:
            verdict = Text(report.error, style="dim" if report.backend == "-" else "bold red")
            table.add_row(report.format, report.backend, f"{report.inputs:,}", verdict)
            table.add_section()
            continue
        verdict = Text("agrees", style="green") if report.agrees else Text(
            f"{report.value_mismatches:,} differ", style="bold red")
        head = [report.format, f"{report.backend} ({report.device})", f"{report.inputs:,}",
                verdict]
        if not report.mismatches:
            table.add_row(*head, "-", "", "", "")
        for i, m in enumerate(report.mismatches):
            given, reference, backend = m.examples[0]
            example = (f"{input_text(given, float32=True)} -> "
                       f"{input_text(reference, float32=True)} | "
                       f"{input_text(backend, float32=True)}")
            cells = head if i == 0 else ["", "", "", ""]
            style = "red" if m.kind == "value" else "dim"
            table.add_row(*cells, m.input_class, Text(m.kind, style=style), f"{m.count:,}",
                          example)
        table.add_section()
    if result.environment is None:
        return Fit(table)
    return Group(render_environment(result.environment), Fit(table))
