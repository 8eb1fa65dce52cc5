"""Helpers of the Consul HTTP API contract suite: raw HTTP access, clients, a tiny HTTP endpoint."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import consul
import pytest
import requests

DEV_ACL_TOKEN = "c0ffee00-0000-4000-8000-000000000001"  # the management token of the ``dev_acl`` fixture
REAL_CONSUL = bool(os.environ.get("CONSUL_HTTP_ADDR"))
needs_dev_server = pytest.mark.skipif(REAL_CONSUL, reason="configures or restarts the dev server itself")


class Api:
    """Raw HTTP access (status codes and headers), beside the py-consul client."""

    def __init__(self, addr: str, token: str | None = None):
        self.base = f"http://{addr}"
        self.session = requests.Session()
        self.token = token

    def request(self, method: str, path: str, token: str | None = None, **kwargs) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}) or {})
        token = token if token is not None else self.token
        if token:
            headers.setdefault("X-Consul-Token", token)
        kwargs.setdefault("timeout", 30)
        return self.session.request(method, self.base + path, headers=headers, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, **kwargs) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs) -> requests.Response:
        return self.request("DELETE", path, **kwargs)


def _client(addr: str, token: str | None = None) -> consul.Consul:
    host, _, port = addr.rpartition(":")
    return consul.Consul(host=host, port=int(port), token=token)


def client_for(server, token: str | None = None) -> consul.Consul:
    return _client(server.address, token)


class TinyHTTP:
    """A local HTTP endpoint for HTTP checks; ``status`` is what it answers next."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"ok"
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/health"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> object:
    """Poll ``predicate`` (a test-side observation of the server) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def eventually(fetch: Callable[[], object], accept: Callable[[object], bool], timeout: float = 3.0) -> object:
    """The first ``fetch()`` result that ``accept`` takes, else the last one (for the assertion message).

    A Consul agent answers an agent write before anti-entropy has copied it into the catalog, so reads
    of /v1/health and /v1/catalog right after an agent write may briefly show the previous state.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if accept(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


class Cleanup:
    """Service IDs and KV prefixes a test creates; removed at teardown (matters on a real Consul)."""

    def __init__(self) -> None:
        self.services: list[str] = []
        self.prefixes: list[str] = []


def raw(address: str, head: bytes, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes, float]:
    """Send ``head`` (and ``body``) on a new connection; (status, response bytes, seconds to answer)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(head)
        if body:
            try:
                sock.sendall(body)
            except OSError:
                pass
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - started
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data, took
