"""The edge's push feed under hostile agents: one task per node keeps following whatever one answer holds."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from edge.feed import AgentFeed, EdgeView
from edge.pool import AnomalyDetector
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
