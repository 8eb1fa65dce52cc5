"""preflight/checks/cstates.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

import pytest

from preflight import parsers
from preflight.checks import (
    cstates,
)
from preflight.parsers import cmdline
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node

pytestmark = pytest.mark.unit

SPR = fixture_text("cpupower", "intel-sapphire-rapids-intel_idle-c6-disabled.txt")
PLAIN_CMDLINE = "BOOT_IMAGE=/vmlinuz-5.15.0-113-generic root=/dev/mapper/vg0-root ro quiet\n"


def idle(cpupower_text: str, cmdline: str = PLAIN_CMDLINE, qos: str | None = None):
    t = ScriptedTransport().on("n1", "cpupower", "idle-info", reply=cpupower_text)
    t.on("n1", "cat", "/proc/cmdline", reply=cmdline)
    if qos is not None:
        t.on("n1", "od", reply=qos)
    [result] = cstates.CHECK.run(context(t))
    return result


def test_deep_cstate_enabled_without_anything_holding_it_fails():
    result = idle(SPR)  # C6 disabled but C1E (deeper than C1) still enabled
    assert (result.verdict, result.code) == (Verdict.FAIL, "CSTATES_DEEP")
    assert "C1E" in result.reason


def judge_cstates(cpupower_text: str, cmdline_text: str = PLAIN_CMDLINE, qos_us: int | None = None):
    n = node()
    facts = cstates.CstatesFacts(parsers.parse("cpupower", cpupower_text), cmdline.parse(cmdline_text), qos_us)
    [result] = cstates.CHECK.evaluate(facts, profile_of(n), n)
    return result


def test_deep_states_disabled_or_held_by_kernel_args_or_pm_qos_pass():
    assert (
        judge_cstates(fixture_text("cpupower", "intel-skylake-sp-deep-states-disabled-two-cpus.txt")).verdict
        is Verdict.PASS
    )
    held = judge_cstates(SPR, PLAIN_CMDLINE.strip() + " intel_idle.max_cstate=0 processor.max_cstate=1\n")
    assert (held.verdict, held.evidence["found"]["kernel_args"]) == (
        Verdict.PASS,
        ["intel_idle.max_cstate=0 processor.max_cstate=1"],
    )
    assert judge_cstates(SPR, qos_us=0).reason == "held by PM QoS (0 us)"
    assert judge_cstates(SPR, qos_us=2000000000).verdict is Verdict.FAIL


def test_pm_qos_target_is_gathered_from_od():
    assert idle(SPR, qos="          0\n").reason == "held by PM QoS (0 us)"
    assert idle(SPR, qos=" 2000000000\n").verdict is Verdict.FAIL


def test_intel_idle_limit_alone_does_not_count_when_acpi_idle_is_unlimited():
    assert cstates.cmdline_limits(cmdline.parse("ro intel_idle.max_cstate=0")) == []
    assert cstates.cmdline_limits(cmdline.parse("ro idle=poll")) == ["idle=poll"]
    assert cstates.cmdline_limits(cmdline.parse("ro intel_idle.max_cstate=1")) == ["intel_idle.max_cstate=1"]


def test_unparseable_cpupower_is_an_error():
    assert idle(fixture_text("cpupower", "truncated-inside-c1e.txt")).verdict is Verdict.ERROR


def test_od_output_that_is_no_number_is_an_error_not_no_pm_qos_hold():
    """od's answer is read by the pm-qos parser: text that is not its one number (here od's default format,
    as a wrapper without -An -tu4 prints it) is an ERROR with the excerpt; it used to read as "no hold"
    and FAIL the node as CSTATES_DEEP. A device that cannot be read is still "no hold"."""
    garbled = idle(SPR, qos="0000000 035400 035632\n0000004\n")
    assert (garbled.verdict, garbled.code) == (Verdict.ERROR, "GATHER")
    assert "pm-qos" not in garbled.reason and "od -An -tu4 -N4 /dev/cpu_dma_latency" in garbled.reason
    assert "0000004" in garbled.evidence["output"]
    assert idle(SPR, qos="          \u00b2\n").verdict is Verdict.ERROR  # str.isdigit() took a superscript two
    assert idle(SPR, qos=None).code == "CSTATES_DEEP"  # no od answer (rc 127): judged without a hold
