"""preflight/checks/dcgm_diag.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

import json

import pytest

from common.errors import ExitCode
from preflight import parsers
from preflight.checks import dcgm_diag, gpu_health, nvlink
from preflight.result import Verdict
from preflight.runner import exit_code, node_passed
from tests.helpers.preflight import ScriptedTransport, context, fixture_text
from tests.helpers.preflight_checks import PROFILE, N, parsed, verdict

pytestmark = pytest.mark.unit


def dcgm(name, nvlinks="h100-sxm-driver550-18-links-26.562.txt"):
    return {"diag": parsed("dcgm-diag", name), "level": 2, "depth": "standard",
            "nvlinks": parsed("nvlink-status", nvlinks) if nvlinks else "not read"}


def test_dcgm_pass_and_skips():
    """A run whose hardware, integration and stress tests all reported Skip (NVIDIA/DCGM#139: PCIe, GPU Memory,
    Diagnostic and Targeted Stress skipped at -r 3) tested the deployment only. It used to PASS as "3 tests
    passed (4 skipped)"; at level 2 and above a skipped test of those categories is a WARN naming them, and a
    FAIL at depth full, where the onboarding gate relies on them having run."""
    assert verdict(dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-h200-r3-pass.txt"), PROFILE, N)) == (Verdict.PASS, "DCGM_OK")
    skipped = dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-t400-r3-skipped-dcgm-139.txt"), PROFILE, N)[0]
    assert (skipped.verdict, skipped.code) == (Verdict.WARN, "DCGM_SKIPPED")
    assert all(name in skipped.reason for name in ("PCIe", "GPU Memory", "Diagnostic", "Targeted Stress"))
    full = dcgm_diag.CHECK.evaluate({**dcgm("dcgm3.3-t400-r3-skipped-dcgm-139.txt"), "level": 3, "depth": "full"},
                                    PROFILE, N)[0]
    assert (full.verdict, full.code) == (Verdict.FAIL, "DCGM_SKIPPED")
    # level 1 runs the deployment tests only: nothing else is expected to have run
    quick = dcgm_diag.CHECK.evaluate({**dcgm("dcgm3.3-t400-r3-skipped-dcgm-139.txt"), "level": 1, "depth": "quick"},
                                     PROFILE, N)[0]
    assert (quick.verdict, quick.code) == (Verdict.PASS, "DCGM_OK")


def test_a_dcgm_run_that_ran_no_test_is_an_error_not_a_pass():
    """JSON with empty test_categories passed as "0 tests passed"; every test skipped passed as well."""
    empty = parsers.parse("dcgm-diag", json.dumps({"DCGM GPU Diagnostic": {"test_categories": []}, "version": "3.3.5"}))
    result = dcgm_diag.CHECK.evaluate({**dcgm("dcgm3.3-h200-r3-pass.txt"), "diag": empty}, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "DCGM_NOTHING_RUN")
    every = parsers.parse("dcgm-diag", json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [{"name": "software", "results": [{"status": "Skip"}]}]},
        {"category": "Hardware", "tests": [{"name": "memory", "results": [{"gpu_id": "0", "status": "Skip"}]}]}]}}))
    result = dcgm_diag.CHECK.evaluate({**dcgm("dcgm3.3-h200-r3-pass.txt"), "diag": every}, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "DCGM_NOTHING_RUN") and "2 skipped" in result.reason


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


def test_a_host_without_dcgm_is_an_error_that_names_the_package():
    """DCGM is a package of its own (datacenter-gpu-manager): no driver or image brings dcgmi."""
    t = ScriptedTransport()  # answers every command with exit 127, "command not found"
    result = dcgm_diag.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "DCGM_NOT_INSTALLED")
    assert "datacenter-gpu-manager" in result.reason and "provision" in result.reason


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


def test_a_dcgm_pass_never_overrides_the_nvlink_fail_on_the_node():
    """NVIDIA/DCGM#198 (level 2 passes with every NVLink down): with DCGM passing and nvidia-smi showing
    inactive links, the node still fails preflight: nvlink's FAIL stands and DCGM's pass is only a WARN."""
    inactive = "h200-sxm-gpu6-two-links-inactive.txt"
    zero = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    links = nvlink.CHECK.evaluate({"status": parsed("nvlink-status", inactive), "before": zero, "after": zero,
                                   "elapsed_s": 60.0}, PROFILE, N)
    diag = dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-h200-r3-pass.txt", nvlinks=inactive), PROFILE, N)
    results = links + diag
    assert [(r.check, r.verdict) for r in results] == [("nvlink", Verdict.FAIL), ("dcgm_diag", Verdict.WARN)]
    assert not node_passed(results) and exit_code(results) == ExitCode.FAILED
    # and a DCGM pass beside a gpu_health memory FAIL (uncorrectable DRAM ECC, remap pending) leaves it standing
    t = ScriptedTransport().on("n1", "nvidia-smi", "-q", reply=fixture_text(
        "nvsmi_q", "h100-sxm-driver550-dram-uncorrectable-remap-pending.txt")).on("n1", "journalctl", reply="")
    t.on("n1", "systemctl", "is-active", "nvidia-fabricmanager", reply="active\n")
    memory = gpu_health.CHECK.run(context(t))
    passed = dcgm_diag.CHECK.evaluate(dcgm("dcgm3.3-h200-r3-pass.txt"), PROFILE, N)
    assert [r.verdict for r in memory + passed] == [Verdict.FAIL, Verdict.PASS]
    assert not node_passed(memory + passed) and exit_code(memory + passed) == ExitCode.FAILED
