"""One HTTP GET within a deadline, over a kept-alive connection: how the agent scrapes vLLM's ``/metrics`` and
how a reader polls agents' ``GET /scores`` (edge/pool/watch.py). Standard library only."""

from __future__ import annotations

import http.client
import io
import math
import socket
import time
from collections.abc import Callable
from urllib.parse import urlparse


class FetchError(Exception):
    pass


MAX_BODY = 8 * 2**20  # a real vLLM scrape is 20-200 KB; more is not a vLLM exporter


class _DeadlineReader(io.RawIOBase):
    """The socket as the response reads it: every read waits at most until the GET's deadline, so a server
    dripping its status line and headers a byte at a time is cut off there (a per-read timeout is not)."""

    def __init__(self, sock: socket.socket, deadline: float, clock: Callable[[], float]):
        super().__init__()
        self.sock, self.deadline, self.clock = sock, deadline, clock

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.sock.close()
        super().close()

    def readinto(self, buffer) -> int:
        left = self.deadline - self.clock()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _DeadlineSocket:
    """What :class:`http.client.HTTPResponse` is given instead of the socket: it only calls ``makefile``."""

    def __init__(self, sock: socket.socket, deadline: float, clock: Callable[[], float]):
        self.sock, self.deadline, self.clock = sock, deadline, clock

    def makefile(self, mode: str) -> io.BufferedReader:
        # its own descriptor, as socket.makefile keeps the socket open for its file: http.client closes the
        # connection's socket as soon as an answer says "Connection: close", before its body is read
        return io.BufferedReader(_DeadlineReader(self.sock.dup(), self.deadline, self.clock))


class _DeadlineConnection:
    """Mixed into http.client's connections: responses read against ``deadline`` (set per GET)."""

    deadline = math.inf
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def response_class(self, sock, *args, **kwargs) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_DeadlineSocket(sock, self.deadline, self.clock), *args, **kwargs)


class _HTTPConnection(_DeadlineConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


class HttpFetcher:
    """GET one URL over a kept-alive connection (a new TCP connection per 200 ms cycle costs more CPU).

    ``timeout_s`` is a deadline for the whole GET (connect, headers, body), not a per-read socket timeout: a
    server dripping one byte per read would otherwise hold the scrape for as long as it likes. Every read of
    the answer (status line, headers, body) waits at most until the deadline, so the GET ends by then on the
    caller's own thread (the agent scrapes a node's only IU that way); the body is also capped in bytes.
    :meth:`abort` (the agent calls it on a scrape still running at its deadline) shuts the socket down, so a
    read blocked anyway fails at once.
    """

    def __init__(self, url: str, timeout_s: float, max_body: int = MAX_BODY, clock=time.monotonic):
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.https = parsed.scheme == "https"
        self.path = (parsed.path or "/metrics") + (f"?{parsed.query}" if parsed.query else "")
        self.timeout_s, self.max_body, self.clock = timeout_s, max_body, clock
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        cls = _HTTPSConnection if self.https else _HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_s)
        conn.clock = self.clock
        return conn

    def _where(self) -> str:
        return f"GET {self.host}:{self.port}{self.path}"

    def __call__(self) -> str:
        deadline = self.clock() + self.timeout_s
        for attempt in (1, 2):  # a kept-alive connection the server closed fails once; retry on a fresh one
            if self.conn is None:
                self.conn = self._connect()
            self.conn.deadline = deadline
            if self.conn.sock is None:  # connecting (a retry's too) ends by the deadline as well
                self.conn.timeout = max(0.001, deadline - self.clock())
            try:
                self.conn.request("GET", self.path)
                response = self.conn.getresponse()
                body = self._read_body(response, deadline)
            except (OSError, http.client.HTTPException, ValueError, FetchError) as exc:
                self.close()
                if isinstance(exc, FetchError):
                    raise
                if isinstance(exc, TimeoutError) or self.clock() >= deadline:
                    raise FetchError(
                        f"{self._where()}: no complete answer within {self.timeout_s:g} s ({exc or type(exc).__name__})"
                    ) from exc
                if attempt == 2:
                    raise FetchError(f"{self._where()}: {exc or type(exc).__name__}") from exc
                continue
            if response.status != 200:
                raise FetchError(f"{self._where()}: HTTP {response.status}")
            return body.decode("utf-8", "replace")
        raise AssertionError("unreachable")

    def _read_body(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        length = response.getheader("Content-Length")
        # ASCII digits only: str.isdigit() also takes '²', which int() then refuses (http.client itself reads
        # such a length as absent, and so does this; the byte cap below still holds)
        if length is not None and length.isascii() and length.isdigit() and int(length) > self.max_body:
            raise FetchError(f"{self._where()}: body of {length} bytes is over the {self.max_body} byte cap")
        chunks, total = [], 0
        while True:
            if self.clock() >= deadline:
                raise FetchError(f"{self._where()}: no complete answer within {self.timeout_s:g} s")
            chunk = response.read1(65536)  # waits at most until the deadline (_DeadlineReader)
            if not chunk:
                # read1 at the end of a Content-Length body returns b"" without closing the response, and
                # http.client then refuses the next request on this connection (ResponseNotReady): every
                # scrape sent a second request on a new connection (vLLM rendered /metrics twice). Closing
                # the response keeps the kept-alive connection usable.
                response.close()
                return b"".join(chunks)
            total += len(chunk)
            if total > self.max_body:
                raise FetchError(f"{self._where()}: body over the {self.max_body} byte cap")
            chunks.append(chunk)

    def abort(self) -> None:
        """From another thread: make a blocked read fail now (the next call reconnects)."""
        conn = self.conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
