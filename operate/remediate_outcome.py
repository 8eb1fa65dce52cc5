"""What ``clusterctl remediate`` (:mod:`operate.remediate`) did and left: each step, the outcome, and the
exception that ends the ladder."""

from __future__ import annotations

from dataclasses import dataclass, field

from operate.remediate_breaker import Verdict


@dataclass
class Step:
    rung: str
    at_s: float
    took_s: float
    ok: bool
    did: list[str]
    detail: str = ""

    def as_dict(self) -> dict:
        return {"rung": self.rung, "at_s": round(self.at_s, 3), "took_s": round(self.took_s, 3), "ok": self.ok,
                "did": self.did, "detail": self.detail}


@dataclass
class Outcome:
    """``state``: planned (nothing touched), released (healthy and back in rotation), repair (the node marked
    for repair), stopped (a step could not be carried out), breaker (refused by the breaker), refused (the node
    is marked for repair: nothing touched), interrupted."""

    target: str
    state: str
    message: str
    steps: list[Step] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what the unit and its node are left as
    plan: list[str] = field(default_factory=list)
    took_s: float = 0.0
    healthy_s: float | None = None  # from the start until the unit was verified healthy
    start: str = ""  # the first rung after the drain
    start_why: str = ""  # named by the operator, or what the XID catalogue made of the unit's latest XID

    @property
    def ok(self) -> bool:
        return self.state in ("planned", "released")

    def as_dict(self) -> dict:
        return {"target": self.target, "state": self.state, "ok": self.ok, "message": self.message,
                "took_s": round(self.took_s, 3),
                "healthy_s": None if self.healthy_s is None else round(self.healthy_s, 3),
                "steps": [s.as_dict() for s in self.steps], "breaker": [v.as_dict() for v in self.verdicts],
                "left": self.left, "plan": self.plan, "start": self.start, "start_why": self.start_why}


class Stop(Exception):
    """The ladder ends here; the outcome's state and message."""

    def __init__(self, state: str, message: str):
        super().__init__(message)
        self.state, self.message = state, message
