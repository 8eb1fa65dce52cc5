"""The agent's own HTTP endpoint: ``/metrics`` (prometheus_client), ``GET /scores`` and ``POST /announce``.

``GET /scores`` serves the latest cycle's body in the shape the KV key holds (docs/contracts/score-body.md),
computed by the same code, so an edge following agents directly and one reading Consul see the same numbers.
Every cycle's body gets the next index; a follower either holds a blocking query (``?index=N&wait_s=S``:
each new body within a network round trip, without polling and without writing anything to Consul) or a
stream (``?stream=1``, the edge's push channel: each body costs one write per stream, where a blocking query
costs an HTTP request to parse, a thread to wake and an answer to frame per follower per body; with 16 edges
and the announce channel's extra bodies that was most of the agent's CPU, bench/push_fanout.py). A stream
follower that falls behind gets the latest body, not every one in between; a stream also ends when a write
stalls for the connection timeout. The framing, limits and errors: docs/contracts/scores-stream.md.

``POST /announce`` (only with ``announce_token_file`` configured; 404 otherwise) is the announce channel's
receiving end (eas_agent/announce.py); its authentication, limits and answers: docs/contracts/announce.md.
The agent then serves a new ``/scores`` body at once, which answers the edges' waiting queries. Answers
always carry a Content-Length; one whose request body was left unread also closes the connection
(``Connection: close``), the others keep it alive for the edge's next batch.
"""

from __future__ import annotations

import hmac
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from eas_wire.announce import ANNOUNCE_PATH, MAX_BATCH_BYTES, AnnounceError, answer_json
from eas_wire.scorebody import STATUSES, ScoreBody
from eas_wire.stream import (
    HEARTBEAT,
    INDEX_HEADER,
    MAX_STREAM_S,
    SCORES_PATH,
    STREAM_CONTENT_TYPE,
    STREAM_HEARTBEAT_S,
    blocking_args,
    frame,
    wants_stream,
)

CONNECTION_TIMEOUT_S = 10.0  # headers, body and keep-alive idle; an edge poller asks every 200 ms
# Each edge holds two connections to each agent (its /scores long poll and its /announce sender): 16 edges
# are 32, and a restarted edge's old ones linger until their wait or CONNECTION_TIMEOUT_S ends (up to 64),
# plus Prometheus and an operator's `clusterctl scores`. A connection is one mostly idle thread.
MAX_CONNECTIONS = 128


class QuietHTTPServer(ThreadingHTTPServer):
    """A client that gave up (timeout) or went away is normal here: no traceback on stderr for it."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, TimeoutError)):
            super().handle_error(request, client_address)


class QuietHandler(BaseHTTPRequestHandler):
    """Request handler with one way to answer (``_send``) and no access log (the agent's and the simulated
    vLLM's servers both use it)."""

    def _send(self, code: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep logs and test output clean
        pass


class BoundedHTTPServer(QuietHTTPServer):
    """The agent's server: at most ``max_connections`` connections are served at once (a thread each); the next is closed at
    once, so clients that open connections and never finish a request (slowloris) cannot grow the agent's
    threads without bound. Each connection has a socket timeout (the handler's ``timeout``).
    """

    max_connections = MAX_CONNECTIONS
    # socketserver's default listen backlog is 5: 16 edges reconnecting at once (an agent restart) overflowed
    # it, and the connections it dropped waited out a SYN retransmission (1 s, the edges' connect timeout)
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class AgentMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "eas_agent_cycle_seconds",
            "Time to collect and score all IUs once.",
            buckets=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
            registry=r,
        )
        self.collector_errors = Counter(
            "eas_agent_collector_errors", "Collector failures.", ["collector", "iu"], registry=r
        )
        self.consul_writes = Counter(
            "eas_agent_consul_writes", "KV writes of this node's scores.", registry=r
        )
        self.consul_skips = Counter(
            "eas_agent_consul_skips",
            "Cycles with no KV write (no level change, heartbeat not due, or backing off).",
            registry=r,
        )
        self.consul_errors = Counter("eas_agent_consul_errors", "Failed Consul calls.", registry=r)
        self.score = Gauge(
            "eas_agent_score", "Last score per IU (NaN when unknown).", ["iu", "profile"], registry=r
        )
        self.status = Gauge(
            "eas_agent_iu_status", "1 for the IU's current check status.", ["iu", "status"], registry=r
        )
        self.announcements = Counter(
            "eas_agent_announcements",
            "Announcements received on POST /announce: accepted, or the reason one was ignored.",
            ["result"],
            registry=r,
        )
        self.announce_batches = Counter(
            "eas_agent_announce_batches", "POST /announce requests by HTTP status.", ["code"], registry=r
        )

        # per IU: (its score gauge, its status gauges, the status they show); labels() is looked up once
        # per IU instead of four times a cycle (it was the cycle's largest cost outside scraping and parsing)
        self._gauges: dict[tuple[str, str], tuple[Gauge, dict[str, Gauge], list]] = {}

    def observe_scores(self, profile: str, results: dict) -> None:
        for iu, result in results.items():
            gauges = self._gauges.get((iu, profile))
            if gauges is None:
                statuses = {status: self.status.labels(iu, status) for status in STATUSES}
                gauges = self._gauges[(iu, profile)] = (self.score.labels(iu, profile), statuses, [None])
            score, statuses, shown = gauges
            score.set(math.nan if result.score is None else result.score)
            if result.status != shown[0]:
                for status, gauge in statuses.items():
                    gauge.set(1 if result.status == status else 0)
                shown[0] = result.status


# a parsed batch -> (accepted, ignored by reason, the ignored ones' sequence numbers)
Announce = Callable[[object], tuple[int, dict, list]]


def bearer_matches(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` holds ``token`` (compared in constant time)."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode())


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


class AgentHttpServer:
    def __init__(self, host: str, port: int, metrics: AgentMetrics, *, announce: Announce | None = None,
                 announce_token: str | None = None):
        """``announce`` (the agent's :meth:`~eas_agent.agent.Agent.announce` at its clock) serves ``POST
        /announce`` when ``announce_token`` is set; without a token the channel is off (404)."""
        self.metrics = metrics
        self.announce, self.announce_token = announce, announce_token
        self.scores_json = b"{}"  # the latest ScoreBody, serialized once when set
        self.index = 0  # of scores_json; +1 per set_scores (the blocking query's index)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closing = False  # stop(): streams end
        self.server = BoundedHTTPServer((host, port), self._handler())
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="eas-agent-http",
            daemon=True,
        )

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def set_scores(self, body: ScoreBody) -> None:
        encoded = body.dumps().encode()
        with self.lock:
            self.scores_json = encoded
            self.index += 1
            self.changed.notify_all()

    def stream_bodies(self, write, heartbeat_s: float = STREAM_HEARTBEAT_S, max_s: float = MAX_STREAM_S) -> None:
        """Write each new body as one line to ``write`` (the first as soon as a cycle has made one; an empty
        line after ``heartbeat_s`` without one) until ``max_s`` has passed, the server stops, or ``write``
        raises (the reader went away or stalled: the handler's socket timeout)."""
        deadline = time.monotonic() + max_s
        index = 0  # the index before the first cycle's body: wait for a body, never stream "{}"
        while True:
            with self.lock:
                self.changed.wait_for(lambda seen=index: self.index != seen or self.closing,
                                      timeout=max(0.0, min(heartbeat_s, deadline - time.monotonic())))
                if self.closing:
                    return
                fresh = self.index != index
                index, body = self.index, self.scores_json
            write(frame(body) if fresh else HEARTBEAT)
            if time.monotonic() >= deadline:
                return

    def scores_after(self, index: int | None, wait_s: float) -> tuple[int, bytes]:
        """(index, JSON body) of the latest cycle, waiting up to ``wait_s`` while ``index`` is the current."""
        with self.lock:
            if index is not None and index == self.index:
                self.changed.wait_for(lambda: self.index != index, timeout=wait_s)
            return self.index, self.scores_json

    def _handler(self):
        owner = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"
            timeout = CONNECTION_TIMEOUT_S
            # headers and body go out in two writes; with Nagle on, keep-alive clients wait for a delayed ACK
            disable_nagle_algorithm = True

            def do_GET(self):  # noqa: N802
                if self.path.startswith("/metrics"):
                    return self._send(
                        200, generate_latest(owner.metrics.registry), "text/plain; version=0.0.4"
                    )
                if self.path.startswith(SCORES_PATH):
                    query = urlsplit(self.path).query
                    if wants_stream(query):
                        return self._stream()
                    index, body = owner.scores_after(*blocking_args(query))
                    return self._send(200, body, "application/json", {INDEX_HEADER: str(index)})
                return self._send(404, b"not found\n", "text/plain")

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", STREAM_CONTENT_TYPE)
                self.send_header("Cache-Control", "no-store")
                self.send_header("Connection", "close")  # the body ends where the connection does
                self.end_headers()
                self.close_connection = True
                owner.stream_bodies(self.wfile.write)

            def do_POST(self):  # noqa: N802
                code, body, read = self._announce()
                owner.metrics.announce_batches.labels(str(code)).inc()
                headers = {}
                if not read:  # the request body is still on the socket: this connection cannot carry another
                    self.close_connection = True
                    headers["Connection"] = "close"
                if code == 401:
                    headers["WWW-Authenticate"] = "Bearer"
                return self._send(code, body, "application/json", headers)

            def _announce(self) -> tuple[int, bytes, bool]:
                """(status, JSON answer, whether the request body was read)."""
                if urlsplit(self.path).path != ANNOUNCE_PATH:
                    return 404, _error(f"not found (POST serves {ANNOUNCE_PATH} only)"), False
                if owner.announce_token is None or owner.announce is None:
                    return 404, _error("the announce channel is off (the agent config sets no "
                                       "announce_token_file)"), False
                if not bearer_matches(self.headers.get("Authorization"), owner.announce_token):
                    return 401, _error("missing or wrong Authorization: Bearer token"), False
                raw = self.headers.get("Content-Length")
                if raw is None:
                    return 411, _error("Content-Length required"), False
                raw = raw.strip()
                if not (raw.isascii() and raw.isdigit()):
                    return 400, _error(f"Content-Length {raw[:40]!r} is not a byte count"), False
                length = int(raw)
                if length > MAX_BATCH_BYTES:
                    return 413, _error(f"body of {length} bytes (at most {MAX_BATCH_BYTES})"), False
                data = self.rfile.read(length)
                if len(data) < length:
                    return 400, _error(f"body ended after {len(data)} of {length} bytes"), False
                try:
                    obj = json.loads(data)
                except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
                    return 400, _error(f"body is not JSON: {str(exc)[:200]}"), True
                try:
                    accepted, ignored, ignored_seqs = owner.announce(obj)
                except AnnounceError as exc:
                    return 400, _error(str(exc)), True
                except Exception as exc:  # a bug: this batch is lost, the connection and the agent go on
                    return 500, _error(f"agent error: {type(exc).__name__}"), True
                counter = owner.metrics.announcements
                if accepted:
                    counter.labels("accepted").inc(accepted)
                for reason, n in ignored.items():
                    counter.labels(reason).inc(n)
                return 200, answer_json(accepted, ignored, ignored_seqs), True

        return Handler

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.closing = True
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
