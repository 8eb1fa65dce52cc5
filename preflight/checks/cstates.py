"""cstates: the effective CPU idle state, read back from the running kernel, not from config files.

Deep idle states cost tens to hundreds of microseconds on wake-up, which shows up as decode jitter.
``gather`` runs ``cpupower idle-info`` (kind ``cpupower``), reads ``/proc/cmdline`` (kind ``cmdline``)
and the PM QoS CPU latency target (kind ``pm-qos``); ``evaluate`` (pure) passes when any of these holds: every idle state outside ``cstates.allowed_states`` is disabled
(``cpupower idle-info`` reads the cpuidle ``disable`` flags), or the kernel runs with ``idle=poll`` or
``intel_idle.max_cstate``/``processor.max_cstate`` <= 1 (``/proc/cmdline``), or a PM QoS request holds
the CPU DMA latency below every enabled deep state's exit latency (``/dev/cpu_dma_latency``).

Fault codes: CSTATES_DEEP, CSTATES_OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext, command_line, parse_output
from preflight.parsers.cmdline import KernelCmdline
from preflight.parsers.cpupower import CpuIdleInfo
from preflight.result import CheckResult, Verdict

CPUPOWER = ["cpupower", "idle-info"]
CMDLINE = ["cat", "/proc/cmdline"]
# od prints the 32-bit PM QoS target (us) that the kernel returns when /dev/cpu_dma_latency is read.
PM_QOS = ["od", "-An", "-tu4", "-N4", "/dev/cpu_dma_latency"]


@dataclass(frozen=True)
class CstatesFacts:
    idle: CpuIdleInfo
    cmdline: KernelCmdline
    pm_qos_us: int | None  # None: not readable (no device, no permission)


def cmdline_limits(cmdline: KernelCmdline) -> list[str]:
    """Kernel arguments on this boot that keep CPUs out of deep idle states."""
    held = [f"{name}={value}" for name, value in (("idle", "poll"), ("idle", "halt"), ("cpuidle.off", "1"))
            if cmdline.value(name) == value]
    limits = {driver: int(value) for driver in ("intel_idle", "processor")
              if (value := cmdline.value(f"{driver}.max_cstate")) is not None and value.isdigit()}
    # intel_idle.max_cstate=0 hands idle to acpi_idle, which processor.max_cstate then limits.
    if "intel_idle" in limits and limits["intel_idle"] <= 1 and (
            limits["intel_idle"] == 1 or limits.get("processor", 99) <= 1):
        held.append(" ".join(f"{k}.max_cstate={v}" for k, v in sorted(limits.items())))
    elif "intel_idle" not in limits and limits.get("processor", 99) <= 1:
        held.append(f"processor.max_cstate={limits['processor']}")
    return held


class Cstates(Check):
    name = "cstates"
    codes = {
        "CSTATES_DEEP": "idle states deeper than the profile allows are enabled and nothing holds them off"
    }

    def gather(self, ctx: NodeContext) -> CstatesFacts:
        info = ctx.parsed("cpupower", CPUPOWER)
        cmdline = ctx.parsed("cmdline", CMDLINE)
        # Read whether or not it will be needed: judging is evaluate's. Opening the device adds a
        # default (no-limit) request only while od holds it open, which changes no other request.
        qos = ctx.run(PM_QOS)
        # A device that cannot be read (none, no permission) is "no PM QoS hold", not an error; what od
        # printed when it could read it must be od's one number (an ERROR otherwise, never "no hold").
        target = parse_output("pm-qos", qos.stdout, command_line(PM_QOS)).latency_us if qos.ok else None
        return CstatesFacts(info, cmdline, target)

    def evaluate(self, facts: CstatesFacts, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        info = facts.idle
        allowed = set(profile["cstates"]["allowed_states"])
        deep_enabled = [s for s in info.states if s.name not in allowed and not s.disabled]
        held_by_args = cmdline_limits(facts.cmdline)
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
            return [self.result(node, Verdict.PASS, "CSTATES_OK", f"{how} ({info.driver or 'no driver'})", **evidence)]
        if held_by_args:
            return [self.result(node, Verdict.PASS, "CSTATES_OK", f"held by kernel args {held_by_args[0]}", **evidence)]
        target = facts.pm_qos_us
        evidence["found"]["pm_qos_us"] = target
        if target is not None and all(target < s.latency_us for s in deep_enabled):
            return [self.result(node, Verdict.PASS, "CSTATES_OK", f"held by PM QoS ({target} us)", **evidence)]
        names = ", ".join(f"{s.name} ({s.latency_us} us)" for s in deep_enabled)
        return [self.result(node, Verdict.FAIL, "CSTATES_DEEP",
                            f"deep idle states enabled: {names}; disable them or boot with intel_idle.max_cstate=0 "
                            "processor.max_cstate=1", **evidence)]


CHECK = Cstates()
