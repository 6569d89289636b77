"""The tables of ``fmt audit`` (``audit.AuditResult``).

A title line (the input, its layouts, quantized and plain tensors); at most
``SUMMARY_ABOVE`` quantized tensors: a row per tensor, worst first; more: a row per role
(worst first), then the worst tensors (``top`` rows each; ``show_all``: every tensor, no
role table); under the tables each failed or suspicious check of the tensors shown, one
line each (``FAIL name  tensor: evidence``, wrapped at the console, never cut); the plain
tensors in one line; the totals (effective bits per parameter against the nominal) and the
model's checks.  Worst: most failed checks, then most warnings, then checkpoint order.
Computes nothing but the order of the rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.text import Text

from fmtcli.base.choices import SUMMARY_ABOVE, SUMMARY_TOP
from fmtcli.inputs.checkpoints import shared_prefix, without_prefix
from fmtcli.render.numbers import percent_text, value_text
from fmtcli.render.plaintable import HeadedRows
from fmtcli.render.widgets import prefix_note, shape_text, user_text

if TYPE_CHECKING:
    from fmtcli.audit import AuditResult, RoleAudit, TensorAudit

HEADERS = ["element", "scale", "bits", "amax", "rms", "checks"]
ROLE_HEADERS = ["bits", "amax", "rms", "checks"]
TOTAL_HEADERS = ["quantized", "plain", "bits q", "bits all", "nominal", "checks"]
CAPTION = ("beside each name: its shape and what one scale covers; bits: stored bits per "
           "parameter, scales included; amax, rms: of the dequantized values; checks: "
           "failed (fail) and suspicious (warn)")
STYLE = {"fail": "bold red", "warn": "yellow"}
PLAIN_LISTED = 4  # plain tensors named in the table (--json: all)


def verdict_text(counts: dict) -> str:
    """``ok``, or ``2 fail, 1 warn``."""
    said = [f"{counts[v]} {v}" for v in ("fail", "warn") if counts.get(v)]
    return ", ".join(said) or "ok"


def _counts(t: TensorAudit) -> dict:
    out = {"fail": 0, "warn": 0}
    for c in t.checks:
        if c.verdict.value in out:
            out[c.verdict.value] += 1
    return out


def worst_first(t: TensorAudit) -> tuple[int, int]:
    counts = _counts(t)
    return -counts["fail"], -counts["warn"]


def _value(values, name: str) -> str:
    return value_text(getattr(values, name), 3) if values is not None else "-"


def _tensor_cells(t: TensorAudit) -> list[str]:
    return [t.element, t.scale_dtype, f"{t.bits_per_param:.3f}", _value(t.values, "amax"),
            _value(t.values, "rms"), verdict_text(_counts(t))]


def _role_cells(r: RoleAudit) -> list[str]:
    return [f"{r.bits_per_param:.3f}", _value(r.values, "amax"), _value(r.values, "rms"),
            verdict_text(r.checks)]


def _evidence(tensors, name) -> list[Text]:
    lines = []
    for t in tensors:
        for c in t.checks:
            verdict = c.verdict.value
            if verdict in STYLE:
                line = Text()
                line.append(verdict.upper(), style=STYLE[verdict])
                line.append(f" {c.name}  {name(t)}: {user_text(c.evidence)}")
                lines.append(line)
    return lines


def _title(result: AuditResult) -> Text:
    n, plain = len(result.tensors), result.plain.count
    layouts = f" ({', '.join(result.layouts)})" if result.layouts else ""
    return Text(f"{user_text(result.path)}: {n:,} quantized tensor{'s' * (n != 1)}"
                f"{layouts}, {plain:,} plain", style="bold")


def every(n: int) -> str:
    """``all 3 tensors``, ``the one tensor``."""
    return f"all {n:,} tensors" if n != 1 else "the one tensor"


def _plain_line(result: AuditResult) -> Text:
    p = result.plain
    if not p.count:
        return Text("Plain data: none (every tensor read as a quantized layout)")
    dtypes = ", ".join(f"{dtype} x{n:,}" for dtype, n in p.dtypes.items())
    listed = ", ".join(user_text(name) for name in p.keys[:PLAIN_LISTED])
    more = (f" and {p.count - PLAIN_LISTED:,} more (--json lists them)"
            if p.count > PLAIN_LISTED else "")
    if not result.tensors:
        return Text(f"No quantized layout found: {every(p.count)} read as plain data "
                    f"({dtypes}; {p.params:,} parameters): {listed}{more}")
    return Text(f"Plain data (no layout claimed them): {p.count:,} tensors ({dtypes}), "
                f"{p.params:,} parameters: {listed}{more}")


def render_audit(result: AuditResult, top: int = SUMMARY_TOP, show_all: bool = False):
    tensors = sorted(result.tensors, key=worst_first)
    prefix = shared_prefix([t.key for t in tensors] + [r.pattern for r in result.roles]
                           if len(tensors) > 1 else [])

    def name(t: TensorAudit) -> str:
        return user_text(without_prefix(t.key, t.key, prefix))

    parts: list = [_title(result)]
    if prefix:
        parts.append(prefix_note(prefix))
    shown = tensors if show_all or len(tensors) <= SUMMARY_ABOVE else tensors[:top]
    if len(tensors) > SUMMARY_ABOVE and not show_all and top:
        roles = sorted(result.roles, key=lambda r: (-r.checks["fail"], -r.checks["warn"]))
        more = len(roles) - top
        parts.append(HeadedRows(
            f"By role, worst first: {len(tensors):,} tensors in {len(roles):,} "
            f"role{'s' * (len(roles) != 1)}"
            + (f"; the {top:,} worst" if more > 0 else ""), "layout", ROLE_HEADERS,
            [(user_text(without_prefix(r.pattern, r.pattern, prefix)), f"x{r.count:,}",
              [(", ".join(r.layouts), _role_cells(r))]) for r in roles[:top]],
            name_header="role",
            caption=f"{more:,} more role{'s' * (more > 1)}: --all lists every tensor, "
                    "--json all" if more > 0 else None))
    if shown:
        title = (f"{len(tensors):,} quantized tensor{'s, worst first' * (len(tensors) > 1)}"
                 if len(shown) ==
                 len(tensors) else f"Worst {len(shown):,} of {len(tensors):,} tensors "
                 "(--all: every one)")
        parts.append(HeadedRows(title, "layout", HEADERS,
                                [(name(t), f"{shape_text(t.shape)}, {t.group}", [(t.layout,
                                                                  _tensor_cells(t))])
                                 for t in shown], caption=CAPTION))
        evidence = _evidence(shown, name)
        if evidence:
            parts += [Text("Failed and suspicious checks", style="bold"), *evidence, Text("")]
    parts += [_plain_line(result), Text(""), _totals(result)]
    for c in result.totals.checks:
        verdict = c.verdict.value
        line = Text()
        line.append(verdict.upper(), style=STYLE.get(verdict, "green"))
        line.append(f" {c.name}: {user_text(c.evidence)}")
        parts.append(line)
    return Group(*parts)


def _totals(result: AuditResult) -> HeadedRows:
    t = result.totals
    nominal = f"{t.nominal_bits:.4g}" if t.nominal_bits else "-"
    return HeadedRows(
        f"Total of {t.params:,} parameters", "", TOTAL_HEADERS,
        [(None, None, [("", [percent_text(t.quantized_share),
                             percent_text(1 - t.quantized_share) if t.params else "-",
                             f"{t.quantized_bits_per_param:.3f}" if t.quantized_params
                             else "-", f"{t.effective_bits:.3f}",
                             nominal, verdict_text(t.counts)])])],
        caption="quantized, plain: shares of the parameters; bits q: bits/param of the "
                "quantized tensors; bits all: of every stored byte")
