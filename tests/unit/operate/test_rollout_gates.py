"""Gate metrics: edge totals over a step, p99 from buckets, verdicts (inconclusive is never a pass)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edge.rollout import ROLLOUT_TTFT_BUCKETS, RolloutFollower
from operate.rollout_gates import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    ConsulSamples,
    EdgeTotals,
    evaluate,
    parse_edge_metrics,
    quantile,
    verdict_of,
)
from operate.rollout_plan import parse_plan

pytestmark = pytest.mark.unit


def plan(*gates, min_requests=100):
    return parse_plan({"name": "r", "stable": "old", "canary": "new", "edges": ["e:1"], "min_requests": min_requests,
                       "steps": [{"weight": 100, "hold": "1s"}], "gates": list(gates)})


def edge_text(requests: dict[str, list[float]], errors: dict[str, int]) -> str:
    """An edge's /metrics after serving ``requests`` (revision -> TTFTs) with ``errors`` (revision -> 5xx)."""
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv([{"Key": follower.key, "Value": '{"version": 1, "name": "r", "stable": "old", "canary": '
                        '"new", "weight": 0.5, "state": "progressing", "updated": 1}'}])
    for revision, ttfts in requests.items():
        follower._side_of = {"iu": revision}
        for n, ttft in enumerate(ttfts):
            follower.first_byte("iu", ttft)
            follower.finished("iu", False, 500 if n < errors.get(revision, 0) else 200)
    return generate_latest(registry).decode()


def totals(text: str, edge: str = "e:1") -> EdgeTotals:
    t = EdgeTotals()
    t.requests[edge], t.errors[edge], t.buckets[edge] = parse_edge_metrics(text)
    return t


def test_p99_from_the_edges_buckets_is_within_the_bucket_width():
    ttfts = [0.2 + 0.001 * k for k in range(1000)]  # p99 = 1.19 s
    _, _, buckets = parse_edge_metrics(edge_text({"new": ttfts}, {}))
    assert quantile(buckets["new"], 0.99) == pytest.approx(1.19, rel=0.125)
    assert len(ROLLOUT_TTFT_BUCKETS) > 40 and ROLLOUT_TTFT_BUCKETS[-1] > 60


def test_a_twice_slower_canary_fails_the_ratio_and_an_equal_one_passes():
    gate = {"metric": "ttft_p99_ratio", "max": 1.5}
    slow = totals(edge_text({"old": [0.5] * 200, "new": [1.0] * 200}, {}))
    same = totals(edge_text({"old": [0.5] * 200, "new": [0.5] * 200}, {}))
    [failed] = evaluate(plan(gate), slow, ConsulSamples())
    [passed] = evaluate(plan(gate), same, ConsulSamples())
    assert (failed.verdict, passed.verdict) == (FAIL, PASS)
    assert failed.value == pytest.approx(2.0, rel=0.15) and "p99 canary" in failed.detail


def test_too_few_requests_are_inconclusive_not_a_pass():
    few = totals(edge_text({"old": [0.5] * 200, "new": [9.0] * 20}, {"new": 20}))
    results = evaluate(plan({"metric": "ttft_p99_ratio", "max": 1.5}, {"metric": "error_rate", "max": 0.01}), few,
                       ConsulSamples())
    assert [r.verdict for r in results] == [INCONCLUSIVE, INCONCLUSIVE]
    assert verdict_of(results) == INCONCLUSIVE


def test_two_percent_errors_fail_the_error_gates():
    text = edge_text({"old": [0.5] * 500, "new": [0.5] * 500}, {"new": 10})
    results = evaluate(plan({"metric": "error_rate", "max": 0.005}, {"metric": "error_rate_delta", "max": 0.005}),
                       totals(text), ConsulSamples())
    assert [(r.verdict, r.value) for r in results] == [(FAIL, 0.02), (FAIL, 0.02)]


def test_the_window_is_the_step_and_a_restarted_edge_counts_from_its_restart():
    before = totals(edge_text({"old": [0.5] * 300, "new": [5.0] * 300}, {"new": 300}))
    after = totals(edge_text({"old": [0.5] * 400, "new": [5.0] * 300 + [0.5] * 100}, {"new": 300}))
    window = after.since(before)
    assert window.total("new")[:2] == (100, 0) and window.total("old")[:2] == (100, 0)
    restarted = totals(edge_text({"old": [0.5] * 10}, {}))
    assert restarted.since(before).total("old")[0] == 10


def test_consul_and_agent_gates():
    samples = ConsulSamples(passing=9999, total=10000, util={"a": 0.5, "b": 0.9}, ecc={"b"})
    results = evaluate(plan({"metric": "health_check_success", "min": 0.9999}, {"metric": "gpu_util_variance",
                                                                                 "max": 0.05},
                            {"metric": "ecc_events", "max": 0}), EdgeTotals(), samples)
    assert [r.verdict for r in results] == [PASS, PASS, FAIL]
    assert "b" in results[2].detail
