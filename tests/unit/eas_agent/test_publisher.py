"""Publisher in simulated time against the in-memory store: levels, hysteresis, heartbeat, CAS, backoff."""

from __future__ import annotations

import json
import random

import pytest

from eas_agent.publisher import Backoff, Publisher, Quantizer
from eas_agent.score import ScoreResult
from sim.memstore import MemoryStore
from tests.helpers.hostile import GOOD, strict_json
from tests.unit.eas_agent.test_agent import agent_with

pytestmark = pytest.mark.unit

IUS = ["n1-iu0", "n1-iu1"]


def results(s0, s1=0.5, status0="passing"):
    return {
        "n1-iu0": ScoreResult(s0, status0, "", {"queue_s": s0}),
        "n1-iu1": ScoreResult(s1, "passing", "", {}),
    }


def make(store=None, **kw):
    store = store or MemoryStore()
    defaults = dict(
        key="clusterctl/eas/dc1/n1",
        node="n1",
        rack="r1",
        iu_ids=IUS,
        heartbeat_s=2.0,
        min_write_interval_s=0.5,
        rng=random.Random(1),
    )
    return store, Publisher(store, **{**defaults, **kw})


def test_quantizer_hysteresis():
    q = Quantizer(base=0.05, ratio=1.25, hysteresis=0.3)
    level = q.level(None, 1.0)
    assert q.level(level, 1.0 * 1.2) == level  # within 0.8 of a level: unchanged
    assert q.level(level, 1.0 * 1.25**2) != level
    assert q.level(level, None) is None


def test_heartbeat_and_level_changes_drive_writes():
    store, pub = make(urgent_rise_s=None)  # every rise waits for the interval here (urgent rises: below)
    assert pub.step(0.0, results(1.0)) is True  # first write
    assert pub.step(0.2, results(1.02)) is False  # same level
    assert pub.step(1.0, results(3.0)) is True  # crossed levels
    assert pub.step(1.2, results(6.0)) is False  # crossed again but inside min_write_interval: deferred
    assert pub.step(1.6, results(6.0)) is True
    assert pub.step(3.2, results(6.0)) is False
    assert pub.step(3.4, results(6.0)) is False
    assert pub.step(3.6, results(6.0)) is True  # heartbeat: written age never exceeds 2 s
    assert pub.stats.write_reasons == {"first": 1, "level": 2, "heartbeat": 1} and pub.stats.deferred == 1
    body = json.loads(store.kv["clusterctl/eas/dc1/n1"][1])
    assert body["seq"] == 4 and body["ts"] == 3.6 and body["ius"]["n1-iu0"]["score"] == 6.0
    assert body["heartbeat_s"] == 2.0 and "clock_offset_s" in body and body["rack"] == "r1"


def test_status_transition_is_written_at_once_with_its_reason():
    """The body is the agent's only verdict (it keeps no TTL checks), so a status change is written at once."""
    store, pub = make()
    pub.step(0.0, results(1.0))
    pub.step(
        0.6,
        {
            "n1-iu0": ScoreResult(None, "warning", "missing vllm:num_requests_waiting"),
            "n1-iu1": ScoreResult(0.5, "passing", ""),
        },
    )
    iu = json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]["n1-iu0"]
    assert (iu["score"], iu["status"], iu["reason"]) == (None, "warning", "missing vllm:num_requests_waiting")
    assert pub.stats.write_reasons == {"first": 1, "status": 1}


def test_publishing_is_kv_writes_only():
    """Between heartbeats an unchanged state costs no Consul request at all."""
    store, pub = make()
    pub.step(0.0, results(1.0))
    writes = store.writes
    for i in range(1, 9):  # 1.6 s of cycles, under the 2 s heartbeat
        assert pub.step(i * 0.2, results(1.0)) is False
    assert store.writes == writes


class CountingStore(MemoryStore):
    """Records each KV call: one request to Consul each."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def kv_read(self, key):
        self.calls.append("read")
        return super().kv_read(key)

    def kv_cas_write(self, key, value, cas):
        self.calls.append("cas")
        return super().kv_cas_write(key, value, cas)


def test_a_write_is_one_request_after_the_first():
    """The check-and-set answers the entry's new index, so no read follows a write: half the KV requests per
    write (each a GET the servers answer, at 0.7-0.9 writes per node per second). Guards against: read, cas, read for
    the first write and cas, read for each after it."""
    store, pub = make(store=CountingStore())
    for t in (0.0, 1.0, 2.0, 3.0):
        assert pub.step(t, results(1.0 + t)) is True
    assert store.calls == ["read", "cas", "cas", "cas", "cas"]
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["seq"] == 4


def test_cas_conflict_rereads_index():
    store, pub = make()
    pub.step(0.0, results(1.0))
    store.kv_cas_write(
        "clusterctl/eas/dc1/n1", "{}", store.kv_read("clusterctl/eas/dc1/n1")[0]
    )  # another writer
    assert pub.step(2.5, results(1.0)) is True and pub.stats.cas_conflicts == 1


def test_outage_backs_off_with_jitter_then_one_catch_up_write():
    store, pub = make(backoff=Backoff(base_s=0.25, cap_s=2.0))
    pub.step(0.0, results(1.0))
    store.available = False
    attempts_before = pub.stats.errors
    t = 0.2
    while t < 10.0:  # 10 s of outage at 5 Hz
        pub.step(t, results(1.0 + t))
        t = round(t + 0.2, 1)
    attempts = pub.stats.errors - attempts_before
    assert 5 <= attempts <= 12  # not 49 attempts: backoff (0.25, 0.5, 1, 2, 2, ...) with jitter
    store.available = True
    writes_before = store.writes
    while not pub.step(t, results(11.0)):
        t = round(t + 0.2, 1)
    assert store.writes == writes_before + 1 and pub.stats.write_reasons["first"] == 2
    assert pub.step(t + 0.2, results(11.0)) is False  # caught up: nothing more to write
    body = json.loads(store.kv["clusterctl/eas/dc1/n1"][1])
    assert body["seq"] == 2 and body["ius"]["n1-iu0"]["score"] == 11.0  # no gap in seq, latest state


def test_stop_marks_everything_critical():
    store, pub = make()
    pub.step(0.0, results(1.0))
    pub.stop(0.5, results(1.0))
    body = json.loads(store.kv["clusterctl/eas/dc1/n1"][1])
    assert {(iu["status"], iu["reason"]) for iu in body["ius"].values()} == {("critical", "agent stopping")}


def test_nothing_is_published_after_stop():
    store, pub = make()
    pub.step(0.0, results(1.0))
    pub.stop(0.5)
    assert pub.step(3.0, results(9.0)) is False  # a late cycle from the publishing thread changes nothing
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]["n1-iu0"]["reason"] == "agent stopping"


class LosesAnswerAfterPut(MemoryStore):
    """The PUT reaches the store but the agent never hears back (Consul stopped right after applying it)."""

    def __init__(self):
        super().__init__()
        self.lose_next = False

    def kv_cas_write(self, key, value, cas):
        ok = super().kv_cas_write(key, value, cas)
        if self.lose_next:
            self.lose_next = False
            from consul_io.client import ConsulUnavailable

            raise ConsulUnavailable("connection reset")
        return ok


def test_sequence_numbers_are_never_reused_when_an_answer_is_lost():
    store, pub = make(store=LosesAnswerAfterPut(), backoff=Backoff(base_s=0.1, cap_s=0.1))
    pub.step(0.0, results(1.0))
    store.lose_next = True
    assert pub.step(1.0, results(5.0)) is False  # applied, but the agent saw an error
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["seq"] == 2
    assert pub.step(1.2, results(5.0)) is True  # catch-up write
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["seq"] == 3 and pub.seq == 3


def test_restarted_agent_continues_the_sequence():
    store, pub = make()
    for t in (0.0, 2.0, 4.0):
        pub.step(t, results(1.0))
    _, again = make(store=store)
    again.step(5.0, results(1.0))
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["seq"] == 4


def test_quantizer_min_change_keeps_a_level_near_zero():
    # an idle-ish IU's drain flips between 0 and one short prefill in flight: 4 geometric levels apart at
    # base 0.05, one write per flip before min_change
    q = Quantizer(base=0.05, ratio=1.25, hysteresis=0.3, min_change=0.1)
    level = q.level(None, 0.0)
    assert q.level(level, 0.07) == level and q.level(level, 0.1) == level
    assert q.level(level, 0.25) != level  # a real change is still written
    assert q.value(q.level(None, 2.0)) == pytest.approx(2.0, rel=0.15)
    assert Quantizer(base=0.05).level(0, 0.07) != 0  # without it: a new level


def test_drain_publisher_ignores_flips_of_one_short_prefill():
    store, pub = make()
    assert pub.step(0.0, results(0.0)) is True
    writes = [pub.step(0.6 * k, results(0.07 if k % 2 else 0.0)) for k in range(1, 4)]
    assert writes == [False, False, False]


def test_an_urgent_rise_is_written_inside_the_interval_a_small_change_waits():
    store, pub = make(profile="drain", min_write_interval_s=1.0)
    assert pub.urgent_rise_s == 0.5 and pub.step(0.0, results(0.0)) is True
    assert pub.step(0.4, results(0.3)) is False  # a level, not urgent: waits for the interval
    assert pub.step(0.6, results(1.2)) is True  # rose 1.2 s above the written 0.0: at once
    assert pub.stats.write_reasons == {"first": 1, "rise": 1} and pub.stats.deferred == 1
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]["n1-iu0"]["score"] == 1.2
    assert pub.step(0.8, results(1.5)) is False  # measured from the written 1.2: not urgent, inside 1 s
    assert pub.step(1.0, results(0.3)) is False  # a fall is never urgent
    assert pub.step(1.6, results(0.3)) is False  # interval passed, but 1.52 tokens: one is kept for a rise
    assert pub.step(2.2, results(0.3)) is True  # 2 tokens again


def test_the_token_bucket_bounds_writes_however_often_scores_rise():
    store, pub = make(profile="drain", min_write_interval_s=1.0)
    written = []
    for k in range(600):  # 120 s of 200 ms cycles, the score jumping 0 -> 3 s -> 0 ...: every other one urgent
        if pub.step(0.2 * k, results(3.0 * (k % 2))):
            written.append(0.2 * k)
    assert len(written) <= pub.write_burst + 1 + 0.95 * 120  # the bucket's bound
    assert 0.8 < len(written) / 120 <= 1.0  # within the budget, and most of it used
    for start in range(0, 110, 5):  # any 10 s window
        assert sum(start <= t < start + 10 for t in written) <= 2 + 1 + 0.95 * 10


def test_a_level_change_leaves_a_token_for_the_next_urgent_rise():
    store, pub = make(profile="drain", min_write_interval_s=0.2, write_rate_per_s=0.5)
    assert pub.step(0.0, results(0.0)) is True  # tokens 2 -> 1
    assert pub.step(0.4, results(0.3)) is False  # a level change: would leave none for a rise
    assert pub.step(0.6, results(2.0)) is True  # the rise gets the kept token
    assert pub.step(0.8, results(4.0)) is False  # urgent, but the bucket is empty (0.1 tokens)
    assert pub.step(2.8, results(4.0)) is True  # 1.1 tokens: written
    with pytest.raises(ValueError, match="write_burst"):
        make(write_burst=0.5)


def test_seed_profile_has_no_urgent_rises():
    _store, pub = make(profile="seed")
    assert pub.urgent_rise_s is None and pub.reserve == 0.0


def test_publisher_never_writes_non_finite_json():
    from eas_agent.score import ScoreResult

    agent, store = agent_with([lambda: GOOD], serve_http=False)
    results = {"n1-iu0": ScoreResult(float("nan"), "passing", "", {"x": float("inf"), "y": 1.0})}
    agent.publisher.step(1000.0, results)  # guards against: json.dumps wrote NaN and Infinity into the KV
    body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
    assert body["ius"]["n1-iu0"]["score"] is None and body["ius"]["n1-iu0"]["components"] == {
        "x": None,
        "y": 1.0,
    }


def test_while_edges_stream_a_level_change_waits_for_the_heartbeat_rises_and_statuses_do_not():
    streamed = [True]
    store, pub = make(streamed=lambda: streamed[0])
    assert pub.step(0.0, results(1.0)) is True  # first write
    assert pub.step(1.0, results(1.3)) is False  # a level change: the streams carry it
    assert pub.step(1.8, results(1.3)) is False
    assert pub.step(2.0, results(1.3)) is True  # the heartbeat (the last cycle within 2 s) writes the state
    assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]["n1-iu0"]["score"] == 1.3
    assert pub.step(2.4, results(2.0)) is True  # an urgent rise (>= 0.5 s above the written score): at once
    assert pub.step(4.0, results(2.0, status0="warning")) is True  # a status change: at once
    assert pub.stats.write_reasons == {"first": 1, "heartbeat": 1, "rise": 1, "status": 1}
    streamed[0] = False  # no edge streams any more: the KV is every reader's source again
    assert pub.step(5.5, results(1.0, status0="warning")) is True
    assert pub.stats.write_reasons["level"] == 1
