"""The edge's push feed over the agents' streams (``/scores?stream=1``): one request for many bodies, agents
from before streams, hostile and closing streams."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web

from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.stream import STREAM_CONTENT_TYPE
from edge.feed import AgentFeed, EdgeView
from edge.pool import AnomalyDetector
from tests.edge.helpers import body_of, typed


def view_of_one_node() -> EdgeView:
    view = EdgeView(detector=AnomalyDetector())
    view.apply_health([{"Service": {"ID": "n0-iu0", "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": "n0"}},
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


async def following(port: int, until, **kwargs) -> tuple[AgentFeed, EdgeView]:
    """A feed on one node's agent at ``port`` until ``until(view)`` holds (5 s at most); stopped after."""
    view = view_of_one_node()
    async with aiohttp.ClientSession() as session:
        feed = AgentFeed(view, session, port, apply_interval_s=0.01, reconcile_s=60.0, **kwargs).start()
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
    the feed asks for a stream again (before: it stayed on blocking queries until the edge restarted)."""
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
