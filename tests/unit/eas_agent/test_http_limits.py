"""The agent's HTTP server under attack from the node network (eas_agent/serving.py, eas_agent/http.py):
per-address connection and stream caps, the request head's deadline, slots reserved for signed requests,
anonymous streams' short life. Clients bind distinct loopback source addresses (127.0.0.2-127.0.0.5)."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

import eas_agent.http as agent_http
from eas_agent.announce_keys import EdgeKeys
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_agent.serving import MAX_CONNECTIONS_PER_ADDRESS
from eas_wire.scorebody import ScoreBody
from eas_wire.signing import (
    SIGNATURE_HEADER,
    generate_key_pair,
    load_private,
    parse_public_keys,
    request_message,
    sign,
)
from eas_wire.stream import STREAM_CONTENT_TYPE

pytestmark = pytest.mark.unit

PRIVATE, PUBLIC = generate_key_pair()
KEY = load_private(PRIVATE)
STREAM = "/scores?stream=1"


@pytest.fixture
def server():
    started = []

    def start(**kwargs) -> AgentHttpServer:
        agent = AgentHttpServer("127.0.0.1", 0, AgentMetrics(), edge_keys=EdgeKeys(parse_public_keys(PUBLIC)),
                                **kwargs)
        agent.set_scores(ScoreBody(node="n", ts=1.0, ius={}, seq=1))
        agent.start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def connect_from(agent: AgentHttpServer, source: str) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(3)
    sock.bind((source, 0))
    sock.connect(agent.server.server_address[:2])
    return sock


def client_from(agent: AgentHttpServer, source: str) -> http.client.HTTPConnection:
    host, port = agent.server.server_address[:2]
    return http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0))  # not a measure: room for a loaded host


def get(agent: AgentHttpServer, source: str, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    conn = client_from(agent, source)
    conn.request("GET", path, headers=headers or {})
    return conn.getresponse()


def signed(path: str = STREAM) -> dict:
    return {SIGNATURE_HEADER: sign(KEY, request_message("GET", path), time.time())}


def test_non_reading_streams_from_one_address_leave_another_address_served(server):
    agent = server()
    held = []
    try:
        # the attack: from one address, streams opened and never read; from another, heads never finished
        for source, request in (("127.0.0.2", f"GET {STREAM} HTTP/1.1\r\nHost: x\r\n\r\n"),
                                ("127.0.0.4", "GET /scores HTTP/1.1\r\nHost: x\r\n")):
            for _ in range(128):
                try:
                    sock = connect_from(agent, source)
                    sock.sendall(request.encode())
                    held.append(sock)
                except OSError:
                    pass
        time.sleep(0.3)
        # during the attack, a second address gets its scores, its metrics and a stream of its own
        answer = get(agent, "127.0.0.3", "/scores")
        assert answer.status == 200 and json.loads(answer.read())["node"] == "n"
        assert get(agent, "127.0.0.3", "/metrics").status == 200
        stream = get(agent, "127.0.0.3", STREAM)
        assert stream.status == 200 and stream.getheader("Content-Type") == STREAM_CONTENT_TYPE
        assert json.loads(stream.readline())["node"] == "n"
        assert agent.server.by_address["127.0.0.4"] <= MAX_CONNECTIONS_PER_ADDRESS
        assert agent.server.refused["per_address"] >= 128 - MAX_CONNECTIONS_PER_ADDRESS
        assert agent.streams_by_address.get("127.0.0.2", 0) <= agent_http.MAX_STREAMS_PER_ADDRESS
    finally:
        for sock in held:
            sock.close()


def test_an_address_holds_at_most_its_anonymous_streams_and_a_signed_one_is_not_counted(server):
    agent = server()
    first, second = get(agent, "127.0.0.2", STREAM), get(agent, "127.0.0.2", STREAM)
    assert first.status == second.status == 200
    third = get(agent, "127.0.0.2", STREAM)
    assert third.status == 429 and "streams per client address" in json.loads(third.read())["error"]
    edge = get(agent, "127.0.0.2", STREAM, signed())
    assert edge.status == 200 and json.loads(edge.readline())["node"] == "n"


def test_a_dripped_request_head_is_cut_at_its_deadline(server, monkeypatch):
    monkeypatch.setattr(agent_http, "HEAD_DEADLINE_S", 0.5)
    agent = server()
    sock = connect_from(agent, "127.0.0.2")
    started = time.monotonic()
    cut = None
    try:
        for byte in b"GET /scores HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:  # each within the read timeout
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
    except OSError:
        cut = time.monotonic() - started
    if cut is None:
        sock.settimeout(1)
        assert sock.recv(1) == b""  # closed by the agent
        cut = time.monotonic() - started
    sock.close()
    assert cut < 2.5, f"the dripped head lasted {cut:.1f} s"


def test_a_signed_stream_is_served_when_the_anonymous_slots_are_full(server):
    agent = server(max_connections=4, reserved_for_edges=2)
    anonymous = []
    for source in ("127.0.0.2", "127.0.0.3"):
        for _ in range(2):  # kept-alive connections: each holds an anonymous slot while it is open
            conn = client_from(agent, source)
            conn.request("GET", "/scores")
            assert conn.getresponse().read()
            anonymous.append(conn)
    busy = get(agent, "127.0.0.4", "/scores")
    assert busy.status == 503 and "only edges" in json.loads(busy.read())["error"]
    edge = get(agent, "127.0.0.4", STREAM, signed())
    assert edge.status == 200 and json.loads(edge.readline())["node"] == "n"
    forged = get(agent, "127.0.0.5", STREAM, {SIGNATURE_HEADER: signed()[SIGNATURE_HEADER].replace("sig=", "sig=A")})
    assert forged.status == 503  # a header that does not verify is anonymous
    for conn in anonymous:
        conn.close()


def test_an_anonymous_stream_ends_early_and_a_signed_one_does_not(server, monkeypatch):
    monkeypatch.setattr(agent_http, "ANONYMOUS_MAX_STREAM_S", 0.3)
    agent = server()
    anonymous, edge = get(agent, "127.0.0.2", STREAM), get(agent, "127.0.0.3", STREAM, signed())
    started = time.monotonic()
    assert anonymous.readline() and edge.readline()
    anonymous.read()  # until the agent ends it
    assert time.monotonic() - started < 2.0
    agent.set_scores(ScoreBody(node="n", ts=2.0, ius={}, seq=2))
    assert json.loads(edge.readline())["seq"] == 2  # the edge's stream goes on
