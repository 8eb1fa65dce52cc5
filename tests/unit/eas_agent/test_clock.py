"""The clock offset reader (eas_agent/clock.py): any text is read or refused, never raised on."""

from __future__ import annotations

import pytest

from eas_agent.clock import parse_system_time_offset

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text", ["System time     : . seconds fast of NTP time", "System time : 1.2.3 seconds slow of NTP time"]
)
def test_clock_parse_never_raises(text):
    assert parse_system_time_offset(text) is None  # guards against: float('.') raised inside the cycle


def test_clock_parse_reads_offsets():
    assert parse_system_time_offset("System time     : 0.000012 seconds slow of NTP time") == -0.000012
