"""What every check returns: one :class:`CheckResult` per (node, IU or whole node, check)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"  # the check could not run (command failed, output unparseable)
    SKIP = "SKIP"  # not applicable here (e.g. DCQCN on an InfiniBand link)
    UNREACHABLE = "UNREACHABLE"  # the host did not answer

    def __str__(self) -> str:
        return self.value


# Worst first; a node's or run's overall verdict is the worst of its results.
SEVERITY = (Verdict.FAIL, Verdict.UNREACHABLE, Verdict.ERROR, Verdict.WARN, Verdict.PASS, Verdict.SKIP)


@dataclass(frozen=True)
class CheckResult:
    rack: str
    node: str
    iu: str | None  # IU id ("r01n01-iu0") or None when the result is about the whole node / a link
    check: str
    verdict: Verdict
    reason: str  # one line a person can act on
    evidence: dict[str, Any] = field(default_factory=dict)  # always has "code"; expected vs found

    @property
    def code(self) -> str:
        return str(self.evidence.get("code", ""))

    def to_json(self) -> dict[str, Any]:
        return {
            "rack": self.rack,
            "node": self.node,
            "iu": self.iu,
            "check": self.check,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        return cls(
            rack=data["rack"],
            node=data["node"],
            iu=data.get("iu"),
            check=data["check"],
            verdict=Verdict(data["verdict"]),
            reason=data.get("reason", ""),
            evidence=dict(data.get("evidence") or {}),
        )


def worst(verdicts) -> Verdict | None:
    present = set(verdicts)
    for verdict in SEVERITY:
        if verdict in present:
            return verdict
    return None
