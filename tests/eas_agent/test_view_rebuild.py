"""A PoolView rebuild builds entries only for nodes whose body (or Consul's health, or the reading edge's id)
changed, and the anomaly detector's memo of a frozen verdict follows each IU's readings."""

from __future__ import annotations

import json

from edge.pool import AnomalyDetector, PoolView
from tests.eas_agent.test_pick import Clock, health_entry, kv_entry


def body(node: str, ius: dict, ts: float, announced: dict | None = None) -> dict:
    raw = json.loads(kv_entry(node, ius, ts)["Value"])
    if announced is not None:
        raw["announced"] = announced
    return raw


def state(node: str, score: float, tokens: float = 1.0) -> dict:
    return {f"{node}-iu{i}": (score + 0.01 * i, "passing", tokens, 1) for i in range(3)}


def test_a_rebuild_keeps_the_entries_of_nodes_whose_body_did_not_change():
    clock = Clock(100.0)
    view = PoolView(clock=clock)
    view.apply_health([health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3)])
    view.apply_polled([body("n1", state("n1", 1.0), 100.0), body("n2", state("n2", 1.0), 100.0)])
    before = view.snapshot().by_id()

    clock.t = 100.2
    view.apply_polled([body("n2", state("n2", 1.2), 100.2)])
    after = view.snapshot().by_id()
    assert all(after[f"n1-iu{i}"] is before[f"n1-iu{i}"] for i in range(3))  # before: built anew every time
    assert after["n2-iu0"].score == 1.2 and after["n2-iu0"] is not before["n2-iu0"]

    view.apply_health([health_entry("n1-iu0", "critical")] +
                      [health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3) if (node, i) != ("n1", 0)])
    assert view.snapshot().by_id()["n1-iu0"].health == "critical"  # health changed: every node's entries anew

    view.apply_polled([body("n1", state("n1", 1.0), 100.4, announced={"edge-a.0001": 7})])
    assert view.snapshot().by_id()["n1-iu1"].acked == 0
    view.edge_id = "edge-a.0001"
    view.apply_polled([])  # the same bodies, read by an edge with an id now: entries carry its acknowledgement
    assert view.snapshot().by_id()["n1-iu1"].acked == 7


def test_a_frozen_iu_stays_flagged_over_rebuilds_for_other_nodes_and_clears_when_its_counters_move():
    clock = Clock(100.0)
    view = PoolView(detector=AnomalyDetector(frozen_s=4.0), clock=clock)
    view.apply_health([health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3)])
    for step in range(4):  # n1's counters stand still for 6 s while it reports running requests
        clock.t = 100.0 + 2 * step
        view.apply_polled([body("n1", state("n1", 1.0, tokens=5.0), clock.t),
                           body("n2", state("n2", 1.0, tokens=100.0 * step), clock.t)])
    assert view.snapshot().by_id()["n1-iu0"].anomaly == "frozen"
    for k in range(5):  # only n2 changes: n1's entries (and their memoized verdict) are kept
        clock.t += 0.2
        view.apply_polled([body("n2", state("n2", 1.0, tokens=1000.0 + k), clock.t)])
        assert view.snapshot().by_id()["n1-iu0"].anomaly == "frozen"
    clock.t += 0.2
    view.apply_polled([body("n1", state("n1", 1.0, tokens=6.0), clock.t)])  # its counters moved
    assert view.snapshot().by_id()["n1-iu0"].anomaly is None
