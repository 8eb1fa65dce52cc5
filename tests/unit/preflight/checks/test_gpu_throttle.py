"""preflight/checks/gpu_throttle.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight.checks import gpu_throttle
from preflight.checks.base import GatherError
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node
from tests.helpers.preflight_checks import PROFILE, N, parsed, verdict

pytestmark = pytest.mark.unit


def perf(name):
    return parsed("nvsmi-perf", name)


def test_throttle_idle_passes_and_sw_power_cap_is_not_a_fault():
    idle = perf("h100-sxm-driver550-idle-with-counters.txt")
    assert verdict(gpu_throttle.CHECK.evaluate({"before": idle, "after": idle}, PROFILE, N)) == (Verdict.PASS, "THROTTLE_OK")
    capped = perf("a100-sxm4-driver470-throttle-reasons-no-counters.txt")
    v100 = perf("v100-driver418-idle-legacy-names.txt")
    two = node(gpu_count=2, iu_size=2, rdma_nics=[])  # both captures are of 2 GPUs
    result = gpu_throttle.CHECK.evaluate({"before": v100, "after": v100}, PROFILE, two)[0]
    assert result.verdict is Verdict.PASS and result.evidence["counters"] is False
    problems = gpu_throttle.CHECK.evaluate({"before": capped, "after": capped}, PROFILE, two)[0].evidence["problems"]
    # SW power cap on GPU0 is not a fault; HW Slowdown is named by its cause, the power brake.
    assert problems == ["GPU1 (0F:00.0): hw_power_brake_slowdown active after load"]
    alone = replace(capped, gpus=[replace(g, reasons={**g.reasons, "hw_power_brake_slowdown": False})
                                  for g in capped.gpus])
    facts = {"before": alone, "after": alone}
    problems = [p for p in [gpu_throttle.CHECK.evaluate(facts, PROFILE, two)[0].reason]]
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


def test_throttle_sw_thermal_slowdown_fails():
    hot = perf("h200-sxm-gpu5-sw-thermal-slowdown.txt")
    result = gpu_throttle.CHECK.evaluate({"before": hot, "after": hot}, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "THROTTLE_ACTIVE")
    assert result.reason.startswith("GPU5 ") and "sw_thermal_slowdown active after load" in result.reason


def test_throttle_applications_clocks_idle_sync_boost_and_display_are_not_faults():
    idle = perf("h100-sxm-driver550-idle-with-counters.txt")
    told = {"idle": True, "applications_clocks_setting": True, "sw_power_cap": True, "sync_boost": True,
            "display_clock_setting": True}
    busy = replace(idle, gpus=[replace(g, reasons={**g.reasons, **{k: v for k, v in told.items() if k in g.reasons}})
                               for g in idle.gpus])
    assert {k for k in told if k in busy.gpus[0].reasons} >= {"idle", "applications_clocks_setting", "sw_power_cap"}
    assert verdict(gpu_throttle.CHECK.evaluate({"before": idle, "after": busy}, PROFILE, N)) == (Verdict.PASS,
                                                                                                "THROTTLE_OK")


def test_throttle_unreadable_reading_before_or_after_is_error_with_excerpt():
    healthy = fixture_text("nvsmi_perf", "h100-sxm-driver550-idle-with-counters.txt")
    garbage = fixture_text("nvsmi_perf", "garbage-nvml-driver-mismatch.txt")
    t = ScriptedTransport().on("n1", *gpu_throttle.PERFORMANCE, reply=garbage)
    with pytest.raises(GatherError) as info:
        gpu_throttle.CHECK.gather(context(t))
    result = gpu_throttle.CHECK.finish(context(t), info.value)[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "Driver/library version mismatch" in result.evidence["output"]
    # a second reading cut short (the host went away mid-print) is an ERROR too, never a PASS on the first alone
    readings = iter([healthy, fixture_text("nvsmi_perf", "truncated-inside-gpu-4.txt")])
    t = ScriptedTransport().on("n1", *gpu_throttle.PERFORMANCE,
                               reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    ctx = context(t)
    result = gpu_throttle.CHECK.finish(ctx, gpu_throttle.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "cannot parse" in result.reason
    assert result.evidence["output"] and len(t.called("n1", "PERFORMANCE")) == 2  # read twice, not cached


def test_a_gpu_missing_from_a_reading_fails_naming_it():
    """With 7 of 8 GPUs in the reading after the load tests the eighth was judged by nothing: a GPU that left
    during the load (fallen off the bus) passed. Named by bus id when the reading before had it."""
    idle = perf("h100-sxm-driver550-idle-with-counters.txt")
    after = replace(idle, gpus=idle.gpus[:3] + idle.gpus[4:])
    result = gpu_throttle.CHECK.evaluate({"before": idle, "after": after}, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "THROTTLE_GPU_MISSING")
    assert any("7 of 8 GPUs" in p for p in result.evidence["problems"])
    assert any(f"GPU3 ({idle.gpus[3].bus_id.split(':', 1)[-1]})" in p for p in result.evidence["problems"])
    short = replace(idle, gpus=idle.gpus[:7])
    both = gpu_throttle.CHECK.evaluate({"before": short, "after": short}, PROFILE, N)[0]
    assert (both.verdict, both.code) == (Verdict.FAIL, "THROTTLE_GPU_MISSING") and "GPU7" in both.reason
