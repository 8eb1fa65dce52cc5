"""The announce channel's edge side (edge/announce.py) against a fake node agent, and through the real proxy."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from eas_wire.announce import MAX_BATCH_ITEMS
from eas_wire.placed import blocks_to_json
from eas_wire.signing import (
    SIGNATURE_HEADER,
    SignatureError,
    generate_key_pair,
    key_id,
    load_private,
    parse_public_keys,
    verify,
)
from edge import announce as announce_module
from edge.announce import AnnounceSender
from edge.config import AnnounceConfig, EdgeConfig
from edge.feed import EdgeView
from edge.metrics import EdgeMetrics
from edge.pool import IUEntry
from edge.pool.prefix import prompt_prefix, relay_blocks
from edge.proxy import EdgeState
from edge.routing import Decision, Router
from edge.tokens import estimate_prompt_tokens, prompt_parts
from tests.helpers.edge import MODEL, Pool, body_of, metric, post, running_edge, wait_for

pytestmark = pytest.mark.integration

PRIVATE, PUBLIC = generate_key_pair()
KEY = load_private(PRIVATE)
EDGE = f"edge-test.{key_id(KEY.public_key())}.0badc0de"


def signed_by_key(post: dict) -> bool:
    """The POST's signature is this edge key's over its exact body."""
    try:
        verify(parse_public_keys(PUBLIC), post["signature"], post["raw"], time.time(), 5.0)
    except SignatureError:
        return False
    return True


class FakeAgent:
    """A node agent's ``POST /announce`` (and, for the proxy test, a blocking ``GET /scores`` whose body
    acknowledges what it was announced). ``status``: what it answers; ``delay``: before answering."""

    def __init__(self, node: str = "n0", status: int = 200, delay: float = 0.0):
        self.node, self.status, self.delay = node, status, delay
        self.posts: list[dict] = []  # {"at", "auth", "body"}
        self.answered: list[float] = []  # when each POST's answer left (monotonic)
        self.concurrent = self.max_concurrent = 0
        self.accepted: int | None = None  # what a 200 says it accepted (None: the whole batch)
        self.ignored_seqs: list[int] | None = None  # what a 200 says it did not count (None: not said)
        self.raw_answer: bytes | None = None  # a 200 with this body instead of the JSON answer
        self.acked: dict[str, int] = {}
        self.index = 1
        self.changed: asyncio.Event | None = None
        self.stopping: asyncio.Event | None = None
        self.scores: dict[str, float] = {}
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def _announce(self, request: web.Request) -> web.Response:
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            raw = await request.read()
            body = json.loads(raw)
            self.posts.append({"at": time.monotonic(), "signature": request.headers.get(SIGNATURE_HEADER),
                               "raw": raw, "body": body})
            if self.delay:
                try:
                    await asyncio.wait_for(self.stopping.wait(), self.delay)
                except TimeoutError:
                    pass
            if self.status != 200:
                return web.json_response({"error": "no"}, status=self.status)
            items = body["announcements"]
            if items:
                self.acked[body["edge"]] = items[-1]["seq"]
                self.index += 1
                self.changed.set()
            if self.raw_answer is not None:
                return web.Response(body=self.raw_answer, content_type="application/json")
            accepted = len(items) if self.accepted is None else self.accepted
            answer = {"accepted": accepted, "ignored": {}}
            if self.ignored_seqs is not None:
                answer["ignored_seqs"] = self.ignored_seqs
            return web.json_response(answer)
        finally:
            self.concurrent -= 1
            self.answered.append(time.monotonic())

    async def _scores(self, request: web.Request) -> web.Response:
        asked = request.query.get("index")
        if asked is not None and int(asked) == self.index:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), float(request.query.get("wait_s", "1")))
            except TimeoutError:
                pass
        body = {**body_of(self.node, self.scores), "announced": dict(self.acked)}
        return web.json_response(body, headers={"X-Eas-Index": str(self.index)})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> FakeAgent:
        self.changed, self.stopping = asyncio.Event(), asyncio.Event()
        app = web.Application()
        app.router.add_post("/announce", self._announce)
        app.router.add_get("/scores", self._scores)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port).start()
        self.address = f"{host}:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        self.stopping.set()  # a slow answer ends now
        await self.runner.cleanup()

    async def __aenter__(self) -> FakeAgent:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def seqs(self, i: int) -> list[int]:
        return [a["seq"] for a in self.posts[i]["body"]["announcements"]]


class Ledger:
    """The sender's view of EdgeLedger: what it unannounced, in order."""

    def __init__(self):
        self.unannounced: list[int] = []

    def unannounce(self, seqs) -> None:
        self.unannounced.extend(seqs)


def run(test, **sender_kwargs):
    """``test(sender, ledger, session)`` on a fresh loop with a sender on a fresh session."""

    async def main():
        ledger = Ledger()
        async with aiohttp.ClientSession() as session:
            kwargs = {"rng": random.Random(1), **sender_kwargs}
            sender = AnnounceSender(session, ledger, EDGE, KEY, **kwargs)
            try:
                await test(sender, ledger, session)
            finally:
                await sender.close(timeout_s=0.2)

    asyncio.run(main())


async def until(predicate, timeout: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def test_one_node_s_announcements_within_a_tick_leave_as_one_post_in_order_signed_with_the_edge_id():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as a, FakeAgent("n1") as b:
            started = time.monotonic()
            for seq in (1, 2, 3):
                sender.announce("n0", a.address, "n0-iu0", 100 * seq, seq, 1764780000.5 + seq)
            sender.announce("n1", b.address, "n1-iu1", 42, 4, 1764780000.9)
            sender.announce("n0", a.address, "n0-iu1", 7, 5, 1764780001.0)
            await asyncio.sleep(0)
            assert not a.posts and not b.posts  # nothing leaves before the tick
            await until(lambda: a.posts and b.posts, what="both batches")
            await asyncio.sleep(0.05)  # nothing more follows
            assert len(a.posts) == 1 and len(b.posts) == 1
            assert a.posts[0]["at"] - started < 0.2  # the next 10 ms tick, not a second later
            assert signed_by_key(a.posts[0])
            assert a.posts[0]["body"] == {"edge": EDGE, "announcements": [
                {"iu": "n0-iu0", "tokens": 100, "seq": 1, "sent": 1764780001.5},
                {"iu": "n0-iu0", "tokens": 200, "seq": 2, "sent": 1764780002.5},
                {"iu": "n0-iu0", "tokens": 300, "seq": 3, "sent": 1764780003.5},
                {"iu": "n0-iu1", "tokens": 7, "seq": 5, "sent": 1764780001.0}]}
            assert b.seqs(0) == [4]
            await until(lambda: sender.batches["sent"] == 2, what="both answers")
            assert sender.announcements == {"sent": 5} and not ledger.unannounced
            # the next announcement opens a new batch at the next tick
            sender.announce("n0", a.address, "n0-iu0", 9, 6, 1764780002.0)
            await until(lambda: len(a.posts) == 2, what="the second batch")
            assert a.seqs(1) == [6]

    run(test)


def test_announcements_a_few_ms_apart_leave_together_at_the_edge_s_next_tick():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            loop = asyncio.get_running_loop()
            # just after one of this edge's ticks: the next is ~50 ms away
            await asyncio.sleep(sender.batch_s - (loop.time() - sender.phase) % sender.batch_s + 0.002)
            sender.announce("n0", agent.address, "n0-iu0", 10, 1, time.time())
            tick = sender.nodes["n0"].timer.when()
            assert 0.03 < tick - loop.time() <= 0.05
            on_grid = (tick - sender.phase) % sender.batch_s  # the edge's ticks, not 50 ms after the first item
            assert min(on_grid, sender.batch_s - on_grid) < 1e-6
            for seq in (2, 3):
                await asyncio.sleep(0.008)
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
            await until(lambda: agent.posts, what="the batch")
            await asyncio.sleep(0.02)
            assert len(agent.posts) == 1 and agent.seqs(0) == [1, 2, 3]
            assert agent.posts[0]["at"] >= tick - 0.001

    run(test, batch_s=0.05)


def test_one_post_in_flight_per_node_the_next_batch_carries_what_queued_meanwhile():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0", delay=0.3) as slow:
            sender.announce("n0", slow.address, "n0-iu0", 10, 1, time.time())
            await until(lambda: slow.posts, what="the first POST")
            for seq in (2, 3, 4):
                sender.announce("n0", slow.address, "n0-iu0", 10, seq, time.time())
                await asyncio.sleep(0.03)  # several ticks pass while the first POST is in flight
            assert len(slow.posts) == 1
            await until(lambda: len(slow.posts) == 2, what="the second POST")
            assert slow.max_concurrent == 1
            assert slow.posts[1]["at"] >= slow.answered[0]  # sent after the first one's answer
            assert [slow.seqs(0), slow.seqs(1)] == [[1], [2, 3, 4]]
            await until(lambda: sender.batches["sent"] == 2, what="the second answer")
            assert not ledger.unannounced

    run(test, timeout_s=1.0)


def test_a_failing_agent_unannounces_the_batch_drops_during_backoff_and_recovers_after():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0", status=500) as agent:
            sender.announce("n0", agent.address, "n0-iu0", 10, 1, time.time())
            sender.announce("n0", agent.address, "n0-iu0", 10, 2, time.time())
            await until(lambda: sender.batches["failed"] == 1, what="the failed batch")
            assert ledger.unannounced == [1, 2]
            failed_at = time.monotonic()
            sender.announce("n0", agent.address, "n0-iu0", 10, 3, time.time())  # backing off: dropped at once
            assert ledger.unannounced == [1, 2, 3]
            await asyncio.sleep(0.05)
            assert len(agent.posts) == 1 and sender.announcements == {"dropped": 3}
            agent.status = 200
            await asyncio.sleep(0.4 - (time.monotonic() - failed_at))  # backoff 0.3 s * [0.75, 1.25]: over
            sender.announce("n0", agent.address, "n0-iu0", 10, 4, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the batch after the backoff")
            assert agent.seqs(1) == [4] and ledger.unannounced == [1, 2, 3]
            assert sender.announcements == {"dropped": 3, "sent": 1}

    run(test, backoff_s=0.3)


def test_unreachable_and_silent_agents_fail_their_batch():
    async def test(sender, ledger, _session):
        async with FakeAgent("n1", delay=2.0) as silent:
            closed = await FakeAgent("n0").start()
            refused = closed.address
            await closed.stop()  # nothing listens there any more: connection refused
            sender.announce("n0", refused, "n0-iu0", 10, 1, time.time())
            sender.announce("n1", silent.address, "n1-iu0", 10, 2, time.time())
            started = time.monotonic()
            await until(lambda: sender.batches["failed"] == 2, what="both failures")
            assert time.monotonic() - started < 1.0  # the silent one times out at timeout_s, not at 2 s
            assert sorted(ledger.unannounced) == [1, 2]

    run(test, timeout_s=0.3)


def test_queued_behind_a_batch_that_fails_are_dropped_as_a_batch():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0", status=503, delay=0.2) as agent:
            sender.announce("n0", agent.address, "n0-iu0", 10, 1, time.time())
            await until(lambda: agent.posts, what="the first POST")
            sender.announce("n0", agent.address, "n0-iu0", 10, 2, time.time())
            sender.announce("n0", agent.address, "n0-iu0", 10, 3, time.time())
            await until(lambda: sender.batches["failed"] == 1, what="the failure")
            assert ledger.unannounced == [1, 2, 3] and sender.batches == {"failed": 1, "dropped": 1}
            await asyncio.sleep(0.05)
            assert len(agent.posts) == 1

    run(test, backoff_s=5.0)


@pytest.mark.parametrize("status, state", [(401, "401: the agent does not hold this edge's public key"),
                                           (404, "404: the announce channel is off at that agent")])
def test_401_and_404_back_off_and_log_once_without_the_key(status, state, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="edge.announce")
    monkeypatch.setattr(announce_module, "LOG_INTERVAL_S", 0.0)  # each change logged: the state rule alone

    async def test(sender, ledger, _session):
        async with FakeAgent("n0", status=status) as agent:
            for seq in (1, 2, 3):
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
                await until(lambda n=seq: sender.batches["failed"] == len(agent.posts) == n, what="a failure")
                assert ledger.unannounced[-1] == seq
                sender.announce("n0", agent.address, "n0-iu0", 10, 100 + seq, time.time())  # backing off
                assert ledger.unannounced[-1] == 100 + seq
                await asyncio.sleep(0.15)  # the backoff (0.1 s * [0.75, 1.25]) ends
            assert ledger.unannounced == [1, 101, 2, 102, 3, 103]
            assert len(agent.posts) == 3
            warnings = [r.getMessage() for r in caplog.records if r.name == "edge.announce"]
            assert len(warnings) == 1 and state in warnings[0] and "n0" in warnings[0], warnings
            agent.status = 200
            sender.announce("n0", agent.address, "n0-iu0", 10, 4, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the recovery")
            lines = [r.getMessage() for r in caplog.records if r.name == "edge.announce"]
            assert len(lines) == 2 and "working again" in lines[1]
            assert PRIVATE not in caplog.text

    run(test, backoff_s=0.1)


def test_an_agent_that_accepts_part_of_a_batch_has_the_whole_batch_counted_by_time():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            agent.accepted = 1  # e.g. one of two rate-limited: which one is not said
            sender.announce("n0", agent.address, "n0-iu0", 10, 1, time.time())
            sender.announce("n0", agent.address, "n0-iu0", 10, 2, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the answer")
            assert ledger.unannounced == [1, 2] and sender.announcements == {"sent": 1, "dropped": 1}

    run(test)


@pytest.mark.parametrize("raw", [b"<html>ok</html>", b"[1]", b'{"accepted": "all"}', b'{"accepted": 9}'])
def test_a_200_whose_answer_cannot_be_read_has_the_whole_batch_counted_by_time(raw):
    """Guards against: an unreadable answer was taken as every announcement counted, which the node's next
    acknowledgement would then pass over even if the agent had counted none."""
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            agent.raw_answer = raw
            for seq in (1, 2):
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the answer")
            assert ledger.unannounced == [1, 2] and sender.announcements == {"sent": 0, "dropped": 2}

    run(test)


def test_an_agent_that_names_what_it_did_not_count_has_only_those_counted_by_time():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            agent.accepted, agent.ignored_seqs = 2, [2]  # e.g. the second rate-limited
            for seq in (1, 2, 3):
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the answer")
            assert ledger.unannounced == [2] and sender.announcements == {"sent": 2, "dropped": 1}

    run(test)


@pytest.mark.parametrize("ignored", [[], [7], [2, 3], "2"])
def test_an_answer_naming_the_wrong_ones_has_the_whole_batch_counted_by_time(ignored):
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            agent.accepted, agent.ignored_seqs = 2, ignored  # one not counted, but not said which (or nonsense)
            for seq in (1, 2, 3):
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the answer")
            assert ledger.unannounced == [1, 2, 3]

    run(test)


def test_a_batch_holds_at_most_max_batch_items_the_overflow_is_dropped():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0") as agent:
            for seq in range(1, MAX_BATCH_ITEMS + 4):
                sender.announce("n0", agent.address, "n0-iu0", 10, seq, time.time())
            await until(lambda: sender.batches["sent"] == 1, what="the batch")
            assert agent.seqs(0) == list(range(1, MAX_BATCH_ITEMS + 1))
            assert ledger.unannounced == [MAX_BATCH_ITEMS + 1, MAX_BATCH_ITEMS + 2, MAX_BATCH_ITEMS + 3]

    run(test)


def test_close_flushes_what_is_queued_and_waits_for_it_bounded():
    async def test(sender, ledger, _session):
        async with FakeAgent("n0", delay=0.1) as agent:
            quick = AnnounceSender(_session, ledger, EDGE, KEY, batch_s=1.0)
            quick.announce("n0", agent.address, "n0-iu0", 10, 100, time.time())  # its tick is up to 1 s away
            await quick.close(timeout_s=2.0)
            assert [agent.seqs(i) for i in range(len(agent.posts))] == [[100]] and quick.batches == {"sent": 1}
            agent.posts.clear()
            sender.announce("n0", agent.address, "n0-iu0", 10, 1, time.time())
            await until(lambda: agent.posts, what="the first POST")
            sender.announce("n0", agent.address, "n0-iu0", 10, 2, time.time())  # queued behind it
            sender.announce("n0", agent.address, "n0-iu0", 10, 3, time.time())
            await sender.close(timeout_s=2.0)
            assert [agent.seqs(i) for i in range(len(agent.posts))] == [[1], [2, 3]]
            assert sender.batches == {"sent": 2} and not ledger.unannounced
            sender.announce("n0", agent.address, "n0-iu0", 10, 4, time.time())  # closed: dropped
            assert ledger.unannounced == [4]
            # bounded: an agent that never answers does not hold the shutdown
            agent.delay = 5.0
            late = AnnounceSender(_session, ledger, EDGE, KEY, timeout_s=10.0)
            late.announce("n0", agent.address, "n0-iu0", 10, 5, time.time())
            started = time.monotonic()
            await late.close(timeout_s=0.2)
            assert time.monotonic() - started < 1.0 and ledger.unannounced == [4, 5]

    run(test)


def _state(sender=None, feed=None) -> EdgeState:
    config = EdgeConfig()
    state = EdgeState(config, EdgeView(), Router(random.Random(1), announcing=True), EdgeMetrics())
    state.announcer, state.feed = sender, feed
    return state


def _decision(address: str | None = "127.0.0.1") -> Decision:
    entry = IUEntry("n0-iu0", "n0", "r1", 0.1, "passing", "", time.time(), 2.0, "passing", address=address, port=8000)
    return Decision("n0-iu0", "p2c", entry)


def test_a_request_without_a_known_prompt_size_is_unannounced_not_sent():
    async def test(sender, _ledger, _session):
        state = _state(sender)
        ledger = state.router.ledger
        sender.ledger = ledger
        seq = state.router.sent("n0-iu0", time.time())
        assert seq == 1
        state.announce(_decision(), None, seq, time.time())
        assert ledger.unannounced == {1: None}
        seq = state.router.sent("n0-iu0", time.time())
        state.announce(_decision(address=None), 100, seq, time.time())  # nowhere to send it
        assert ledger.unannounced == {1: None, 2: None}
        await asyncio.sleep(0.05)
        assert not sender.nodes and sender.announcements == {}

    run(test)


def test_without_a_feed_task_the_announcement_goes_to_the_iu_s_address_at_the_push_port():
    async def test(sender, _ledger, _session):
        async with FakeAgent("n0") as agent:
            state = _state(sender)
            port = int(agent.address.rsplit(":", 1)[1])
            state.config = EdgeConfig(push=type(state.config.push)(agent_port=port))
            sender.ledger = state.router.ledger
            seq = state.router.sent("n0-iu0", time.time())
            state.announce(_decision("127.0.0.1"), 321, seq, 1764780000.0)
            await until(lambda: agent.posts, what="the POST")
            assert agent.posts[0]["body"]["announcements"] == [
                {"iu": "n0-iu0", "tokens": 321, "seq": 1, "sent": 1764780000.0}]

    run(test)


# -- through the real proxy ---------------------------------------------------------------------------------

class AgentsThread:
    """Fake agents (announce + blocking /scores) on their own event loop thread, at the pool's node addresses."""

    def __init__(self, pool: Pool):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-agents", daemon=True)
        self.thread.start()
        self.agents: dict[str, FakeAgent] = {}
        for node, address in pool.nodes.items():
            agent = FakeAgent(node)
            agent.scores = {iu: 0.01 for iu in pool.ius if pool.node_of(iu) == node}
            self.call(agent.start(address, pool.agent_port))
            self.agents[node] = agent

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self) -> None:
        for agent in self.agents.values():
            self.call(agent.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_the_proxy_announces_a_routed_completion_to_its_node_agent_and_reads_the_acknowledgement(
        consul_addr, tmp_path):
    key_file = tmp_path / "announce.key"
    key_file.write_text(PRIVATE + "\n")
    key_file.chmod(0o600)
    pool = Pool(consul_addr, nodes=2, ius_per_node=1, agents=False)
    agents = AgentsThread(pool)
    try:
        for node in pool.nodes:
            pool.publish_kv(node, {f"{node}-iu0": 0.01})
        with running_edge(pool, announce=AnnounceConfig(key_file=str(key_file), edge_name="edge test/1")) as edge:
            state = edge.state
            edge_id = state.view.edge_id
            assert edge_id.startswith("edge-test-1.") and state.router.ledger.announcing
            body = {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 2}
            status, headers, _ = post(edge.url("/v1/completions"), body)
            assert status == 200
            iu = headers["X-Eas-IU"]
            agent = agents.agents[pool.node_of(iu)]
            wait_for(lambda: agent.posts, 5, "the announcement at the IU's node agent")
            assert signed_by_key(agent.posts[0])
            # with the prompt's relayed block hashes: the agent relays them to every edge (eas_wire/placed.py)
            blocks = relay_blocks(prompt_prefix(prompt_parts(body, False)).hashes)
            assert blocks
            assert agent.posts[0]["body"] == {"edge": edge_id, "announcements": [
                {"iu": iu, "tokens": estimate_prompt_tokens(body, chat=False), "seq": state.router.ledger.seq,
                 "sent": agent.posts[0]["body"]["announcements"][0]["sent"], "blocks": blocks_to_json(blocks)}]}
            assert state.router.ledger.seq == 1 and abs(agent.posts[0]["body"]["announcements"][0]["sent"]
                                                        - time.time()) < 5
            other = [a for a in agents.agents.values() if a is not agent]
            assert all(not a.posts for a in other)
            # the agent's pushed body acknowledges it: the view's entry for that IU carries this edge's ack
            wait_for(lambda: {e.iu_id: e.acked for e in state.view.snapshot().entries}.get(iu) == 1, 5,
                     "the acknowledgement in the view")
            wait_for(lambda: metric(edge, "eas_edge_announcements_total", 'result="sent"') == 1, 5, "the metric")
            assert metric(edge, "eas_edge_announce_batches_total", 'result="sent"') == 1
            assert metric(edge, "eas_edge_announce_rtt_seconds_count") == 1
            assert not state.router.ledger.unannounced
    finally:
        agents.stop()
        pool.stop()


def test_metrics_show_the_announce_counters_at_zero_when_announcing_is_off():
    state = _state()
    state.metrics.watch(state)
    from prometheus_client import generate_latest

    text = generate_latest(state.metrics.registry).decode()
    for line in ('eas_edge_announce_batches_total{result="sent"} 0.0',
                 'eas_edge_announce_batches_total{result="failed"} 0.0',
                 'eas_edge_announce_batches_total{result="dropped"} 0.0',
                 'eas_edge_announcements_total{result="sent"} 0.0',
                 'eas_edge_announcements_total{result="dropped"} 0.0',
                 "eas_edge_announce_rtt_seconds_count 0.0"):
        assert line in text
