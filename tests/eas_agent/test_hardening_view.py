"""Review H2 (the security review's findings, tests/faults/README.md): the edge reader validates what it reads under the score
prefix; one bad body never kills the watch, and a spoofed body cannot steer traffic."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import pytest

from consul_io.client import ConsulUnavailable
from eas_wire.scorebody import MAX_HEARTBEAT_S, BodyError, ScoreBody
from edge.pool import AnomalyDetector, EdgeLedger, PoolView, pick
from edge.pool.view import TS_TOLERANCE_S
from edge.pool.watch import ConsulWatcher

from .test_pick import Clock, health_entry, kv_entry


def raw_entry(node, body, key_node=None):
    return {"Key": f"clusterctl/eas/dc1/{key_node or node}", "Value": json.dumps(body).encode()}


def good_body(node="n2", ts=100.0, score=1.0, iu=None):
    return json.loads(kv_entry(node, {iu or f"{node}-iu0": (score, "passing", 1.0, 1)}, ts)["Value"])


BAD_BODIES = [
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": 5}},
    {"node": "n2", "ts": "soon", "ius": {}},
    {"node": "n2", "ts": 100.0, "clock_offset_s": "x", "ius": {}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": "0.1", "status": "passing"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": -1e9, "status": "passing"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": 1.0, "status": "sunny"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": 1.0, "status": "passing", "components": []}}},
    {"node": "n2", "ts": 100.0, "heartbeat_s": "2", "ius": {}},
    {"node": "n2", "ts": 100.0, "ius": []},
    {"node": ["n2"], "ts": 100.0, "ius": {}},
    [1, 2],
    "a string",
    None,
]


def fresh_view(ius=("n1-iu0", "n2-iu0")):
    view = PoolView(detector=AnomalyDetector(), clock=Clock(100.0))
    view.apply_health([health_entry(iu) for iu in ius])
    return view


@pytest.mark.parametrize("bad", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_body_next_to_a_good_one_is_skipped_and_counted(bad):
    view = fresh_view()
    good = kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)
    view.apply_kv([good, raw_entry("n2", bad)])  # before: AttributeError/ValueError/TypeError out of here
    snap = view.snapshot()
    assert [e.iu_id for e in snap.scored] == ["n1-iu0"]
    assert view.rejected_bodies + view.rejected_ius >= 1 and view.problems
    view.apply_health([health_entry("n1-iu0"), health_entry("n2-iu0")])  # and later rebuilds still work
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]


def test_undecodable_and_huge_values_are_skipped():
    view = fresh_view()
    view.apply_kv(
        [
            {"Key": "clusterctl/eas/dc1/n2", "Value": b"\xff\xfe{"},
            {"Key": "clusterctl/eas/dc1/n3", "Value": b"[" * (2 << 20)},
            {"Key": "clusterctl/eas/dc1/n4", "Value": b"[" * 100_000},  # under the cap, too deep for json
            "not a dict",
            kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0),
        ]
    )
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"] and view.rejected_bodies == 4


def test_body_must_name_the_node_of_its_key():
    view = fresh_view()
    view.apply_kv([raw_entry("n1", good_body("n1", score=0.0, iu="n1-iu0"), key_node="n2")])
    assert view.snapshot().scored == () and "names node 'n1'" in view.problems[-1]


def test_ius_must_belong_to_the_bodys_node_in_the_catalog():
    """n2 writes its own key but claims n1's IU with a winning score: dropped, n1's own entry kept."""
    view = fresh_view()
    view.apply_kv(
        [
            kv_entry("n1", {"n1-iu0": (5.0, "passing", 1.0, 1)}, 100.0),
            kv_entry("n2", {"n2-iu0": (5.0, "passing", 1.0, 1), "n1-iu0": (0.0, "passing", 1.0, 1)}, 100.0),
        ]
    )
    by_id = view.snapshot().by_id()
    assert by_id["n1-iu0"].node == "n1" and by_id["n1-iu0"].score == 5.0
    assert "belongs to node n1" in view.problems[-1]


def test_far_future_timestamp_is_clamped_and_goes_stale():
    """Review repro: ts = now + 1e9, score -1e9 won 1000/1000 picks an hour later. Score -1e9 is now rejected
    by the schema; with a legal score 0 the ts is clamped, so the body goes stale like an honest one."""
    clock = Clock(100.0)
    view = PoolView(detector=AnomalyDetector(), clock=clock)
    view.apply_health([health_entry("n1-iu0"), health_entry("n2-iu0")])
    spoof = good_body("n2", ts=100.0 + 1e9, score=0.0)
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0), raw_entry("n2", spoof)])
    entry = view.snapshot().by_id()["n2-iu0"]
    assert entry.ts <= 100.0 + TS_TOLERANCE_S
    # an hour later, with the same bodies re-listed (any other key's write re-lists the prefix)
    clock.t = 3700.0
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 3700.0), raw_entry("n2", spoof)])
    rng, ledger = random.Random(1), EdgeLedger()
    counts = Counter(pick(view.snapshot(), ledger, 3700.5, rng).iu_id for _ in range(1000))
    assert counts["n2-iu0"] == 0 and counts["n1-iu0"] == 1000


def test_heartbeat_is_bounded():
    body, problems = ScoreBody.from_json({**good_body(), "heartbeat_s": 1e9})
    assert body.heartbeat_s == MAX_HEARTBEAT_S and not problems
    with pytest.raises(BodyError, match="clock_offset_s"):
        ScoreBody.from_json({**good_body(), "clock_offset_s": -1e9})


def test_schema_round_trips_what_the_publisher_writes():
    body, problems = ScoreBody.from_json(good_body())
    assert not problems and ScoreBody.from_json(json.loads(body.dumps()))[0] == body


class FlakyIO:
    """kv_list: one listing with a bad body, then garbage of other kinds, then good listings."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def kv_list(self, prefix, index=None, wait_s=None):
        with self.lock:
            self.calls += 1
            n = self.calls
        time.sleep(0.01)
        if n == 1:
            return 5, [raw_entry("n2", {"ius": {"x": 5}})]
        if n == 2:
            raise RuntimeError("bug in the client")
        if n == 3:
            return "seven", None
        if n == 4:
            raise ConsulUnavailable("down")
        return 10 + n, [kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)]

    def health_service(self, index=None, wait_s=None):
        time.sleep(0.05)
        return 1, [health_entry("n1-iu0")]


def test_watch_threads_survive_any_exception():
    view = PoolView(detector=AnomalyDetector(), clock=Clock(100.0))
    io = FlakyIO()
    watcher = ConsulWatcher(view, io, min_interval_s=0.01, max_backoff_s=0.05).start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not view.snapshot().scored:
            time.sleep(0.02)
        assert all(t.is_alive() for t in watcher.threads)  # before: the kv thread died on the first body
        assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"] and io.calls > 4
    finally:
        watcher.stop()


def test_scores_poller_is_not_held_by_a_dripping_agent():
    """Review M4 (related): ScoresPoller polled agents one after another with a per-read timeout."""
    from eas_agent.http import AgentHttpServer, AgentMetrics
    from edge.pool import ScoresPoller

    from .test_hardening_agent import DripServer

    good = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    good.set_scores(ScoreBody.from_json(good_body("n2", ts=100.0))[0])
    good.start()
    drip = DripServer(every_s=0.1, header_drip=True)
    view = fresh_view()
    poller = ScoresPoller(view, [f"127.0.0.1:{drip.port}", good.address], timeout_s=0.2)
    try:
        started = time.monotonic()
        poller.poll_once()
        assert time.monotonic() - started < 1.0  # before: the drip held the poll for its whole body
        assert [e.iu_id for e in view.snapshot().scored] == ["n2-iu0"] and poller.errors == 1
    finally:
        poller.stop()
        drip.close()
        good.stop()


def test_a_query_that_fails_after_stop_is_not_reported(caplog):
    """The demo's last line was "consul watch failed: GET health/service/vllm-iu: ChunkedEncodingError ..."
    in 2 of 2 runs (operator review M3): a blocking query still open when Consul was stopped after the
    watcher's stop(). A failure once stop() was called is the shutdown, not news."""
    import logging

    in_query, release = threading.Event(), threading.Event()

    class ShutdownIO:
        def kv_list(self, prefix, index=None, wait_s=None):
            if index is None:
                return 1, []
            in_query.set()
            release.wait(5)
            raise ConsulUnavailable("GET kv: Connection broken: IncompleteRead(0 bytes read)")

        def health_service(self, index=None, wait_s=None):
            return self.kv_list("", index, wait_s)

    view = PoolView(detector=AnomalyDetector(), clock=Clock(100.0))
    watcher = ConsulWatcher(view, ShutdownIO(), min_interval_s=0.01).start()
    assert in_query.wait(5)
    with caplog.at_level(logging.WARNING, logger="edge.pool"):
        watcher.stop()
        release.set()  # Consul goes away under the open queries
        for thread in watcher.threads:
            thread.join(5)
    assert not any(t.is_alive() for t in watcher.threads)
    assert "consul watch failed" not in caplog.text


# JSON reads "1" followed by 400 zeros as a Python int that no float can hold: math.isfinite(), float() and
# comparisons with floats raise OverflowError on it. Any node can write it (every agent shares one token).
HUGE = 10**400
HUGE_PLACES = {
    "ts": lambda body: body.update(ts=HUGE),
    "heartbeat_s": lambda body: body.update(heartbeat_s=HUGE),
    "clock_offset_s": lambda body: body.update(clock_offset_s=HUGE),
    "score": lambda body: body["ius"]["n2-iu0"].update(score=HUGE),
    "component": lambda body: body["ius"]["n2-iu0"]["components"].update(request_cost_s=HUGE),
    "negative score": lambda body: body["ius"]["n2-iu0"].update(score=-HUGE),
}


def huge_body(place: str) -> dict:
    body = good_body("n2", ts=100.0)
    HUGE_PLACES[place](body)
    return body


@pytest.mark.parametrize(("place", "reason"), [("ts", "ts_invalid"), ("heartbeat_s", "heartbeat_invalid"),
                                             ("clock_offset_s", "clock_offset_invalid")])
def test_a_number_no_float_holds_rejects_the_body(place, reason):
    with pytest.raises(BodyError, match=place) as info:  # before: OverflowError out of from_json
        ScoreBody.from_json(json.loads(json.dumps(huge_body(place))))
    assert info.value.reason == reason


@pytest.mark.parametrize("place", ["score", "negative score"])
def test_a_score_no_float_holds_is_not_finite(place):
    counts: Counter = Counter()
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body(place))), counts=counts)
    assert "n2-iu0" not in body.ius and counts == Counter(score_not_finite=1) and "n2-iu0" in problems[0]
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body(place))), blank_bad_scores=True)
    assert body.ius["n2-iu0"].score is None and "score_not_finite" in body.ius["n2-iu0"].reason and not problems


def test_a_component_no_float_holds_is_dropped():
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body("component"))))
    assert not problems and "request_cost_s" not in body.ius["n2-iu0"].components
    assert body.ius["n2-iu0"].score == 1.0


@pytest.mark.parametrize("place", sorted(HUGE_PLACES))
def test_a_good_body_next_to_a_huge_number_still_updates(place):
    view = fresh_view()
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    # before: OverflowError out of apply_kv, the view kept n1's old score for as long as n2's body stayed
    view.apply_kv([kv_entry("n1", {"n1-iu0": (2.0, "passing", 1.0, 1)}, 100.0), raw_entry("n2", huge_body(place))])
    by_id = view.snapshot().by_id()
    assert by_id["n1-iu0"].score == 2.0
    n2 = by_id.get("n2-iu0")
    if place == "component":  # the one number is dropped, the rest of the body is fine
        assert n2.score == 1.0 and "request_cost_s" not in n2.components
    else:
        assert n2 is None or n2.score is None  # the body (or its IU) rejected: registered, never scored
        assert view.rejected_bodies + view.rejected_ius == 1 and view.problems


def test_one_body_the_reader_cannot_check_never_stops_the_others(monkeypatch):
    """Whatever checking one body raises (a bug in the schema included), that body is skipped and counted."""
    real = ScoreBody.from_json.__func__

    def from_json(cls, obj, **kwargs):
        if isinstance(obj, dict) and obj.get("node") == "n2":
            raise ArithmeticError("a bug in the reader")
        return real(cls, obj, **kwargs)

    monkeypatch.setattr(ScoreBody, "from_json", classmethod(from_json))
    view = fresh_view()
    view.apply_kv([raw_entry("n2", good_body("n2")), kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]  # before: ArithmeticError out of apply_kv
    assert view.rejected_bodies == 1 and view.ignored["reader_error"] == 1 and "a bug in the reader" in view.problems[-1]
    view.apply_polled([good_body("n2"), good_body("n1", ts=101.0, iu="n1-iu0", score=3.0)])
    assert view.snapshot().by_id()["n1-iu0"].score == 3.0 and view.rejected_bodies == 2


class CannedAgent:
    """A ScoresPoller fetcher answering one canned text (or raising)."""

    def __init__(self, answer):
        self.answer = answer

    def __call__(self):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def abort(self):
        pass

    def close(self):
        pass


def test_one_agents_answer_never_costs_the_others_the_poll_round():
    from edge.pool import ScoresPoller

    view = fresh_view(("n1-iu0", "n2-iu0", "n3-iu0"))
    poller = ScoresPoller(view, ["a", "b", "c", "d"], timeout_s=1.0)
    poller.fetchers = [
        CannedAgent(json.dumps(huge_body("ts"))),
        CannedAgent(json.dumps(good_body("n1", iu="n1-iu0", score=0.5))),
        CannedAgent(RuntimeError("a bug in the fetcher")),
        CannedAgent("[" * 100_000 + "]" * 100_000),
    ]
    try:
        poller.poll_once()  # before: OverflowError (or the RuntimeError) out of poll_once, n1's body lost
        assert {e.iu_id: e.score for e in view.snapshot().scored} == {"n1-iu0": 0.5}
        assert poller.errors == 2 and view.rejected_bodies == 1
    finally:
        poller.stop()


def test_a_kv_value_that_is_no_string_is_skipped():
    view = fresh_view()
    view.apply_kv([{"Key": "clusterctl/eas/dc1/n2", "Value": 5}, kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]  # before: TypeError (len of an int) out of apply_kv
    assert view.rejected_bodies == 1 and view.ignored["reader_error"] == 1
