"""gpu_throttle: no GPU slowed its clocks to protect itself, during or after the load tests (FAIL, not warn).

A bracket check: ``nvidia-smi -q -d PERFORMANCE`` before the load tests (gpu_bandwidth, dcgm_diag, nccl)
and again after them. Drivers from R535 print ``Clocks Event Reasons Counters``: the microseconds each
reason has been active since the driver loaded. Their growth between the two readings is what happened
*during* the load; the flags of the second reading are what holds *after* it. Older drivers print only
the flags, so only "after" can be judged (evidence says so).

Judgement (``evaluate``, pure): any reason in ``throttle.fail_reasons`` (by default HW slowdown, HW
thermal slowdown, HW power brake, SW thermal slowdown) active after the load -> FAIL ``THROTTLE_ACTIVE``;
its counter grown during the load -> FAIL ``THROTTLE_DURING_LOAD``. Idle, applications clocks, SW power
cap, sync boost and display clock reasons are a GPU doing what it was told, not faults. azurehpc's
check_gpu_clock_throttling only warns; an on-call gate that lets a thermally throttling GPU through
takes a slow node into service, so here it fails.

A reading that lists fewer GPUs than the node has, or a GPU of the first reading missing from the second
-> FAIL ``THROTTLE_GPU_MISSING`` naming them (a GPU nobody read is not a GPU that did not throttle).

Fault codes: THROTTLE_ACTIVE, THROTTLE_DURING_LOAD, THROTTLE_GPU_MISSING, THROTTLE_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, gpus_short
from preflight.parsers.nvsmi_sections import ClockEventsReport
from preflight.result import CheckResult, Verdict

PERFORMANCE = ["nvidia-smi", "-q", "-d", "PERFORMANCE"]
_HW_SLOWDOWN_CAUSES = ("hw_thermal_slowdown", "hw_power_brake_slowdown")


def gpu_label(index: int, bus_id: str) -> str:
    """``GPU5 (AB:00.0)``: nvidia-smi lists GPUs in PCI bus order, which is also its index order. The
    bus id without its ``00000000:`` domain, which next to ``:AB:`` would read as an emoji code to rich."""
    return f"GPU{index} ({bus_id.split(':', 1)[-1]})"


# flag -> the counter that accumulates its time (hw_slowdown is the sum of its two sub-reasons).
COUNTER_OF = {"hw_thermal_slowdown": "hw_thermal_slowdown", "hw_power_brake_slowdown": "hw_power_braking",
              "sw_thermal_slowdown": "sw_thermal_slowdown", "sw_power_cap": "sw_power_capping",
              "sync_boost": "sync_boost"}


class GpuThrottle(Check):
    name = "gpu_throttle"
    scope = "bracket"
    codes = {
        "THROTTLE_ACTIVE": "a protective clock event reason is active after the load tests",
        "THROTTLE_DURING_LOAD": "a protective clock event reason accumulated time during the load tests",
        "THROTTLE_GPU_MISSING": "a reading lists fewer GPUs than the node has, or a GPU left between the readings",
    }

    def gather(self, ctx: NodeContext) -> ClockEventsReport:
        return ctx.parsed("nvsmi-perf", PERFORMANCE, cache=False)

    def finish(self, ctx: NodeContext, before: Any) -> list[CheckResult]:
        if isinstance(before, GatherError):
            return [self.error(ctx.node, before)]
        try:
            after = ctx.parsed("nvsmi-perf", PERFORMANCE, cache=False)
        except GatherError as exc:
            return [self.error(ctx.node, exc)]
        return self.evaluate({"before": before, "after": after}, ctx.profile, ctx.node)

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        before: ClockEventsReport = facts["before"]
        after: ClockEventsReport = facts["after"]
        fail_reasons = profile["throttle"]["fail_reasons"]
        earlier = {g.bus_id: g for g in before.gpus}
        problems: list[tuple[Verdict, str, str]] = []
        found: dict[str, Any] = {}
        counted = True
        for index, gpu in enumerate(after.gpus):
            label = gpu_label(index, gpu.bus_id)
            active = [r for r, on in gpu.reasons.items() if on]
            grown = {}
            old = earlier.get(gpu.bus_id)
            if gpu.counters_us and old is not None and old.counters_us:
                for counter, value in gpu.counters_us.items():
                    start = old.counters_us.get(counter)
                    if value is not None and start is not None and value > start:
                        grown[counter] = value - start
            else:
                counted = False
            found[gpu.bus_id] = {"active": active, "grown_us": grown}
            for reason in fail_reasons:
                # HW Slowdown is the parent of the thermal and power-brake slowdowns: name the specific one.
                implied = reason == "hw_slowdown" and any(gpu.reasons.get(r) for r in _HW_SLOWDOWN_CAUSES)
                if gpu.reasons.get(reason) and not implied:
                    problems.append((Verdict.FAIL, "THROTTLE_ACTIVE", f"{label}: {reason} active after load"))
                counter = COUNTER_OF.get(reason)
                if counter and grown.get(counter):
                    problems.append((Verdict.FAIL, "THROTTLE_DURING_LOAD",
                                     f"{label}: {reason} for {grown[counter] / 1e6:.3g} s during the load tests"))
        for when, reading in (("before", before), ("after", after)):
            if short := gpus_short(f"nvidia-smi -q -d PERFORMANCE {when} the load tests", range(len(reading.gpus)),
                                   node.gpu_count):
                problems.append((Verdict.FAIL, "THROTTLE_GPU_MISSING", short))
        listed_after = {g.bus_id for g in after.gpus}
        for index, gpu in enumerate(before.gpus):
            if gpu.bus_id not in listed_after:
                problems.append((Verdict.FAIL, "THROTTLE_GPU_MISSING",
                                 f"{gpu_label(index, gpu.bus_id)} gone from nvidia-smi after the load tests"))
        how = "during and after the load tests" if counted else "after the load tests (driver prints no counters)"
        return [self.outcome(node, problems, "THROTTLE_OK", f"{len(after.gpus)} GPUs: no protective clock events {how}",
                             expected={"not_active": fail_reasons}, found=found, counters=counted)]


CHECK = GpuThrottle()
