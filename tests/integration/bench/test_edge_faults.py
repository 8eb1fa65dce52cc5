"""bench/edge_faults.py in short: an IU's engine killed and another stalled under load, behind a local edge;
no client sees either."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import edge_faults  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_killed_and_a_stalled_engine_cost_no_client_a_request_or_a_long_silence():
    numbers = edge_faults.run(units=3, load=0.5, repeats=1, baseline_s=2.0, stall_s=6.0, kill_s=3.0,
                              settle_s=2.0, client_idle_s=5.0)
    for kind in ("kill", "stall"):
        row = numbers["kinds"][kind]
        assert row["requests_during"] > 10
        assert row["failed_not_streaming"] == row["failed_streaming"] == 0, row["errors"]
        assert row["longest_silence_s"] <= edge_faults.TARGET_SILENCE_S
        assert row["back_in_rotation_s"] is not None  # the IU took requests again once it answered
    assert numbers["kinds"]["kill"]["last_send_after_fault_s"] <= edge_faults.TARGET_KILLED_S
    assert numbers["kinds"]["stall"]["last_send_after_fault_s"] <= edge_faults.TARGET_STALLED_S
    lines, _met = edge_faults.verdict_lines(numbers)
    assert len(lines) == 8 and all(line.endswith(("met", "NOT met")) for line in lines)
