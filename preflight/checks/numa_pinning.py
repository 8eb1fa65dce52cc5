"""numa_pinning: each IU's vLLM unit is pinned to the CPUs and memory of the IU's NUMA node.

Reads back what systemd applies (``systemctl show -p CPUAffinity,NUMAPolicy,NUMAMask vllm-iu@<N>``),
not the unit files, and compares it with the live topology (``/sys/devices/system/node/node<N>/cpulist``
on the host), so a stale drop-in or a BIOS that renumbered CPUs is caught.

Fault codes: UNIT_MISSING, CPU_AFFINITY, NUMA_POLICY, NUMA_MASK, NUMA_UNKNOWN, PINNING_OK.
"""

from __future__ import annotations

from preflight.checks.base import Check, GatherError, NodeContext, verdict_of
from preflight.result import CheckResult, Verdict

UNIT = "vllm-iu@{index}.service"
ACCEPTED_POLICIES = ("bind", "preferred")  # memory local to the IU's socket (preferred may spill when full)


def parse_cpu_list(text: str) -> set[int]:
    """'0-47,96-143' (kernel cpulist) or '0-47 96-143' / '0 1 2' (systemctl show) -> set of CPUs."""
    cpus: set[int] = set()
    for token in text.replace(",", " ").split():
        if "-" in token:
            low, high = token.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        else:
            cpus.add(int(token))
    return cpus


def compact(cpus: set[int]) -> str:
    ordered, ranges, i = sorted(cpus), [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def show_properties(text: str) -> dict[str, str]:
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


class NumaPinning(Check):
    name = "numa_pinning"
    codes = {
        "UNIT_MISSING": "the IU's vllm-iu@ unit is not installed",
        "CPU_AFFINITY": "CPUAffinity differs from the IU's NUMA node CPUs",
        "NUMA_POLICY": "NUMAPolicy is not bind/preferred",
        "NUMA_MASK": "NUMAMask differs from the IU's NUMA node",
        "NUMA_UNKNOWN": "the IU has no NUMA node in the inventory",
    }

    def run(self, ctx: NodeContext) -> list[CheckResult]:
        return [self._one(ctx, iu) for iu in ctx.node.ius]

    def _one(self, ctx: NodeContext, iu) -> CheckResult:
        node = ctx.node
        if iu.numa_node is None:
            return self.result(
                node, Verdict.FAIL, "NUMA_UNKNOWN", "IU has no NUMA node (set gpu_numa_nodes)", iu=iu.id
            )
        unit = UNIT.format(index=iu.index)
        try:
            node_cpus = parse_cpu_list(
                ctx.output(["cat", f"/sys/devices/system/node/node{iu.numa_node}/cpulist"])
            )
            show = ["systemctl", "show", "-p", "LoadState,CPUAffinity,NUMAPolicy,NUMAMask", unit]
            props = show_properties(ctx.output(show))
            if (
                "LoadState" not in props
            ):  # e.g. "Running in chroot, ignoring command 'show'": no manager to ask
                raise GatherError(
                    f"`systemctl show {unit}` gave no properties: "
                    f"{ctx.run(show).last_line() or 'empty output'}"
                )
            affinity = parse_cpu_list(props.get("CPUAffinity", ""))
            mask = parse_cpu_list(props.get("NUMAMask", ""))
        except ValueError as exc:
            return self.result(node, Verdict.ERROR, "GATHER", f"cannot read CPU list: {exc}", iu=iu.id)
        except GatherError as exc:
            return self.error(node, exc, iu=iu.id)
        expected = {
            "unit": unit,
            "CPUAffinity": compact(node_cpus),
            "NUMAPolicy": "|".join(ACCEPTED_POLICIES),
            "NUMAMask": str(iu.numa_node),
        }
        found = {
            "LoadState": props.get("LoadState"),
            "CPUAffinity": compact(affinity),
            "NUMAPolicy": props.get("NUMAPolicy"),
            "NUMAMask": compact(mask),
        }
        problems: list[tuple[Verdict, str, str]] = []
        if props.get("LoadState") != "loaded":
            problems.append((Verdict.FAIL, "UNIT_MISSING", f"{unit} is {props.get('LoadState')}"))
        else:
            if affinity != node_cpus:
                what = "unpinned" if not affinity else f"pinned to {compact(affinity)}"
                problems.append(
                    (
                        Verdict.FAIL,
                        "CPU_AFFINITY",
                        f"{unit} {what}, NUMA {iu.numa_node} CPUs are {compact(node_cpus)}",
                    )
                )
            if props.get("NUMAPolicy") not in ACCEPTED_POLICIES:
                problems.append(
                    (Verdict.FAIL, "NUMA_POLICY", f"{unit} NUMAPolicy={props.get('NUMAPolicy') or '(none)'}")
                )
            if mask != {iu.numa_node}:
                problems.append(
                    (
                        Verdict.FAIL,
                        "NUMA_MASK",
                        f"{unit} NUMAMask={compact(mask) or '(none)'}, expected {iu.numa_node}",
                    )
                )
        if not problems:
            return self.result(
                node,
                Verdict.PASS,
                "PINNING_OK",
                f"{unit} on NUMA {iu.numa_node} CPUs {compact(node_cpus)}",
                iu=iu.id,
                expected=expected,
                found=found,
            )
        verdict, code, reason = verdict_of(problems)
        return self.result(node, verdict, code, reason, iu=iu.id, expected=expected, found=found)


CHECK = NumaPinning()
