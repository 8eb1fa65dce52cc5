"""bench/routesim/announce.py: the announce channel (a design that does not ship), its mechanics."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from routesim.agents import AgentFleet, direct_scrapes  # noqa: E402
from routesim.announce import (  # noqa: E402
    ANNOUNCE_BATCH_S,
    ANNOUNCE_TRANSIT_S,
    AnnouncedPrompts,
    AnnounceLedger,
    AnnounceNodes,
    AnnounceScorer,
    ScrapeScoreDetector,
    announce_edges,
)
from routesim.readers import PUSH_LATENCY_S, ConsulKVWatch, HealthFeed  # noqa: E402
from routesim.runner import announce_scenarios, edge_scenarios, main_scenarios  # noqa: E402
from routesim.sim import Pool  # noqa: E402
from routesim.workload import TraceRequest  # noqa: E402

from eas_agent.collectors.vllm import VllmReading  # noqa: E402
from eas_agent.scheduler import AnomalyDetector, IUEntry  # noqa: E402
from eas_agent.score import DrainParams, IUInputs, Scorer  # noqa: E402
from eas_agent.vllm_metrics import VllmMetrics  # noqa: E402
from edge.config import PushConfig  # noqa: E402
from sim.vllm.roofline import IUModel  # noqa: E402

APPLY_S = PushConfig().apply_interval_s


def test_the_waiting_ones_are_the_most_recent_announced_prompts_not_seen_admitted():
    prompts = AnnouncedPrompts()
    for tokens in (100, 2_000, 12_000, 300):
        prompts.announce(tokens, sent=0.1)
    assert prompts.reconcile(2, now=0.2, prefill_tps=10_000.0, request_cost_s=0.1) == (12_300, 0)
    assert list(prompts.pending) == [12_000, 300]  # the two oldest were admitted: gone for good
    assert prompts.reconcile(3, now=0.4, prefill_tps=10_000.0, request_cost_s=0.1) == (12_300, 1)
    assert prompts.reconcile(0, now=0.6, prefill_tps=10_000.0, request_cost_s=0.1) == (0, 0)


def test_an_announcement_adds_its_prefill_until_the_scrape_and_a_late_one_resizes_a_mean_counted_request():
    prompts = AnnouncedPrompts()
    prompts.reconcile(1, now=1.0, prefill_tps=10_000.0, request_cost_s=0.1)  # one waiting, no announcement names it
    prompts.announce(5_000, sent=0.999)  # sent before that scrape: the one it counted at the mean request
    assert prompts.added_s == pytest.approx(0.5 - 0.1)
    prompts.announce(2_000, sent=0.998)  # no unnamed waiting request left: it was admitted by the scrape
    prompts.announce(3_000, sent=1.01)  # after the scrape: all of it
    assert prompts.added_s == pytest.approx(0.4 + 0.3)
    assert list(prompts.pending) == [5_000, 3_000]
    prompts.reconcile(2, now=1.2, prefill_tps=10_000.0, request_cost_s=0.1)
    assert prompts.added_s == 0.0  # the scrape counts them now

    unsized = AnnouncedPrompts(sizes=False)  # the ablation: waiting requests stay at the mean prompt
    unsized.reconcile(1, now=1.0, prefill_tps=10_000.0, request_cost_s=0.1)
    unsized.announce(5_000, sent=0.999)
    assert unsized.added_s == 0.0 and unsized.unattributed == 1


def _inputs(waiting: float) -> IUInputs:
    metrics = VllmMetrics(schema="v1", num_requests_running=4.0, num_requests_waiting=waiting, kv_cache_usage=0.3,
                          prompt_tokens_total=1e5, generation_tokens_total=2e5, prefix_cache_queries_total=1e5)
    return IUInputs("n1-iu0", VllmReading(metrics, mean_prompt_tokens=1_000.0, preemptions_per_s=0.0))


def test_the_scrape_counts_waiting_requests_at_their_announced_sizes():
    prompts = AnnouncedPrompts()
    for tokens in (700, 12_000, 300):
        prompts.announce(tokens, sent=0.0)
    shipped = Scorer("drain", DrainParams()).score(_inputs(2.0), 1.0)
    design = AnnounceScorer(DrainParams(), prompts).score(_inputs(2.0), 1.0)
    prefill = DrainParams().prefill_tps_prior  # no rate measured yet
    assert design.score == pytest.approx(shipped.score + (12_300 - 2 * 1_000) / prefill, abs=1e-4)
    assert design.components["backlog_tokens"] == 12_300 and shipped.components["backlog_tokens"] == 2_000
    unsized = AnnouncedPrompts(sizes=False)
    unsized.announce(12_000, sent=0.0)
    assert AnnounceScorer(DrainParams(), unsized).score(_inputs(2.0), 1.0) == shipped


def test_the_ledger_drops_exactly_the_requests_the_score_acknowledges():
    acked = {"iu0": 0}
    ledger = AnnounceLedger(lambda iu: acked[iu])
    for t, cost in ((1.0, 0.1), (2.0, 0.2), (3.0, 0.4)):
        ledger.on_sent("iu0", t, cost)
    assert ledger.seq == 3
    assert ledger.sent_cost_since("iu0", 0.5, 0.1) == pytest.approx(0.7)
    acked["iu0"] = 2  # the body counts requests 1 and 2 through their announcements
    assert ledger.sent_cost_since("iu0", 0.5, 0.1) == pytest.approx(0.4)
    acked["iu0"] = 0  # a body without acknowledgements (the KV's): only its scrape time counts
    assert ledger.sent_cost_since("iu0", 2.5, 0.1) == pytest.approx(0.4)
    acked["iu0"] = 3
    assert ledger.sent_cost_since("iu0", 2.5, 0.1) == 0.0


def test_the_queued_excess_stays_only_for_requests_the_score_has_no_announcement_of():
    acked = {"iu0": 0}
    ledger = AnnounceLedger(lambda iu: acked[iu])
    # a 1 s prompt predicted to wait 2 s; the score counts a waiting request as 0.1 s
    ledger.on_sent("iu0", 1.0, 1.0, "r1", expected_s=3.0, queued_as_s=0.1)
    assert ledger.sent_cost_since("iu0", 1.5, 0.1) == pytest.approx(0.9)  # scraped at 1.5, not yet announced
    acked["iu0"] = 1
    assert ledger.sent_cost_since("iu0", 1.5, 0.1) == 0.0  # the agent knows its size


class Harness:
    """Two edges, one node of two IUs, agents cycling every 5 s: nothing but the announcement changes a
    score for seconds after a cycle."""

    def __init__(self):
        self.pool = Pool(IUModel(), 2, 2)
        self.loop = self.pool.loop
        fleet = AgentFleet(self.pool.units, 2, 4, profile="drain", interval_s=5.0, heartbeat_s=5.0, loop=self.loop,
                           rng=random.Random(1), direct=True)
        self.nodes = AnnounceNodes(fleet, self.loop)
        self.views = [self.nodes.view(self.loop) for _ in range(2)]
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
    assert ledger.sent_cost_since(iu, before.ts, before.request_cost_s) == pytest.approx(own)  # the ledger has it
    h.run(h.edges[0].sender.next_tick(sent) + ANNOUNCE_TRANSIT_S + PUSH_LATENCY_S + APPLY_S + 1e-6)
    after = h.entry(0, iu)
    assert after.ts == before.ts and after.score == pytest.approx(before.score + own, abs=2e-4)  # the score has it
    assert ledger.sent_cost_since(iu, after.ts, after.request_cost_s) == 0.0  # so the ledger no longer does


def test_design_rows_are_labelled_as_such_and_the_shipped_rows_stay_as_they_are():
    design = announce_scenarios((1, 4, 16))
    assert [s.label for s in design] == ["design: push + announce, 1 edge", "design: push + announce, 4 edges",
                                         "design: push + announce, 16 edges"]
    assert [s.rng_label for s in design] == ["ours (push + Consul), 1 edge", "ours (push + Consul)",
                                             "ours (push + Consul), 16 edges"]
    shipped = [s for s in main_scenarios(4) + edge_scenarios((1, 4, 16)) if s.label.startswith("ours")]
    assert {s.feed for s in shipped} == {"push", "consul"}


def test_the_anomaly_detector_judges_the_scrape_score_not_what_announcements_added():
    def entries(announced_s: float) -> list[IUEntry]:
        return [IUEntry(f"n1-iu{k}", "n1", "r1", score, "passing", "", 10.0, 2.0, "passing",
                        components={"announced_s": announced_s} if k == 3 else {})
                for k, score in enumerate((0.1, 0.1, 0.1, 2.0))]
    assert AnomalyDetector().observe(entries(1.9), 10.0)["n1-iu3"].flag == "high_outlier"  # as the edge ships
    assert ScrapeScoreDetector().observe(entries(1.9), 10.0)["n1-iu3"].flag is None  # 0.1 scraped + 1.9 announced
    assert ScrapeScoreDetector().observe(entries(0.0), 10.0)["n1-iu3"].flag == "high_outlier"  # scraped so
