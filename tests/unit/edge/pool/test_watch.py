"""The pool's readers of Consul and of the agents (ConsulWatcher, ScoresPoller): a failing or dripping source
never stops a watch thread or costs the other agents their poll round."""

from __future__ import annotations

import json
import threading
import time

import pytest

from consul_io.client import ConsulUnavailable
from eas_wire.scorebody import ScoreBody
from edge.pool import AnomalyDetector, PoolView
from edge.pool.watch import ConsulWatcher
from tests.unit.edge.pool.test_view import fresh_view, good_body, huge_body, raw_entry

from .test_pick import Clock, health_entry, kv_entry

pytestmark = pytest.mark.unit


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
        assert all(t.is_alive() for t in watcher.threads)  # guards against: the kv thread died on the first body
        assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"] and io.calls > 4
    finally:
        watcher.stop()


def test_scores_poller_is_not_held_by_a_dripping_agent():
    """ScoresPoller polled agents one after another with a per-read timeout."""
    from eas_agent.http import AgentHttpServer, AgentMetrics
    from edge.pool import ScoresPoller
    from tests.helpers.hostile import DripServer

    good = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    good.set_scores(ScoreBody.from_json(good_body("n2", ts=100.0))[0])
    good.start()
    drip = DripServer(every_s=0.1, header_drip=True)
    view = fresh_view()
    poller = ScoresPoller(view, [f"127.0.0.1:{drip.port}", good.address], timeout_s=0.2)
    try:
        started = time.monotonic()
        poller.poll_once()
        assert time.monotonic() - started < 1.0  # guards against: the drip held the poll for its whole body
        assert [e.iu_id for e in view.snapshot().scored] == ["n2-iu0"] and poller.errors == 1
    finally:
        poller.stop()
        drip.close()
        good.stop()


def test_a_query_that_fails_after_stop_is_not_reported(caplog):
    """The demo's last line was "consul watch failed: GET health/service/vllm-iu: ChunkedEncodingError ..."
    in 2 of 2 runs: a blocking query still open when Consul was stopped after the
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
        poller.poll_once()  # guards against: OverflowError (or the RuntimeError) out of poll_once, n1's body lost
        assert {e.iu_id: e.score for e in view.snapshot().scored} == {"n1-iu0": 0.5}
        assert poller.errors == 2 and view.rejected_bodies == 1
    finally:
        poller.stop()
