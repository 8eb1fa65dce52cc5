"""The agent's HTTP server under attack from the node network: who gets a thread, for how long. (It
imports nothing of the project: the simulated vLLM server uses its quiet server and handler too.)

Threat: the agent's port is reachable from every host of the node network (a compromised GPU node among
them). Connections that never finish a request, or ``/scores`` streams that are never read, must not lock
the edges and Prometheus out. So:

- one client address holds at most :data:`MAX_CONNECTIONS_PER_ADDRESS` connections (the next is closed at
  once);
- a request head (request line and headers) must be complete within :data:`HEAD_DEADLINE_S` of its first
  byte being awaited, however slowly it drips (a per-read timeout alone is no deadline);
- :data:`MAX_CONNECTIONS` connections serve anyone; :data:`RESERVED_FOR_EDGES` more are accepted but answer
  only requests signed by an edge key (the handler decides once the head is read: ``anonymous_slot``).
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Each edge holds two connections to each agent (its /scores stream and its /announce sender): 16 edges
# are 32, and a restarted edge's old ones linger until their wait or the connection timeout ends (up to
# 64), plus Prometheus and an operator's `clusterctl scores`. A connection is one mostly idle thread.
MAX_CONNECTIONS = 128
RESERVED_FOR_EDGES = 64  # served only to requests signed by an edge key, when the anonymous ones are full
MAX_CONNECTIONS_PER_ADDRESS = 8  # an edge needs 2 (and 2 more while a restarted edge's old ones linger)
HEAD_DEADLINE_S = 5.0  # a request head is one packet; 5 s is a stalled or hostile client


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


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each with at most ``timeout_s``; after :meth:`expect_head`, the reads from the
    first byte of the head on end at an absolute deadline ``head_s`` later (TimeoutError), however slowly
    the bytes drip. A kept-alive connection idles up to ``timeout_s`` before its next head."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock, self.timeout_s = sock, timeout_s
        self.head_s: float | None = None
        self.deadline: float | None = None

    def expect_head(self, head_s: float | None) -> None:
        """The next bytes start a request head (``head_s``), or the head is in (None: no deadline)."""
        self.head_s, self.deadline = head_s, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        timeout = self.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("request head deadline passed")
        self.sock.settimeout(timeout)
        n = self.sock.recv_into(buffer)
        if n and self.head_s is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.head_s
        return n


class BoundedHTTPServer(QuietHTTPServer):
    """At most ``max_connections + reserved`` connections at once (a thread each), at most
    ``per_address`` from one client address; ``anonymous_slot``/``release_anonymous`` hold the first
    ``max_connections`` for requests anyone may make."""

    max_connections = MAX_CONNECTIONS
    reserved = RESERVED_FOR_EDGES
    per_address = MAX_CONNECTIONS_PER_ADDRESS
    # socketserver's default listen backlog is 5: 16 edges reconnecting at once (an agent restart) overflowed
    # it, and the connections it dropped waited out a SYN retransmission (1 s, the edges' connect timeout)
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        self._count_lock = threading.Lock()
        self.by_address: Counter[str] = Counter()
        self.total = 0
        self.anonymous = 0
        self.refused: Counter[str] = Counter()  # connections closed at once, by reason (for tests and metrics)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        address = client_address[0]
        with self._count_lock:
            if self.total >= self.max_connections + self.reserved:
                reason = "full"
            elif self.by_address[address] >= self.per_address:
                reason = "per_address"
            else:
                reason = None
                self.total += 1
                self.by_address[address] += 1
        if reason is not None:
            self.refused[reason] += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(address)
            raise

    def _release(self, address: str) -> None:
        with self._count_lock:
            self.total -= 1
            self.by_address[address] -= 1
            if not self.by_address[address]:
                del self.by_address[address]

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(client_address[0])

    def anonymous_slot(self) -> bool:
        """Take one of the slots anyone may use (False: all taken; only signed requests are served now)."""
        with self._count_lock:
            if self.anonymous >= self.max_connections:
                return False
            self.anonymous += 1
            return True

    def release_anonymous(self) -> None:
        with self._count_lock:
            self.anonymous -= 1
