"""The remediation breaker: how much of the fleet may be out of rotation at once, judged from Consul's view
before each rung of :mod:`operate.remediate` that takes more out.

A unit is *out* when Consul's health of its node's ``vllm-iu-<node>`` service lists it with a critical check (its HTTP check
failing, its service or its node in maintenance), or does not list it at all (deregistered: no client
reaches it either). The fleet is the inventory's IUs. Two limits, both from the issue's defaults:

- ``max_unit_share`` (0.10): at most that share of the fleet's units out, counting the ones the rung would
  take out; never fewer than one unit (a fleet of fewer than ten units may still remediate one);
- ``max_nodes_per_rack`` (1): at most that many nodes of the target's rack with a unit out, counting the
  target's node.

A breaker that is open refuses the rung and says which units are out and why; nothing is touched. It never
closes by itself: the next remediation judges afresh from Consul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.model import Cluster
from common.errors import UsageError

DEFAULT_MAX_UNIT_SHARE = 0.10
DEFAULT_MAX_NODES_PER_RACK = 1


@dataclass(frozen=True)
class Limits:
    max_unit_share: float = DEFAULT_MAX_UNIT_SHARE
    max_nodes_per_rack: int = DEFAULT_MAX_NODES_PER_RACK

    def __post_init__(self):
        if not 0 < self.max_unit_share <= 1:
            raise UsageError(f"--max-unit-share: must be in (0, 1] (got {self.max_unit_share:g})")
        if self.max_nodes_per_rack < 1:
            raise UsageError(f"--max-nodes-per-rack: must be at least 1 (got {self.max_nodes_per_rack})")

    def units_allowed(self, fleet: int) -> int:
        return max(1, math.floor(self.max_unit_share * fleet + 1e-9))


@dataclass(frozen=True)
class Verdict:
    open: bool
    out_before: dict[str, str]  # IU id -> why it is out now
    taking: tuple[str, ...]  # the IUs the rung would take out
    units_out: int  # with the rung's
    units_allowed: int
    rack: str
    rack_nodes_out: tuple[str, ...]  # with the target's node
    nodes_allowed: int
    reason: str  # one line: why open, or the counts when closed

    def as_dict(self) -> dict:
        return {"open": self.open, "reason": self.reason, "out_before": self.out_before, "taking": list(self.taking),
                "units_out": self.units_out, "units_allowed": self.units_allowed, "rack": self.rack,
                "rack_nodes_out": list(self.rack_nodes_out), "nodes_allowed": self.nodes_allowed}


def units_out(cluster: Cluster, entries: list) -> dict[str, str]:
    """IU id -> why it is out of rotation, for the inventory's IUs (``entries``: every node's ``vllm-iu-<node>`` health)."""
    listed: dict[str, str | None] = {}
    for entry in entries:
        sid = (entry.get("Service") or {}).get("ID")
        critical = sorted(str(c.get("CheckID")) for c in entry.get("Checks") or [] if c.get("Status") == "critical")
        listed[sid] = ", ".join(critical) + " critical" if critical else None
    out = {}
    for iu in cluster.ius():
        if iu.id not in listed:
            out[iu.id] = "not registered in Consul"
        elif listed[iu.id]:
            out[iu.id] = listed[iu.id]
    return out


def judge(cluster: Cluster, entries: list, node_name: str, taking: tuple[str, ...], limits: Limits) -> Verdict:
    """Whether taking ``taking`` (IUs of node ``node_name``) out as well keeps the fleet within ``limits``."""
    out = units_out(cluster, entries)
    fleet = sum(1 for _ in cluster.ius())
    after = set(out) | set(taking)
    allowed = limits.units_allowed(fleet)
    nodes = {n.name: n for n in cluster.nodes()}
    rack = nodes[node_name].rack
    rack_out = tuple(sorted(n.name for n in nodes.values() if n.rack == rack
                            and (n.name == node_name or any(iu.id in after for iu in n.ius))))
    others = {iu: why for iu, why in out.items() if iu not in taking}
    named = "; ".join(f"{iu}: {why}" for iu, why in sorted(others.items())[:6]) or "none"
    if len(after) > allowed:
        reason = (f"breaker open: {len(after)} of {fleet} units would be out of rotation, more than "
                  f"{allowed} ({limits.max_unit_share:.0%} of the fleet); already out: {named}")
    elif len(rack_out) > limits.max_nodes_per_rack:
        reason = (f"breaker open: {len(rack_out)} nodes of rack {rack} would have a unit out "
                  f"({', '.join(rack_out)}), more than {limits.max_nodes_per_rack}; already out: {named}")
    else:
        reason = (f"breaker closed: {len(after)} of {fleet} units out with this one (at most {allowed}), "
                  f"{len(rack_out)} node(s) of rack {rack} (at most {limits.max_nodes_per_rack})")
    return Verdict(reason.startswith("breaker open"), out, taking, len(after), allowed, rack, rack_out,
                   limits.max_nodes_per_rack, reason)
