"""The edge's push feed (edge/feed.py) over the agents' streams (``/scores?stream=1``): one request for many
bodies, agents from before streams, hostile and closing streams; under hostile agents one task per node keeps
following whatever one answer holds."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.placed import Placement
from eas_wire.stream import STREAM_CONTENT_TYPE
from edge.feed import AgentFeed, EdgeView
from edge.pool import AnomalyDetector
from tests.helpers.edge import body_of, typed

pytestmark = pytest.mark.unit


def view_of_one_node(address: str = "127.0.0.1") -> EdgeView:
    view = EdgeView(detector=AnomalyDetector())
    view.apply_health([{"Node": {"Node": "n0"}, "Service": {"Service": "vllm-iu-n0", "ID": "n0-iu0", "Address": address, "Port": 8000, "Meta": {"node": "n0"}},
                        "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]}])
    return view


def score_of(view: EdgeView) -> float | None:
    entry = view.snapshot().by_id().get("n0-iu0")
    return None if entry is None else entry.score


async def serve(handler) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/scores", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.2)  # a handler still holding its stream open is cut off
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def open_stream(request: web.Request) -> web.StreamResponse:
    """An agent's stream answer, headers sent; the handler writes its lines."""
    answer = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
    await answer.prepare(request)
    return answer


async def following_agent(handler, until, **kwargs) -> tuple[AgentFeed, EdgeView]:
    """:func:`following` an agent served by ``handler`` (``GET /scores``), stopped after."""
    runner, port = await serve(handler)
    try:
        return await following(port, until, **kwargs)
    finally:
        await runner.cleanup()


async def following(port: int, until, address: str = "127.0.0.1", **kwargs) -> tuple[AgentFeed, EdgeView]:
    """A feed on one node's agent at ``address:port`` until ``until(view)`` holds (5 s at most); stopped after."""
    view = view_of_one_node(address)
    async with aiohttp.ClientSession() as session:
        feed = AgentFeed(view, session, port, **{"apply_interval_s": 0.01, "reconcile_s": 60.0, **kwargs}).start()
        try:
            for _ in range(500):
                await asyncio.sleep(0.01)
                if until(view):
                    break
        finally:
            await feed.stop()
    return feed, view


def test_the_feed_reads_every_body_of_a_real_agent_over_one_request():
    async def run() -> None:
        server = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
        server.start()
        seen: list[float] = []
        try:
            async def publish() -> None:
                for k in range(1, 11):
                    server.set_scores(typed(body_of("n0", {"n0-iu0": k / 100})))
                    await asyncio.sleep(0.03)

            port = server.server.server_address[1]
            publisher = asyncio.get_running_loop().create_task(publish())

            def until(view: EdgeView) -> bool:
                seen.append(score_of(view))
                return score_of(view) == 0.1

            feed, view = await following(port, until)
            await publisher
        finally:
            server.stop()
        assert score_of(view) == 0.1 and not feed.errors
        # every body reached the feed (the view folds them every 10 ms, so it shows most of them)
        assert len({s for s in seen if s is not None}) >= 5

    asyncio.run(run())


def test_every_relayed_placement_of_a_real_agent_is_read_once_though_its_lines_arrive_faster_than_the_flush():
    """A stream line carries each placement once: the feed reads a line's placements as it arrives, since a
    newer line of the node replaces the body queued for the next flush."""
    async def run() -> None:
        server = AgentHttpServer("127.0.71.1", 0, AgentMetrics())
        server.start()
        try:
            async def publish() -> None:
                await asyncio.sleep(0.05)
                for k in range(1, 7):  # a window of three, a body per placement, faster than the 0.2 s flush
                    placed = tuple(Placement(seq, "n0-iu0", ((8, seq),)) for seq in range(max(1, k - 2), k + 1))
                    server.set_scores(replace(typed(body_of("n0", {"n0-iu0": k / 100})), seq=k, placed=placed))
                    await asyncio.sleep(0.01)

            publisher = asyncio.get_running_loop().create_task(publish())
            feed, view = await following(server.server.server_address[1], lambda v: v.relayed.read_total >= 6
                                         and score_of(v) == 0.06, "127.0.71.1", apply_interval_s=0.2)
            await publisher
        finally:
            server.stop()
        assert not feed.errors and score_of(view) == 0.06
        assert view.relayed.take() == [("n0-iu0", ((8, seq),)) for seq in range(1, 7)]

    asyncio.run(run())


def test_one_stream_carries_many_bodies_and_an_agent_without_streams_gets_blocking_queries():
    async def run() -> None:
        asked: list[dict] = []

        async def streaming(request: web.Request) -> web.StreamResponse:
            asked.append(dict(request.query))
            answer = await open_stream(request)
            for k in range(1, 6):
                await answer.write(json.dumps(body_of("n0", {"n0-iu0": k / 10})).encode() + b"\n\n")
                await asyncio.sleep(0.02)
            await asyncio.sleep(5)
            return answer

        feed, view = await following_agent(streaming, lambda v: score_of(v) == 0.5)
        assert score_of(view) == 0.5 and asked == [{"stream": "1"}] and not feed.errors  # five bodies, one request

        asked.clear()

        async def plain(request: web.Request) -> web.Response:  # an agent from before streams
            asked.append(dict(request.query))
            n = len(asked)
            if request.query.get("index") == "2":
                await asyncio.sleep(float(request.query.get("wait_s", "0")))
            return web.json_response(body_of("n0", {"n0-iu0": n / 10}), headers={"X-Eas-Index": str(n)})

        feed, view = await following_agent(plain, lambda v: score_of(v) == 0.2, wait_s=0.3)
        assert score_of(view) == 0.2 and not feed.errors
        assert asked[:2] == [{"stream": "1"}, {"index": "1", "wait_s": "0.3"}]  # then blocking queries

    asyncio.run(run())


def test_a_hostile_stream_costs_that_stream_only():
    """Not JSON, then a line larger than the reader's buffer (no newline ever), then an honest stream."""
    async def run() -> None:
        streams = [b"{not json\n", b"x" * (1 << 20), json.dumps(body_of("n0", {"n0-iu0": 0.25})).encode() + b"\n"]
        asked: list[int] = []

        async def hostile(request: web.Request) -> web.StreamResponse:
            n = min(len(asked), len(streams) - 1)
            asked.append(n)
            answer = await open_stream(request)
            await answer.write(streams[n])
            await asyncio.sleep(5)
            return answer

        feed, view = await following_agent(hostile, lambda v: score_of(v) == 0.25, max_backoff_s=0.05)
        assert score_of(view) == 0.25 and asked[:3] == [0, 1, 2]
        assert feed.errors["n0"] == 2

    asyncio.run(run())


def test_an_agent_that_ends_each_stream_at_once_is_backed_off_not_busy_looped():
    async def run() -> None:
        asked: list[float] = []

        async def closing(request: web.Request) -> web.StreamResponse:
            asked.append(time.monotonic())
            return await open_stream(request)  # ends the stream without a body

        started = time.monotonic()
        feed, _ = await following_agent(closing, lambda v: time.monotonic() - started > 1.0, max_backoff_s=0.4)
        assert 2 <= len(asked) <= 8, len(asked)  # backoff 0.1-0.4 s each: a busy loop asks hundreds of times
        assert feed.errors["n0"] == len(asked) or feed.errors["n0"] == len(asked) - 1

    asyncio.run(run())


def test_an_agent_upgraded_to_streams_is_streamed_from_after_its_restart():
    """Plain answers (an agent from before streams), one failed query (its restart), then a streaming agent:
    the feed asks for a stream again (not: it stayed on blocking queries until the edge restarted)."""
    async def run() -> None:
        asked: list[dict] = []

        async def upgraded(request: web.Request) -> web.StreamResponse:
            asked.append(dict(request.query))
            if len(asked) <= 2:  # before the upgrade: plain bodies
                if "index" in request.query:
                    return web.Response(status=503)  # going down for the upgrade
                return web.json_response(body_of("n0", {"n0-iu0": 0.1}), headers={"X-Eas-Index": "1"})
            answer = await open_stream(request)
            await answer.write(json.dumps(body_of("n0", {"n0-iu0": 0.3})).encode() + b"\n")
            await asyncio.sleep(5)
            return answer

        feed, view = await following_agent(upgraded, lambda v: score_of(v) == 0.3, max_backoff_s=0.05)
        assert score_of(view) == 0.3 and feed.streaming["n0"] is True
        assert asked[0] == {"stream": "1"} and "index" in asked[1] and asked[2] == {"stream": "1"}

    asyncio.run(run())


# "1" followed by 400 zeros: an int no float holds (math.isfinite raises OverflowError on it); then a body
# nested too deep for the JSON decoder (RecursionError); then an honest body.
ANSWERS = [
    json.dumps({**body_of("n0", {"n0-iu0": 0.1}), "ts": 10**400}),
    "[" * 100_000 + "]" * 100_000,
    json.dumps(body_of("n0", {"n0-iu0": 0.25})),
]


async def hostile_then_honest_agent() -> tuple[web.AppRunner, int, list[int]]:
    asked: list[int] = []

    async def scores(request: web.Request) -> web.Response:
        n = min(len(asked), len(ANSWERS) - 1)
        asked.append(n)
        if n == len(ANSWERS) - 1 and request.query.get("index") == str(n + 1):
            await asyncio.sleep(float(request.query.get("wait_s", "0")))  # nothing new: the wait runs out
        return web.Response(text=ANSWERS[n], headers={"X-Eas-Index": str(n + 1)})

    app = web.Application()
    app.router.add_get("/scores", scores)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], asked


def test_a_feed_that_got_hostile_bodies_keeps_following():
    async def run() -> None:
        import aiohttp

        runner, port, asked = await hostile_then_honest_agent()
        view = view_of_one_node()
        async with aiohttp.ClientSession() as session:
            feed = AgentFeed(view, session, port, wait_s=0.2, apply_interval_s=0.01, reconcile_s=60.0,
                             max_backoff_s=0.05).start()
            try:
                for _ in range(300):
                    await asyncio.sleep(0.01)
                    if view.snapshot().by_id().get("n0-iu0") and view.snapshot().by_id()["n0-iu0"].score == 0.25:
                        break
                # guards against: OverflowError ended the node's task on the first answer, and nothing restarted it
                assert view.snapshot().by_id()["n0-iu0"].score == 0.25, (asked, view.problems)
                assert asked[:3] == [0, 1, 2]
                assert view.rejected_bodies == 1 and feed.errors["n0"] == 1  # the ts, then the JSON
            finally:
                await feed.stop()
                await runner.cleanup()

    asyncio.run(run())


def test_reconcile_restarts_a_task_that_ended():
    async def run() -> None:
        import aiohttp

        view = view_of_one_node()
        async with aiohttp.ClientSession() as session:
            feed = AgentFeed(view, session, 1, wait_s=0.2, reconcile_s=60.0)
            ended = asyncio.get_running_loop().create_future()
            ended.set_result(None)
            feed.tasks["n0"] = ("127.0.0.1:1", ended)
            feed.reconcile()
            agent, task = feed.tasks["n0"]
            try:
                assert task is not ended and not task.done()  # guards against: the ended task stayed, never replaced
                assert agent == "127.0.0.1:1"
            finally:
                await feed.stop()

    asyncio.run(run())


HUGE_BYTES = 50 * 1024 * 1024


async def huge_json_agent() -> tuple[web.AppRunner, int, list[int]]:
    """An agent port answering every /scores with 50 MiB of ``application/json`` (chunked, no length), sent
    from one reused 1 MiB block so that the sender itself allocates little; ``sent`` counts the MiB sent."""
    block = b"a" * (1 << 20)
    sent: list[int] = []

    async def scores(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "X-Eas-Index": "7"})
        await response.prepare(request)
        try:
            await response.write(b'{"pad": "')  # one string that never ends
            for _ in range(HUGE_BYTES // len(block)):
                await response.write(block)
                sent.append(1)
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    app = web.Application()
    app.router.add_get("/scores", scores)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], sent


def test_a_huge_plain_answer_on_an_agent_port_is_refused_after_a_mib_not_buffered():
    """Whoever answers on an agent's port (a squatter while the agent restarts) must not make every edge
    buffer its answer: both the stream request and the blocking query stop reading past the body cap."""
    import tracemalloc

    import aiohttp
    import pytest

    from edge.pool.view import MAX_BODY_BYTES

    async def scenario():
        runner, port, sent = await huge_json_agent()
        agent = f"127.0.0.1:{port}"
        url = f"http://{agent}/scores"
        async with aiohttp.ClientSession() as session:
            feed = AgentFeed(view_of_one_node(), session, port, wait_s=2.0)
            for read in (lambda: feed._read_stream("n0", agent, url),
                         lambda: feed._next("n0", agent, url, aiohttp.ClientTimeout(total=10), None)):
                tracemalloc.start()
                try:
                    with pytest.raises(Exception) as info:
                        await read()
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert peak < 8 * MAX_BODY_BYTES, f"{peak >> 20} MiB allocated reading the answer"
                assert "more than" in str(info.value), info.value
        await runner.cleanup()
        return sent

    sent = asyncio.run(scenario())
    assert len(sent) < 40  # the reader stopped early and closed: most of the 50 MiB was never sent


def test_a_feed_with_the_edge_key_is_served_when_anonymous_clients_hold_every_slot():
    """The feed signs its stream request with the edge's key: an agent whose anonymous slots are all taken
    (here: none) still serves it from the slots reserved for edges."""
    from eas_agent.announce_keys import EdgeKeys
    from eas_wire.signing import generate_key_pair, load_private, parse_public_keys

    private, public = generate_key_pair()

    async def run(key) -> tuple[AgentFeed, EdgeView]:
        server = AgentHttpServer("127.0.0.1", 0, AgentMetrics(), edge_keys=EdgeKeys(parse_public_keys(public)),
                                 max_connections=0, reserved_for_edges=4)
        server.set_scores(typed(body_of("n0", {"n0-iu0": 0.25})))
        server.start()
        try:
            return await following(server.server.server_address[1], lambda view: score_of(view) == 0.25, key=key)
        finally:
            server.stop()

    _feed, view = asyncio.run(run(load_private(private)))
    assert score_of(view) == 0.25
    feed, view = asyncio.run(run(None))  # anonymous: refused while the slots are taken
    assert score_of(view) is None and feed.errors
