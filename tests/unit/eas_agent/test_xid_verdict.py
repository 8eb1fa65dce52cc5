"""Which XIDs mark an IU critical: the pure verdict over its GPUs' latest XIDs, the score it gates, and the
agent's table kept equal to the controller's catalogue."""

from __future__ import annotations

import pytest

from eas_agent.collectors.gpu import GpuReading
from eas_agent.xid_actions import XID_ACTIONS
from eas_agent.xid_verdict import TABLE, XID_HOLD_S, takes_out, xid_verdict
from operate.xid_catalog import agent_table, agent_table_source, load_catalog

pytestmark = pytest.mark.unit

NOW = 1_764_406_000.0


def gpu(index: int, xid: int | None, at: float | None) -> GpuReading:
    return GpuReading(index=index, memory_used_mib=73400, memory_total_mib=81559, utilization_pct=90,
                      ecc_volatile_uncorrectable=0, xid_events=0 if xid is None else 1, xid_last=xid,
                      xid_order=0 if xid is None else 1, xid_last_at=at)


@pytest.mark.parametrize(("xid", "rung", "bucket"), [
    (79, "reboot", "RESTART_BM"), (48, "gpu_reset", "WORKFLOW_XID_48"), (94, "restart", "RESTART_APP"),
    (95, "gpu_reset", "RESET_GPU"), (119, "gpu_reset", "RESET_GPU"), (120, "gpu_reset", "RESET_GPU"),
])
def test_a_recent_catalogued_xid_with_an_action_marks_the_unit_critical_naming_it(xid, rung, bucket):
    reason = xid_verdict([gpu(0, None, None), gpu(1, xid, NOW - 12.4)], NOW)
    mnemonic = XID_ACTIONS[xid][0]
    assert reason == (f"GPU 1: XID {xid} {mnemonic} 12 s ago (NVIDIA's action {bucket}; remediation rung {rung})")


@pytest.mark.parametrize("xid", [43, 63, 92])
def test_an_xid_nvidia_says_to_ignore_leaves_the_unit_in_rotation(xid):
    assert TABLE[xid].bucket == "IGNORE" and not takes_out(TABLE[xid])
    assert xid_verdict([gpu(0, xid, NOW - 1)], NOW) is None


def test_an_xid_not_in_the_catalogue_gives_no_verdict():
    assert 999 not in TABLE and xid_verdict([gpu(0, 999, NOW - 1)], NOW) is None


def test_an_xid_older_than_the_hold_or_without_a_time_no_longer_counts():
    assert xid_verdict([gpu(0, 79, NOW - XID_HOLD_S)], NOW) is not None
    assert xid_verdict([gpu(0, 79, NOW - XID_HOLD_S - 0.1)], NOW) is None
    assert xid_verdict([gpu(0, 79, NOW - 30)], NOW, hold_s=20) is None
    assert xid_verdict([gpu(0, 79, None)], NOW) is None


def test_a_clock_stepped_back_still_counts_the_xid_as_new():
    assert xid_verdict([gpu(0, 95, NOW + 5)], NOW).endswith("0 s ago (NVIDIA's action RESET_GPU; remediation rung gpu_reset)")


def test_the_newest_xid_that_takes_the_unit_out_names_the_reason():
    reason = xid_verdict([gpu(0, 95, NOW - 50), gpu(1, 13, NOW - 3), gpu(2, 43, NOW - 1)], NOW)
    assert reason.startswith("GPU 1: XID 13 ROBUST_CHANNEL_GR_EXCEPTION 3 s ago")


def test_the_agents_table_is_the_catalogue():
    """The agent's generated copy equals the controller's catalogue; regenerate it with the command in its
    docstring when this fails."""
    catalog = load_catalog()
    assert XID_ACTIONS == agent_table(catalog)
    from eas_agent import xid_actions

    with open(xid_actions.__file__) as shipped:
        assert shipped.read() == agent_table_source(catalog), "python -m operate.xid_catalog > eas_agent/xid_actions.py"
