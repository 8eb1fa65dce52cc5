"""Reselection before the first byte: an IU that fails before it has sent anything costs the client nothing."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from tests.helpers.edge import MODEL, metric, post, running_edge, scripted_pool, sse_chunks, stream, wait_for

pytestmark = pytest.mark.integration


def completion(**extra) -> dict:
    return {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 8, **extra}


def headers_then(after):
    """A stand-in that sends its 200 and headers, then ``after(request)`` (dies or stalls before a token)."""

    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await after(request)
        return response

    return handler


async def die(request):
    await asyncio.sleep(0.5)  # the other stand-in is back by then
    request.transport.close()


async def stall(request):
    await asyncio.sleep(30)


@pytest.mark.parametrize("fault", ["dies", "stalls"])
def test_an_iu_that_sent_its_headers_but_no_token_is_left_for_another(consul_addr, fault):
    after = die if fault == "dies" else stall
    with scripted_pool(consul_addr, ("s-iu0", headers_then(after)), ("s-iu1", sse_chunks(3, 0.01))) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            edge.state.router.ejected["s-iu1"] = time.time() + 0.3
            started = time.monotonic()
            status, headers, lines = stream(edge.url("/v1/completions"), completion())
            took = time.monotonic() - started
            assert status == 200 and headers["X-Eas-IU"] == "s-iu1" and lines[-1][1] == b"data: [DONE]"
            assert len(ius[0].seen) == 1 and len(ius[1].seen) == 1
            reason = "first_byte" if fault == "dies" else "stalled"
            assert metric(edge, "eas_edge_retries_total", f'reason="{reason}"') == 1
            if fault == "stalls":  # a first byte 5 s late (the floor: nothing was predicted) marks a stall
                assert 5.0 <= took < 7.0
                assert "s-iu0" in edge.state.router.ejected  # definitive: ejected at once
            else:
                assert took < 2.0 and "s-iu0" not in edge.state.router.ejected  # one failure of three


def test_a_5xx_before_the_first_byte_moves_the_request_and_the_last_one_is_passed_on(consul_addr):
    async def broken(request):
        return web.json_response({"object": "error", "message": "engine dead", "type": "InternalServerError",
                                  "param": None, "code": 500}, status=500)

    with scripted_pool(consul_addr, ("s-iu0", broken), ("s-iu1", broken)) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            status, headers, body = post(edge.url("/v1/completions"), completion())
            # both tried; the last one's answer is the client's, in OpenAI's shape
            assert status == 500 and json.loads(body)["error"]["message"] == "engine dead"
            assert len(ius[0].seen) + len(ius[1].seen) == 2
            assert metric(edge, "eas_edge_retries_total", 'reason="status_5xx"') == 1


def test_three_failures_eject_an_iu_and_its_health_probe_brings_it_back_or_keeps_it_out(consul_addr):
    failing = {"on": True}

    async def flaky(request):
        if failing["on"]:
            return web.json_response({"error": {"message": "engine dead", "type": "InternalServerError",
                                                "param": None, "code": 500}}, status=500)
        return await sse_chunks(2, 0.01)(request)

    with scripted_pool(consul_addr, ("s-iu0", flaky), ("s-iu1", sse_chunks(2, 0.01))) as (pool, ius):
        with running_edge(pool, push=None, eject_s=0.5) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            for _ in range(20):  # every client is served, by s-iu1 when s-iu0 answers 500
                status, _, lines = stream(edge.url("/v1/completions"), completion())
                assert status == 200 and lines[-1][1] == b"data: [DONE]"
                if "s-iu0" in edge.state.router.ejected:
                    break
            assert len(ius[0].seen) == 3 and metric(edge, "eas_edge_ejections_total", 'outcome="failed"') == 1
            ius[0].healthy = False
            time.sleep(0.6)
            stream(edge.url("/v1/completions"), completion())  # a request sends the due probe
            wait_for(lambda: metric(edge, "eas_edge_probes_total", 'outcome="failed"') == 1, 3, "a failed probe")
            assert edge.state.router.outliers.records["s-iu0"].backoff_s == 1.0  # doubled
            seen = len(ius[0].seen)
            ius[0].healthy, failing["on"] = True, False
            time.sleep(1.1)
            stream(edge.url("/v1/completions"), completion())
            wait_for(lambda: metric(edge, "eas_edge_probes_total", 'outcome="ok"') == 1, 3, "a good probe")
            assert len(ius[0].seen) == seen  # probes are the edge's own GET /health, no client request
            assert "s-iu0" not in edge.state.router.outliers.records
            served = {stream(edge.url("/v1/completions"), completion())[1]["X-Eas-IU"] for _ in range(10)}
            assert "s-iu0" in served


def test_a_request_awaiting_its_first_byte_leaves_an_iu_ejected_meanwhile(consul_addr):
    with scripted_pool(consul_addr, ("s-iu0", stall), ("s-iu1", sse_chunks(3, 0.01))) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            edge.state.router.ejected["s-iu1"] = time.time() + 0.3
            started = time.monotonic()
            threading.Timer(1.0, lambda: edge.loop.call_soon_threadsafe(
                edge.state.router.outcome, "s-iu0", time.time(), "definitive", 2)).start()
            status, headers, lines = stream(edge.url("/v1/completions"), completion())
            # moved when s-iu0 was ejected (its other streams went silent), not 5 s later by its own rule
            assert status == 200 and headers["X-Eas-IU"] == "s-iu1" and time.monotonic() - started < 2.0
            assert metric(edge, "eas_edge_retries_total", 'reason="ejected"') == 1


def test_a_request_on_an_iu_whose_streams_all_went_silent_is_moved_before_any_stall_rule(consul_addr):
    engine = {"stalled": False}

    async def stallable(request):  # one engine: when it stops stepping, every stream and request waits
        if engine["stalled"]:
            await asyncio.sleep(30)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(300):
            if engine["stalled"]:
                await asyncio.sleep(30)
            await response.write(b'data: {"choices": [{"text": "tok"}]}\n\n')
            await asyncio.sleep(0.01)
        await response.write(b"data: [DONE]\n\n")
        return response

    with scripted_pool(consul_addr, ("s-iu0", stallable), ("s-iu1", sse_chunks(3, 0.01))) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            router = edge.state.router
            router.ejected["s-iu1"] = time.time() + 0.5  # both requests go to s-iu0 first
            long = threading.Thread(target=stream, args=(edge.url("/v1/completions"), completion(max_tokens=300)))
            long.start()
            wait_for(lambda: router.liveness.relaying.get("s-iu0"), 3, "a stream relayed from s-iu0")
            router.ejected["s-iu1"] = time.time() + 0.15
            engine["stalled"] = True
            started = time.monotonic()
            status, headers, lines = stream(edge.url("/v1/completions"), completion())
            took = time.monotonic() - started
            # moved once s-iu0 was silent past its floor, not 3 s later (stream_stall_s) nor 5 s (the floor)
            assert status == 200 and headers["X-Eas-IU"] == "s-iu1" and lines[-1][1] == b"data: [DONE]"
            assert took < 1.5 and metric(edge, "eas_edge_retries_total", 'reason="silent"') == 1
            assert "s-iu0" not in router.ejected  # silence steers; only the stall rule ejects
            long.join(10)
            assert "s-iu0" in router.ejected  # the silent stream, cut at stream_stall_s: a stall
