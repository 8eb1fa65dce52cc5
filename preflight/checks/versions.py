"""versions: driver, CUDA, fabric manager, NCCL and OFED equal across the rack and to the inventory pins.

Per node (with the node checks): the driver and CUDA versions from ``nvidia-smi -q`` (shared with
gpu_health), ``nv-fabricmanager --version`` on NVSwitch boards, ``dpkg-query`` for libnccl2 and
``ofed_info -s``. Per rack: a version differing from the inventory pin (``preflight_version_pins``
or the nvidia_stack role variables of :data:`cluster.spec.PIN_VARS`, resolved into
``node.settings.version_pins``) -> FAIL; without a pin, one differing from the rack's
most common value -> FAIL. A component a host cannot report is shown as unknown, not guessed.

Fault codes: VERSION_PIN, VERSION_DRIFT, VERSION_UNKNOWN, VERSIONS_OK.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from cluster.spec import COMPONENTS
from preflight.checks.base import Check, GatherError, NodeContext, RackContext
from preflight.checks.gpu_health import NVSMI_Q, nvsmi_q_fields
from preflight.result import CheckResult, Verdict

_FM = re.compile(r"version is\s*:\s*(\S+)", re.IGNORECASE)
_NCCL_CODE = re.compile(r"nccl-library=(\d+)")
_NCCL_PRINTED = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def nccl_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> x.y.z (major*10000 + minor*100 + patch since 2.9, major*1000 + ... before)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_in_outputs(outputs: list[str]) -> str | None:
    for text in outputs:
        printed = _NCCL_PRINTED.search(text)
        if printed:
            return printed.group(1)
        code = _NCCL_CODE.search(text)
        if code:
            return nccl_from_code(int(code.group(1)))
    return None


def matches_pin(found: str, pin: str) -> bool:
    """'2.21.5-1+cuda12.4' matches pin '2.21.5'; '550.90.07' does not match '550.90.0'."""
    return found == pin or (found.startswith(pin) and not found[len(pin)].isalnum())


def pins_of(node) -> dict[str, str]:
    return dict(node.settings.version_pins)


class Versions(Check):
    name = "versions"
    scope = "rack"
    codes = {
        "VERSION_PIN": "a component differs from the inventory pin",
        "VERSION_DRIFT": "a component differs from the rest of the rack",
        "VERSION_UNKNOWN": "a pinned component could not be read",
    }

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        found: dict[str, Any] = dict.fromkeys(COMPONENTS)
        fields = nvsmi_q_fields(ctx.output(NVSMI_Q))
        found["driver"], found["cuda"] = fields["driver"], fields["cuda"]
        if ctx.profile["gpu"]["nvswitch"]:
            fm = ctx.run(["nv-fabricmanager", "--version"])
            match = _FM.search(fm.stdout) if fm.ok else None
            found["fabric_manager"] = match.group(1) if match else None
        nccl = ctx.run(["dpkg-query", "-W", "-f", "${Version}", "libnccl2"])
        if nccl.ok and nccl.stdout.strip():
            found["nccl"] = nccl.stdout.strip()
        else:  # no dpkg (or NCCL from a tarball): the version nccl-tests printed, if the nccl check ran
            found["nccl"] = nccl_in_outputs(ctx.cached_outputs("all_reduce_perf"))
        ofed = ctx.run(["ofed_info", "-s"])
        if ofed.ok and ofed.stdout.strip():
            found["ofed"] = ofed.stdout.strip().splitlines()[-1].rstrip(":")
        return found

    def run_rack(self, ctx: RackContext) -> list[CheckResult]:
        results = []
        gathered = {c.node.name: ctx.facts.get(c.node.name) for c in ctx.nodes}
        usable = {name: v for name, v in gathered.items() if isinstance(v, dict)}
        common: dict[str, tuple[str | None, int]] = {}
        for component in COMPONENTS:
            counts = Counter(v[component] for v in usable.values() if v[component] is not None)
            ranked = counts.most_common()
            tie = len(ranked) > 1 and ranked[0][1] == ranked[1][1]
            common[component] = (None if not ranked or tie else ranked[0][0], len(ranked))
        for nctx in ctx.nodes:
            node = nctx.node
            found = gathered[node.name]
            if isinstance(found, GatherError):
                results.append(self.error(node, found))
                continue
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
                            f"{component} {value}, rest of rack {ctx.rack} on {', '.join(others)}",
                        )
                    )
            evidence = {
                "expected": {"pins": pins, "rack": {c: common[c][0] for c in COMPONENTS}},
                "found": found,
            }
            if not problems:
                known = ", ".join(f"{c} {found[c]}" for c in ("driver", "cuda", "nccl") if found[c])
                results.append(
                    self.result(
                        node, Verdict.PASS, "VERSIONS_OK", known or "no versions readable", **evidence
                    )
                )
                continue
            worst = next(p for v in (Verdict.FAIL, Verdict.WARN) for p in problems if p[0] is v)
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            results.append(
                self.result(
                    node, worst[0], worst[1], worst[2] + more, problems=[p[2] for p in problems], **evidence
                )
            )
        return results


CHECK = Versions()
