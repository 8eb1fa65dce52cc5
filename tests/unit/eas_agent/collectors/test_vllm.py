"""The vLLM collector's HTTP fetcher (eas_agent/collectors/vllm.py): the scrape timeout is a deadline for
the whole answer, one kept-alive connection, a capped body, an answer that closes its connection read whole."""

from __future__ import annotations

import http.server
import time

import pytest

from eas_agent.vllm_metrics import parse_vllm_metrics
from eas_wire.fetch import FetchError, HttpFetcher
from tests.helpers.hostile import GOOD, DripServer, serving

pytestmark = pytest.mark.unit


def test_scrape_timeout_is_a_deadline_not_a_per_read_timeout():
    server = DripServer()
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=0.15)
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.15 s"):
            fetch()  # guards against: ~4 s for 40 bytes, hours for a 100 KB drip
        assert time.monotonic() - started < 0.5
    finally:
        server.close()


def test_scrapes_reuse_one_kept_alive_connection_with_one_request_each():
    """Before the fix every scrape after the first failed on the kept-alive connection (ResponseNotReady),
    then asked again on a new one: two requests and a connection per scrape, /metrics rendered twice."""
    seen = {"connections": 0, "requests": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            seen["connections"] += 1
            super().setup()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            seen["requests"] += 1
            body = GOOD.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        fetch = HttpFetcher(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
        for _ in range(5):
            assert parse_vllm_metrics(fetch()).num_requests_running == 237.0
        assert seen == {"connections": 1, "requests": 5}


@pytest.mark.parametrize("length", ["\u00b2", None, "exact"])
def test_an_answer_that_closes_the_connection_is_read_whole(length):
    """An answer with "Connection: close" (an HTTP/1.0 exporter or a proxy in front of vLLM): http.client
    closes the connection's socket before the body is read, and the deadline reader read from that closed
    descriptor (EBADF: every scrape failed). A Content-Length of '²' passes str.isdigit() and int() refuses
    it: read as absent, as http.client reads it."""
    body = GOOD.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200)
            if length is not None:
                self.send_header("Content-Length", str(len(body)) if length == "exact" else length)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        fetch = HttpFetcher(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
        assert parse_vllm_metrics(fetch()).num_requests_running == 237.0


def test_scrape_body_is_capped():
    server = DripServer(every_s=0.0, body_bytes=10)
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=1.0, max_body=4)
        with pytest.raises(FetchError, match="byte cap"):
            fetch()
    finally:
        server.close()


def test_dripped_headers_are_cut_at_the_deadline_without_an_abort():
    server = DripServer(header_drip=True)
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=0.15)
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.15 s"):
            fetch()
        assert time.monotonic() - started < 0.4
    finally:
        server.close()
