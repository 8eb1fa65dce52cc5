"""Reader library: view folding, pick rules, robust anomaly verdicts (all in simulated time)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from edge.pool import AnomalyDetector, EdgeLedger, PoolView, pick

pytestmark = pytest.mark.unit


def kv_entry(node, ius, ts, heartbeat_s=2.0, offset=None):
    body = {
        "node": node,
        "rack": "r1",
        "ts": ts,
        "heartbeat_s": heartbeat_s,
        "clock_offset_s": offset,
        "seq": 1,
        "ius": {
            iu: {
                "score": score,
                "status": status,
                "reason": "",
                "components": {
                    "request_cost_s": 0.1,
                    "tokens_total": tokens,
                    "running": running,
                    "waiting": 0,
                },
            }
            for iu, (score, status, tokens, running) in ius.items()
        },
    }
    return {"Key": f"clusterctl/eas/dc1/{node}", "Value": json.dumps(body).encode()}


def health_entry(iu, status="passing", maintenance=False):
    checks = [{"CheckID": f"vllm-iu:{iu}:health", "Status": status}]
    if maintenance:
        checks.append({"CheckID": f"_service_maintenance:{iu}", "Status": "critical"})
    return {
        "Node": {"Node": iu.split("-")[0], "Address": "127.0.0.1"},
        "Service": {
            "Service": f"vllm-iu-{iu.split('-')[0]}",
            "ID": iu,
            "Address": "127.0.0.1",
            "Port": 8000,
            "Meta": {"node": iu.split("-")[0], "rack": "r"},
        },
        "Checks": checks,
    }


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def pool(scores: dict, ts=100.0, health=None, clock=None, detector=None):
    view = PoolView(detector=detector or AnomalyDetector(), clock=clock or Clock(ts))
    view.apply_health(
        [
            health_entry(iu, (health or {}).get(iu, "passing"), (health or {}).get(iu) == "maint")
            for iu in scores
        ]
    )
    view.apply_kv([kv_entry("n1", {iu: (s, "passing", 1000.0, 1) for iu, s in scores.items()}, ts)])
    return view


def picks(view, now, n=2000, ledger=None, seed=1):
    rng, ledger = random.Random(seed), ledger or EdgeLedger()
    return Counter(pick(view.snapshot(), ledger, now, rng).iu_id for _ in range(n))


def test_p2c_prefers_low_scores_but_spreads():
    view = pool({f"n1-iu{i}": float(i) for i in range(8)})
    counts = picks(view, 101.0)
    assert counts["n1-iu0"] > counts["n1-iu3"] > counts["n1-iu7"] == 0  # the max never wins a pair
    assert len(counts) == 7  # but it is not winner-take-all


def test_drops_critical_maintenance_and_stale():
    view = pool(
        {"n1-iu0": 0.1, "n1-iu1": 0.2, "n1-iu2": 0.3, "n1-iu3": 5.0},
        health={"n1-iu0": "critical", "n1-iu1": "maint"},
    )
    assert set(picks(view, 101.0)) == {"n1-iu2"}  # iu3 (5.0) loses every pair it is in
    view.apply_health(
        [
            health_entry("n1-iu0", "critical"),
            health_entry("n1-iu1", maintenance=True),
            health_entry("n1-iu2", "critical"),
            health_entry("n1-iu3"),
        ]
    )
    assert pick(view.snapshot(), EdgeLedger(), 101.0, random.Random()).iu_id == "n1-iu3"
    stale_view = pool({"n1-iu0": 0.1, "n1-iu1": 0.2})
    assert (
        pick(stale_view.snapshot(), EdgeLedger(), 100.0 + 3 * 2.0 + 0.01, random.Random()).mode == "fail_open"
    )


def test_requests_sent_since_the_score_count_against_it():
    view = pool({"n1-iu0": 0.0, "n1-iu1": 0.35})
    ledger = EdgeLedger()
    for _ in range(3):
        ledger.on_sent("n1-iu0", 100.5)  # 3 x 0.1 s of cost the published score cannot know about
    assert picks(view, 101.0, n=50, ledger=ledger) == {"n1-iu0": 50}
    ledger.on_sent("n1-iu0", 100.6)
    assert picks(view, 101.0, n=50, ledger=ledger) == {"n1-iu1": 50}
    view.apply_kv(
        [kv_entry("n1", {"n1-iu0": (0.0, "passing", 1.0, 1), "n1-iu1": (0.35, "passing", 1.0, 1)}, 101.0)]
    )  # newer score includes those requests: the ledger no longer counts them
    assert picks(view, 101.5, n=50, ledger=ledger) == {"n1-iu0": 50}


def test_fail_open_to_least_inflight_when_no_fresh_scores():
    view = pool({"n1-iu0": None, "n1-iu1": None, "n1-iu2": None}, health={"n1-iu2": "critical"})
    ledger = EdgeLedger()
    ledger.on_sent("n1-iu0", 100.0)
    choice = pick(view.snapshot(), ledger, 101.0, random.Random())
    assert (choice.iu_id, choice.mode) == ("n1-iu1", "fail_open")
    none = pool({"n1-iu0": 1.0}, health={"n1-iu0": "critical"})
    assert pick(none.snapshot(), ledger, 101.0, random.Random()).mode == "none"


def test_clock_offset_corrects_score_age():
    view = PoolView(clock=Clock(100.0))
    view.apply_health([health_entry("n1-iu0")])
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, ts=105.0, offset=5.0)])
    assert view.snapshot().entries[0].ts == 100.0


def test_frozen_counters_with_low_score_are_flagged_and_deweighted():
    clock = Clock(100.0)
    view = PoolView(detector=AnomalyDetector(frozen_s=4.0), clock=clock)
    ius = [f"n1-iu{i}" for i in range(6)]
    view.apply_health([health_entry(iu) for iu in ius])
    for step in range(8):  # 8 heartbeats: healthy IUs' counters move, iu5's do not while it claims 4 running
        clock.t = 100.0 + 2 * step
        state = {iu: (2.0 + 0.1 * i, "passing", 1000.0 * step + i, 20) for i, iu in enumerate(ius[:5])}
        state["n1-iu5"] = (0.01, "passing", 777.0, 4)
        view.apply_kv([kv_entry("n1", state, clock.t)])
    entry = view.snapshot().by_id()["n1-iu5"]
    assert entry.anomaly == "frozen" and entry.weight == 0.05
    assert all(e.anomaly is None for e in view.snapshot().entries if e.iu_id != "n1-iu5")
    counts = picks(view, clock.t + 0.5, n=4000)
    assert counts["n1-iu5"] < 0.1 * 4000  # would win ~5/6 of draws at full weight; far fewer now


def test_high_outlier_is_gated():
    view = pool({"n1-iu0": 1.0, "n1-iu1": 1.1, "n1-iu2": 0.9, "n1-iu3": 1.05, "n1-iu4": 60.0})
    entry = view.snapshot().by_id()["n1-iu4"]
    assert entry.anomaly == "high_outlier" and entry.weight == 0.0
    assert "n1-iu4" not in picks(view, 101.0)


def busy_pool(admitted_tokens: float, prefill_tps: float = 9000.0, busy_score: float = 1.8):
    """Five idle IUs (drain ~0.01 s) and one whose score is ``busy_score``, with ``admitted_tokens`` of
    admitted prompt not yet prefilled at ``prefill_tps``: the demo's quiet pool with one long prompt."""
    from edge.pool import IUEntry

    def entry(k, score, **components):
        return IUEntry(f"n1-iu{k}", "n1", "r1", score, "passing", "", 10.0, 2.0, "passing",
                       components={"running": 1, "tokens_total": 1000.0, **components})
    idle = [entry(k, 0.008 + 0.001 * k, prefill_tps=prefill_tps, admitted_prefill_tokens=0) for k in range(5)]
    return [*idle, entry(5, busy_score, prefill_tps=prefill_tps, admitted_prefill_tokens=admitted_tokens)]


def test_an_iu_busy_with_its_own_admitted_prefill_is_busy_not_an_outlier():
    """1.79 s of its own admitted prompt (16,100 tokens at 9,000 tokens/s) explains a 1.8 s score: the IU is
    busy, not implausible; it is kept out of the draw all the same (routing as for an outlier)."""
    verdict = AnomalyDetector().observe(busy_pool(16_100), 10.0)["n1-iu5"]
    assert verdict.flag == "busy" and verdict.weight == 0.0
    # the same score with no admitted prefill behind it is an outlier, and so is one the prefill explains
    # only a small part of
    assert AnomalyDetector().observe(busy_pool(0), 10.0)["n1-iu5"].flag == "high_outlier"
    assert AnomalyDetector().observe(busy_pool(900), 10.0)["n1-iu5"].flag == "high_outlier"
    # a body without the rate (an older agent) explains nothing
    no_rate = busy_pool(16_100)
    no_rate[5] = type(no_rate[5])(**{**no_rate[5].__dict__, "components": {"admitted_prefill_tokens": 16_100},
                                     "terms": None})
    assert AnomalyDetector().observe(no_rate, 10.0)["n1-iu5"].flag == "high_outlier"
    assert all(v.flag is None for k, v in AnomalyDetector().observe(busy_pool(16_100), 10.0).items() if k != "n1-iu5")


def test_new_iu_ramps_up():
    clock = Clock(100.0)
    view = pool({"n1-iu0": 1.0, "n1-iu1": 1.0}, clock=clock)
    clock.t = 102.0
    view.apply_health([health_entry(f"n1-iu{i}") for i in range(3)])
    view.apply_kv(
        [kv_entry("n1", {f"n1-iu{i}": (1.0 if i < 2 else 0.0, "passing", 1.0, 1) for i in range(3)}, 102.0)]
    )
    entry = view.snapshot().by_id()["n1-iu2"]
    assert entry.anomaly == "ramp" and entry.ramp_start == 102.0
    early = picks(view, 102.5)["n1-iu2"]
    late = picks(view, 102.0 + 5.9)["n1-iu2"]  # ramp over: the best score wins every pair it is in
    assert early < 0.5 * late
    assert view.snapshot().by_id()["n1-iu0"].ramp_start is None  # present from the start: no ramp


def test_partly_stale_pool_picks_only_fresh_entries_as_time_moves():
    view = PoolView(clock=Clock(100.0))
    view.apply_health([health_entry(f"n{n}-iu{i}") for n in (1, 2) for i in (0, 1)])
    view.apply_kv(
        [
            kv_entry("n1", {"n1-iu0": (0.0, "passing", 1.0, 1), "n1-iu1": (0.1, "passing", 1.0, 1)}, 95.0),
            kv_entry("n2", {"n2-iu0": (5.0, "passing", 1.0, 1), "n2-iu1": (6.0, "passing", 1.0, 1)}, 100.0),
        ]
    )
    assert set(picks(view, 100.5)) == {"n1-iu0", "n1-iu1", "n2-iu0"}  # n1 (written at 95) fresh until 101
    assert set(picks(view, 101.5)) == {"n2-iu0"}  # n1 stale now: the memo is rebuilt, not reused
    assert set(picks(view, 105.9)) == {"n2-iu0"}
    assert pick(view.snapshot(), EdgeLedger(), 106.5, random.Random()).mode == "fail_open"
