"""Request bodies at the edge (edge.body): bounded, parsed without stalling other streams, and a body the
decoder cannot take is a 400 in OpenAI's shape, never a 500."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from tests.helpers.edge import MODEL, post, running_edge, scripted_pool, sse_chunks, stream, wait_for

pytestmark = pytest.mark.integration


def completion(**extra) -> dict:
    return {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 8, **extra}


def test_deeply_nested_and_oversized_bodies_are_answered_in_openai_shape(consul_addr):
    with scripted_pool(consul_addr, ("s-iu0", sse_chunks(2, 0.01))) as (pool, (iu,)):
        with running_edge(pool, push=None, max_body_bytes=1 << 20) as edge:
            status, headers, body = post(edge.url("/v1/completions"), b"[" * 200_000 + b"]" * 200_000)
            assert status == 400 and json.loads(body) == {"error": {
                "message": "invalid JSON body: nested too deeply", "type": "invalid_request_error", "param": None,
                "code": "invalid_json"}}
            assert headers["X-Edge-Reason"] == "invalid_json"
            status, headers, body = post(edge.url("/v1/completions"), completion(prompt="x" * (2 << 20)))
            error = json.loads(body)["error"]
            assert status == 413 and error["type"] == "invalid_request_error" and error["code"] == "body_too_large"
            assert iu.seen == []


def test_a_large_body_does_not_stall_the_event_loop(consul_addr):
    """A 16 MiB token-id body takes the JSON decoder ~0.2-0.35 s; parsed on the event loop (or in a thread:
    the decoder holds the GIL) every stream in flight would stall that long. A probe on the edge's loop
    measures how late a 5 ms timer fires while such a body is handled, next to a flowing stream; the bound
    is half of what decoding that body takes on this host right now (a shared 2-core host's load moves both)."""
    with scripted_pool(consul_addr, ("s-iu0", sse_chunks(60, 0.02), MODEL)) as (pool, _ius):
        with running_edge(pool, push=None, max_body_bytes=64 << 20) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 1, 5, "the stand-in in the view")
            wait_for(edge.state.bodies.ready, 10, "the edge's body parsing workers started")
            big = json.dumps(completion(model="not-served", prompt=list(range(2_000_000)))).encode()
            assert len(big) > 16 << 20
            started = time.perf_counter()
            json.loads(big)
            decode_s = time.perf_counter() - started
            answers = {}
            streaming = threading.Thread(target=lambda: answers.update(stream=stream(edge.url("/v1/completions"),
                                                                                    completion())))
            streaming.start()
            wait_for(lambda: edge.state.router.inflight("s-iu0") == 1, 5, "the stream flowing")
            lags: list[float] = []
            probing = asyncio.run_coroutine_threadsafe(loop_lag(lags, 0.005), edge.loop)
            answers["big"] = post(edge.url("/v1/completions"), big)
            probing.cancel()
            streaming.join(10)
            print(f"largest event loop lag while the big body was handled: {max(lags) * 1000:.0f} ms "
                  f"(decoding it: {decode_s * 1000:.0f} ms)")
            assert max(lags) < max(0.05, decode_s / 2), f"the edge's loop stalled {max(lags) * 1000:.0f} ms"
            status, _, body = answers["big"]
            assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
            assert answers["stream"][0] == 200 and answers["stream"][2][-1][1] == b"data: [DONE]"


async def loop_lag(lags: list[float], interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval_s)
        lags.append(loop.time() - started - interval_s)
