"""gpu_topology: the GPUs, NVLinks, NUMA placement and NIC distances each IU was laid out for.

``gather``: ``nvidia-smi topo -m`` once per node (kind ``topo``); ``evaluate`` (pure) judges it. Per node: the GPU count equals the inventory's. Per IU: every
GPU pair is connected by at least the profile's number of NVLinks (``NV18`` on H100), every GPU sits on
the IU's NUMA node, and each of the IU's NICs is PIX/PXB from one of its GPUs (GPUDirect RDMA). When an
IU does not fit, the reason carries an ``iu_layout`` that does fit the live topology.

Fault codes: GPU_COUNT, NVLINK_MISSING, NVLINK_DEGRADED, GPU_NUMA, NIC_FAR, NIC_MISSING, TOPO_OK.
"""

from __future__ import annotations

import itertools
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext, verdict_of
from preflight.parsers.topo import Topology
from preflight.result import CheckResult, Verdict

TOPO = ["nvidia-smi", "topo", "-m"]
# PCIe distance tokens of `nvidia-smi topo -m`, nearest first (SOC is the pre-R384 name of SYS).
DISTANCE_ORDER = ("X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")


def link(topology: Any, a: str, b: str) -> str | None:
    return topology.token(a, b)


def gpu_numa(topology: Any) -> dict[int, int | None]:
    """GPU index -> NUMA node from the live topology (None where the driver does not print it)."""
    return {i: gpu.numa_node for i, gpu in enumerate(topology.gpus)}


def nvlink_cliques(topology: Any, numa: dict[int, int | None], size: int, minimum: int) -> list[list[int]]:
    """Disjoint groups of ``size`` GPUs, all pairs >= ``minimum`` NVLinks, each on one NUMA node.

    Exhaustive over combinations per NUMA node (at most C(8,4)=70 per node), taking the lowest-numbered
    fitting group first, which reproduces the default consecutive layout whenever that one fits.
    """
    chosen: list[list[int]] = []
    by_numa: dict[int | None, list[int]] = {}
    for gpu, node in sorted(numa.items()):
        by_numa.setdefault(node, []).append(gpu)
    for _node, gpus in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        free = list(gpus)
        for group in itertools.combinations(gpus, size):
            if not all(g in free for g in group):
                continue
            if all(
                topology.nvlinks(f"GPU{a}", f"GPU{b}") >= minimum
                for a, b in itertools.combinations(group, 2)
            ):
                chosen.append(list(group))
                free = [g for g in free if g not in group]
    return sorted(chosen)


class GpuTopology(Check):
    name = "gpu_topology"
    codes = {
        "GPU_COUNT": "fewer/more GPUs than the inventory's gpu_count",
        "NVLINK_MISSING": "a GPU pair inside an IU has no NVLink (traffic over PCIe)",
        "NVLINK_DEGRADED": "a GPU pair inside an IU has fewer NVLinks than the profile",
        "GPU_NUMA": "a GPU of the IU is not on the IU's NUMA node",
        "NIC_FAR": "an IU's NIC is further than the profile's nic_max_distance from its GPUs",
        "NIC_MISSING": "an IU's NIC does not appear in the topology",
    }

    def gather(self, ctx: NodeContext) -> Topology:
        return ctx.parsed("topo", TOPO)

    def evaluate(self, facts: Topology, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        topology = facts
        gpu_cfg = profile["gpu"]
        found = len(topology.gpus)
        if found != node.gpu_count:
            return [
                self.result(
                    node,
                    Verdict.FAIL,
                    "GPU_COUNT",
                    f"{found} GPUs visible, inventory expects {node.gpu_count}",
                    expected={"gpus": node.gpu_count},
                    found={"gpus": found},
                )
            ]
        numa = gpu_numa(topology)
        results = [
            self.result(
                node,
                Verdict.PASS,
                "TOPO_OK",
                f"{found} GPUs",
                expected={"gpus": node.gpu_count},
                found={"gpus": found},
            )
        ]
        layout_wrong = False
        for iu in node.ius:
            problems = self._iu_problems(topology, numa, iu, node, gpu_cfg)
            if not problems:
                results.append(
                    self.result(
                        node,
                        Verdict.PASS,
                        "TOPO_OK",
                        f"GPUs {iu.cuda_visible_devices} NVLink-connected on NUMA {iu.numa_node}",
                        iu=iu.id,
                        expected={"nvlink_min": gpu_cfg["nvlink_min"], "numa_node": iu.numa_node},
                        found={"numa": {g: numa.get(g) for g in iu.gpus}},
                    )
                )
                continue
            layout_wrong |= any(p[1] in ("NVLINK_MISSING", "NVLINK_DEGRADED", "GPU_NUMA") for p in problems)
            verdict, code, reason = verdict_of(problems)
            results.append(
                self.result(
                    node,
                    verdict,
                    code,
                    reason + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                    iu=iu.id,
                    problems=[p[2] for p in problems],
                    expected={
                        "nvlink_min": gpu_cfg["nvlink_min"],
                        "numa_node": iu.numa_node,
                        "nic_max_distance": gpu_cfg["nic_max_distance"],
                    },
                    found={
                        "links": {
                            f"GPU{a}-GPU{b}": link(topology, f"GPU{a}", f"GPU{b}")
                            for a, b in itertools.combinations(iu.gpus, 2)
                        },
                        "numa": {g: numa.get(g) for g in iu.gpus},
                    },
                )
            )
        if layout_wrong:
            self._suggest(results, topology, numa, node, gpu_cfg["nvlink_min"])
        return results

    def _iu_problems(self, topology, numa, iu, node, gpu_cfg) -> list[tuple[Verdict, str, str]]:
        problems: list[tuple[Verdict, str, str]] = []
        for a, b in itertools.combinations(iu.gpus, 2):
            token = link(topology, f"GPU{a}", f"GPU{b}")
            links = topology.nvlinks(f"GPU{a}", f"GPU{b}")
            if links == 0:
                problems.append((Verdict.FAIL, "NVLINK_MISSING", f"GPU{a}-GPU{b} is {token}, not NVLink"))
            elif links < gpu_cfg["nvlink_min"]:
                problems.append(
                    (
                        Verdict.FAIL,
                        "NVLINK_DEGRADED",
                        f"GPU{a}-GPU{b} has {links} NVLinks, expected >= {gpu_cfg['nvlink_min']}",
                    )
                )
        for g in iu.gpus:
            if numa.get(g) is not None and numa[g] != iu.numa_node:
                problems.append(
                    (Verdict.FAIL, "GPU_NUMA", f"GPU{g} is on NUMA {numa[g]}, IU expects {iu.numa_node}")
                )
        problems += self._nic_problems(topology, iu, node, gpu_cfg["nic_max_distance"])
        return problems

    def _nic_problems(self, topology, iu, node, max_distance: str) -> list[tuple[Verdict, str, str]]:
        by_device = {n.device: n.name for n in topology.nics if n.device}
        if not topology.nics:
            return []  # a driver that prints no NIC rows: nothing to judge here (ib_ports covers the HCAs)
        problems: list[tuple[Verdict, str, str]] = []
        limit = DISTANCE_ORDER.index(max_distance)
        for device in iu.nics:
            label = by_device.get(device)
            if label is None:
                problems.append((Verdict.FAIL, "NIC_MISSING", f"{device} not in `nvidia-smi topo -m`"))
                continue
            paired = [n.gpu for n in node.nics if n.device == device and n.gpu is not None]
            gpus = paired or list(iu.gpus)
            tokens = {g: link(topology, f"GPU{g}", label) or "?" for g in gpus}
            best = min(tokens.values(), key=lambda t: DISTANCE_ORDER.index(t) if t in DISTANCE_ORDER else 99)
            if best not in DISTANCE_ORDER or DISTANCE_ORDER.index(best) > limit:
                where = ", ".join(f"GPU{g}:{t}" for g, t in tokens.items())
                problems.append((Verdict.FAIL, "NIC_FAR", f"{device} is {where}, expected <= {max_distance}"))
        return problems

    def _suggest(self, results: list[CheckResult], topology, numa, node, minimum: int) -> None:
        layout = nvlink_cliques(topology, numa, node.iu_size, minimum)
        used = {g for group in layout for g in group}
        left_out = [g for g in range(len(topology.gpus)) if g not in used]
        note = f"; suggested iu_layout: {layout}" + (f" (GPUs {left_out} unusable)" if left_out else "")
        for i, result in enumerate(results):
            if result.verdict is Verdict.FAIL and result.iu is not None:
                evidence = {**result.evidence, "suggested_iu_layout": layout, "unusable_gpus": left_out}
                results[i] = type(result)(
                    result.rack,
                    result.node,
                    result.iu,
                    result.check,
                    result.verdict,
                    result.reason + note,
                    evidence,
                )


CHECK = GpuTopology()
