"""The agent's own HTTP endpoint: ``/metrics`` (prometheus_client), ``GET /scores`` and ``POST /announce``.

``GET /scores`` serves the latest cycle's body in the shape the KV key holds (docs/contracts/score-body.md),
computed by the same code, so an edge following agents directly and one reading Consul see the same numbers.
Every cycle's body gets the next index; a follower either holds a blocking query (``?index=N&wait_s=S``:
each new body within a network round trip, without polling and without writing anything to Consul) or a
stream (``?stream=1``, the edge's push channel: each body costs one write per stream, where a blocking query
costs an HTTP request to parse, a thread to wake and an answer to frame per follower per body; with 16 edges
and the announce channel's extra bodies that was most of the agent's CPU, bench/push_fanout.py). A stream
follower that falls behind gets the latest body, not every one in between; a stream also ends when a write
stalls for the connection timeout. A stream's line carries only the relayed placements (eas_wire/placed.py)
not yet written to that stream; a blocking query's answer carries the whole relay window. The framing, limits
and errors: docs/contracts/scores-stream.md.

``POST /announce`` (only with ``announce_keys_file`` configured; 404 otherwise) is the announce channel's
receiving end (eas_agent/announce.py): batches signed by an edge key (eas_agent/announce_keys.py); its
authentication, limits and answers: docs/contracts/announce.md.

Who is served (docs/contracts/scores-stream.md, "Limits"): anyone on the node network reaches this port, so
one client address holds at most :data:`MAX_CONNECTIONS_PER_ADDRESS` connections and
:data:`MAX_STREAMS_PER_ADDRESS` anonymous streams, a request head must arrive within
:data:`HEAD_DEADLINE_S` however slowly it drips, an anonymous stream ends after :data:`ANONYMOUS_MAX_STREAM_S`,
and :data:`RESERVED_FOR_EDGES` connections beyond :data:`MAX_CONNECTIONS` serve only requests signed by an
edge key (eas_agent/serving.py).
The agent then serves a new ``/scores`` body at once, which answers the edges' waiting queries. Answers
always carry a Content-Length; one whose request body was left unread also closes the connection
(``Connection: close``), the others keep it alive for the edge's next batch.
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from eas_agent.announce import EdgeKeyMismatch
from eas_agent.announce_keys import EdgeKeys
from eas_agent.serving import (
    HEAD_DEADLINE_S,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_ADDRESS,
    RESERVED_FOR_EDGES,
    BoundedHTTPServer,
    DeadlineReader,
    QuietHandler,
    QuietHTTPServer,  # noqa: F401 - re-exported
)
from eas_wire.announce import ANNOUNCE_PATH, MAX_BATCH_BYTES, AnnounceError, answer_json
from eas_wire.placed import Placement, first_unsent
from eas_wire.scorebody import STATUSES, ScoreBody, dumps
from eas_wire.signing import SIGNATURE_HEADER, SignatureError, request_message
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

CONNECTION_TIMEOUT_S = 10.0  # body and keep-alive idle, each read; an edge poller asks every 200 ms
MAX_STREAMS_PER_ADDRESS = 2  # anonymous /scores streams one client address may hold (an operator's, a test's)
ANONYMOUS_MAX_STREAM_S = 30.0  # an anonymous follower reconnects; a signed one (an edge) keeps MAX_STREAM_S


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


# (a parsed batch, the key id that signed it) -> (accepted, ignored by reason, the ignored ones' sequence numbers)
Announce = Callable[[object, str], tuple[int, dict, list]]


def with_placed(bare: bytes, fragments: tuple[bytes, ...]) -> bytes:
    """A body's compact JSON ``bare`` (without ``placed``) with ``placed`` the serialized ``fragments``: the
    same bytes :meth:`ScoreBody.dumps` writes (``placed`` is its last key)."""
    if not fragments:
        return bare
    return b"".join((bare[:-1], b',"placed":[', b",".join(fragments), b"]}"))


def stream_line(bare: bytes, placed: tuple[Placement, ...], fragments: tuple[bytes, ...], sent: int
                ) -> tuple[bytes, int]:
    """(the stream line of a body, the relay number of the last placement written with it): ``bare`` with the
    serialized ``fragments`` of the ``placed`` numbered after ``sent``."""
    line = frame(with_placed(bare, fragments[first_unsent(placed, sent):]))
    return line, placed[-1].seq if placed else sent


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


class AgentHttpServer:
    def __init__(self, host: str, port: int, metrics: AgentMetrics, *, announce: Announce | None = None,
                 edge_keys: EdgeKeys | None = None, clock=time.time, max_connections: int = MAX_CONNECTIONS,
                 reserved_for_edges: int = RESERVED_FOR_EDGES, per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                 streams_per_address: int = MAX_STREAMS_PER_ADDRESS):
        """``announce`` (the agent's :meth:`~eas_agent.agent.Agent.announce` at its clock) serves ``POST
        /announce`` when ``edge_keys`` is set; without keys the channel is off (404) and no request is
        taken as an edge's. The connection limits: eas_agent/serving.py."""
        self.metrics = metrics
        self.announce, self.edge_keys, self.clock = announce, edge_keys, clock
        self.streams_by_address: dict[str, int] = {}  # anonymous streams held, per client address
        self.streams_per_address = streams_per_address
        self.edge_streams = 0  # /scores streams held by edges (signed requests): the publisher writes less then
        self.scores_json = b"{}"  # the latest ScoreBody, serialized once when set
        # the same body without its placements, and its placements each serialized once: a stream's line
        # is the bare body with the placements not yet written to that stream (stream_bodies)
        self.scores_bare = b"{}"
        self.scores_placed: tuple[Placement, ...] = ()
        self.scores_fragments: tuple[bytes, ...] = ()
        self.index = 0  # of scores_json; +1 per set_scores (the blocking query's index)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closing = False  # stop(): streams end
        self.server = BoundedHTTPServer((host, port), self._handler())
        self.server.max_connections, self.server.reserved = max_connections, reserved_for_edges
        self.server.per_address = per_address
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
        obj = body.to_json()
        obj.pop("placed", None)
        bare = dumps(obj).encode()
        fragments = tuple(dumps(p.to_json()).encode() for p in body.placed)
        encoded = with_placed(bare, fragments)
        with self.lock:
            self.scores_json = encoded
            self.scores_bare, self.scores_placed, self.scores_fragments = bare, body.placed, fragments
            self.index += 1
            self.changed.notify_all()

    def stream_bodies(self, write, heartbeat_s: float = STREAM_HEARTBEAT_S, max_s: float = MAX_STREAM_S) -> None:
        """Write each new body as one line to ``write`` (the first as soon as a cycle has made one; an empty
        line after ``heartbeat_s`` without one) until ``max_s`` has passed, the server stops, or ``write``
        raises (the reader went away or stalled: the handler's socket timeout). A line carries the relayed
        placements numbered after the last one written to this stream: each placement reaches each follower
        once (a reconnected follower gets the window again and skips what it holds)."""
        deadline = time.monotonic() + max_s
        index = 0  # the index before the first cycle's body: wait for a body, never stream "{}"
        sent = 0  # the relay number of the last placement written to this stream
        while True:
            with self.lock:
                self.changed.wait_for(lambda seen=index: self.index != seen or self.closing,
                                      timeout=max(0.0, min(heartbeat_s, deadline - time.monotonic())))
                if self.closing:
                    return
                fresh = self.index != index
                index, bare, placed, fragments = (self.index, self.scores_bare, self.scores_placed,
                                                  self.scores_fragments)
            if not fresh:
                write(HEARTBEAT)
            else:
                line, sent = stream_line(bare, placed, fragments, sent)
                write(line)
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
            holds_anonymous = False  # this connection holds one of the slots anyone may use

            def setup(self):
                super().setup()
                self.reader = DeadlineReader(self.connection, CONNECTION_TIMEOUT_S)
                self.rfile = io.BufferedReader(self.reader)

            def handle_one_request(self):
                self.reader.expect_head(HEAD_DEADLINE_S)
                try:
                    super().handle_one_request()
                except TimeoutError:  # the head's deadline or a read's timeout: the connection ends
                    self.close_connection = True

            def parse_request(self) -> bool:
                ok = super().parse_request()
                self.reader.expect_head(None)  # the head is in: the body's reads have their own timeout
                if ok and not self.signed() and not self.holds_anonymous:
                    self.holds_anonymous = owner.server.anonymous_slot()
                    if not self.holds_anonymous:
                        self.close_connection = True
                        self._send(503, _error("busy: only edges are served now"), "application/json",
                                   {"Connection": "close", "Retry-After": "1"})
                        return False
                return ok

            def finish(self):
                super().finish()
                if self.holds_anonymous:
                    owner.server.release_anonymous()

            def signed(self) -> bool:
                """The request carries a valid edge signature: over its body for POST (checked by the
                announce handler), over its method and path for GET."""
                header = self.headers.get(SIGNATURE_HEADER)
                if owner.edge_keys is None or not owner.edge_keys.known(header):
                    return False
                if self.command == "POST":
                    return True  # the body's signature is checked before anything is counted
                try:
                    owner.edge_keys.check(header, request_message(self.command, self.path), owner.clock())
                except SignatureError:
                    return False
                return True

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
                anonymous = self.holds_anonymous
                address = self.client_address[0]
                if anonymous:
                    with owner.lock:
                        held = owner.streams_by_address.get(address, 0)
                        if held < owner.streams_per_address:
                            owner.streams_by_address[address] = held + 1
                    if held >= owner.streams_per_address:
                        self.close_connection = True
                        return self._send(429, _error(f"at most {owner.streams_per_address} streams per client "
                                                      "address"), "application/json", {"Connection": "close"})
                if not anonymous:
                    with owner.lock:
                        owner.edge_streams += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", STREAM_CONTENT_TYPE)
                    self.send_header("Cache-Control", "no-store")
                    self.send_header("Connection", "close")  # the body ends where the connection does
                    self.end_headers()
                    self.close_connection = True
                    owner.stream_bodies(self.wfile.write, max_s=ANONYMOUS_MAX_STREAM_S if anonymous else MAX_STREAM_S)
                finally:
                    with owner.lock:
                        if anonymous:
                            owner.streams_by_address[address] -= 1
                            if not owner.streams_by_address[address]:
                                del owner.streams_by_address[address]
                        else:
                            owner.edge_streams -= 1

            def do_POST(self):  # noqa: N802
                code, body, read = self._announce()
                owner.metrics.announce_batches.labels(str(code)).inc()
                headers = {}
                # the request body still on the socket: this connection cannot carry another; a refused
                # signature: a connection taken from the edges' reserve is not kept by a forger
                if not read or code == 401:
                    self.close_connection = True
                    headers["Connection"] = "close"
                return self._send(code, body, "application/json", headers)

            def _announce(self) -> tuple[int, bytes, bool]:
                """(status, JSON answer, whether the request body was read)."""
                if urlsplit(self.path).path != ANNOUNCE_PATH:
                    return 404, _error(f"not found (POST serves {ANNOUNCE_PATH} only)"), False
                if owner.edge_keys is None or owner.announce is None:
                    return 404, _error("the announce channel is off (the agent config sets no "
                                       "announce_keys_file)"), False
                signature = self.headers.get(SIGNATURE_HEADER)
                if not owner.edge_keys.known(signature):
                    return 401, _error(f"missing {SIGNATURE_HEADER}, or not by a key of this agent's "
                                       "edges"), False
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
                    key = owner.edge_keys.check(signature, data, owner.clock())
                except SignatureError as exc:
                    return 401, _error(str(exc)), True
                try:
                    obj = json.loads(data)
                except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
                    return 400, _error(f"body is not JSON: {str(exc)[:200]}"), True
                try:
                    accepted, ignored, ignored_seqs = owner.announce(obj, key)
                except EdgeKeyMismatch as exc:
                    return 403, _error(str(exc)), True
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
