"""The edge end to end on loopback: dev Consul, simulated IUs (sim.vllm), fake agents, the real proxy."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from tests.helpers.edge import (
    MODEL,
    Pool,
    metric,
    post,
    running_edge,
    scripted_pool,
    sse_chunks,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(consul_addr):
    pool = Pool(consul_addr, nodes=2, ius_per_node=1)
    for node in pool.nodes:
        pool.publish_kv(node, {f"{node}-iu0": 0.01})
    yield pool
    pool.stop()


def completion(tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "prompt": "hello " * 40, "max_tokens": tokens, **extra}


def test_stream_passes_through_chunk_by_chunk_and_plain_answers_too(pool):
    with running_edge(pool) as edge:
        status, headers, lines = stream(edge.url("/v1/completions"), completion(tokens=30))
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert headers["X-Eas-IU"] in pool.ius
        assert lines[-1][1] == b"data: [DONE]"
        events = [json.loads(line[6:]) for _, line in lines[:-1]]
        assert sum(e["choices"][0]["text"].count("tok") for e in events) == 30
        # not buffered: the first event reached the client well before the last (the engine took > 0.3 s)
        assert len(events) >= 3 and lines[-1][0] - lines[0][0] > 0.1
        status, headers, body = post(edge.url("/v1/chat/completions"),
                                     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 4})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
        with urllib.request.urlopen(edge.url("/v1/models"), timeout=10) as answer:
            assert json.load(answer)["data"][0]["id"] == MODEL
        assert metric(edge, "eas_edge_ttft_seconds_count", 'stream="true"') == 1
        assert metric(edge, "eas_edge_requests_total", 'code="200",endpoint="/v1/completions"') == 1


def test_answer_headers_say_how_the_pick_saw_the_chosen_iu(pool):
    scores = {"n0-iu0": 0.2, "n1-iu0": 0.7}
    for node in pool.nodes:
        pool.publish_kv(node, {f"{node}-iu0": scores[f"{node}-iu0"]})
    with running_edge(pool) as edge:
        wait_for(lambda: {e.score for e in edge.state.view.snapshot().scored} == set(scores.values()), 10,
                 "both scores read")
        status, headers, _ = post(edge.url("/v1/completions"), completion(tokens=2))  # 60 prompt tokens
        assert status == 200
        chosen = headers["X-Eas-IU"]
        assert headers["X-Eas-Pick"] == "p2c"
        assert float(headers["X-Eas-Score"]) == scores[chosen]
        assert float(headers["X-Eas-Prefill-S"]) == pytest.approx(60 / 12000.0, abs=1e-4)  # published prefill_tps
        assert float(headers["X-Eas-Expected-S"]) >= scores[chosen] + 60 / 12000.0 - 1e-4


def test_malformed_json_is_400_with_the_parse_error_and_unknown_model_is_404(pool):
    with running_edge(pool) as edge:
        status, _, body = post(edge.url("/v1/completions"), b'{"model": "x", "prompt": ')
        answer = json.loads(body)["error"]
        assert status == 400 and answer["type"] == "invalid_request_error" and answer["code"] == "invalid_json"
        assert "invalid JSON body: Expecting value: line 1 column" in answer["message"]
        status, _, body = post(edge.url("/v1/completions"), b"[1, 2]")
        assert status == 400 and "expected an object, got list" in json.loads(body)["error"]["message"]
        # the IU's own 404 (vLLM's flat shape) reaches the client in OpenAI's
        status, _, body = post(edge.url("/v1/completions"), completion(model="no-such-model"))
        assert status == 404 and json.loads(body) == {"error": {
            "message": "The model `no-such-model` does not exist.", "type": "invalid_request_error",
            "param": None, "code": None}}
        assert sum(sim.model.success_total for sim in pool.ius.values()) == 0


def test_maintenance_and_critical_ius_never_get_traffic(pool):
    pool.maintenance("n1-iu0", "test")
    with running_edge(pool) as edge:
        with urllib.request.urlopen(edge.url("/healthz"), timeout=5) as answer:
            assert json.load(answer)["routable_ius"] == 1
        served = {post(edge.url("/v1/completions"), completion(tokens=1))[1]["X-Eas-IU"] for _ in range(12)}
        assert served == {"n0-iu0"}
        pool.maintenance("n0-iu0", "test")
        wait_for(lambda: not edge.state.view.snapshot().healthy, 5, "both IUs out of the view")
        status, headers, body = post(edge.url("/v1/completions"), completion(tokens=1))
        assert status == 503 and headers["Retry-After"] == "1" and b"no healthy IU" in body
        with pytest.raises(urllib.error.HTTPError) as info:  # a load balancer stops sending to this edge
            urllib.request.urlopen(edge.url("/healthz"), timeout=5)
        assert info.value.code == 503 and json.load(info.value)["status"] == "no_routable_iu"
        with urllib.request.urlopen(edge.admin_url("/metrics"), timeout=5) as answer:
            assert 'eas_edge_rejected_total{reason="no_healthy_iu"} 1.0' in answer.read().decode()


def test_connection_failure_before_any_byte_is_retried_on_another_iu(pool):
    pool.ius["n1-iu0"].stop()  # registered and healthy in Consul, nothing listening
    with running_edge(pool) as edge:
        results = [post(edge.url("/v1/completions"), completion(tokens=1)) for _ in range(8)]
        assert all(status == 200 and headers["X-Eas-IU"] == "n0-iu0" for status, headers, _ in results)
        retries = metric(edge, "eas_edge_retries_total", 'reason="connect"')
        assert retries == 1  # the first pick of the dead IU was retried; refused: ejected at once, skipped
        assert metric(edge, "eas_edge_upstream_errors_total", 'iu="n1-iu0",kind="connect"') == retries
        assert metric(edge, "eas_edge_ejections_total", 'outcome="definitive"') == 1


def test_two_dead_ius_each_tried_once_then_502_and_only_half_ejected(pool):
    for sim in pool.ius.values():
        sim.stop()
    with running_edge(pool) as edge:
        status, _, body = post(edge.url("/v1/completions"), completion(tokens=1))
        assert status == 502 and b"2 tried, each failed before its first byte" in body
        assert metric(edge, "eas_edge_retries_total", 'reason="connect"') == 1  # moved once, then none left
        # at most half the pool is ejected at once: the second stays routable, so is tried again
        assert len(edge.state.router.ejected) == 1 and edge.state.router.outliers.refused_by_cap == 1
        status, headers, body = post(edge.url("/v1/completions"), completion(tokens=1))
        assert status == 502 and headers["X-Edge-Reason"] == "upstream_connect"


def test_a_stream_cut_by_its_ius_death_is_resumed_on_another_as_one_stream(pool):
    pool.ius["n0-iu0"].die_after_tokens = 5
    with running_edge(pool) as edge:
        edge.state.router.rng.random = lambda: 0.0  # pick n0-iu0 first (sampling index 0)
        status, headers, lines = stream(edge.url("/v1/completions"),
                                        completion(tokens=40, stream_options={"include_usage": True}))
        assert status == 200 and headers["X-Eas-IU"] == "n0-iu0" and headers["X-Edge-Resumable"] == "1"
        assert [line for _, line in lines if line.startswith(b":")] == [
            b": resumed on n1-iu0 after n0-iu0 mid_stream"]
        assert lines[-1][1] == b"data: [DONE]"
        events = [json.loads(line[6:]) for _, line in lines if line.startswith(b"data: {")]
        assert len({e["id"] for e in events}) == 1
        text = "".join(c["text"] for e in events for c in e["choices"])
        assert text.count("tok") == 40  # 5 from n0-iu0, the rest continued by n1-iu0
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 40
        # the continuation asked for the prompt plus the text so far, and only what was left
        assert metric(edge, "eas_edge_resumed_total", 'reason="mid_stream"') == 1
        assert metric(edge, "eas_edge_upstream_errors_total", 'iu="n0-iu0",kind="mid_stream"') == 1
        assert pool.ius["n1-iu0"].model.success_total == 1


def test_a_chat_stream_is_resumed_by_continuing_the_partial_assistant_message(consul_addr):
    def cut_after(events: int):
        async def handler(request):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": '
                                 b'"assistant", "content": ""}}]}\n\n')
            for n in range(events):
                await response.write(b'data: {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": '
                                     b'{"content": "w%d "}}]}\n\n' % n)
                await asyncio.sleep(0.01)
            request.transport.close()  # the engine dies: no last chunk
            return response
        return handler

    with scripted_pool(consul_addr, ("s-iu0", cut_after(3)), ("s-iu1", sse_chunks(2, 0.01))) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            messages = [{"role": "user", "content": "count"}]
            for _ in range(20):  # fail-open picks among the two: until one lands on the dying stand-in
                status, headers, lines = stream(edge.url("/v1/chat/completions"),
                                                {"model": MODEL, "messages": messages, "max_tokens": 10})
                if headers["X-Eas-IU"] == "s-iu0":
                    break
            assert status == 200 and headers["X-Eas-IU"] == "s-iu0" and lines[-1][1] == b"data: [DONE]"
            continued = ius[1].seen[-1][1]
            assert continued["messages"] == messages + [{"role": "assistant", "content": "w0 w1 w2 "}]
            assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
            assert continued["max_tokens"] == 7
            events = [json.loads(line[6:]) for _, line in lines if line.startswith(b"data: {")]
            assert {e["id"] for e in events} == {"chatcmpl-1"}


def test_per_iu_cap_queues_then_429_with_retry_after(consul_addr):
    pool = Pool(consul_addr, nodes=1, ius_per_node=1)
    try:
        with running_edge(pool, max_inflight_per_iu=1, max_queue=1, queue_timeout_s=10.0) as edge:
            results = {}

            def send(name, tokens):
                results[name] = stream(edge.url("/v1/completions"), completion(tokens=tokens))

            first = threading.Thread(target=send, args=("first", 60))
            first.start()
            wait_for(lambda: edge.state.router.inflight("n0-iu0") == 1, 5, "first request in flight")
            queued = threading.Thread(target=send, args=("queued", 2))
            queued.start()
            wait_for(lambda: len(edge.state.waiters) == 1, 5, "second request queued")
            status, headers, lines = stream(edge.url("/v1/completions"), completion(tokens=2))
            assert status == 429 and headers["X-Edge-Reason"] == "queue_full"
            assert int(headers["Retry-After"]) >= 1  # nothing drained yet: the queue timeout
            assert b"1 requests are queued" in lines[0][1]
            first.join(30)
            queued.join(30)
            assert results["first"][0] == results["queued"][0] == 200
            assert results["queued"][2][-1][1] == b"data: [DONE]"
            assert metric(edge, "eas_edge_queue_wait_seconds_count") == 1
    finally:
        pool.stop()


def test_graceful_shutdown_drains_in_flight_streams(pool):
    with running_edge(pool) as edge:
        result = {}
        client = threading.Thread(target=lambda: result.update(
            out=stream(edge.url("/v1/completions"), completion(tokens=50))))
        client.start()
        wait_for(lambda: edge.state.active == 1, 5, "the stream in flight")
        drain = threading.Thread(target=edge.drain)
        drain.start()
        wait_for(lambda: edge.state.draining, 5, "draining")
        time.sleep(0.1)
        with pytest.raises(OSError):  # the listener is closed: new clients go to another edge
            urllib.request.urlopen(edge.url("/healthz"), timeout=2)
        client.join(30)
        drain.join(30)
        status, _, lines = result["out"]
        assert status == 200 and lines[-1][1] == b"data: [DONE]"


def test_a_request_started_before_the_drain_is_served_even_if_its_body_comes_after(pool):
    """The race CI hit: the handler had started (counted in flight) but not yet read the body when the drain
    began; that request was answered 503 "draining". Here the body is held back until the drain has begun."""
    with running_edge(pool) as edge:
        body = json.dumps({**completion(tokens=5), "stream": True}).encode()
        host, port = edge.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {edge.address}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body[:10])
            wait_for(lambda: edge.state.active == 1, 5, "the handler started")
            drain = threading.Thread(target=edge.drain)
            drain.start()
            wait_for(lambda: edge.state.draining, 5, "draining")
            conn.sendall(body[10:])
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        drain.join(30)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b"data: [DONE]" in answer


def test_consul_lost_later_keeps_routing_then_fails_open(consul_addr):
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0") as server:
        pool = Pool(server.address, nodes=2, agents=False)
        try:
            for node in pool.nodes:
                pool.publish_kv(node, {f"{node}-iu0": 0.01}, heartbeat_s=0.3)
            with running_edge(pool, push=None) as edge:
                wait_for(lambda: len(edge.state.view.snapshot().scored) == 2, 5, "scores in the view")
                server.stop()
                assert post(edge.url("/v1/completions"), completion(tokens=1))[0] == 200
                time.sleep(1.0)  # scores older than 3 heartbeats: stale
                assert all(post(edge.url("/v1/completions"), completion(tokens=1))[0] == 200 for _ in range(3))
                assert metric(edge, "eas_edge_picks_total", 'mode="fail_open"') >= 3
                assert metric(edge, "eas_edge_consul_errors_total") >= 1
        finally:
            pool.stop()


def canned_iu(pool: Pool, iu_id: str, host: str, address: str, answer: bytes) -> tuple[socket.socket, list[bytes]]:
    """The pool's only routable IU becomes ``iu_id`` at ``host`` (its Consul address), a loopback listener
    on ``address`` that reads one request per connection, keeps it, sends ``answer`` and closes."""
    from sim.vllm.registration import IUService

    listener = socket.socket()
    listener.bind((address, 0))
    listener.listen(8)
    seen: list[bytes] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            seen.append(conn.recv(65536))
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    pool.ius["n0-iu0"].stop()
    pool.maintenance("n0-iu0", f"only {iu_id}")
    pool.register(IUService(iu_id, iu_id.split("-")[0], "r1", host, listener.getsockname()[1], (0,), 0))
    return listener, seen


def test_an_iu_answering_garbage_is_a_502_naming_it_not_a_crash(consul_addr):
    pool = Pool(consul_addr, nodes=1, agents=False)
    listener, _seen = canned_iu(pool, "bad-iu0", "127.0.200.9", "127.0.200.9", b"NOT HTTP AT ALL\r\n\r\n")
    try:
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: [e.iu_id for e in edge.state.view.snapshot().healthy] == ["bad-iu0"], 5, "the view")
            status, _, body = post(edge.url("/v1/completions"), completion(tokens=1))
            assert status == 502 and b"IU bad-iu0 answered with a broken response" in body
            assert metric(edge, "eas_edge_upstream_errors_total", 'iu="bad-iu0",kind="protocol"') == 1
            assert edge.state.router.inflight("bad-iu0") == 0  # the slot was released
    finally:
        listener.close()
        pool.stop()


def test_a_cookie_one_answer_set_is_never_sent_on_anothers_request(consul_addr):
    """The edge is a proxy, not a browser: a Set-Cookie from an IU (addressed by name in Consul) must not be
    stored and replayed on later requests, which come from other clients."""
    pool = Pool(consul_addr, nodes=1, agents=False)
    listener, seen = canned_iu(pool, "named-iu0", "localhost", "127.0.0.1",
                               b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: session=client-a; "
                               b"Path=/\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    try:
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: [e.iu_id for e in edge.state.view.snapshot().healthy] == ["named-iu0"], 5, "the view")
            assert [post(edge.url("/v1/completions"), completion(tokens=1))[0] for _ in range(2)] == [200, 200]
        assert len(seen) == 2 and not any(b"\r\ncookie:" in request.lower() for request in seen), seen
    finally:
        listener.close()
        pool.stop()


def test_a_long_stream_that_is_never_idle_completes_and_an_idle_one_is_cut_and_blamed(consul_addr):
    with scripted_pool(consul_addr, ("s-iu0", sse_chunks(12, 0.25)), ("s-iu1", sse_chunks(6, 0.05, 2, 3.0))) as (
            pool, _ius):
        with running_edge(pool, push=None, upstream_timeout_s=1.0, stream_idle_timeout_s=1.0) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            edge.state.router.ejected["s-iu1"] = time.time() + 60  # the long stream goes to s-iu0
            status, headers, lines = stream(edge.url("/v1/completions"), completion())
            assert status == 200 and headers["X-Eas-IU"] == "s-iu0"
            assert lines[-1][1] == b"data: [DONE]" and lines[-1][0] - lines[0][0] > 2.0  # longer than 1 s total
            assert metric(edge, "eas_edge_upstream_errors_total", 'iu="s-iu0",kind="idle"') == 0
            assert "s-iu0" not in edge.state.router.ejected
            edge.state.router.ejected = {"s-iu0": time.time() + 60}  # now the one that goes silent
            started = time.monotonic()
            status, headers, lines = stream(edge.url("/v1/completions"), completion())
            assert status == 200 and headers["X-Eas-IU"] == "s-iu1" and time.monotonic() - started < 2.5
            assert lines[-2][1] == b"event: error" and b"silent for 1 s" in lines[-1][1]
            assert metric(edge, "eas_edge_upstream_errors_total", 'iu="s-iu1",kind="idle"') == 1
            # silence is the IU's failure: it would be ejected, but s-iu0 is, and at most half the pool may be
            assert edge.state.router.outliers.refused_by_cap == 1


def test_a_client_that_leaves_cancels_its_upstream_request_and_a_queued_one_is_never_sent(consul_addr):
    import asyncio

    from aiohttp import web

    async def slow_answer(request):
        await asyncio.sleep(6)
        return web.json_response({"choices": []})

    with scripted_pool(consul_addr, ("s-iu0", slow_answer)) as (pool, (iu,)):
        with running_edge(pool, push=None, max_inflight_per_iu=1, queue_timeout_s=10.0) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 1, 5, "the stand-in in the view")
            host, port = edge.address.rsplit(":", 1)
            body = json.dumps(completion()).encode()
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: {edge.address}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            first, queued = (socket.create_connection((host, int(port)), timeout=10) for _ in range(2))
            first.sendall(head + body)
            wait_for(lambda: len(iu.seen) == 1, 5, "the first request at the IU")
            queued.sendall(head + body)
            wait_for(lambda: len(edge.state.waiters) == 1, 5, "the second request queued")
            queued.close()
            wait_for(lambda: len(edge.state.waiters) == 0, 2, "the departed client's request out of the queue")
            left = time.monotonic()
            first.close()
            wait_for(lambda: iu.cancelled, 2, "the IU's request cancelled")
            assert iu.cancelled[0] - left < 0.5
            time.sleep(0.3)
            assert len(iu.seen) == 1  # the queued request never reached the IU
            assert edge.state.router.inflight("s-iu0") == 0
            assert "s-iu0" not in edge.state.router.outliers.records  # a client that left is not the IU's failure


def test_requests_go_only_to_the_ius_serving_their_model_and_an_unknown_model_is_a_404(consul_addr):
    from aiohttp import web

    async def answer(request):
        return web.json_response({"choices": [{"text": "ok"}]})

    with scripted_pool(consul_addr, ("a-iu0", answer, "model-a"), ("b-iu0", answer, "model-b")) as (pool, ius):
        with running_edge(pool, push=None) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 2, 5, "the stand-ins in the view")
            for model, iu_id in (("model-a", "a-iu0"), ("model-b", "b-iu0")):
                served = {post(edge.url("/v1/completions"), completion(model=model))[1]["X-Eas-IU"] for _ in range(8)}
                assert served == {iu_id}
            status, headers, body = post(edge.url("/v1/completions"), completion(model="model-c"))
            assert status == 404 and headers["X-Edge-Reason"] == "model_not_found"
            assert json.loads(body) == {"error": {"message": "The model `model-c` does not exist.",
                                                  "type": "invalid_request_error", "param": "model",
                                                  "code": "model_not_found"}}
            assert [len(iu.seen) for iu in ius] == [8, 8]


def test_a_plain_answer_past_the_edges_own_deadline_is_a_504_and_blames_no_iu(consul_addr):
    import asyncio

    from aiohttp import web

    async def slow_answer(request):
        await asyncio.sleep(3)
        return web.json_response({"choices": []})

    with scripted_pool(consul_addr, ("s-iu0", slow_answer)) as (pool, (iu,)):
        with running_edge(pool, push=None, upstream_timeout_s=1.0) as edge:
            wait_for(lambda: len(edge.state.view.snapshot().healthy) == 1, 5, "the stand-in in the view")
            status, headers, body = post(edge.url("/v1/completions"), completion())
            assert status == 504 and headers["X-Edge-Reason"] == "upstream_deadline", body
            assert json.loads(body)["error"]["type"] == "server_error"
            assert edge.state.router.ejected == {} and metric(edge, "eas_edge_retries_total") == 0
            assert len(iu.seen) == 1
