"""Helpers of the Consul HTTP API contract suite: raw HTTP access, clients, a tiny HTTP endpoint."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import consul
import pytest
import requests

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
