"""One layout check of ``fmt audit``: its name, verdict and evidence.

Every check follows the exporter's own definition of its layout (cited where the check is
defined) and has a documented threshold (``docs/audit.md``) and a test that makes it fire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Verdict(str, Enum):
    """``ok``: the layout holds; ``warn``: suspicious, the values may still be right;
    ``fail``: the dequantized values are wrong or unreadable; ``n/a``: the check does not
    apply to this tensor (said only in JSON)."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class Check:
    """``name`` (a short kebab-case id, e.g. ``scale-power-of-two``), ``verdict``,
    ``evidence`` (one line a user can act on: the figure, the threshold, where), and
    ``figures`` (the numbers behind it, JSON-ready)."""

    name: str
    verdict: Verdict
    evidence: str
    figures: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": Verdict(self.verdict).value,
                "evidence": self.evidence, "figures": dict(self.figures)}
