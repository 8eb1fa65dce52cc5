"""eas_agent/announce.py, the announce channel's agent side: batch parsing, the per-IU announced prompts, the
waiting-sizes scorer and the node's /scores body with what announcements added (no HTTP here:
test_announce_endpoint.py serves it)."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from eas_agent.announce import MAX_PENDING, AnnouncedPrompts, AnnounceScorer, NodeAnnouncements
from eas_agent.collectors.vllm import VllmReading
from eas_agent.score import DrainParams, IUInputs, Scorer
from eas_agent.vllm_metrics import VllmMetrics
from eas_wire.announce import MAX_BATCH_ITEMS, SENT_TOLERANCE_S, AnnounceError, Announcement, parse_batch
from eas_wire.scorebody import MAX_ANNOUNCED_EDGES, MAX_SEQ, IUScore, ScoreBody

NOW = 1_764_780_000.0
IUS = {"n1-iu0", "n1-iu1"}


def item(seq: int, tokens: int = 1_000, iu: str = "n1-iu0", sent: float = NOW) -> dict:
    return {"iu": iu, "tokens": tokens, "seq": seq, "sent": sent}


def batch(*items, edge: str = "edge-a.3f9c2b1d") -> dict:
    return {"edge": edge, "announcements": list(items)}


# ------------------------------------------------------------------------------------------ parse_batch


@pytest.mark.parametrize("obj, message", [
    ([], "body is list, not an object"),
    ("edge", "body is str, not an object"),
    ({"announcements": []}, "edge 'None' is not an edge id"),
    ({"edge": "", "announcements": []}, "edge '' is not an edge id"),
    ({"edge": "-leading-dash", "announcements": []}, "is not an edge id"),
    ({"edge": "a" * 81, "announcements": []}, "is not an edge id"),
    ({"edge": "edge a", "announcements": []}, "is not an edge id"),
    ({"edge": 7, "announcements": []}, "edge '7' is not an edge id"),
    ({"edge": "edge-a"}, "announcements is NoneType, not a list"),
    ({"edge": "edge-a", "announcements": {"iu": "n1-iu0"}}, "announcements is dict, not a list"),
])
def test_a_malformed_batch_is_refused_whole_naming_the_field(obj, message):
    with pytest.raises(AnnounceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_batch(obj, IUS, NOW)


def test_a_batch_of_more_than_max_items_is_refused_and_max_items_is_parsed():
    items = [item(seq) for seq in range(1, MAX_BATCH_ITEMS + 1)]
    edge, kept, ignored = parse_batch(batch(*items), IUS, NOW)
    assert edge == "edge-a.3f9c2b1d" and len(kept) == MAX_BATCH_ITEMS and not ignored
    with pytest.raises(AnnounceError, match=f"has {MAX_BATCH_ITEMS + 1} entries"):
        parse_batch(batch(*items, item(MAX_BATCH_ITEMS + 1)), IUS, NOW)


@pytest.mark.parametrize("bad, reason", [
    ("not an object", "malformed"),
    ([1, 2], "malformed"),
    (item(1, iu="n2-iu0"), "unknown_iu"),
    (item(1, iu=None), "unknown_iu"),
    ({"tokens": 5, "seq": 1, "sent": NOW}, "unknown_iu"),
    (item(1, tokens=0), "tokens_invalid"),
    (item(1, tokens=-3), "tokens_invalid"),
    (item(1, tokens=1.5), "tokens_invalid"),
    (item(1, tokens=True), "tokens_invalid"),
    (item(1, tokens="100"), "tokens_invalid"),
    (item(0), "seq_invalid"),
    (item(-1), "seq_invalid"),
    (item(MAX_SEQ + 1), "seq_invalid"),
    ({**item(1), "seq": True}, "seq_invalid"),
    ({**item(1), "seq": 2.0}, "seq_invalid"),
    (item(1, sent=float("nan")), "sent_out_of_range"),
    (item(1, sent=float("inf")), "sent_out_of_range"),
    (item(1, sent=NOW + SENT_TOLERANCE_S + 0.01), "sent_out_of_range"),
    (item(1, sent=NOW - SENT_TOLERANCE_S - 0.01), "sent_out_of_range"),
    ({**item(1), "sent": True}, "sent_out_of_range"),
    ({**item(1), "sent": "now"}, "sent_out_of_range"),
    ({**item(1), "sent": None}, "sent_out_of_range"),
])
def test_each_bad_announcement_is_ignored_and_counted_the_others_kept(bad, reason):
    edge, kept, ignored = parse_batch(batch(bad, item(5), item(6, iu="n1-iu1")), IUS, NOW)
    assert ignored == Counter({reason: 1})
    assert kept == [Announcement("n1-iu0", 1_000, 5, NOW), Announcement("n1-iu1", 1_000, 6, NOW)]


def test_the_edges_of_the_ranges_are_kept():
    _, kept, ignored = parse_batch(batch(item(1, tokens=1, sent=NOW - SENT_TOLERANCE_S),
                                         item(MAX_SEQ, sent=int(NOW + SENT_TOLERANCE_S))), IUS, NOW)
    assert not ignored and [(a.tokens, a.seq) for a in kept] == [(1, 1), (1_000, MAX_SEQ)]
    assert isinstance(kept[1].sent, float)


def test_tokens_above_the_cap_are_kept_at_the_cap_and_counted():
    _, kept, ignored = parse_batch(batch(item(1, tokens=32_768), item(2, tokens=32_769), item(3, tokens=10**12)),
                                   IUS, NOW, max_prompt_tokens=32_768)
    assert [a.tokens for a in kept] == [32_768, 32_768, 32_768]
    assert ignored == Counter(tokens_capped=2)


def test_seq_must_increase_within_a_batch():
    _, kept, ignored = parse_batch(batch(item(5), item(5), item(4), item(9), item(7), item(10)), IUS, NOW)
    assert [a.seq for a in kept] == [5, 9, 10] and ignored == Counter(seq_invalid=3)


def test_an_ignored_announcement_does_not_advance_the_batchs_seq():
    _, kept, ignored = parse_batch(batch(item(8, iu="n9-iu0"), item(3)), IUS, NOW)
    assert [a.seq for a in kept] == [3] and ignored == Counter(unknown_iu=1)


# ------------------------------------------------------------------------------------ AnnouncedPrompts


def test_an_announcement_adds_its_prefill_until_the_next_scrape():
    prompts = AnnouncedPrompts()
    prompts.announce(4_000, sent=0.5)  # no scrape yet: the first one counts it, nothing is added
    assert prompts.added_s == 0.0 and list(prompts.pending) == [4_000]
    assert prompts.reconcile(1, now=1.0, prefill_tps=8_000.0, request_cost_s=0.125) == (4_000, 0)
    prompts.announce(2_000, sent=1.05)
    prompts.announce(6_000, sent=1.10)
    assert prompts.added_s == pytest.approx((2_000 + 6_000) / 8_000)
    assert prompts.reconcile(3, now=1.2, prefill_tps=8_000.0, request_cost_s=0.125) == (12_000, 0)
    assert prompts.added_s == 0.0  # the scrape sees them itself


def test_a_late_announcement_resizes_a_request_the_scrape_counted_at_the_mean():
    prompts = AnnouncedPrompts()
    prompts.reconcile(2, now=1.0, prefill_tps=10_000.0, request_cost_s=0.1)  # two waiting, none announced
    prompts.announce(5_000, sent=0.99)  # sent before the scrape: one of the two it counted at 0.1 s
    assert prompts.added_s == pytest.approx(0.5 - 0.1) and prompts.unattributed == 1
    prompts.announce(500, sent=0.98)  # a small one: the correction is negative
    assert prompts.added_s == pytest.approx(0.4 + 0.05 - 0.1) and prompts.unattributed == 0
    prompts.announce(9_000, sent=0.97)  # no mean-counted request left: the scrape found it admitted
    assert prompts.added_s == pytest.approx(0.35) and list(prompts.pending) == [5_000, 500]


def test_waiting_are_the_most_recent_pending_prompts_fifo():
    prompts = AnnouncedPrompts()
    for tokens in (100, 2_000, 12_000, 300):
        prompts.announce(tokens, sent=0.1)
    assert prompts.reconcile(2, now=0.2, prefill_tps=10_000.0, request_cost_s=0.1) == (12_300, 0)
    assert list(prompts.pending) == [12_000, 300]  # the two oldest were admitted, gone for good
    assert prompts.reconcile(5, now=0.4, prefill_tps=10_000.0, request_cost_s=0.1) == (12_300, 3)
    assert prompts.reconcile(1, now=0.6, prefill_tps=10_000.0, request_cost_s=0.1) == (300, 0)
    assert prompts.reconcile(0, now=0.8, prefill_tps=10_000.0, request_cost_s=0.1) == (0, 0)
    assert not prompts.pending


def test_pending_is_bounded_keeping_the_most_recent():
    prompts = AnnouncedPrompts()
    prompts.reconcile(0, now=0.0, prefill_tps=10_000.0, request_cost_s=0.1)
    for tokens in range(1, MAX_PENDING + 101):
        prompts.announce(tokens, sent=0.5)
    assert len(prompts.pending) == MAX_PENDING
    assert prompts.pending[0] == 101 and prompts.pending[-1] == MAX_PENDING + 100


# -------------------------------------------------------------------------------------- AnnounceScorer


def reading(waiting: float | None, running: float = 4.0, *, kv: float = 0.3, prompt_total: float = 1e5,
            queries: float | None = 1.2e5, mean: float | None = 1_000.0, prompt_tps: float | None = 4_000.0,
            preempt: float | None = 0.0) -> VllmReading:
    metrics = VllmMetrics(schema="v1", num_requests_running=running, num_requests_waiting=waiting,
                          kv_cache_usage=kv, prompt_tokens_total=prompt_total, generation_tokens_total=2e5,
                          prefix_cache_queries_total=queries)
    return VllmReading(metrics, prompt_tps=prompt_tps, generation_tps=1_500.0, completions_per_s=5.0,
                       mean_prompt_tokens=mean, preemptions_per_s=preempt)


def varied_readings(rng: random.Random, n: int) -> list[VllmReading | None]:
    out: list[VllmReading | None] = []
    prompt_total, queries = 1e5, 1.2e5
    for _ in range(n):
        prompt_total += rng.uniform(0, 5e4)
        queries += rng.uniform(0, 8e4)
        kind = rng.random()
        if kind < 0.08:
            out.append(None)  # the scrape failed
        elif kind < 0.16:
            out.append(reading(None, prompt_total=prompt_total, queries=queries))  # no waiting gauge
        else:
            out.append(reading(float(rng.randint(0, 40)), float(rng.randint(0, 64)), kv=rng.uniform(0, 1),
                               prompt_total=prompt_total, queries=rng.choice([queries, None]),
                               mean=rng.choice([None, rng.uniform(50, 20_000)]),
                               prompt_tps=rng.choice([None, rng.uniform(100, 30_000)]),
                               preempt=rng.choice([None, 0.0, rng.uniform(0, 5)])))
    return out


@pytest.mark.parametrize("profile", ["drain", "seed"])
@pytest.mark.parametrize("seed", range(5))
def test_without_announcements_the_scorer_is_exactly_the_inner_one(profile, seed):
    rng = random.Random(seed)
    plain = Scorer(profile, DrainParams())
    wrapped = AnnounceScorer(Scorer(profile, DrainParams()), AnnouncedPrompts())
    for t, vllm in enumerate(varied_readings(rng, 60)):
        vllm = vllm if vllm is not None else VllmReading(None, error="connection refused")
        inputs = IUInputs("n1-iu0", vllm, kv_cache_gb=40.0)
        now = 1_000.0 + t * rng.uniform(0.1, 30)
        assert wrapped.score(inputs, now) == plain.score(inputs, now), (seed, t)


def test_a_long_waiting_prompt_raises_the_queue_term_by_its_excess_over_the_mean():
    params = DrainParams()
    plain = Scorer("drain", params)
    prompts = AnnouncedPrompts()
    wrapped = AnnounceScorer(Scorer("drain", params), prompts)
    prompts.announce(20_000, sent=NOW - 0.1)  # before any scrape: pending, the scrape sizes it
    vllm = reading(1.0, preempt=2.0)  # one waiting, at the mean prompt of 1,000 tokens
    inputs = IUInputs("n1-iu0", vllm)
    shipped, sized = plain.score(inputs, NOW), wrapped.score(inputs, NOW)
    prefill_tps = params.prefill_tps_prior  # measured 4,000/s is below the prior's peak
    prefill_eff = prefill_tps - 2.0 * 1_000  # two preemptions a second re-prefill the mean prompt
    assert sized.score == pytest.approx(shipped.score + (20_000 - 1_000) / prefill_eff, abs=1e-4)
    assert sized.components["backlog_tokens"] == 20_000 and shipped.components["backlog_tokens"] == 1_000
    assert sized.components["queue_s"] == pytest.approx(20_000 / prefill_eff, abs=1e-4)
    assert (sized.status, sized.reason) == (shipped.status, shipped.reason)


def test_one_announced_and_one_unnamed_waiting_request():
    prompts = AnnouncedPrompts()
    wrapped, plain = AnnounceScorer(Scorer("drain"), prompts), Scorer("drain")
    prompts.announce(9_000, sent=NOW)
    inputs = IUInputs("n1-iu0", reading(2.0))
    delta = wrapped.score(inputs, NOW).score - plain.score(inputs, NOW).score
    assert delta == pytest.approx((9_000 + 1_000 - 2 * 1_000) / DrainParams().prefill_tps_prior, abs=1e-4)


# ----------------------------------------------------------------------------------- NodeAnnouncements


def entries(**scores) -> dict[str, IUScore]:
    return {iu.replace("_", "-"): IUScore(score, "passing" if score is not None else "warning",
                                          components={"queue_s": 0.1})
            for iu, score in scores.items()}


def base_body(**scores) -> ScoreBody:
    return ScoreBody(node="n1", ts=NOW, ius=entries(**scores), rack="r1", seq=3)


def scraped_node(**kw) -> NodeAnnouncements:
    """A node whose two IUs were scraped at NOW - 0.1 with 10,000 prompt tokens/s measured."""
    node = NodeAnnouncements(sorted(IUS), **kw)
    for prompts in node.prompts.values():
        prompts.reconcile(0, now=NOW - 0.1, prefill_tps=10_000.0, request_cost_s=0.1)
    return node


def test_a_replayed_seq_is_ignored():
    node = scraped_node()
    first = batch(item(1), item(2), item(3))
    assert node.receive_json(first, NOW) == (3, Counter())
    assert node.receive_json(first, NOW) == (0, Counter(replayed=3))
    assert node.receive_json(batch(item(2), item(3), item(4), item(5)), NOW) == (2, Counter(replayed=2))
    assert node.acked == {"edge-a.3f9c2b1d": 5}
    assert node.prompts["n1-iu0"].added_s == pytest.approx(5 * 0.1)  # the replays added nothing
    assert node.counts == Counter(accepted=5, replayed=5)


def test_each_edge_is_held_to_its_rate():
    node = scraped_node(rate_per_s=10.0, burst=5.0)
    accepted, ignored = node.receive_json(batch(*(item(s) for s in range(1, 9))), NOW)
    assert (accepted, ignored) == (5, Counter(rate_limited=3))
    assert node.acked["edge-a.3f9c2b1d"] == 5  # the ones refused are not acknowledged
    # another edge has a bucket of its own
    assert node.receive_json(batch(*(item(s) for s in range(1, 4)), edge="edge-b.1"), NOW) == (3, Counter())
    # 0.35 s later the first edge has 3.5 more
    accepted, ignored = node.receive_json(batch(*(item(s) for s in range(9, 14))), NOW + 0.35)
    assert (accepted, ignored) == (3, Counter(rate_limited=2))
    # the bucket refills to its size, no more
    accepted, _ = node.receive_json(batch(*(item(s) for s in range(20, 40))), NOW + 4.0)
    assert accepted == 5


def test_at_most_max_announced_edges_are_remembered_least_recently_heard_dropped():
    node = scraped_node()
    edges = [f"edge-{i}.x" for i in range(MAX_ANNOUNCED_EDGES)]
    for i, edge in enumerate(edges):
        node.receive_json(batch(item(i + 1), edge=edge), NOW)
    node.receive_json(batch(item(100), edge=edges[0]), NOW)  # heard again: now the most recent
    node.receive_json(batch(item(1), edge="edge-new.y"), NOW)
    assert len(node.acked) == MAX_ANNOUNCED_EDGES and len(node.buckets) == MAX_ANNOUNCED_EDGES
    assert edges[1] not in node.acked and edges[1] not in node.buckets  # the least recently heard
    assert node.acked[edges[0]] == 100 and node.acked["edge-new.y"] == 1
    # a forgotten edge starts over: its old sequence numbers count again
    assert node.receive_json(batch(item(2), edge=edges[1]), NOW) == (1, Counter())


def test_an_edge_that_sent_only_ignored_announcements_is_not_remembered():
    node = scraped_node()
    assert node.receive_json(batch(item(1, iu="n7-iu0")), NOW) == (0, Counter(unknown_iu=1))
    assert node.acked == {} and node.buckets == {}


def test_body_carries_announced_and_what_announcements_added():
    node = scraped_node()
    assert node.body(base_body(n1_iu0=0.5, n1_iu1=0.2)).announced == {}
    node.receive_json(batch(item(1, tokens=3_000), item(2, tokens=2_000, iu="n1-iu1")), NOW)
    node.receive_json(batch(item(7, tokens=1_000), edge="edge-b.2"), NOW)
    base = base_body(n1_iu0=0.5, n1_iu1=0.2)
    body = node.body(base)
    assert body.announced == {"edge-a.3f9c2b1d": 2, "edge-b.2": 7}
    iu0, iu1 = body.ius["n1-iu0"], body.ius["n1-iu1"]
    assert iu0.score == pytest.approx(0.5 + 0.4) and iu0.components["announced_s"] == pytest.approx(0.4)
    assert iu1.score == pytest.approx(0.2 + 0.2) and iu1.components["announced_s"] == pytest.approx(0.2)
    assert iu0.components["queue_s"] == 0.1  # the scrape's terms as they were
    assert base.ius["n1-iu0"].score == 0.5 and base.announced is None  # the base is not changed
    assert (body.node, body.ts, body.seq) == (base.node, base.ts, base.seq)
    # at the next scrape what they added ends; the acknowledgements stay
    for prompts in node.prompts.values():
        prompts.reconcile(1, now=NOW + 0.1, prefill_tps=10_000.0, request_cost_s=0.1)
    after = node.body(base_body(n1_iu0=0.9, n1_iu1=0.4))
    assert after.ius["n1-iu0"].score == 0.9 and "announced_s" not in after.ius["n1-iu0"].components
    assert after.announced == {"edge-a.3f9c2b1d": 2, "edge-b.2": 7}


def test_an_iu_with_no_score_is_untouched():
    node = scraped_node()
    node.receive_json(batch(item(1, tokens=5_000), item(2, tokens=5_000, iu="n1-iu1")), NOW)
    base = base_body(n1_iu0=None, n1_iu1=0.0)
    body = node.body(base)
    assert body.ius["n1-iu0"] is base.ius["n1-iu0"]
    assert body.ius["n1-iu1"].score == pytest.approx(0.5)


def test_body_never_acknowledges_an_announcement_whose_addition_it_does_not_hold():
    """receive() acknowledges and adds under one lock, and body() reads both under it: a body built while a
    batch is being counted has neither or both."""
    node = scraped_node()
    prompts = node.prompts["n1-iu0"]
    entered, release = threading.Event(), threading.Event()
    original = prompts.announce

    def slow_announce(tokens, sent):
        entered.set()
        assert release.wait(5)
        original(tokens, sent)

    prompts.announce = slow_announce
    receiver = threading.Thread(target=node.receive_json, args=(batch(item(1, tokens=5_000)), NOW))
    receiver.start()
    assert entered.wait(5)
    bodies: list[ScoreBody] = []
    reader = threading.Thread(target=lambda: bodies.append(node.body(base_body(n1_iu0=0.1, n1_iu1=0.1))))
    reader.start()
    reader.join(0.2)
    release.set()
    receiver.join(5)
    reader.join(5)
    (body,) = bodies
    acked = body.announced.get("edge-a.3f9c2b1d", 0)
    added = body.ius["n1-iu0"].components.get("announced_s", 0.0)
    assert (acked, added) in ((0, 0.0), (1, pytest.approx(0.5)))
    assert (acked, added) == (1, pytest.approx(0.5))  # the reader waited for the lock


def test_body_and_receive_agree_under_concurrency():
    """Many batches counted while bodies are built: each body's acknowledgement and addition agree."""
    node = scraped_node(rate_per_s=1e9, burst=1e9)
    base = base_body(n1_iu0=0.0, n1_iu1=0.0)
    done = threading.Event()

    def send():
        for seq in range(1, 3_001):
            node.receive_json(batch(item(seq, tokens=100)), NOW)
        done.set()

    sender = threading.Thread(target=send)
    sender.start()
    seen = []
    while not done.is_set():
        body = node.body(base)
        seen.append((body.announced.get("edge-a.3f9c2b1d", 0), body.ius["n1-iu0"].components.get("announced_s", 0.0)))
    sender.join()
    for acked, added in seen:
        assert added == pytest.approx(acked * 0.01, abs=1e-3)
