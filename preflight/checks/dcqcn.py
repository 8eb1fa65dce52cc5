"""dcqcn: RoCE congestion control on every Ethernet (RoCE) HCA; InfiniBand links -> SKIP.

On the lossless priority (``dcqcn.priority``): ECN notification point and reaction point enabled
(``/sys/class/net/<if>/ecn/roce_np|roce_rp/enable/<prio>``, the mlx5 knobs), and from ``mlnx_qos -i <if>``
the trust state is ``dscp`` and PFC is enabled on that priority.

Fault codes: ECN_NP_OFF, ECN_RP_OFF, TRUST_NOT_DSCP, PFC_OFF, DCQCN_IB_SKIP, DCQCN_OK.
"""

from __future__ import annotations

import re

from preflight.checks.base import Check, GatherError, NodeContext
from preflight.result import CheckResult, Verdict

_TRUST = re.compile(r"^\s*Priority trust state:\s*(\S+)", re.IGNORECASE)


def parse_mlnx_qos(text: str) -> dict:
    """{"trust": "dscp", "pfc": {0: False, ..., 3: True}} from ``mlnx_qos -i <if>`` output.

    The PFC block is two rows under "PFC configuration:", ``priority 0 1 .. 7`` and ``enabled 0 0 0 1 ..``.
    Raises ValueError when either part is missing.
    """
    trust, priorities, enabled = None, None, None
    for line in text.replace("\r", "").splitlines():
        match = _TRUST.match(line)
        if match:
            trust = match.group(1).lower()
        words = line.split()
        if (
            words[:1] == ["priority"]
            and len(words) > 1
            and all(w.isdigit() for w in words[1:])
            and priorities is None
        ):
            priorities = [int(w) for w in words[1:]]
        elif words[:1] == ["enabled"] and priorities is not None and enabled is None:
            enabled = [w == "1" for w in words[1:]]
    if trust is None or priorities is None or enabled is None or len(enabled) < len(priorities):
        raise ValueError("no 'Priority trust state' line or no PFC 'priority'/'enabled' rows")
    return {"trust": trust, "pfc": dict(zip(priorities, enabled, strict=False))}


class Dcqcn(Check):
    name = "dcqcn"
    codes = {
        "ECN_NP_OFF": "ECN notification point (roce_np) disabled on the lossless priority",
        "ECN_RP_OFF": "ECN reaction point (roce_rp) disabled on the lossless priority",
        "TRUST_NOT_DSCP": "the port trusts PCP (or nothing) instead of DSCP",
        "PFC_OFF": "PFC not enabled on the lossless priority",
    }

    def run(self, ctx: NodeContext) -> list[CheckResult]:
        node = ctx.node
        roce = [n for n in node.nics if n.link_layer == "ethernet"]
        if not roce:
            return [
                self.result(node, Verdict.SKIP, "DCQCN_IB_SKIP", "no RoCE links (InfiniBand has no DCQCN)")
            ]
        prio = ctx.profile["dcqcn"]["priority"]
        problems: list[tuple[Verdict, str, str]] = []
        found = {}
        for nic in roce:
            if not nic.netdev:
                problems.append(
                    (Verdict.FAIL, "PFC_OFF", f"{nic.device}: inventory gives no netdev to check")
                )
                continue
            try:
                np_on = ctx.output(["cat", f"/sys/class/net/{nic.netdev}/ecn/roce_np/enable/{prio}"]).strip()
                rp_on = ctx.output(["cat", f"/sys/class/net/{nic.netdev}/ecn/roce_rp/enable/{prio}"]).strip()
                qos_text = ctx.output(["mlnx_qos", "-i", nic.netdev])
                qos = parse_mlnx_qos(qos_text)
            except GatherError as exc:
                return [self.error(node, exc)]
            except ValueError as exc:
                return [
                    self.result(
                        node,
                        Verdict.ERROR,
                        "GATHER",
                        f"cannot parse `mlnx_qos -i {nic.netdev}`: {exc}",
                        output=qos_text[:400],
                    )
                ]
            found[nic.netdev] = {
                "roce_np": np_on,
                "roce_rp": rp_on,
                "trust": qos["trust"],
                "pfc": qos["pfc"].get(prio),
            }
            if np_on != "1":
                problems.append(
                    (Verdict.FAIL, "ECN_NP_OFF", f"{nic.netdev}: ECN roce_np off on priority {prio}")
                )
            if rp_on != "1":
                problems.append(
                    (Verdict.FAIL, "ECN_RP_OFF", f"{nic.netdev}: ECN roce_rp off on priority {prio}")
                )
            if qos["trust"] != "dscp":
                problems.append(
                    (Verdict.FAIL, "TRUST_NOT_DSCP", f"{nic.netdev}: trust {qos['trust']}, expected dscp")
                )
            if not qos["pfc"].get(prio):
                problems.append((Verdict.FAIL, "PFC_OFF", f"{nic.netdev}: PFC off on priority {prio}"))
        expected = {"priority": prio, "roce_np": "1", "roce_rp": "1", "trust": "dscp", "pfc": True}
        return [
            self.outcome(
                node, problems, "DCQCN_OK", f"{len(roce)} RoCE ports: ECN NP/RP, trust dscp, PFC on priority {prio}",
                expected=expected, found=found,
            )
        ]


CHECK = Dcqcn()
