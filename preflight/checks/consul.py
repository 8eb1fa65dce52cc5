"""consul: the Consul agent the node uses answers and every IU of the node is registered as an instance of its ``vllm-iu-<node>``.

``gather`` reads through :mod:`preflight.consul` (the only module that talks to Consul); ``evaluate``
(pure) judges what it read. An IU in maintenance
is reported, not failed: that is how nodes wait for preflight; ``--release`` clears it afterwards for
nodes where every check passed.

Fault codes: CONSUL_AGENT_DOWN, CONSUL_NODE_UNHEALTHY, CONSUL_SERVICE_MISSING, CONSUL_OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight import consul
from preflight.checks.base import Check, NodeContext
from preflight.result import CheckResult, Verdict


@dataclass(frozen=True)
class ConsulFacts:
    address: str
    alive: dict[str, Any] | None = None  # consul.agent_alive(), None when the agent did not answer
    agent_error: str | None = None
    services: dict[str, Any] | None = None  # IU id -> consul.ServiceState
    services_error: str | None = None


class Consul(Check):
    name = "consul"
    codes = {
        "CONSUL_AGENT_DOWN": "no Consul agent answers at consul_http_addr",
        "CONSUL_NODE_UNHEALTHY": "Consul's serfHealth for this node is not passing",
        "CONSUL_SERVICE_MISSING": "an IU of the node is not registered as an instance of its vllm-iu-<node>",
    }

    def gather(self, ctx: NodeContext) -> ConsulFacts:
        """The HTTP reads (the check's "commands"); an agent that does not answer is a fact, not an error."""
        node = ctx.node
        address = consul.address_of(node)
        try:
            alive = consul.agent_alive(node)
        except consul.ConsulUnavailable as exc:
            return ConsulFacts(address, agent_error=str(exc))
        try:
            return ConsulFacts(address, alive, services=consul.iu_services(node))
        except consul.ConsulUnavailable as exc:
            return ConsulFacts(address, alive, services_error=str(exc))

    def evaluate(self, facts: ConsulFacts, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        address = facts.address
        if facts.alive is None:
            return [self.result(node, Verdict.FAIL, "CONSUL_AGENT_DOWN", f"Consul at {address}: {facts.agent_error}",
                                expected={"agent": address}, found={"error": facts.agent_error})]
        if facts.services is None:
            return [self.result(node, Verdict.ERROR, "GATHER", f"Consul at {address}: {facts.services_error}")]
        alive, services = facts.alive, facts.services
        expected = {"agent": address, "services": [iu.id for iu in node.ius]}
        found = {
            **alive,
            "services": {
                s.id: {"node": s.node, "maintenance": s.in_maintenance, "checks": s.checks}
                for s in services.values()
            },
        }
        if alive["serf_health"] not in (None, "passing"):
            return [
                self.result(
                    node,
                    Verdict.FAIL,
                    "CONSUL_NODE_UNHEALTHY",
                    f"serfHealth of {node.name} is {alive['serf_health']}",
                    expected=expected,
                    found=found,
                )
            ]
        missing = [iu.id for iu in node.ius if iu.id not in services]
        if missing:
            return [
                self.result(
                    node,
                    Verdict.FAIL,
                    "CONSUL_SERVICE_MISSING",
                    f"not registered in Consul: {', '.join(missing)}",
                    expected=expected,
                    found=found,
                )
            ]
        waiting = [s.id for s in services.values() if s.in_maintenance]
        note = f"; in maintenance: {', '.join(waiting)}" if waiting else ""
        return [
            self.result(
                node,
                Verdict.PASS,
                "CONSUL_OK",
                f"{len(services)} IU services registered{note}",
                expected=expected,
                found=found,
            )
        ]


CHECK = Consul()
