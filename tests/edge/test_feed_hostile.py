"""The edge's push feed under hostile agents: one task per node keeps following whatever one answer holds."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from eas_agent.scheduler import AnomalyDetector
from edge.feed import AgentFeed, EdgeView
from tests.edge.helpers import body_of

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


def view_of_one_node() -> EdgeView:
    view = EdgeView(detector=AnomalyDetector())
    view.apply_health([{"Service": {"ID": "n0-iu0", "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": "n0"}},
                        "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]}])
    return view


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
                # before: OverflowError ended the node's task on the first answer, and nothing restarted it
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
                assert task is not ended and not task.done()  # before: the ended task stayed, never replaced
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

    from eas_agent.scheduler.view import MAX_BODY_BYTES

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
