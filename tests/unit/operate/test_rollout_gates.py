"""Gate metrics: edge totals over a step, p99 from buckets, verdicts (inconclusive is never a pass)."""

from __future__ import annotations

import json

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


def edge_text(requests: dict[str, list[float]], errors: dict[str, int], units: int = 1) -> str:
    """An edge's /metrics after serving ``requests`` (revision -> TTFTs, dealt round robin over ``units`` IUs
    of that revision) with ``errors`` (revision -> 5xx)."""
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv([{"Key": follower.key, "Value": '{"version": 1, "name": "r", "stable": "old", "canary": '
                        '"new", "weight": 0.5, "state": "progressing", "updated": 1}'}])
    for revision, ttfts in requests.items():
        follower._side_of = {f"{revision}-iu{k}": revision for k in range(units)}
        for n, ttft in enumerate(ttfts):
            iu = f"{revision}-iu{n % units}"
            follower.first_byte(iu, ttft)
            follower.finished(iu, False, 500 if n < errors.get(revision, 0) else 200)
    return generate_latest(registry).decode()


def totals(text: str, edge: str = "e:1") -> EdgeTotals:
    t = EdgeTotals()
    t.requests[edge], t.errors[edge], t.buckets[edge], t.units[edge] = parse_edge_metrics(text)
    return t


def test_p99_from_the_edges_buckets_is_within_the_bucket_width():
    ttfts = [0.2 + 0.001 * k for k in range(1000)]  # p99 = 1.19 s
    _, _, buckets, _ = parse_edge_metrics(edge_text({"new": ttfts}, {}))
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


class AgentsInConsul:
    """What ConsulSamples.sample reads: the IUs' catalog entries and the agents' score bodies."""

    def __init__(self):
        self.xids: dict[str, tuple[float | None, float | None]] = {"n2-iu0": (0, None), "n3-iu0": (0, None)}

    def health_service(self):
        return 1, [{"Service": {"ID": iu, "Meta": {"revision": "new"}}, "Checks": [{"Status": "passing"}]}
                   for iu in self.xids] + [{"Service": {"ID": "n0-iu0", "Meta": {"revision": "old"}}, "Checks": []}]

    def kv_list(self, prefix):
        ius = {iu: {"score": 0.1, "status": "passing", "components": {"xid_events": n, "xid_last": last}}
               for iu, (n, last) in self.xids.items()}
        ius["n0-iu0"] = {"score": 0.1, "status": "passing", "components": {"xid_events": 40, "xid_last": 13}}
        return 1, [{"Key": f"{prefix}n", "Value": json.dumps({"node": "n", "ts": 1.0, "ius": ius})}]


def xid_gate(samples: ConsulSamples):
    return evaluate(plan({"metric": "xid_events", "max": 0}), EdgeTotals(), samples)[0]


def test_xid_events_count_what_the_canary_gpus_had_since_the_step_began():
    agents, samples, p = AgentsInConsul(), ConsulSamples(), plan({"metric": "xid_events", "max": 0})
    agents.xids["n2-iu0"] = (3, 13)  # XIDs before the step: not the step's
    samples.sample(agents, p, "dc1")
    samples.sample(agents, p, "dc1")
    assert (xid_gate(samples).verdict, xid_gate(samples).value) == (PASS, 0)  # stable's 40 are not the canary's
    agents.xids["n3-iu0"] = (1, 79)
    samples.sample(agents, p, "dc1")
    failed = xid_gate(samples)
    assert (failed.verdict, failed.value) == (FAIL, 1)
    assert failed.detail == "new XID events: n3-iu0 1 (latest Xid 79) over 2 canary IUs"


def test_an_agent_restart_starts_its_xid_counter_again_and_nothing_is_lost():
    agents, samples, p = AgentsInConsul(), ConsulSamples(), plan({"metric": "xid_events", "max": 0})
    agents.xids["n2-iu0"] = (5, 48)
    samples.sample(agents, p, "dc1")
    agents.xids["n2-iu0"] = (7, 48)
    samples.sample(agents, p, "dc1")
    agents.xids["n2-iu0"] = (1, 79)  # restarted, one XID since
    samples.sample(agents, p, "dc1")
    assert samples.new_xids() == {"n2-iu0": 3, "n3-iu0": 0} and samples.xid_last["n2-iu0"] == 79


def test_without_an_xid_count_from_any_canary_the_gate_is_inconclusive():
    agents, samples = AgentsInConsul(), ConsulSamples()
    agents.xids = {"n2-iu0": (None, None)}  # NVML refused the event registration: null, never 0
    samples.sample(agents, plan({"metric": "xid_events", "max": 0}), "dc1")
    result = xid_gate(samples)
    assert (result.verdict, result.value) == (INCONCLUSIVE, None)
    assert "no canary IU publishes an XID count" in result.detail


JITTER = {"metric": "ttft_jitter_delta", "max": 0.1}


def test_one_slow_canary_unit_fails_the_jitter_gate_even_units_pass():
    even = {"old": [0.2, 0.2] * 100, "new": [0.2, 0.21] * 100}
    uneven = {"old": [0.2, 0.2] * 100, "new": [0.2, 0.4] * 100}  # new-iu1 twice as slow as new-iu0
    passed = evaluate(plan(JITTER), totals(edge_text(even, {}, units=2)), ConsulSamples())[0]
    failed = evaluate(plan(JITTER), totals(edge_text(uneven, {}, units=2)), ConsulSamples())[0]
    assert passed.verdict == PASS and passed.value == pytest.approx(0.0244, abs=1e-3)
    assert failed.verdict == FAIL and failed.value == pytest.approx(1 / 3, abs=1e-3)  # stdev/mean of 0.2, 0.4
    assert failed.detail.startswith("spread of the IUs' mean TTFT (stdev/mean): canary 0.333 over 2 IUs, "
                                    "stable 0.000 over 2 IUs")


def test_jitter_needs_two_units_with_enough_requests_on_each_side():
    one_unit = evaluate(plan(JITTER), totals(edge_text({"old": [0.2] * 200, "new": [0.4] * 200}, {})),
                        ConsulSamples())[0]
    few = evaluate(plan(JITTER), totals(edge_text({"old": [0.2] * 200, "new": [0.2, 0.4] * 10}, {}, units=2)),
                   ConsulSamples())[0]
    short_side = evaluate(plan(JITTER, min_requests=120), totals(edge_text({"old": [0.2] * 200, "new": [0.2, 0.4] * 50},
                                                                           {}, units=2)), ConsulSamples())[0]
    assert (one_unit.verdict, few.verdict) == (INCONCLUSIVE, INCONCLUSIVE)  # a unit needs min_requests / 4
    assert short_side.verdict == INCONCLUSIVE  # 100 canary requests, 30 per IU: a side needs min_requests


def test_unit_ttfts_count_over_the_step_only():
    before = totals(edge_text({"old": [0.2, 0.2] * 100, "new": [0.2, 0.9] * 100}, {}, units=2))
    after = totals(edge_text({"old": [0.2, 0.2] * 200, "new": [0.2, 0.9] * 100 + [0.2, 0.2] * 100}, {}, units=2))
    step = evaluate(plan(JITTER), after.since(before), ConsulSamples())[0]
    assert (step.verdict, step.value) == (PASS, 0)  # the slow unit was slow before the step, not in it
