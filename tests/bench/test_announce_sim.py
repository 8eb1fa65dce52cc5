"""bench/routesim/announce.py: the shipped announce channel driven in simulated time, its timing and effects;
and the edge ledger's acknowledgement rule (eas_agent.scheduler.pick.EdgeLedger). The agent side's units are
tested in tests/eas_agent/test_announce.py."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from routesim.agents import AgentFleet, direct_scrapes  # noqa: E402
from routesim.announce import ANNOUNCE_BATCH_S, ANNOUNCE_TRANSIT_S, AnnounceNodes, announce_edges  # noqa: E402
from routesim.readers import PUSH_LATENCY_S, ConsulKVWatch, HealthFeed, new_view  # noqa: E402
from routesim.runner import SHIPPED, SHIPPED_PUSH, edge_scenarios, main_scenarios  # noqa: E402
from routesim.sim import Pool  # noqa: E402
from routesim.workload import TraceRequest  # noqa: E402

from edge.config import PushConfig  # noqa: E402
from edge.pool import AnomalyDetector, EdgeLedger, IUEntry  # noqa: E402
from sim.vllm.roofline import IUModel  # noqa: E402

APPLY_S = PushConfig().apply_interval_s


def test_the_ledger_drops_exactly_the_requests_the_score_acknowledges():
    ledger = EdgeLedger(announcing=True)
    assert [ledger.on_sent("iu0", t, cost) for t, cost in ((1.0, 0.1), (2.0, 0.2), (3.0, 0.4))] == [1, 2, 3]
    assert ledger.sent_cost_since("iu0", 0.5, 0.1) == pytest.approx(0.7)
    assert ledger.sent_cost_since("iu0", 0.5, 0.1, acked=2) == pytest.approx(0.4)  # 1 and 2 are in the score
    # a body without acknowledgements (the KV's): only its scrape time counts
    assert ledger.sent_cost_since("iu0", 2.5, 0.1) == pytest.approx(0.4)
    assert ledger.sent_cost_since("iu0", 2.5, 0.1, acked=3) == 0.0
    assert EdgeLedger().on_sent("iu0", 1.0, 0.1) == 0  # not announcing: no sequence number


def test_a_request_whose_announcement_was_dropped_stays_in_the_ledger_after_a_later_acknowledgement():
    ledger = EdgeLedger(announcing=True)
    for t, cost in ((1.0, 0.1), (2.0, 0.2), (3.0, 0.4)):
        ledger.on_sent("iu0", t, cost)
    ledger.unannounce([2])  # its batch never reached the agent
    assert ledger.sent_cost_since("iu0", 0.5, 0.1, acked=3) == pytest.approx(0.2)
    assert ledger.sent_cost_since("iu0", 0.5, 0.1, acked=1) == pytest.approx(0.6)


def test_the_queued_excess_stays_only_for_requests_the_score_has_no_announcement_of():
    ledger = EdgeLedger(announcing=True)
    # a 1 s prompt predicted to wait 2 s; the score counts a waiting request as 0.1 s
    ledger.on_sent("iu0", 1.0, 1.0, "r1", expected_s=3.0, queued_as_s=0.1)
    assert ledger.sent_cost_since("iu0", 1.5, 0.1) == pytest.approx(0.9)  # scraped at 1.5, not yet announced
    assert ledger.sent_cost_since("iu0", 1.5, 0.1, acked=1) == 0.0  # the agent knows its size


class Harness:
    """Two edges, one node of two IUs, agents cycling every 5 s: nothing but the announcement changes a
    score for seconds after a cycle."""

    def __init__(self):
        self.pool = Pool(IUModel(), 2, 2)
        self.loop = self.pool.loop
        fleet = AgentFleet(self.pool.units, 2, 4, profile="drain", interval_s=5.0, heartbeat_s=5.0, loop=self.loop,
                           rng=random.Random(1), direct=True)
        self.nodes = AnnounceNodes(fleet, self.loop)
        self.views = [new_view(self.loop) for _ in range(2)]
        HealthFeed(fleet, self.views, self.loop, 0.005)
        for view in self.views:
            ConsulKVWatch(fleet, view, self.loop, 0.005)
        iu_ids = [u.iu_id for u in self.pool.units]
        self.edges = announce_edges(fleet, self.views, self.loop, [random.Random(i) for i in range(2)], iu_ids,
                                    self.nodes)
        self.pool.edges = self.edges
        self.run(6.0)
        self.cycle_ts = self.views[1].snapshot().entries[0].ts  # the last cycle; the next is 5 s later

    def run(self, until: float) -> None:
        with direct_scrapes(True):
            self.loop.run(until=until)

    def entry(self, edge: int, iu_id: str):
        return next(e for e in self.views[edge].snapshot().entries if e.iu_id == iu_id)

    def send(self, at: float, prompt: int) -> list[str]:
        chosen: list[str] = []
        request = TraceRequest(rid=1, arrival=at, klass="C", prompt=prompt, output=10, edge_u=0.0)
        self.loop.schedule(at, lambda _arg, now: chosen.append(self.edges[0].iu_ids[self.edges[0].pick(request, now)]))
        self.run(at)
        return chosen


def test_an_announcement_reaches_the_other_edges_only_after_the_batch_tick_transit_push_and_apply():
    h = Harness()
    sent = h.cycle_ts + 0.5003
    [iu] = h.send(sent, 12_000)
    base = h.entry(1, iu).score
    rate = h.entry(1, iu).components["prefill_tps"]
    tick = h.edges[0].sender.next_tick(sent)
    assert sent < tick <= sent + ANNOUNCE_BATCH_S and tick - sent > 1e-3  # the batch's wait is part of the delay
    arrives = tick + ANNOUNCE_TRANSIT_S + PUSH_LATENCY_S + APPLY_S
    h.run(arrives - 1e-6)
    assert h.entry(1, iu).score == base  # not one moment sooner
    h.run(arrives + 1e-6)
    assert h.entry(1, iu).score == pytest.approx(base + 12_000 / rate, abs=2e-4)
    assert h.entry(1, iu).ts == h.cycle_ts  # still the scrape's time: what it counts by time is unchanged


def test_the_sending_edge_counts_its_request_once_before_and_after_the_acknowledgement():
    h = Harness()
    sent = h.cycle_ts + 0.5003
    [iu] = h.send(sent, 12_000)
    ledger = h.edges[0].ledger
    before = h.entry(0, iu)
    own = 12_000 / before.components["prefill_tps"]
    assert before.acked == 0
    assert ledger.sent_cost_since(iu, before.ts, before.request_cost_s, before.acked) == pytest.approx(own)
    h.run(h.edges[0].sender.next_tick(sent) + ANNOUNCE_TRANSIT_S + PUSH_LATENCY_S + APPLY_S + 1e-6)
    after = h.entry(0, iu)
    assert after.ts == before.ts and after.score == pytest.approx(before.score + own, abs=2e-4)  # the score has it
    assert after.acked == ledger.seq == 1
    assert ledger.sent_cost_since(iu, after.ts, after.request_cost_s, after.acked) == 0.0  # so the ledger does not


def test_every_ours_row_is_one_of_the_edges_three_modes_and_the_default_announces():
    ours = [s for s in main_scenarios(4) if s.label.startswith("ours")]
    assert [(s.label, s.feed) for s in ours] == [(SHIPPED, "announce"), (SHIPPED_PUSH, "push"),
                                                 ("ours (Consul only)", "consul")]
    edges = edge_scenarios((1, 4, 16))
    assert [s.label for s in edges] == [f"{SHIPPED}, 1 edge", f"{SHIPPED}, 4 edges", f"{SHIPPED}, 16 edges"]
    assert {s.feed for s in edges} == {"announce"} and edges[1].rng_label == SHIPPED  # = the main table's row


def test_the_anomaly_detector_judges_the_scrape_score_not_what_announcements_added():
    def entries(announced_s: float) -> list[IUEntry]:
        return [IUEntry(f"n1-iu{k}", "n1", "r1", score, "passing", "", 10.0, 2.0, "passing",
                        components={"announced_s": announced_s} if k == 3 else {})
                for k, score in enumerate((0.1, 0.1, 0.1, 2.0))]
    assert AnomalyDetector().observe(entries(1.9), 10.0)["n1-iu3"].flag is None  # 0.1 scraped + 1.9 announced
    assert AnomalyDetector().observe(entries(0.0), 10.0)["n1-iu3"].flag == "high_outlier"  # scraped so
