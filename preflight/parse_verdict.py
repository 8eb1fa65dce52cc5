"""The verdict a check would give on one pasted output: ``clusterctl preflight parse KIND FILE --profile P``.

On-call holds a ticket's output and wants the answer preflight would give, not only the fields. For the
kinds one check judges from that one output, this builds the check's facts from the parse and runs the
check's own pure ``evaluate`` against the profile (one copy of the thresholds: the check's), for a node
that has ``gpus`` GPUs laid out by the inventory defaults (``iu_size`` GPUs an IU). What a paste cannot
show is stated, never guessed: the nccl run's exit status is taken as 0 (the paste shows the table), the
cstates check sees no kernel arguments and no PM QoS hold, the topology's own NUMA placement is the
node's. The parse's warnings reach the results as the check's do on a host
(:func:`preflight.checks.base.with_parse_warnings`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.model import Node, build_node
from common.errors import ClusterctlError, ExitCode
from preflight.checks.base import with_parse_warnings
from preflight.profiles import profile_for
from preflight.result import CheckResult

PASTED_NODE = "pasted"


@dataclass(frozen=True)
class Judged:
    """How one kind is judged: the check, the GPU count the output itself shows, and its facts."""

    check: str  # the check's name (preflight.checks)
    gpus_shown: Callable[[Any], int | None]
    facts: Callable[[Any, Node, dict[str, Any]], Any]
    assumed: str  # what the verdict takes for granted that the paste does not show


def _nccl_facts(result: Any, node: Node, profile: dict[str, Any]) -> Any:
    from preflight.checks.nccl import NcclRun, all_reduce_argv

    gpus = tuple(range(node.gpu_count))
    return [NcclRun(None, gpus, tuple(all_reduce_argv(gpus, profile["nccl"])), rc=0, parsed=result)]


def _cstates_facts(result: Any, node: Node, profile: dict[str, Any]) -> Any:
    from preflight.checks.cstates import CstatesFacts
    from preflight.parsers.cmdline import KernelCmdline

    return CstatesFacts(result, KernelCmdline([], {}, []), None)


JUDGED: dict[str, Judged] = {
    "nccl": Judged("nccl", lambda r: r.n_gpus, _nccl_facts,
                   "one run on all the GPUs, exit status 0"),
    "topo": Judged("gpu_topology", lambda r: len(r.gpus), lambda r, node, profile: r,
                   "IUs laid out by the inventory defaults, on the NUMA nodes the matrix shows"),
    "chrony": Judged("time_sync", lambda r: None, lambda r, node, profile: r, "nothing"),
    "cpupower": Judged("cstates", lambda r: None, _cstates_facts,
                       "no kernel argument and no PM QoS request holding the CPUs out of deep states"),
    "os-release": Judged("os_support", lambda r: None, lambda r, node, profile: {"os": r, "kernel": None},
                         "nothing (the kernel, which os-release does not show, is not judged)"),
}


def judge(kind: str, result: Any, warnings: list[str], profile_name: str, gpus: int | None,
          iu_size: int | None = None) -> tuple[list[CheckResult], str]:
    """The check's results for ``result`` (a parse of ``kind``) under the named profile, and what the
    verdict assumes; a ClusterctlError (usage) for a kind no check judges alone, or a GPU count that is
    neither given nor shown by the output."""
    from preflight.checks import BY_NAME

    judged = JUDGED.get(kind)
    if judged is None:
        raise ClusterctlError(f"no check judges {kind} output alone; --profile works with: {', '.join(JUDGED)}",
                              ExitCode.USAGE)
    count = gpus or judged.gpus_shown(result)
    if count is None and kind == "nccl":
        raise ClusterctlError(f"the {kind} output does not say how many GPUs ran it: pass --gpus N",
                              ExitCode.USAGE)
    node = _node(profile_name, count or 8, iu_size, result if kind == "topo" else None)
    profile = profile_for(PASTED_NODE, {"preflight_profile": profile_name})
    check = BY_NAME[judged.check]
    results = check.evaluate(judged.facts(result, node, profile), profile, node)
    return with_parse_warnings(results, warnings), judged.assumed


def _node(profile_name: str, gpus: int, iu_size: int | None, topology: Any) -> Node:
    hostvars: dict[str, Any] = {"gpu_model": profile_name, "gpu_count": gpus, "rack": "-"}
    if iu_size is not None:
        hostvars["iu_size"] = iu_size
    elif gpus % 4:  # the default IU of 4 GPUs does not divide them: one IU of all
        hostvars["iu_size"] = gpus
    if topology is not None and len(topology.gpus) == gpus and all(g.numa_node is not None for g in topology.gpus):
        hostvars["gpu_numa_nodes"] = [g.numa_node for g in topology.gpus]
    return build_node(PASTED_NODE, hostvars)
