"""preflight/checks/gpu_throttle.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

from dataclasses import replace

from preflight.checks import gpu_throttle
from preflight.result import Verdict
from tests.preflight.checks.helpers import PROFILE, N, parsed, verdict


def perf(name):
    return parsed("nvsmi-perf", name)


def test_throttle_idle_passes_and_sw_power_cap_is_not_a_fault():
    idle = perf("h100-sxm-driver550-idle-with-counters.txt")
    assert verdict(gpu_throttle.CHECK.evaluate({"before": idle, "after": idle}, PROFILE, N)) == (Verdict.PASS, "THROTTLE_OK")
    capped = perf("a100-sxm4-driver470-throttle-reasons-no-counters.txt")
    v100 = perf("v100-driver418-idle-legacy-names.txt")
    result = gpu_throttle.CHECK.evaluate({"before": v100, "after": v100}, PROFILE, N)[0]
    assert result.verdict is Verdict.PASS and result.evidence["counters"] is False
    problems = gpu_throttle.CHECK.evaluate({"before": capped, "after": capped}, PROFILE, N)[0].evidence["problems"]
    # SW power cap on GPU0 is not a fault; HW Slowdown is named by its cause, the power brake.
    assert problems == ["GPU1 (0F:00.0): hw_power_brake_slowdown active after load"]
    alone = replace(capped, gpus=[replace(g, reasons={**g.reasons, "hw_power_brake_slowdown": False})
                                  for g in capped.gpus])
    facts = {"before": alone, "after": alone}
    problems = [p for p in [gpu_throttle.CHECK.evaluate(facts, PROFILE, N)[0].reason]]
    assert problems == ["GPU1 (0F:00.0): hw_slowdown active after load"]


def test_throttle_hw_thermal_active_fails_not_warns():
    hot = perf("h100-sxm-gpu0-hw-thermal-slowdown.txt")
    result = gpu_throttle.CHECK.evaluate({"before": hot, "after": hot}, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "THROTTLE_ACTIVE")
    assert result.reason.startswith("GPU0 (18:00.0): hw_thermal_slowdown active after load")


def test_throttle_counter_growth_during_load_fails_even_when_the_flag_cleared():
    idle = perf("h100-sxm-driver550-idle-with-counters.txt")
    hot = replace(idle.gpus[0], counters_us={**idle.gpus[0].counters_us, "hw_thermal_slowdown": 2500000})
    facts = {"before": idle, "after": replace(idle, gpus=[hot, *idle.gpus[1:]])}
    result = gpu_throttle.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "THROTTLE_DURING_LOAD") and "2.5 s" in result.reason
