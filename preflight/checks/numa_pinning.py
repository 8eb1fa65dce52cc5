"""numa_pinning: each IU's vLLM unit is pinned to the CPUs and memory of the IU's NUMA node.

``gather`` reads back what systemd applies (``systemctl show -p CPUAffinity,NUMAPolicy,NUMAMask
vllm-iu@<N>``, kind ``systemctl-show``), not the unit files, and the live topology
(``/sys/devices/system/node/node<N>/cpulist`` on the host, kind ``cpulist``); ``evaluate`` (pure)
compares them, so a stale drop-in or a BIOS that renumbered CPUs is caught. Each IU is judged on its
own: a command that fails for one IU is an ERROR for that IU only.

Fault codes: UNIT_MISSING, CPU_AFFINITY, NUMA_POLICY, NUMA_MASK, NUMA_UNKNOWN, PINNING_OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, verdict_of
from preflight.parsers.cpulist import CpuList, format_cpus
from preflight.parsers.systemctl_show import UnitShow
from preflight.result import CheckResult, Verdict

UNIT = "vllm-iu@{index}.service"
ACCEPTED_POLICIES = ("bind", "preferred")  # memory local to the IU's socket (preferred may spill when full)
PROPERTIES = "LoadState,CPUAffinity,NUMAPolicy,NUMAMask"


@dataclass(frozen=True)
class IuPinning:
    node_cpus: CpuList  # the CPUs of the IU's NUMA node, live
    unit: UnitShow  # what systemd applies to the IU's unit


def show_argv(unit: str) -> list[str]:
    return ["systemctl", "show", "-p", PROPERTIES, unit]


class NumaPinning(Check):
    name = "numa_pinning"
    codes = {
        "UNIT_MISSING": "the IU's vllm-iu@ unit is not installed",
        "CPU_AFFINITY": "CPUAffinity differs from the IU's NUMA node CPUs",
        "NUMA_POLICY": "NUMAPolicy is not bind/preferred",
        "NUMA_MASK": "NUMAMask differs from the IU's NUMA node",
        "NUMA_UNKNOWN": "the IU has no NUMA node in the inventory",
    }

    def gather(self, ctx: NodeContext) -> dict[str, IuPinning | GatherError]:
        """IU id -> its readings, or the GatherError of its commands (IUs without a NUMA node: absent)."""
        facts: dict[str, IuPinning | GatherError] = {}
        for iu in ctx.node.ius:
            if iu.numa_node is None:
                continue
            try:
                facts[iu.id] = self._gather_iu(ctx, iu)
            except GatherError as exc:
                facts[iu.id] = exc
        return facts

    def _gather_iu(self, ctx: NodeContext, iu) -> IuPinning:
        node_cpus = ctx.parsed("cpulist", ["cat", f"/sys/devices/system/node/node{iu.numa_node}/cpulist"])
        argv = show_argv(UNIT.format(index=iu.index))
        shown = ctx.parsed("systemctl-show", argv)
        unit = shown.units[0]
        if unit.load_state is None:  # properties, but not the ones asked for: not an answer about this unit
            raise GatherError(f"`{command_line(argv)}` gave no LoadState", command=command_line(argv))
        return IuPinning(node_cpus, unit)

    def evaluate(self, facts: dict[str, IuPinning | GatherError], profile: dict[str, Any],
                 node: Node) -> list[CheckResult]:
        return [self._one(facts.get(iu.id), iu, node) for iu in node.ius]

    def _one(self, reading: IuPinning | GatherError | None, iu, node: Node) -> CheckResult:
        if iu.numa_node is None:
            return self.result(node, Verdict.FAIL, "NUMA_UNKNOWN", "IU has no NUMA node (set gpu_numa_nodes)", iu=iu.id)
        if isinstance(reading, GatherError):
            return self.error(node, reading, iu=iu.id)
        if reading is None:
            return self.result(node, Verdict.ERROR, "GATHER", "no reading of this IU's unit was taken", iu=iu.id)
        unit = UNIT.format(index=iu.index)
        node_cpus = set(reading.node_cpus.cpus)
        props = reading.unit
        affinity = set(props.cpu_affinity or ())
        mask = set(props.numa_mask or ())
        expected = {"unit": unit, "CPUAffinity": format_cpus(node_cpus), "NUMAPolicy": "|".join(ACCEPTED_POLICIES),
                    "NUMAMask": str(iu.numa_node)}
        found = {"LoadState": props.load_state, "CPUAffinity": format_cpus(affinity),
                 "NUMAPolicy": props.get("NUMAPolicy"), "NUMAMask": format_cpus(mask)}
        problems: list[tuple[Verdict, str, str]] = []
        if props.load_state == "not-found":  # systemd's word for "no such unit file"
            problems.append((Verdict.FAIL, "UNIT_MISSING",
                             f"{unit} not installed (is the node provisioned? run clusterctl provision)"))
        elif props.load_state != "loaded":
            problems.append((Verdict.FAIL, "UNIT_MISSING", f"{unit} is {props.load_state}"))
        else:
            if affinity != node_cpus:
                what = "unpinned" if not affinity else f"pinned to {format_cpus(affinity)}"
                problems.append((Verdict.FAIL, "CPU_AFFINITY",
                                 f"{unit} {what}, NUMA {iu.numa_node} CPUs are {format_cpus(node_cpus)}"))
            if props.get("NUMAPolicy") not in ACCEPTED_POLICIES:
                problems.append((Verdict.FAIL, "NUMA_POLICY", f"{unit} NUMAPolicy={props.get('NUMAPolicy') or '(none)'}"))
            if mask != {iu.numa_node}:
                problems.append((Verdict.FAIL, "NUMA_MASK",
                                 f"{unit} NUMAMask={format_cpus(mask) or '(none)'}, expected {iu.numa_node}"))
        if not problems:
            return self.result(node, Verdict.PASS, "PINNING_OK",
                               f"{unit} on NUMA {iu.numa_node} CPUs {format_cpus(node_cpus)}",
                               iu=iu.id, expected=expected, found=found)
        verdict, code, reason = verdict_of(problems)
        return self.result(node, verdict, code, reason, iu=iu.id, expected=expected, found=found)


CHECK = NumaPinning()
