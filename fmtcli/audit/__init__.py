"""``fmt audit``: is an already-quantized checkpoint what its layout says it is?

``audit_path`` reads a file or a (sharded) Hugging Face folder as stored
(``inputs.tensors.load_path(as_stored=True)``), lets the layout readers claim their tensors
(``inputs.layouts.scan`` with the folder's ``config.json`` ``quantization_config``), and for
every quantized tensor:

- describes it: layout, element format, scale dtype, what one scale covers, stored bits per
  parameter (codes and every scale tensor) and the layout's nominal bits
  (``facts["nominal_bits"]``);
- measures it in one streamed pass (``audit.stats``: the dequantized values' amax, rms,
  zeros and non-finite count; per scale group the codes at the format's top, groups in the
  lowest half of the codes, all-zero groups), chunk by chunk, whole groups per chunk;
- runs the generic checks (``audit.checks``) and then the layout-specific ones
  (``audit.layout_checks.CHECKS``: global-scale convention, nibble order, exporters' MX
  rules, ...), each a ``check.Check`` with a verdict.

Tensors no reader claims are listed as plain data (count, parameters, dtypes); roles merge
tensors whose names differ only in layer indices (``streaming.roles``); the totals give the
model's effective bits per parameter (every stored byte over every parameter) against the
quantized tensors' nominal, and two checks of the whole input (``audit.model_checks``):
``model-bits`` (ModelOpt issue #868: an "NVFP4" checkpoint at 6.12 bits/param; judged by the
linear layers left plain that the config does not list) and ``config-quantized`` (a config
that names a scheme no tensor holds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fmtcli.audit import checks as generic
from fmtcli.audit import layout_checks, passes
from fmtcli.audit.check import Check, Verdict
from fmtcli.audit.model_checks import model_checks
from fmtcli.audit.stats import CodeStats, ValueStats
from fmtcli.base.choices import CHUNK_ELEMENTS
from fmtcli.base.errors import DataError, shown
from fmtcli.inputs import layouts
from fmtcli.inputs.storage import itemsize
from fmtcli.inputs.tensors import (
    TensorSource,
    config_folder,
    load_path,
    select_keys,
    skipped_records,
)
from fmtcli.streaming.roles import roles_in_order

__all__ = ["AuditResult", "AuditTotals", "Check", "PlainTensors", "RoleAudit", "TensorAudit",
           "Verdict", "audit_path", "audit_sources"]

SEVERITY = {Verdict.FAIL: 3, Verdict.WARN: 2, Verdict.OK: 1, Verdict.NOT_APPLICABLE: 0}


def worst(verdicts) -> Verdict:
    """The most severe of ``verdicts`` (ok where there are none)."""
    return max(verdicts, key=SEVERITY.__getitem__, default=Verdict.OK)


def _counts(checks) -> dict[str, int]:
    out = {v.value: 0 for v in (Verdict.OK, Verdict.WARN, Verdict.FAIL)}
    for c in checks:
        if c.verdict is not Verdict.NOT_APPLICABLE:
            out[Verdict(c.verdict).value] += 1
    return out


@dataclass(frozen=True)
class TensorAudit:
    """One quantized tensor: what it is, its checks, its streamed figures (``values`` and
    ``codes`` None where it could not be read)."""

    key: str
    source: str
    shape: tuple[int, ...]
    layout: str
    element: str
    scale_dtype: str
    group: str
    bits_per_param: float
    nominal_bits: float | None
    params: int
    stored_bits: int
    checks: tuple[Check, ...]
    values: ValueStats | None
    codes: CodeStats | None
    parts: dict
    facts: dict

    @property
    def verdict(self) -> Verdict:
        return worst(c.verdict for c in self.checks)

    def to_dict(self) -> dict:
        return {"key": self.key, "source": self.source, "shape": list(self.shape),
                "layout": self.layout, "element": self.element,
                "scale_dtype": self.scale_dtype, "group": self.group,
                "bits_per_param": self.bits_per_param, "nominal_bits": self.nominal_bits,
                "params": self.params, "verdict": self.verdict.value,
                "checks": [c.to_dict() for c in self.checks],
                "values": self.values.to_dict() if self.values else None,
                "codes": self.codes.to_dict() if self.codes else None,
                "parts": dict(self.parts), "facts": dict(self.facts)}


@dataclass(frozen=True)
class RoleAudit:
    """Quantized tensors whose names differ only in layer indices, merged."""

    pattern: str
    count: int
    layouts: tuple[str, ...]
    params: int
    stored_bits: int
    checks: dict
    verdict: Verdict
    failing: tuple[str, ...]
    values: ValueStats | None

    @property
    def bits_per_param(self) -> float:
        return self.stored_bits / self.params if self.params else 0.0

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "tensors": self.count, "layouts": list(self.layouts),
                "params": self.params, "bits_per_param": self.bits_per_param,
                "checks": dict(self.checks), "verdict": self.verdict.value,
                "failing": list(self.failing),
                "values": self.values.to_dict() if self.values else None}


@dataclass(frozen=True)
class PlainTensors:
    """The tensors no layout claimed, read as plain data: by dtype, and every one's name
    (``file:key``) and key (the file where it has none)."""

    count: int
    params: int
    stored_bits: int
    dtypes: dict
    names: tuple[str, ...]
    keys: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"count": self.count, "params": self.params, "stored_bits": self.stored_bits,
                "dtypes": dict(self.dtypes), "names": list(self.names),
                "keys": list(self.keys)}


@dataclass(frozen=True)
class AuditTotals:
    """The whole input: quantized and plain parameters and bits, the effective bits per
    parameter, the nominal of the quantized tensors (parameter-weighted), the model checks
    and every check's verdict counted."""

    quantized: int
    quantized_params: int
    quantized_bits: int
    plain_params: int
    plain_bits: int
    nominal_bits: float | None
    checks: tuple[Check, ...]
    counts: dict

    @property
    def params(self) -> int:
        return self.quantized_params + self.plain_params

    @property
    def effective_bits(self) -> float:
        """Every stored bit over every parameter (plain tensors at their own width)."""
        return (self.quantized_bits + self.plain_bits) / self.params if self.params else 0.0

    @property
    def quantized_bits_per_param(self) -> float:
        return self.quantized_bits / self.quantized_params if self.quantized_params else 0.0

    @property
    def quantized_share(self) -> float:
        return self.quantized_params / self.params if self.params else 0.0

    def to_dict(self) -> dict:
        return {"quantized_tensors": self.quantized, "quantized_params": self.quantized_params,
                "plain_params": self.plain_params, "params": self.params,
                "quantized_share": self.quantized_share,
                "quantized_bits_per_param": self.quantized_bits_per_param,
                "effective_bits_per_param": self.effective_bits,
                "nominal_bits": self.nominal_bits,
                "checks": [c.to_dict() for c in self.checks], "verdicts": dict(self.counts)}


@dataclass(frozen=True)
class AuditResult:
    """All of ``fmt audit``: the tensors in checkpoint order, roles, plain tensors, totals."""

    path: str
    config: dict | None
    layouts: tuple[str, ...]
    tensors: tuple[TensorAudit, ...]
    roles: tuple[RoleAudit, ...]
    plain: PlainTensors
    totals: AuditTotals
    skipped: tuple

    @property
    def failed(self) -> int:
        return self.totals.counts.get("fail", 0)

    @property
    def warned(self) -> int:
        return self.totals.counts.get("warn", 0)

    def to_dict(self) -> dict:
        return {"path": self.path, "config": self.config, "layouts": list(self.layouts),
                "tensors": [t.to_dict() for t in self.tensors],
                "roles": [r.to_dict() for r in self.roles], "plain": self.plain.to_dict(),
                "totals": self.totals.to_dict(), "skipped": skipped_records(self.skipped)}


# -- one tensor ----------------------------------------------------------------------------

def audit_quantized(q, scan: layouts.Scan, chunk_elements: int = CHUNK_ELEMENTS,
                    figures: tuple | None = None, checked: list | None = None) -> TensorAudit:
    """One quantized tensor's description, figures (``figures``: measured already, by a
    worker) and checks (generic, then the layout's: ``checked``, run by a worker)."""
    m = passes.measured(q, chunk_elements, figures)
    found = [generic.run_check(check, q, scan, m) for check in generic.CHECKS]
    if m is not None and m.values is None and m.scales_error:
        found.append(Check("readable", Verdict.FAIL, f"cannot be read: {m.scales_error}"))
    if checked is None:
        checked = [generic.run_check(check, q, scan) for check in layout_checks.CHECKS]
    found += checked
    nominal = q.facts.get("nominal_bits")
    return TensorAudit(
        q.key, q.source, tuple(q.shape), q.layout, q.element, q.scale_dtype,
        q.group.spelling, q.bits_per_param,
        float(nominal) if isinstance(nominal, (int, float)) else None, q.size,
        int(round(8 * q.stored_bytes)), tuple(c for c in found if c is not None),
        m.values if m else None, m.codes if m else None,
        {role: p.key for role, p in q.parts.items()}, dict(q.facts))


# -- the whole input -----------------------------------------------------------------------

def _roles(tensors: list[TensorAudit]) -> tuple[RoleAudit, ...]:
    out = []
    for pattern, members in roles_in_order([t.key for t in tensors]).items():
        group = [tensors[i] for i in members]
        checks = [c for t in group for c in t.checks]
        failing = tuple(dict.fromkeys(c.name for c in checks if c.verdict is Verdict.FAIL))
        values = [t.values for t in group if t.values is not None]
        out.append(RoleAudit(pattern, len(group), tuple(dict.fromkeys(t.layout for t in group)),
                             sum(t.params for t in group), sum(t.stored_bits for t in group),
                             _counts(checks), worst(c.verdict for c in checks), failing,
                             ValueStats.merged(values) if values else None))
    return tuple(out)


def _plain(sources: list[TensorSource]) -> PlainTensors:
    dtypes: dict[str, int] = {}
    params = bits = 0
    for s in sources:
        dtypes[str(s.dtype)] = dtypes.get(str(s.dtype), 0) + 1
        size = math.prod(s.shape)
        params += size
        try:  # a dtype fmt does not read (complex, strings) counts what numpy says, or 0
            bits += int(round(8 * size * itemsize(s.dtype)))
        except (KeyError, TypeError, ValueError):
            pass
    return PlainTensors(len(sources), params, bits, dtypes, tuple(s.name for s in sources),
                        tuple(s.key if s.key is not None else s.source for s in sources))


def audit_sources(sources: list[TensorSource], config: dict | None = None,
                  keys: list[str] | None = None, path: str = "",
                  chunk_elements: int = CHUNK_ELEMENTS,
                  on_tensor: Callable[[str], None] | None = None,
                  workers: int | None = None) -> AuditResult:
    """Audit one input's tensors (as stored) with its ``quantization_config``; ``keys``
    picks tensors by logical name or glob (``inputs.tensors.select_keys``); ``workers``
    forked processes measure the tensors (default: the cores available, at most 8; the
    figures do not depend on it)."""
    scan = layouts.scan(sources, config)
    quantized, plain = list(scan.quantized), list(scan.plain)
    if keys:
        views = [(q.as_source(), q) for q in quantized]
        chosen = {id(s) for s in select_keys([v for v, _ in views] + plain, keys)}
        quantized = [q for view, q in views if id(view) in chosen]
        plain = [s for s in plain if id(s) in chosen]
    if workers is None:
        from fmtcli.streaming.parallel import default_workers

        workers = default_workers()
    # inf/NaN products of a broken checkpoint's scales are what the checks count and say:
    # no numpy warning reaches the user (the workers fork inside, errstate and all)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        figures = passes.measure_all(quantized, chunk_elements, workers)
        checked = passes.layout_checks_all(quantized, scan, workers)
        tensors = []
        for i, q in enumerate(quantized):
            if on_tensor is not None:
                on_tensor(q.name)
            tensors.append(audit_quantized(q, scan, chunk_elements, figures.get(i),
                                           checked.get(i)))
    plain_tensors = _plain(plain)
    weighted = [(t.nominal_bits, t.params) for t in tensors if t.nominal_bits and t.params]
    nominal = (sum(n * p for n, p in weighted) / sum(p for _, p in weighted)
               if weighted else None)
    model = model_checks(tensors, plain, plain_tensors, scan.config, nominal)
    every = [c for t in tensors for c in t.checks] + model
    totals = AuditTotals(len(tensors), sum(t.params for t in tensors),
                         sum(t.stored_bits for t in tensors), plain_tensors.params,
                         plain_tensors.stored_bits, nominal, tuple(model), _counts(every))
    return AuditResult(path, scan.config, tuple(dict.fromkeys(t.layout for t in tensors)),
                       tuple(tensors), _roles(tensors), plain_tensors, totals,
                       tuple(s.info() for s in plain if s.skipped is not None))


def audit_path(path: str, keys: list[str] | None = None,
               chunk_elements: int = CHUNK_ELEMENTS,
               on_tensor: Callable[[str], None] | None = None,
               workers: int | None = None) -> AuditResult:
    """Audit a file, a folder or a sharded index (``inputs.tensors.load_path``)."""
    sources = load_path(path, as_stored=True)
    if not sources:
        raise DataError(f"nothing to audit ({shown(path)} holds no tensors)")
    return audit_sources(sources, layouts.read_config(config_folder(path)), keys, path,
                         chunk_elements, on_tensor, workers)
