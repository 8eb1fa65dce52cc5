"""ib_ports: every HCA port the inventory lists is Active/LinkUp at the expected rate and link layer.

``gather``: ``ibstat`` once per node (kind ``ibstat``, cached for ib_pairs, which needs the GUIDs/LIDs);
``evaluate`` (pure) compares every inventory port with it. Expected rate: the NIC's
``rate_gbps`` in the inventory, else the profile's ``ib.port_rate_gbps``.

Fault codes: PORT_MISSING, PORT_DOWN, PORT_RATE, LINK_LAYER, NO_NICS, PORTS_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext
from preflight.parsers.ibstat import IbStat
from preflight.result import CheckResult, Verdict

IBSTAT = ["ibstat"]
LINK_LAYERS = {"infiniband": "InfiniBand", "ethernet": "Ethernet"}


def find_port(ibstat, device: str, port: int):
    for ca in ibstat.cas:
        if ca.name == device:
            return next((p for p in ca.ports if p.port == port), None)
    return None


class IbPorts(Check):
    name = "ib_ports"
    codes = {
        "PORT_MISSING": "an inventory HCA/port is not in ibstat",
        "PORT_DOWN": "port not Active/LinkUp",
        "PORT_RATE": "port rate differs from the expected rate",
        "LINK_LAYER": "port link layer differs from the inventory (InfiniBand vs Ethernet/RoCE)",
    }

    def gather(self, ctx: NodeContext) -> IbStat | None:
        return ctx.parsed("ibstat", IBSTAT) if ctx.node.nics else None

    def evaluate(self, facts: IbStat | None, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        ibstat = facts
        if not node.nics or ibstat is None:
            return [self.result(node, Verdict.SKIP, "NO_NICS", "inventory lists no rdma_nics")]
        problems: list[tuple[Verdict, str, str]] = []
        expected, found = {}, {}
        for nic in node.nics:
            rate = nic.rate_gbps or profile["ib"]["port_rate_gbps"]
            layer = LINK_LAYERS.get(nic.link_layer, nic.link_layer)
            key = f"{nic.device}:{nic.port}"
            expected[key] = {
                "state": "Active",
                "physical_state": "LinkUp",
                "rate_gbps": rate,
                "link_layer": layer,
            }
            port = find_port(ibstat, nic.device, nic.port)
            if port is None:
                found[key] = None
                problems.append((Verdict.FAIL, "PORT_MISSING", f"{key} not found by ibstat"))
                continue
            found[key] = {
                "state": port.state,
                "physical_state": port.physical_state,
                "rate_gbps": port.rate_gbps,
                "link_layer": port.link_layer,
            }
            if port.state != "Active" or port.physical_state != "LinkUp":
                problems.append((Verdict.FAIL, "PORT_DOWN", f"{key} is {port.state}/{port.physical_state}"))
            elif port.rate_gbps is None or float(port.rate_gbps) != float(rate):
                problems.append(
                    (Verdict.FAIL, "PORT_RATE", f"{key} runs at {port.rate_gbps} Gb/s, expected {rate:g}")
                )
            if port.link_layer and port.link_layer.lower() != nic.link_layer:
                problems.append(
                    (Verdict.FAIL, "LINK_LAYER", f"{key} link layer {port.link_layer}, expected {layer}")
                )
        return [
            self.outcome(
                node, problems, "PORTS_OK", f"{len(node.nics)} ports Active/LinkUp at expected rate",
                expected=expected, found=found,
            )
        ]


CHECK = IbPorts()
