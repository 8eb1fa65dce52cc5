"""preflight/checks/gpu_bandwidth.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

import pytest

from preflight.checks import gpu_bandwidth
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text
from tests.helpers.preflight_checks import PROFILE, N, parsed

pytestmark = pytest.mark.unit


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


def test_bandwidth_output_cut_short_is_error_with_excerpt():
    """nvbandwidth cut inside device_to_host_memcpy_ce (a killed run, a dropped connection): the testcases it did
    print are not judged alone, the check is an ERROR naming the command, with what came back."""
    cut = fixture_text("nvbandwidth", "truncated-inside-device_to_host.txt")
    t = ScriptedTransport().on("n1", "nvbandwidth", reply=cut)
    result = gpu_bandwidth.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "cannot parse `nvbandwidth" in result.reason and result.evidence["output"]
    assert result.evidence["output"].removesuffix(" ...") in cut  # the head of what came back; the reason names the cut
