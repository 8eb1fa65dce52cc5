"""preflight/checks/time_sync.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import (
    time_sync,
)
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node

pytestmark = pytest.mark.unit


def tracking(name: str):
    t = ScriptedTransport().on("n1", "chronyc", "tracking", reply=fixture_text("chrony", name))
    [result] = time_sync.CHECK.run(context(t))
    return result


def test_synchronised_clock_passes():
    assert tracking("aws-time-sync-linklocal-chrony4.2-normal.txt").verdict is Verdict.PASS


@pytest.mark.parametrize(
    "name, code",
    [
        ("offset-4.5ms-slow-after-step.txt", "CLOCK_OFFSET"),
        ("unsynchronised-reference-00000000.txt", "CLOCK_UNSYNCED"),
        ("leap-insert-second.txt", "LEAP_STATUS"),
    ],
)
def test_clock_faults_fail(name, code):
    n = node()
    facts = parsers.parse("chrony", fixture_text("chrony", name))  # recorded faults, parsed: the facts
    [result] = time_sync.CHECK.evaluate(facts, profile_of(n), n)
    assert (result.verdict, result.code) == (Verdict.FAIL, code)
    fast = replace(facts, system_time_offset_s=0.0045, stratum=3, reference="A9FEA97B (169.254.169.123)",
                   leap_status="Normal")
    [result] = time_sync.CHECK.evaluate(fast, profile_of(n), n)
    assert (result.code, "fast" in result.reason) == ("CLOCK_OFFSET", True)


def test_chronyc_that_cannot_talk_to_chronyd_is_an_error():
    assert tracking("garbage-cannot-talk-to-daemon.txt").verdict is Verdict.ERROR
