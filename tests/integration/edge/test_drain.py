"""The edge's drain as a load balancer sees it: a balancer keeps connections to each edge open and reuses
them, so on SIGTERM the edge must not only close its listener but end its kept-alive connections too, or the
balancer's next request on one of them reaches the draining edge (answered 503 "draining")."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.helpers.edge import MODEL, running_edge, scripted_pool, sse_chunks, stream, wait_for

pytestmark = pytest.mark.integration

EDGE_HOST = "127.0.62.1"


def read_answer(conn: socket.socket) -> bytes:
    """One HTTP/1.1 answer with a Content-Length, read off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_a_draining_edge_closes_its_idle_kept_alive_connections_while_a_stream_finishes(consul_addr):
    with scripted_pool(consul_addr, ("n0-iu0", sse_chunks(30, 0.1))) as (_pool, _ius), \
            running_edge(_pool, listen=f"{EDGE_HOST}:0", drain_timeout_s=20) as edge:
        wait_for(lambda: edge.state.view.snapshot().healthy, 10, "the IU in the edge's view")
        host, port = edge.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as idle:
            idle.sendall(f"GET /healthz HTTP/1.1\r\nHost: {edge.address}\r\n\r\n".encode())
            assert read_answer(idle).startswith(b"HTTP/1.1 200")  # kept alive, as a balancer keeps it
            result = {}
            client = threading.Thread(target=lambda: result.update(
                out=stream(edge.url("/v1/completions"), {"model": MODEL, "prompt": "hello", "max_tokens": 30})))
            client.start()
            wait_for(lambda: edge.state.active == 1, 5, "the stream in flight")
            drain = threading.Thread(target=edge.drain)
            drain.start()
            wait_for(lambda: edge.state.draining, 5, "draining")
            idle.settimeout(2)
            assert idle.recv(1) == b""  # closed by the edge at once, not after keepalive_timeout_s
            assert edge.state.active == 1 and drain.is_alive()  # while the stream still runs
            client.join(30)
            drain.join(30)
        status, _, lines = result["out"]
        assert status == 200 and lines[-1][1] == b"data: [DONE]"
