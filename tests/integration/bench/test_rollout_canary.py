"""bench/rollout_canary.py end to end: through two real eas-edge processes, a good canary promotes through every
step; a 2x slower one, one with one of its two IUs 2x slower (cross-unit jitter), one failing 2% of requests,
one whose node reports ECC errors and one whose GPU logs an XID (NVML's event, through the agent's NVML
backend over the stand-in) are rolled back, the abort written within one gate interval (two for the slow one's p99) (+ the deciding
evaluation's time) of the evidence and read by both edges within 0.5 s, with at most their step's share of
requests on the canary; an abort puts every edge on stable within 2 s.
The measured table is printed (``-s`` shows it; a failure shows it always)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import rollout_canary  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.realtime]  # 20 ms readings, 1 s gates: load-sensitive


@pytest.mark.timeout(400)
def test_good_promotes_bad_rolls_back_abort_returns_to_stable():
    rows = [rollout_canary.run_case(case) for case in rollout_canary.CASES]
    print("\n" + rollout_canary.table(rows))
    by_case = {row["case"]: row for row in rows}
    assert by_case["good"]["state"] == "promoted"
    assert {by_case[case]["state"] for case in ("slow", "jitter", "errors", "ecc", "xid", "abort")} == {"aborted"}
    assert "ttft_p99_ratio" in by_case["slow"]["reason"] and "error_rate" in by_case["errors"]["reason"]
    assert "ecc_events" in by_case["ecc"]["reason"] and "ttft_jitter_delta" in by_case["jitter"]["reason"]
    assert "xid_events" in by_case["xid"]["reason"] and "Xid 79" in by_case["xid"]["reason"]
    assert [row["case"] for row in rows if not row["met"]] == []
