"""Request framing: a body's length is read only from ASCII digits, and a request whose framing the dev
server does not take at face value is answered once and the connection closed, so nothing sent after it
on the same connection (a smuggled request) is ever answered.

Go's net/http, which Consul serves with, accepts a Content-Length of ASCII digits only, refuses two that
differ, and takes exactly one Transfer-Encoding, ``chunked`` (any other: 501 "Unsupported transfer
encoding", net/http/transfer.go)."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest
import requests

from devconsul import http_server
from devconsul.http_server import MAX_BODY
from devconsul.server import DevConsulServer
from tests.helpers import wait_for
from tests.helpers.devconsul import raw

pytestmark = pytest.mark.integration

SMUGGLED = b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def dev():
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1") as server:
        yield server


def exchange(address: str, data: bytes) -> bytes:
    """Send ``data`` on one connection and read until the server closes it (or 3 s pass)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass  # still open: whatever came is the answer
    return received


def statuses(received: bytes) -> list[int]:
    return [int(part[:3]) for part in received.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.parametrize("length", [b"\xb2", b"\xb9", b"1\xb2", b"00000000001", b"3 3", b"0x3", b"3.0"])
def test_content_length_of_anything_but_ascii_digits_is_400_and_closes(dev, length):
    """Guards against: '\\xb2' (superscript two) passed str.isdigit, int() raised: 500 with a traceback in the
    log, the connection kept open, and the smuggled request after it answered."""
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n"
    received = exchange(dev.address, head + SMUGGLED)
    assert statuses(received) == [400] and b"Connection: close" in received
    assert b"internal error" not in received


def test_two_different_content_lengths_are_400_and_close(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabc"
    assert statuses(exchange(dev.address, head + SMUGGLED)) == [400]


@pytest.mark.parametrize("encoding", [b"gzip, chunked", b"chunked, chunked", b"identity", b"chunked;x", b"xchunked",
                                      b"chunked\r\nTransfer-Encoding: chunked", b"gzip"])
def test_transfer_encoding_other_than_chunked_is_refused_and_closes(dev, encoding):
    """Guards against: anything but exactly 'chunked' was taken as no body at all (or the Content-Length), and
    the chunked body that followed was read as the next request."""
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + encoding + b"\r\n\r\n"
    received = exchange(dev.address, head + b"3\r\nabc\r\n0\r\n\r\n" + SMUGGLED)
    assert statuses(received) == [501] and b"Unsupported transfer encoding" in received
    assert requests.get(f"http://{dev.address}/v1/kv/k", timeout=5).status_code == 404


def test_chunked_in_any_case_is_chunked(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
    assert statuses(exchange(dev.address, head + b"3\r\nabc\r\n0\r\n\r\n")) == [200]
    assert requests.get(f"http://{dev.address}/v1/kv/k?raw", timeout=5).content == b"abc"


def test_any_error_while_reading_a_body_closes_the_connection(dev, monkeypatch):
    """An error the reader did not foresee leaves the stream at an unknown point: nothing after it may be
    read as a request. Guards against: a 500 on a connection kept open, and the smuggled request answered."""
    def broken(self):
        raise ValueError("unforeseen")

    monkeypatch.setattr(http_server.Handler, "_read_chunked", broken)
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    received = exchange(dev.address, head + SMUGGLED)
    assert statuses(received) == [500] and b"Connection: close" in received


@pytest.mark.parametrize("query, status, text", [("index=\u00b2", 400, "Invalid index"),
                                                 ("index=\u0661", 400, "Invalid index"),
                                                 ("cas=\u00b2", 500, "strconv.ParseUint")])
def test_numbers_in_the_query_are_ascii_digits(dev, query, status, text):
    """Guards against: ?index=\u00b2 passed str.isdigit and int() raised: an 'internal error' 500 with a traceback;
    ?index=\u0661 (Arabic-Indic one) was read as 1."""
    method = "PUT" if query.startswith("cas") else "GET"
    resp = requests.request(method, f"http://{dev.address}/v1/kv/k?{query}", data=b"x", timeout=5)
    assert resp.status_code == status and text in resp.text


def test_a_request_refused_before_its_body_is_read_closes_the_connection():
    """A GET with a body, refused by the ACL check before the body is read. Guards against: a 403 on a connection
    kept open, and the body, itself a request, answered as the next one."""
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token="c0ffee00-0000-4000-8000-000000000001") as acl:
        head = b"GET /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED)
        assert statuses(exchange(acl.address, head + SMUGGLED)) == [403]


def raw_request(rng: random.Random) -> bytes:
    method = rng.choice([b"GET", b"PUT", b"POST", b"DELETE", b"HEAD", b"PATCH", b"BREW", b""])
    path = rng.choice([b"/v1/kv/a", b"/v1/kv/a?recurse&index=5&wait=1ms", b"/v1/txn", b"/v1/agent/service/register",
                       b"/v1/health/service/x?filter=" + rng.choice([b"Service.Port%20==%201", b"((((", b"%ff%fe"]),
                       b"/v1/catalog/services?index=-1", b"/" + bytes(rng.randrange(33, 127) for _ in range(20)),
                       b"/scores", b"/metrics", b"*"])
    headers = []
    for _ in range(rng.randint(0, 4)):
        headers.append(rng.choice([
            b"Content-Length: " + rng.choice([b"-1", b"99999999999", b"abc", b"3", b"0", b""]),
            b"Transfer-Encoding: chunked", b"X-Consul-Token: " + bytes(rng.randrange(33, 127) for _ in range(8)),
            b"Host: x", b"Expect: 100-continue", b"Connection: close",
        ]))
    body = rng.choice([b"", b"{}", b"null", b"[" * 5000, b"-5\r\nxx\r\n0\r\n\r\n", b"\xff\xfe", b"3\r\nabc\r\n0\r\n\r\n"])
    return method + b" " + path + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


def fire(address: str, data: bytes) -> None:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    except OSError:
        pass  # the server may close on us: that is an answer


def test_malformed_requests_never_break_the_servers(tally):
    from eas_agent.http import AgentHttpServer, AgentMetrics

    rng = random.Random(1503)
    n = 400
    agent_http = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    agent_http.start()
    try:
        with DevConsulServer(addr="127.0.0.1:0", connection_timeout_s=1.0) as dev:
            for _ in range(n):
                data = raw_request(rng)
                fire(dev.address, data)
                fire(agent_http.address, data)
            assert requests.put(f"http://{dev.address}/v1/kv/after", data=b"ok", timeout=5).json() is True
            assert requests.get(f"http://{dev.address}/v1/kv/after?raw", timeout=5).content == b"ok"
            assert requests.get(f"http://{agent_http.address}/scores", timeout=5).status_code == 200
    finally:
        agent_http.stop()
    tally.inputs("raw HTTP requests (devconsul + agent)", 2 * n)


def test_slowloris_is_bounded_and_real_clients_are_served(tally):
    from eas_agent.http import MAX_CONNECTIONS, AgentHttpServer, AgentMetrics

    agent_http = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    agent_http.start()
    threads_before = threading.active_count()
    held = []
    try:
        with DevConsulServer(addr="127.0.0.1:0", max_connections=64, connection_timeout_s=1.0) as server:
            for address in (server.address, agent_http.address):
                host, port = address.rsplit(":", 1)
                for _ in range(150):
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    sock.sendall(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n")  # never finished
                    held.append(sock)
            time.sleep(0.3)
            assert 150 > MAX_CONNECTIONS  # more unfinished connections than either server serves at once
            assert threading.active_count() - threads_before <= 64 + MAX_CONNECTIONS + 10  # capped, not one per socket
            # the attackers' slots time out (devconsul 1 s, the agent 10 s): devconsul serves again within
            wait_for(lambda: _answers(f"http://{server.address}/v1/status/leader"), 5, "devconsul to serve")
    finally:
        for sock in held:
            sock.close()
        agent_http.stop()
    tally.fault("slowloris: 300 unfinished connections")


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.parametrize("length", [b"-1", b"abc", b"+5", b" "])
def test_content_length_that_is_not_a_number_is_400(dev, length):
    """Guards against: -1 read the body to EOF (12 MiB buffered before the 413)."""
    status, data, _ = raw(dev.address, b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
    assert status == 400 and b"Connection: close" in data


def test_chunked_body_is_capped_while_reading(dev):
    chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, data, _ = raw(dev.address, head, chunk * (MAX_BODY // (1 << 20) + 1))
    assert status == 413
    assert requests.get(f"http://{dev.address}/v1/kv/k", timeout=5).status_code == 404


def test_negative_chunk_size_is_400(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n"
    assert raw(dev.address, head)[0] == 400


def test_content_length_and_chunked_together_is_400(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert raw(dev.address, head)[0] == 400


def test_idle_connection_is_closed_after_the_timeout():
    with DevConsulServer(addr="127.0.0.1:0", connection_timeout_s=0.3) as server:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET /v1/status/leader HTTP/1.1\r\n")  # headers never finished
            started = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server (not: held open forever)
            assert time.monotonic() - started < 3


def test_connections_are_capped():
    with DevConsulServer(addr="127.0.0.1:0", max_connections=4) as server:
        host, port = server.address.rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.2)
            status, data, _ = raw(server.address, b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and b"too many connections" in data
            # "All API responses ... will include ... X-Consul-Default-ACL-Policy" (api-structure page)
            assert b"\r\nx-consul-default-acl-policy: allow\r\n" in data.lower()
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # slots come back when the holders go away
            if requests.get(f"http://{server.address}/v1/status/leader", timeout=5).status_code == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("slots never released")


def test_read_cache_ignores_unknown_parameters_and_is_byte_capped(dev):
    base = f"http://{dev.address}"
    for i in range(20):
        requests.put(f"{base}/v1/kv/big/{i}", data=b"v" * 100_000, timeout=5)
    for n in range(40):  # ?junk=N made one 2.7 MB cache entry per request
        assert requests.get(f"{base}/v1/kv/big?recurse&junk={n}", timeout=5).status_code == 200
    assert len(dev.read_cache._entries) <= 2
    dev.read_cache.max_bytes = 3_000_000
    for n in range(3):
        requests.get(f"{base}/v1/kv/big?recurse&keys={n}", timeout=5)
        requests.get(f"{base}/v1/kv/big/?recurse&raw={n}", timeout=5)
    assert dev.read_cache.bytes <= 3_000_000
