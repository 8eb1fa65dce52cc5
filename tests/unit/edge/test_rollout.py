"""The edge's rollout split: which IUs a request may use, the share, the last good document, the counts."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from consul_io import layout
from edge.pool import IUEntry
from edge.pool.view import Snapshot
from edge.rollout import RolloutFollower

pytestmark = pytest.mark.unit
KEY = layout.rollout_key("dc1")


def entry(k: int, revision: str | None, health: str = "passing") -> IUEntry:
    return IUEntry(f"n{k}-iu0", f"n{k}", "r1", 0.1, "passing", "", 10.0, 2.0, health, revision=revision)


def snapshot(*entries: IUEntry) -> Snapshot:
    healthy = tuple(e for e in entries if e.routable)
    return Snapshot(tuple(entries), healthy, healthy, float("inf"), 0.0)


def kv(weight: float, state: str = "progressing", **changes) -> list[dict]:
    doc = {"version": 1, "name": "r", "stable": "old", "canary": "new", "weight": weight, "state": state,
           "step": 0, "updated": 1.0, "history": [], **changes}
    return [{"Key": KEY, "Value": json.dumps(doc)}]


POOL = snapshot(entry(1, "old"), entry(2, "old"), entry(3, None), entry(4, "new"), entry(5, "new"))
CANARY = frozenset({"n4-iu0", "n5-iu0"})
STABLE = frozenset({"n1-iu0", "n2-iu0", "n3-iu0"})


def test_without_a_document_every_iu_serves_every_request():
    follower = RolloutFollower()
    follower.apply_kv([])
    assert follower.split(POOL, frozenset({"x"})) == frozenset({"x"})


@pytest.mark.parametrize("weight", [0.05, 0.2, 0.5])
def test_the_canary_share_is_the_weight_and_each_request_is_on_one_side_only(weight):
    follower = RolloutFollower()
    follower.apply_kv(kv(weight))
    to_canary = 0
    for _ in range(4000):
        excluded = follower.split(POOL, frozenset())
        assert excluded in (STABLE, CANARY)  # a request never mixes revisions: its retry stays on its side
        to_canary += excluded == STABLE
    assert abs(to_canary - 4000 * weight) <= 1  # the stated tolerance: one request per edge


def test_an_iu_without_a_revision_is_on_the_stable_side():
    follower = RolloutFollower()
    follower.apply_kv(kv(0.5))
    assert follower.sides(POOL) == (CANARY, STABLE)


def test_abort_sends_everything_to_stable_and_promote_everything_to_the_canary():
    follower = RolloutFollower()
    follower.apply_kv(kv(0.0, "aborted"))
    assert {follower.split(POOL, frozenset()) for _ in range(50)} == {CANARY}
    follower.apply_kv(kv(1.0, "promoted"))
    assert {follower.split(POOL, frozenset()) for _ in range(50)} == {STABLE}


def test_a_bad_document_keeps_the_last_good_one_and_is_counted():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(0.2))
    follower.apply_kv(kv(0.7, "aborted"))  # aborted with a weight: refused
    follower.apply_kv([{"Key": KEY, "Value": "{not json"}])
    assert follower.doc.weight == 0.2 and follower.read_errors == 2
    assert "weight = 0.7" in follower.last_error or "not JSON" in follower.last_error
    assert b"eas_edge_rollout_read_errors_total 2.0" in generate_latest(registry)


def test_a_side_with_no_routable_iu_for_the_request_is_not_imposed():
    follower = RolloutFollower()
    follower.apply_kv(kv(1.0, "promoted"))
    down = snapshot(entry(1, "old"), entry(4, "new", "critical"))
    assert follower.split(down, frozenset()) == frozenset()  # served by stable rather than refused
    assert follower.split(POOL, frozenset(CANARY)) == frozenset(CANARY)  # its model runs on no canary IU


def test_outcomes_are_counted_by_the_revision_of_the_iu_that_served():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(0.5))
    follower.split(POOL, frozenset())
    follower.first_byte("n4-iu0", 0.3)
    follower.finished("n4-iu0", failed=False)
    follower.finished("n4-iu0", failed=False, status=500)
    follower.finished("n4-iu0", failed=False, status=404)  # the client's error, not the canary's
    follower.finished("n1-iu0", failed=True)
    text = generate_latest(registry).decode()
    assert 'eas_edge_rollout_requests_total{revision="new"} 3.0' in text
    assert 'eas_edge_rollout_errors_total{kind="status_5xx",revision="new"} 1.0' in text
    assert 'eas_edge_rollout_errors_total{kind="failed",revision="old"} 1.0' in text
    assert 'eas_edge_rollout_ttft_seconds_count{revision="new"} 1.0' in text
    assert 'eas_edge_rollout_unit_ttft_seconds_sum{iu="n4-iu0",revision="new"} 0.3' in text  # per IU: jitter
    assert "eas_edge_rollout_weight 0.5" in text
