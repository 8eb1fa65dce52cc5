"""dcqcn: RoCE congestion control on every Ethernet (RoCE) HCA; InfiniBand links -> SKIP.

``gather`` reads, per RoCE netdev, the ECN notification point and reaction point switches of the
lossless priority (``dcqcn.priority``; ``/sys/class/net/<if>/ecn/roce_np|roce_rp/enable/<prio>``, the
mlx5 knobs, kind ``ecn-switch``) and ``mlnx_qos -i <if>`` (kind ``mlnx-qos``). ``evaluate`` (pure): both ECN switches ``1``,
trust state ``dscp`` and PFC enabled on that priority.

Fault codes: ECN_NP_OFF, ECN_RP_OFF, TRUST_NOT_DSCP, PFC_OFF, DCQCN_IB_SKIP, DCQCN_OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext
from preflight.parsers.mlnx_qos import MlnxQos
from preflight.result import CheckResult, Verdict


@dataclass(frozen=True)
class PortQos:
    roce_np: str  # the sysfs switch ("1" on, "0" off: the ecn-switch parser admits nothing else)
    roce_rp: str
    qos: MlnxQos


def ecn_path(netdev: str, point: str, priority: int) -> str:
    return f"/sys/class/net/{netdev}/ecn/{point}/enable/{priority}"


class Dcqcn(Check):
    name = "dcqcn"
    codes = {
        "ECN_NP_OFF": "ECN notification point (roce_np) disabled on the lossless priority",
        "ECN_RP_OFF": "ECN reaction point (roce_rp) disabled on the lossless priority",
        "TRUST_NOT_DSCP": "the port trusts PCP (or nothing) instead of DSCP",
        "PFC_OFF": "PFC not enabled on the lossless priority",
    }

    def gather(self, ctx: NodeContext) -> dict[str, PortQos]:
        """netdev -> what its port reports, for every RoCE NIC with a netdev in the inventory."""
        prio = ctx.profile["dcqcn"]["priority"]
        ports = {}
        for nic in ctx.node.nics:
            if nic.link_layer != "ethernet" or not nic.netdev:
                continue
            np_on, rp_on = (ctx.parsed("ecn-switch", ["cat", ecn_path(nic.netdev, point, prio)]).enabled
                            for point in ("roce_np", "roce_rp"))
            ports[nic.netdev] = PortQos(str(int(np_on)), str(int(rp_on)),
                                        ctx.parsed("mlnx-qos", ["mlnx_qos", "-i", nic.netdev]))
        return ports

    def evaluate(self, facts: dict[str, PortQos], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        roce = [n for n in node.nics if n.link_layer == "ethernet"]
        if not roce:
            return [self.result(node, Verdict.SKIP, "DCQCN_IB_SKIP", "no RoCE links (InfiniBand has no DCQCN)")]
        prio = profile["dcqcn"]["priority"]
        problems: list[tuple[Verdict, str, str]] = []
        found = {}
        for nic in roce:
            port = facts.get(nic.netdev) if nic.netdev else None
            if port is None:
                problems.append((Verdict.FAIL, "PFC_OFF", f"{nic.device}: inventory gives no netdev to check"))
                continue
            pfc = port.qos.pfc_enabled(prio)
            found[nic.netdev] = {"roce_np": port.roce_np, "roce_rp": port.roce_rp, "trust": port.qos.trust, "pfc": pfc}
            if port.roce_np != "1":
                problems.append((Verdict.FAIL, "ECN_NP_OFF", f"{nic.netdev}: ECN roce_np off on priority {prio}"))
            if port.roce_rp != "1":
                problems.append((Verdict.FAIL, "ECN_RP_OFF", f"{nic.netdev}: ECN roce_rp off on priority {prio}"))
            if port.qos.trust != "dscp":
                problems.append((Verdict.FAIL, "TRUST_NOT_DSCP", f"{nic.netdev}: trust {port.qos.trust}, expected dscp"))
            if not pfc:
                problems.append((Verdict.FAIL, "PFC_OFF", f"{nic.netdev}: PFC off on priority {prio}"))
        expected = {"priority": prio, "roce_np": "1", "roce_rp": "1", "trust": "dscp", "pfc": True}
        return [self.outcome(node, problems, "DCQCN_OK",
                             f"{len(roce)} RoCE ports: ECN NP/RP, trust dscp, PFC on priority {prio}",
                             expected=expected, found=found)]


CHECK = Dcqcn()
