"""preflight/checks/numa_pinning.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

import pytest

from preflight import parsers
from preflight.checks import (
    numa_pinning,
)
from preflight.parsers import cpulist
from preflight.parsers.common import Line
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, node, only

pytestmark = pytest.mark.unit


def pinning(shows: dict[int, str], cpulists=("0-47,96-143\n", "48-95,144-191\n")):
    t = ScriptedTransport()
    for numa, cpus in enumerate(cpulists):
        t.on("n1", "cat", f"/sys/devices/system/node/node{numa}/cpulist", reply=cpus)
    for index, text in shows.items():
        t.on(
            "n1",
            "systemctl",
            "show",
            "-p",
            "LoadState,CPUAffinity,NUMAPolicy,NUMAMask",
            f"vllm-iu@{index}.service",
            reply=text,
        )
    return numa_pinning.CHECK.run(context(t))


GOOD = {
    0: "LoadState=loaded\nCPUAffinity=0-47 96-143\nNUMAPolicy=bind\nNUMAMask=0\n",
    1: "LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=bind\nNUMAMask=1\n",
}


def test_units_pinned_to_their_numa_node_pass():
    assert [r.verdict for r in pinning(GOOD)] == [Verdict.PASS, Verdict.PASS]


@pytest.mark.parametrize(
    "text, code",
    [
        ("LoadState=loaded\nCPUAffinity=\nNUMAPolicy=bind\nNUMAMask=1\n", "CPU_AFFINITY"),
        ("LoadState=loaded\nCPUAffinity=0-47 96-143\nNUMAPolicy=bind\nNUMAMask=0\n", "CPU_AFFINITY"),
        ("LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=default\nNUMAMask=\n", "NUMA_POLICY"),
        ("LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=bind\nNUMAMask=0\n", "NUMA_MASK"),
        ("LoadState=not-found\nCPUAffinity=\nNUMAPolicy=\nNUMAMask=\n", "UNIT_MISSING"),
    ],
)
def test_wrong_pinning_fails_the_iu(text, code):
    def facts(index: int, show: str, numa: str):
        return numa_pinning.IuPinning(parsers.parse("cpulist", numa), parsers.parse("systemctl-show", show).units[0])

    n = node()
    readings = {"n1-iu0": facts(0, GOOD[0], "0-47,96-143\n"), "n1-iu1": facts(1, text, "48-95,144-191\n")}
    results = numa_pinning.CHECK.evaluate(readings, profile_of(n), n)
    assert only(results, iu="n1-iu0").verdict is Verdict.PASS
    bad = only(results, iu="n1-iu1")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, code)


def test_systemctl_without_a_manager_is_an_error_not_a_pass():
    results = pinning({0: "", 1: ""})
    assert {r.verdict for r in results} == {Verdict.ERROR}


def test_cpu_lists_in_both_spellings():
    line = Line(1, "")
    assert cpulist.cpus_of("0-2,8", line) == cpulist.cpus_of("0 1 2 8", line) == {0, 1, 2, 8}
    assert cpulist.format_cpus({0, 1, 2, 8, 9}) == "0-2,8-9"


def test_a_unit_that_is_not_installed_says_so_and_names_the_fix():
    # After `virtual up` discards a provisioned cluster every node answers "vllm-iu@0.service is not-found",
    # systemd's own word, which does not say what to do.
    results = pinning({0: GOOD[0], 1: "LoadState=not-found\nCPUAffinity=\nNUMAPolicy=\nNUMAMask=\n"})
    bad = only(results, iu="n1-iu1")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "UNIT_MISSING")
    assert bad.reason == "vllm-iu@1.service not installed (is the node provisioned? run clusterctl provision)"
    masked = pinning({0: GOOD[0], 1: "LoadState=masked\nCPUAffinity=\nNUMAPolicy=\nNUMAMask=\n"})
    assert only(masked, iu="n1-iu1").reason == "vllm-iu@1.service is masked"  # other states as systemd says them
