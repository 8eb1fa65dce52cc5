"""cstates: the effective CPU idle state, read back from the running kernel, not from config files.

Deep idle states cost tens to hundreds of microseconds on wake-up, which shows up as decode jitter.
PASS when any of these holds: every idle state outside ``cstates.allowed_states`` is disabled
(``cpupower idle-info`` reads the cpuidle ``disable`` flags), or the kernel runs with ``idle=poll`` or
``intel_idle.max_cstate``/``processor.max_cstate`` <= 1 (``/proc/cmdline``), or a PM QoS request holds
the CPU DMA latency below every enabled deep state's exit latency (``/dev/cpu_dma_latency``).

Fault codes: CSTATES_DEEP, CSTATES_OK.
"""

from __future__ import annotations

import re

from preflight.checks.base import Check, GatherError, NodeContext
from preflight.result import CheckResult, Verdict

CPUPOWER = ["cpupower", "idle-info"]
CMDLINE = ["cat", "/proc/cmdline"]
# od prints the 32-bit PM QoS target (us) that the kernel returns when /dev/cpu_dma_latency is read.
PM_QOS = ["od", "-An", "-tu4", "-N4", "/dev/cpu_dma_latency"]
_MAX_CSTATE = re.compile(r"\b(intel_idle|processor)\.max_cstate=(\d+)\b")


def cmdline_limits(cmdline: str) -> list[str]:
    """Kernel arguments on this boot that keep CPUs out of deep idle states."""
    words = cmdline.split()
    held = [w for w in words if w in ("idle=poll", "idle=halt", "cpuidle.off=1")]
    limits = dict(_MAX_CSTATE.findall(cmdline))
    # intel_idle.max_cstate=0 hands idle to acpi_idle, which processor.max_cstate then limits.
    if (
        "intel_idle" in limits
        and int(limits["intel_idle"]) <= 1
        and (int(limits["intel_idle"]) == 1 or int(limits.get("processor", 99)) <= 1)
    ):
        held.append(" ".join(f"{k}.max_cstate={v}" for k, v in sorted(limits.items())))
    elif "intel_idle" not in limits and int(limits.get("processor", 99)) <= 1:
        held.append(f"processor.max_cstate={limits['processor']}")
    return held


class Cstates(Check):
    name = "cstates"
    codes = {
        "CSTATES_DEEP": "idle states deeper than the profile allows are enabled and nothing holds them off"
    }

    def run(self, ctx: NodeContext) -> list[CheckResult]:
        node = ctx.node
        allowed = set(ctx.profile["cstates"]["allowed_states"])
        try:
            info = ctx.parsed("cpupower", CPUPOWER)
            cmdline = ctx.output(CMDLINE).strip()
        except GatherError as exc:
            return [self.error(node, exc)]
        deep_enabled = [s for s in info.states if s.name not in allowed and not s.disabled]
        held_by_args = cmdline_limits(cmdline)
        evidence = {
            "expected": {"enabled_states_within": sorted(allowed)},
            "found": {
                "driver": info.driver,
                "enabled": [s.name for s in info.states if not s.disabled],
                "disabled": [s.name for s in info.states if s.disabled],
                "kernel_args": held_by_args,
            },
        }
        if not deep_enabled:
            how = "deeper states disabled" if info.states else "no cpuidle states"
            return [
                self.result(
                    node, Verdict.PASS, "CSTATES_OK", f"{how} ({info.driver or 'no driver'})", **evidence
                )
            ]
        if held_by_args:
            return [
                self.result(
                    node, Verdict.PASS, "CSTATES_OK", f"held by kernel args {held_by_args[0]}", **evidence
                )
            ]
        qos = ctx.run(PM_QOS)
        target = (
            int(qos.stdout.split()[0])
            if qos.ok and qos.stdout.split() and qos.stdout.split()[0].isdigit()
            else None
        )
        evidence["found"]["pm_qos_us"] = target
        if target is not None and all(target < s.latency_us for s in deep_enabled):
            return [
                self.result(node, Verdict.PASS, "CSTATES_OK", f"held by PM QoS ({target} us)", **evidence)
            ]
        names = ", ".join(f"{s.name} ({s.latency_us} us)" for s in deep_enabled)
        return [
            self.result(
                node,
                Verdict.FAIL,
                "CSTATES_DEEP",
                f"deep idle states enabled: {names}; disable them or boot with intel_idle.max_cstate=0 "
                "processor.max_cstate=1",
                **evidence,
            )
        ]


CHECK = Cstates()
