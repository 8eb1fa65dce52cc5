"""The issue-17 checks: evaluate() fed parsed facts directly (PASS, each FAIL mode), and gather() through a
scripted transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import dcgm_diag, gpu_bandwidth, gpu_throttle, ib_link_health, nvlink, pcie_link
from preflight.checks.base import GatherError
from preflight.parsers.ib_health import PcieLinkState
from preflight.profiles import profile_of
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.preflight.helpers import ScriptedTransport, context, fixture_text, node, only

N = node()
PROFILE = profile_of(N)


def parsed(kind: str, name: str, **kw):
    return parsers.PARSERS[kind](fixture_text(kind.replace("-", "_"), name), **kw)


def verdict(results):
    (result,) = results
    return result.verdict, result.code


# ------------------------------------------------------------------------------------- pcie_link


def pcie_facts(idle="h100-sxm-driver550-pci-performance-busy-gen5.txt", loaded=None, hcas=None, error=None):
    hcas = hcas if hcas is not None else {nic.device: PcieLinkState(5, 5, 16, 16) for nic in N.nics}
    return pcie_link.PcieFacts(parsed("nvsmi-pci", idle), parsed("nvsmi-pci", loaded) if loaded else None, error, hcas)


def test_pcie_healthy_gen5_x16_passes():
    assert verdict(pcie_link.CHECK.evaluate(pcie_facts(), PROFILE, N)) == (Verdict.PASS, "PCIE_OK")


def test_pcie_gpu_trained_x8_fails_width():
    result = pcie_link.CHECK.evaluate(pcie_facts("h100-sxm-gpu3-x8-width-downtrained.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_WIDTH") and "x8" in result.reason


def test_pcie_gpu_gen4_under_load_fails_gen():
    facts = pcie_facts("h200-sxm-gpu0-gen4-on-gen5-slot.txt")
    result = pcie_link.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_GEN") and "Gen4" in result.reason


def test_pcie_idle_gen1_is_judged_by_the_reading_under_load():
    idle = "h100-sxm-driver550-idle-gen1-power-saving.txt"
    passed = pcie_link.CHECK.evaluate(pcie_facts(idle, loaded="h100-sxm-driver550-pci-performance-busy-gen5.txt"),
                                      PROFILE, N)
    assert verdict(passed) == (Verdict.PASS, "PCIE_OK")
    unverified = pcie_link.CHECK.evaluate(pcie_facts(idle, error="cannot start nvbandwidth"), PROFILE, N)
    assert verdict(unverified) == (Verdict.WARN, "PCIE_GEN_UNVERIFIED")


def test_pcie_hca_gen4_x8_and_missing_hca_fail():
    hcas = {"mlx5_0": PcieLinkState(gen=4, gen_max=5, width=8, width_max=16), "mlx5_1": None}
    result = pcie_link.CHECK.evaluate(pcie_facts(hcas=hcas), PROFILE, N)[0]
    assert result.verdict is Verdict.FAIL
    assert {p.split(":")[0] for p in result.evidence["problems"]} >= {"HCA mlx5_0 at x8, expected x16"}
    assert any("mlx5_1" in p for p in result.evidence["problems"])


def test_pcie_a100_profile_accepts_gen4():
    a100 = node(gpu_model="a100-sxm")
    facts = pcie_link.PcieFacts(parsed("nvsmi-pci", "a100-sxm4-driver535-gen4-x16.txt"), None, None, {})
    assert verdict(pcie_link.CHECK.evaluate(facts, profile_of(a100), a100)) == (Verdict.PASS, "PCIE_OK")


def test_pcie_gather_reads_under_load_only_when_idle_reads_low():
    busy = fixture_text("nvsmi_pci", "h100-sxm-driver550-pci-performance-busy-gen5.txt")
    idle = fixture_text("nvsmi_pci", "h100-sxm-driver550-idle-gen1-power-saving.txt")
    readings = iter([idle, busy])
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI,
                               reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    t.on("n1", "grep", reply="".join(f"{p}:{v}\n" for nic in N.nics for p, v in
                                     zip(pcie_link.hca_paths(nic.device), ["32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "16"],
                                         strict=True)))
    pcie_link.LOAD_SETTLE_S, settle = 0.0, pcie_link.LOAD_SETTLE_S
    try:
        results = pcie_link.CHECK.run(context(t))
    finally:
        pcie_link.LOAD_SETTLE_S = settle
    assert verdict(results) == (Verdict.PASS, "PCIE_OK")
    assert t.started == [("n1", tuple(pcie_link.LOAD))] and t.stopped == t.started
    assert only(results).evidence["found"]["GPU0 (18:00.0)"]["read_under_load"] is True


def test_pcie_missing_hca_sysfs_fails_but_a_missing_grep_is_an_error():
    busy = fixture_text("nvsmi_pci", "h100-sxm-driver550-pci-performance-busy-gen5.txt")
    gone = CommandResult(2, "", "grep: /sys/class/infiniband/mlx5_0/device/current_link_speed: No such file or "
                                "directory", 0.0)
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI, reply=busy).on("n1", "grep", reply=gone)
    result = pcie_link.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_MISSING")
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI, reply=busy)  # no grep: rc 127
    result = pcie_link.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "exited 127" in result.reason


# --------------------------------------------------------------------------------- gpu_bandwidth


def bw(name):
    return {"report": parsed("nvbandwidth", name), "depth": "standard", "samples": 3, "gpus": 8}


def test_bandwidth_h100_passes_and_names_the_pinned_testcases():
    result = gpu_bandwidth.CHECK.evaluate(bw("h100-sxm-v0.6-three-pinned-testcases.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.PASS, "GPU_BW_OK")
    assert gpu_bandwidth.argv(3)[2:5] == ["host_to_device_memcpy_ce", "device_to_host_memcpy_ce",
                                           "device_to_device_memcpy_read_ce"]


def test_bandwidth_one_slow_gpu_fails_h2d_and_d2h():
    result = gpu_bandwidth.CHECK.evaluate(bw("h200-sxm-gpu2-h2d-21gbps.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "GPU_BW_H2D")
    assert any(p.startswith("D2H GPU2 21") for p in result.evidence["problems"])


def test_bandwidth_pcie_d2d_and_missing_testcases_fail():
    result = gpu_bandwidth.CHECK.evaluate(bw("a6000-v0.8-d2d-read-pcie-nvbandwidth-issue-50.txt"), PROFILE, N)[0]
    assert result.verdict is Verdict.FAIL
    codes = result.evidence["problems"]
    assert any("did not run host_to_device_memcpy_ce" in p for p in codes)
    assert any(p.startswith("D2D read GPU0<-GPU1 26.34") for p in codes)


def test_bandwidth_garbage_is_error_with_excerpt():
    t = ScriptedTransport().on("n1", "nvbandwidth", reply=fixture_text("nvbandwidth", "garbage-cuda-no-device.txt"))
    result = gpu_bandwidth.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "CUDA_ERROR_NO_DEVICE" in result.evidence["output"]
    assert t.called("n1", "nvbandwidth") == [tuple(gpu_bandwidth.argv(3))]  # standard depth: 3 samples


def test_bandwidth_quick_depth_runs_one_sample():
    t = ScriptedTransport().on("n1", "nvbandwidth",
                               reply=fixture_text("nvbandwidth", "h100-sxm-v0.6-three-pinned-testcases.txt"))
    result = gpu_bandwidth.CHECK.run(context(t, depth="quick"))[0]
    assert result.verdict is Verdict.PASS and result.evidence["depth"] == "quick"
    assert t.called("n1", "nvbandwidth") == [tuple(gpu_bandwidth.argv(1))]


# ---------------------------------------------------------------------------------------- nvlink


def nvl(status="h100-sxm-driver550-18-links-26.562.txt", before="h100-sxm-driver550-all-zero.txt", after=None,
        elapsed=60.0):
    return {"status": parsed("nvlink-status", status), "before": parsed("nvlink-errors", before),
            "after": parsed("nvlink-errors", after or before), "elapsed_s": elapsed}


def test_nvlink_healthy_passes():
    assert verdict(nvlink.CHECK.evaluate(nvl(), PROFILE, N)) == (Verdict.PASS, "NVLINK_OK")


def test_nvlink_inactive_links_fail():
    result = nvlink.CHECK.evaluate(nvl(status="h200-sxm-gpu6-two-links-inactive.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_INACTIVE")
    assert "GPU6: 16 of 18" in result.reason and "4, 9" in result.reason


def test_nvlink_slow_links_fail_speed():
    v100 = nvl(status="v100-sxm2-inactive-links-azhpc-diagnostics-73.txt")
    problems = nvlink.CHECK.evaluate(v100, PROFILE, N)[0].evidence["problems"]
    assert any("25.781 GB/s < 26.562" in p for p in problems)


def with_counters(report, gpu: int, link: int, **counters):
    """An nvlink-errors reading with some counters of one link set: the facts of a link that errors."""
    gpus = [replace(g, links=[replace(k, counters={**k.counters, **counters}) if k.link == link else k
                              for k in g.links]) if g.index == gpu else g for g in report.gpus]
    return replace(report, gpus=gpus)


def test_nvlink_errors_growing_during_the_run_fail_old_history_does_not():
    healthy = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    gpu = healthy.gpus[0].index
    before, after = with_counters(healthy, gpu, 2, replay=7), with_counters(healthy, gpu, 2, replay=9)
    facts = {**nvl(), "before": before, "after": before}
    assert verdict(nvlink.CHECK.evaluate(facts, PROFILE, N)) == (Verdict.PASS, "NVLINK_OK")
    facts["after"] = after
    result = nvlink.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_REPLAY") and "+2 replay" in result.reason


def test_nvlink_recovery_and_crc_rate():
    base = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    gpu = base.gpus[0].index
    after = with_counters(with_counters(base, gpu, 0, recovery=1), gpu, 5, crc=60000)
    facts = {**nvl(), "after": after, "elapsed_s": 100.0}
    problems = nvlink.CHECK.evaluate(facts, PROFILE, N)[0].evidence["problems"]
    assert any("recovery" in p for p in problems) and any("600 CRC errors/s" in p for p in problems)
    facts["elapsed_s"] = 1000.0  # 60 errors/s: under DCGM's 100/s threshold
    assert not any("CRC" in p for p in nvlink.CHECK.evaluate(facts, PROFILE, N)[0].evidence.get("problems", []))


def test_nvlink_bracket_reads_errors_before_and_after():
    zero = fixture_text("nvlink_errors", "h100-sxm-driver550-all-zero.txt")
    readings = iter([zero, zero.replace("Link 0: Replay Errors: 0", "Link 0: Replay Errors: 5", 1)])
    t = ScriptedTransport().on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status",
                                                                        "h100-sxm-driver550-18-links-26.562.txt"))
    t.on("n1", *nvlink.ERRORS, reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    ctx = context(t)
    before = nvlink.CHECK.gather(ctx)
    result = nvlink.CHECK.finish(ctx, before)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_REPLAY")
    assert len(t.called("n1", "-e")) == 2  # not served from the command cache


def test_nvlink_garbage_before_is_error():
    t = ScriptedTransport().on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status", "garbage-nvlink-not-supported.txt"))
    with pytest.raises(GatherError) as info:
        nvlink.CHECK.gather(context(t))
    result = nvlink.CHECK.finish(context(t), info.value)[0]
    assert result.verdict is Verdict.ERROR and "all links are inActive" in result.evidence["output"]


# ---------------------------------------------------------------------------------- gpu_throttle


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


# ------------------------------------------------------------------------------------ dcgm_diag


def dcgm(name, nvlinks="h100-sxm-driver550-18-links-26.562.txt"):
    return {"diag": parsed("dcgm-diag", name), "level": 2, "depth": "standard",
            "nvlinks": parsed("nvlink-status", nvlinks) if nvlinks else "not read"}


def test_dcgm_pass_and_skips():
    assert verdict(dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-h200-r3-pass.txt"), PROFILE, N)) == (Verdict.PASS, "DCGM_OK")
    assert verdict(dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-t400-r3-skipped-dcgm-139.txt"), PROFILE, N))[0] is Verdict.PASS


def test_dcgm_failing_test_fails_with_its_fr_code():
    result = dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-h100-r2-memory-fail-gpu3.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "DCGM_FR_FAULTY_MEMORY") and "GPU 3" in result.reason
    v4 = dcgm_diag.CHECK.evaluate(dcgm("dcgm4.2-r2-pcie-width-fail-gpu5.txt"), PROFILE, N)[0]
    assert (v4.verdict, v4.code) == (Verdict.FAIL, "DCGM_FR_PCIE_WIDTH")


def test_dcgm_memory_alloc_logged_but_passed_is_a_false_pass():
    result = dcgm_diag.CHECK.evaluate(dcgm("dcgm4.2-r2-memory-alloc-logged-but-pass-dcgm-284.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "DCGM_FALSE_PASS") and "DCGM_FR_MEMORY_ALLOC" in result.reason


def test_dcgm_pass_with_inactive_nvlinks_is_not_trusted():
    facts = dcgm("dcgm3.3-h200-r3-pass.txt", nvlinks="h200-sxm-gpu6-two-links-inactive.txt")
    result = dcgm_diag.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.WARN, "DCGM_CROSS_CHECK") and "2 inactive" in result.reason


def test_dcgm_missing_host_engine_is_error_not_pass():
    garbage = fixture_text("dcgm_diag", "garbage-hostengine-not-running.txt")
    t = ScriptedTransport().on("n1", "dcgmi", reply=(255, garbage))
    result = dcgm_diag.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "DCGM_NO_HOSTENGINE")
    assert "Host engine connection invalid" in result.evidence["output"]


def test_dcgm_level_from_depth_or_option_and_json_judged_on_nonzero_exit():
    t = ScriptedTransport().on("n1", "dcgmi", reply=(1, fixture_text("dcgm_diag", "dcgm3.3-h100-r2-memory-fail-gpu3.txt")))
    t.on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status", "h100-sxm-driver550-18-links-26.562.txt"))
    result = dcgm_diag.CHECK.run(context(t, depth="full"))[0]
    assert result.code == "DCGM_FR_FAULTY_MEMORY" and result.evidence["level"] == 3
    dcgm_diag.CHECK.run(context(t, depth="full", dcgm_level=1))
    assert t.called("n1", "dcgmi") == [tuple(dcgm_diag.argv(3)), tuple(dcgm_diag.argv(1))]


def test_dcgm_truncated_json_is_error_with_excerpt():
    t = ScriptedTransport().on("n1", "dcgmi", reply=fixture_text("dcgm_diag", "truncated-json-cut-mid-results.txt"))
    result = dcgm_diag.CHECK.run(context(t))[0]
    assert result.verdict is Verdict.ERROR and "does not decode" in result.reason and result.evidence["output"]


# ------------------------------------------------------------------------------- ib_link_health


def counters(**bumps):
    return {ib_link_health.counter_path(nic.device, nic.port, c): bumps.get(f"{nic.device}_{c}", 0)
            for nic in N.nics for c in ib_link_health.COUNTERS}


def ib(before=None, after=None, log="journalctl-short-no-events.txt", now=None, ber=None):
    events = parsed("kernel-links", log, now=now or time.time())
    return {"before": before or counters(), "after": after or counters(), "events": events,
            "now": now or time.time(), "ber": ber or {}}


def test_ib_health_quiet_ports_pass():
    assert verdict(ib_link_health.CHECK.evaluate(ib(), PROFILE, N)) == (Verdict.PASS, "IB_HEALTH_OK")


def test_ib_health_counter_growth_past_limits_fails():
    result = ib_link_health.CHECK.evaluate(ib(after=counters(mlx5_1_symbol_error=11, mlx5_2_link_downed=1)), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_COUNTER")
    assert len(result.evidence["problems"]) == 2
    small = ib_link_health.CHECK.evaluate(ib(after=counters(mlx5_1_symbol_error=10)), PROFILE, N)[0]
    assert small.verdict is Verdict.PASS  # ibqueryerrors' default threshold is 10


@pytest.mark.parametrize("log", ["bsd-syslog-ubuntu22-ipoib-two-flaps.txt", "rfc3339-syslog-ubuntu24-ipoib-two-flaps.txt"])
def test_ib_health_flaps_counted_in_both_timestamp_formats(log):
    # Both fixtures hold two flaps of ibp60s0 (mlx5_1's netdev) at 09:40 and 10:12 on Jun 10 (2024 or now's year).
    year = 2024 if "rfc3339" in log else time.gmtime().tm_year
    now = time.mktime((year, 6, 10, 12, 0, 0, 0, 0, 0)) - time.timezone
    result = ib_link_health.CHECK.evaluate(ib(log=log, now=now), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_LINK_FLAP") and "2 times" in result.reason
    later = ib_link_health.CHECK.evaluate(ib(log=log, now=now + 86400), PROFILE, N)[0]
    assert later.verdict is Verdict.PASS  # outside the 6 h window


def test_ib_health_ber_above_limit_fails():
    ber = {"mlx5_0": parsed("mlxlink", "cx7-ndr-effective-ber-3E-10.txt"), "mlx5_1": parsed("mlxlink", "cx7-ndr-clean-15E-255.txt")}
    result = ib_link_health.CHECK.evaluate(ib(ber=ber), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_BER") and "mlx5_0" in result.reason


def test_ib_health_unreadable_kernel_log_is_error_never_zero_flaps():
    t = ScriptedTransport().on("n1", "grep", reply=lambda argv: CommandResult(
        0, "".join(f"{p}:0\n" for p in argv[3:]), "", 0.0, argv=argv))
    t.on("n1", "date", reply=f"{int(time.time())}\n")
    t.on("n1", "journalctl", reply="Dez 01 09:00:01 r01n01 kernel: ibp60s0: lost carrier\n")  # localised month
    ctx = context(t)
    result = ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "lost carrier" in result.evidence["output"]
