"""versions: driver, CUDA, fabric manager, NCCL and OFED equal across the rack and to the inventory pins.

Per node (``gather``, with the node checks): the driver and CUDA versions from ``nvidia-smi -q`` (the
cached run of gpu_health, read by the ``nvsmi-q`` parser), ``nv-fabricmanager --version`` on NVSwitch
boards (kind ``fabricmanager-version``), ``dpkg-query`` for libnccl2 (kind ``dpkg-version``; else the version nccl-tests
printed, read by :func:`preflight.parsers.nccl.library_version`) and ``ofed_info -s`` (kind
``ofed-info``). Per rack (``run_rack``: the pure ``evaluate`` per node over the rack's gathered facts,
:class:`RackVersions`): a version differing from the
inventory pin (``preflight_version_pins`` or the nvidia_stack role variables of :data:`cluster.spec.PIN_VARS`,
resolved into ``node.settings.version_pins``) -> FAIL; without a pin, one differing from the rack's
most common value -> FAIL. A component a host cannot report is shown as unknown, not guessed.

Fault codes: VERSION_PIN, VERSION_DRIFT, VERSION_UNKNOWN, VERSIONS_OK.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from cluster.spec import COMPONENTS
from preflight.checks.base import Check, GatherError, NodeContext, RackContext, command_line, parse_output
from preflight.checks.gpu_health import NVSMI_Q
from preflight.parsers import nccl as nccl_parser
from preflight.result import CheckResult, Verdict

FABRIC_MANAGER = ["nv-fabricmanager", "--version"]
OFED_INFO = ["ofed_info", "-s"]
DPKG_NCCL = ["dpkg-query", "-W", "-f", "${Version}", "libnccl2"]


def nccl_in_outputs(outputs: list[str]) -> str | None:
    """The NCCL library version the first of these nccl-tests outputs names (preflight.parsers.nccl)."""
    return next((v for v in map(nccl_parser.library_version, outputs) if v is not None), None)


def matches_pin(found: str, pin: str) -> bool:
    """'2.21.5-1+cuda12.4' matches pin '2.21.5'; '550.90.07' does not match '550.90.0'."""
    return found == pin or (found.startswith(pin) and not found[len(pin)].isalnum())


def pins_of(node) -> dict[str, str]:
    return dict(node.settings.version_pins)


@dataclass
class RackVersions:
    """What gather read on each node of a rack (a GatherError where it could not), in inventory order."""

    rack: str
    found: dict[str, dict[str, Any] | GatherError]


class Versions(Check):
    name = "versions"
    scope = "rack"
    reads_outputs_of = ("gpu_health", "nccl")  # nvidia-smi -q; the NCCL version all_reduce_perf printed
    codes = {
        "VERSION_PIN": "a component differs from the inventory pin",
        "VERSION_DRIFT": "a component differs from the rest of the rack",
        "VERSION_UNKNOWN": "a pinned component could not be read",
    }

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        found: dict[str, Any] = dict.fromkeys(COMPONENTS)
        report = ctx.parsed("nvsmi-q", NVSMI_Q)  # the run gpu_health made (cached), by the one nvsmi-q parser
        found["driver"], found["cuda"] = report.driver_version, report.cuda_version
        # A reporter that is missing (the command fails) leaves its component unknown; one that answers
        # with something unreadable is an ERROR naming the command, never a silently unknown version.
        if ctx.profile["gpu"]["nvswitch"] and ctx.run(FABRIC_MANAGER).ok:
            found["fabric_manager"] = ctx.parsed("fabricmanager-version", FABRIC_MANAGER).version
        nccl = ctx.run(DPKG_NCCL)
        if nccl.ok and nccl.stdout.strip():  # empty: known to dpkg but not installed (config-files)
            found["nccl"] = parse_output("dpkg-version", nccl.stdout, command_line(DPKG_NCCL)).version
        else:  # no dpkg (or NCCL from a tarball): the version nccl-tests printed, if the nccl check ran
            found["nccl"] = nccl_in_outputs(ctx.cached_outputs("all_reduce_perf"))
        ofed = ctx.run(OFED_INFO)
        if ofed.ok and ofed.stdout.strip():
            found["ofed"] = ctx.parsed("ofed-info", OFED_INFO).version
        return found

    def run_rack(self, ctx: RackContext) -> list[CheckResult]:
        """The pure evaluate for each node, over what gather read on every node of the rack."""
        facts = RackVersions(ctx.rack, {c.node.name: ctx.facts.get(c.node.name) for c in ctx.nodes})
        return [r for c in ctx.nodes for r in self.evaluate(facts, c.profile, c.node)]

    def evaluate(self, facts: RackVersions, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        """This node's versions against its pins, else against the rack's most common value (pure)."""
        gathered = facts.found
        usable = {name: v for name, v in gathered.items() if isinstance(v, dict)}
        common: dict[str, tuple[str | None, int]] = {}
        for component in COMPONENTS:
            counts = Counter(v[component] for v in usable.values() if v[component] is not None)
            ranked = counts.most_common()
            tie = len(ranked) > 1 and ranked[0][1] == ranked[1][1]
            common[component] = (None if not ranked or tie else ranked[0][0], len(ranked))
        found = gathered[node.name]
        if isinstance(found, GatherError):
            return [self.error(node, found)]
        pins = pins_of(node)
        problems: list[tuple[Verdict, str, str]] = []
        for component in COMPONENTS:
            value, pin = found[component], pins.get(component)
            majority, distinct = common[component]
            if pin is not None and value is None:
                problems.append((Verdict.WARN, "VERSION_UNKNOWN", f"{component} unknown (pinned {pin})"))
            elif pin is not None and not matches_pin(value, pin):
                problems.append((Verdict.FAIL, "VERSION_PIN", f"{component} {value}, pinned {pin}"))
            elif pin is None and value is not None and distinct > 1 and value != majority:
                others = sorted(
                    {v[component] for n, v in usable.items() if v[component] not in (None, value)}
                )
                problems.append(
                    (
                        Verdict.FAIL,
                        "VERSION_DRIFT",
                        f"{component} {value}, rest of rack {facts.rack} on {', '.join(others)}",
                    )
                )
        evidence = {
            "expected": {"pins": pins, "rack": {c: common[c][0] for c in COMPONENTS}},
            "found": found,
        }
        if not problems:
            known = ", ".join(f"{c} {found[c]}" for c in ("driver", "cuda", "nccl") if found[c])
            return [self.result(node, Verdict.PASS, "VERSIONS_OK", known or "no versions readable", **evidence)]
        worst = next(p for v in (Verdict.FAIL, Verdict.WARN) for p in problems if p[0] is v)
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return [self.result(node, worst[0], worst[1], worst[2] + more, problems=[p[2] for p in problems], **evidence)]


CHECK = Versions()
