"""edge/routing.py with the prefix index: a prompt's cached prefix costs no prefill on the IU holding it,
that IU is a candidate beside the sampled pair ("sticky") until its wait outgrows the prefill it saves
("until saturated"), also when the anomaly detector set it aside as busy, an IU reporting caching off gets no credit, a conversation's home is agreed, and a
prompt another edge sent is found through the agents' relay."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from eas_agent.announce import NodeAnnouncements
from eas_wire.announce import Announcement, batch_json
from eas_wire.scorebody import ScoreBody
from eas_wire.signing import edge_key_id
from edge.pool import AnomalyDetector, PoolView
from edge.pool.prefix import PrefixIndex, PromptPrefix, home_iu, relay_blocks
from edge.routing import Router

pytestmark = pytest.mark.unit

IUS = [f"n1-iu{i}" for i in range(8)]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def score_body(scores: dict[str, float], hit_rate=None) -> dict:
    components = {"request_cost_s": 0.1, "prefill_tps": 10_000.0, "tokens_total": 1000.0, "running": 1,
                  "waiting": 0}
    if hit_rate is not None:
        components["prefix_hit_rate"] = hit_rate
    body = {"node": "n1", "rack": "r1", "ts": 100.0, "heartbeat_s": 2.0, "seq": 1,
            "ius": {iu: {"score": s, "status": "passing", "reason": "", "components": components}
                    for iu, s in scores.items()}}
    return body


def view(scores: dict[str, float], hit_rate=None):
    return view_of(score_body(scores, hit_rate))


def view_of(body: dict):
    pool = PoolView(detector=AnomalyDetector(), clock=Clock(100.0))
    pool.apply_health([{"Node": {"Node": "n1"}, "Service": {"Service": "vllm-iu-n1", "ID": iu, "Address": "127.0.0.1", "Port": 8000,
                                    "Meta": {"node": "n1", "rack": "r"}},
                        "Checks": [{"CheckID": f"eas:{iu}", "Status": "passing"}]} for iu in body["ius"]])
    pool.apply_kv([{"Key": "clusterctl/eas/dc1/n1", "Value": json.dumps(body).encode()}])
    return pool


HASHES = tuple(range(1, 257))  # a 4,096-token prompt: 0.41 s of prefill at 10,000 tokens/s
PROMPT = PromptPrefix(HASHES)


def choices(pool, router_of, n=400, prefix=PROMPT):
    counts = Counter()
    for seed in range(n):
        router = router_of(seed)
        counts[router.choose(pool.snapshot(), 100.05, 4096, prefix=prefix).iu_id] += 1
    return counts


def router_with(seed, holder="n1-iu5"):
    router = Router(random.Random(seed), prefix=PrefixIndex())
    router.prefix.record(holder, HASHES)
    return router


def spread(step: float) -> dict[str, float]:
    """Scores 0, step, 2 step, ...: no IU is an outlier the anomaly detector would set aside."""
    return {iu: step * i for i, iu in enumerate(IUS)}


def test_the_iu_holding_the_prefix_wins_while_its_wait_is_below_the_saved_prefill():
    pool = view(spread(0.04))  # the holder, n1-iu5, is 0.2 s busier than n1-iu0; the hit saves 0.41 s
    assert choices(pool, router_with)["n1-iu5"] == 400
    decision = router_with(0).choose(pool.snapshot(), 100.05, 4096, prefix=PromptPrefix(HASHES))
    assert decision.iu_id == "n1-iu5" and decision.cached_tokens == 4095
    assert decision.cost_s == pytest.approx(1 / 10_000)  # only the uncached token costs prefill


def test_past_the_saved_prefill_the_load_decides():
    pool = view(spread(0.25))  # n1-iu7 holds the prefix but is 0.5 s or more busier than any pair's best
    counts = choices(pool, lambda seed: router_with(seed, "n1-iu7"))
    # only when the sampled pair is n1-iu6 and n1-iu7 itself (1 in 28): then 1.75 s beats 1.5 + 0.41 s
    assert counts["n1-iu7"] < 30


def test_without_the_index_the_prefix_changes_nothing():
    pool = view(spread(0.04))
    assert choices(pool, lambda seed: Router(random.Random(seed)))["n1-iu5"] < 60  # plain p2c: ~32 of 400


def test_an_iu_reporting_caching_off_gets_no_credit():
    pool = view(spread(0.04), hit_rate=-1.0)
    assert choices(pool, router_with)["n1-iu5"] < 60  # as plain p2c


def test_every_edge_sends_a_conversation_to_its_home_without_having_seen_it():
    key = 12345
    home = home_iu(key, IUS)
    pool = view(spread(0.04))  # the home is at most 0.28 s busier; its presumed 3,000 tokens save 0.3 s
    counts = choices(pool, lambda seed: Router(random.Random(seed), prefix=PrefixIndex()),
                     prefix=PromptPrefix(HASHES, key, 3000))
    assert counts[home] == 400


def test_sent_records_the_prompt_for_the_next_request():
    router = Router(random.Random(1), prefix=PrefixIndex())
    router.sent("n1-iu2", 100.0, 0.01, prefix_hashes=HASHES)
    assert router.prefix.match(HASHES)[0] == {"n1-iu2": 256}


def test_a_prompt_another_edge_sent_is_found_on_its_iu_through_the_agents_relay():
    """Edge A sends a prompt to n1-iu5 and announces it with its relay blocks; n1's agent relays them in its
    /scores body; edge B, which never saw the prompt, keeps the conversation's next turn on n1-iu5."""
    agent = NodeAnnouncements(IUS)
    sender = Router(random.Random(0), announcing=True, prefix=PrefixIndex())
    seq = sender.sent("n1-iu5", 100.0, 0.01, prefix_hashes=HASHES)
    batch = batch_json("edge-a.3f9c2b1d", [Announcement("n1-iu5", 4096, seq, 100.0, relay_blocks(HASHES))])
    agent.receive_json(json.loads(batch), 100.0, edge_key_id("edge-a.3f9c2b1d"))
    base = ScoreBody.from_json(score_body(spread(0.04)))[0]
    pushed = json.loads(agent.body(base).dumps())  # what edge B's feed decodes from the stream

    pool = view(spread(0.04))
    pool.apply_polled([pushed])
    placements = pool.relayed.take()
    assert placements == [("n1-iu5", relay_blocks(HASHES))]

    def edge_b(seed):
        router = Router(random.Random(seed), prefix=PrefixIndex())
        router.learn(placements)
        return router

    next_turn = PromptPrefix((*HASHES, 900, 901))
    assert choices(pool, edge_b, prefix=next_turn)["n1-iu5"] == 400
    assert choices(pool, lambda seed: Router(random.Random(seed), prefix=PrefixIndex()),
                   prefix=next_turn)["n1-iu5"] < 60  # what edge B did with only its own index: plain p2c


def test_the_home_is_not_presumed_where_the_index_knows_the_conversation_is():
    key = next(k for k in range(1, 100) if home_iu(k, IUS) == "n1-iu1")
    home = home_iu(key, IUS)
    pool = view(spread(0.04))  # the holder, n1-iu5, is 0.2 s busier than n1-iu0
    turn = PromptPrefix((*HASHES, 900, 901, 902), key, 4_400)  # the previous prompt and its ~300-token reply
    decision = router_with(0).choose(pool.snapshot(), 100.05, 4_700, prefix=turn)
    assert decision.iu_id == "n1-iu5" and decision.cached_tokens == 4_096
    unknown = Router(random.Random(0), prefix=PrefixIndex()).choose(pool.snapshot(), 100.05, 4_700, prefix=turn)
    # nothing known: the home is presumed for the choice, but charged the whole prompt (nothing backs the guess)
    assert unknown.iu_id == home and unknown.cached_tokens == 0


def holder_prefilling(score: float, admitted_tokens: int):
    """Seven IUs at 0-0.07 s and the holder, n1-iu5, at ``score`` with ``admitted_tokens`` of admitted prompt
    not yet prefilled (10,000 tokens/s): explained by them, the detector calls it busy (out of the draw)."""
    body = score_body(spread(0.01))
    holder = body["ius"]["n1-iu5"]
    holder["score"] = score
    holder["components"] = {**holder["components"], "admitted_prefill_tokens": admitted_tokens}
    return view_of(body)


def test_the_iu_holding_the_prefix_competes_on_its_cost_while_busy_with_a_long_prefill():
    pool = holder_prefilling(0.3, 3_000)  # 0.3 s of its own prefill ahead; the hit saves 0.41 s
    assert pool.snapshot().by_id()["n1-iu5"].anomaly == "busy"
    assert "n1-iu5" not in {e.iu_id for e in pool.snapshot().scored}  # out of the draw
    assert choices(pool, router_with)["n1-iu5"] == 400
    decision = router_with(0).choose(pool.snapshot(), 100.05, 4096, prefix=PROMPT)
    assert decision.mode == "affinity" and decision.expected_s == pytest.approx(0.3001)
    # past the saved prefill the load decides: 0.6 s ahead against at most 0.07 + 0.41 s elsewhere
    assert choices(holder_prefilling(0.6, 6_000), router_with)["n1-iu5"] == 0


def test_an_unexplained_high_score_or_this_edge_blocking_it_keeps_the_holder_out():
    outlier = holder_prefilling(0.3, 0)  # nothing admitted explains the score: an implausible reading
    assert outlier.snapshot().by_id()["n1-iu5"].anomaly == "high_outlier"
    assert choices(outlier, router_with)["n1-iu5"] == 0
    busy = holder_prefilling(0.3, 3_000)
    blocked = router_with(0).choose(busy.snapshot(), 100.05, 4096, exclude={"n1-iu5"}, prefix=PROMPT)
    assert blocked.iu_id != "n1-iu5"  # already tried for this request (or ejected, silent, at the cap)


def test_a_claim_to_the_prompt_relayed_for_an_iu_whose_score_is_unexplained_wins_it_no_traffic():
    """A node's agent relays that its IU holds the prompt (any node may claim any prompt it has seen hashed);
    while the IU's score is one its own admitted prefill does not explain, the claim is not weighed at all:
    the cost comparison would trust the very reading the detector rejected."""
    def claimed(seed):
        router = Router(random.Random(seed), prefix=PrefixIndex())
        router.learn([("n1-iu5", relay_blocks(HASHES))])
        return router

    assert choices(holder_prefilling(0.3, 0), claimed)["n1-iu5"] == 0
    assert choices(holder_prefilling(0.3, 3_000), claimed)["n1-iu5"] == 400  # explained: weighed on its cost


def test_past_a_holder_that_may_not_be_weighed_the_next_deepest_holder_that_may_is():
    pool = holder_prefilling(0.3, 0)  # n1-iu5 holds the whole prompt, its score unexplained

    def holders(seed):
        router = router_with(seed)
        router.prefix.record("n1-iu2", HASHES[:128])  # half the prompt: saves 0.2 s
        router.prefix.record("n1-iu6", HASHES[:64])  # a quarter: saves 0.1 s
        return router

    assert choices(pool, holders)["n1-iu2"] == 400
    blocked = Counter(holders(seed).choose(pool.snapshot(), 100.05, 4096, exclude={"n1-iu2"}, prefix=PROMPT).iu_id
                      for seed in range(400))
    assert blocked["n1-iu6"] == 400 and blocked["n1-iu5"] == 0
