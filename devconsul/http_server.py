"""HTTP/1.1 framing and connection limits of the dev server: :class:`HTTPServer` (one daemon thread per
connection, at most ``max_connections``) and :class:`Handler` (request bodies read within bounds, the
answer written with Consul's headers); the endpoints are :mod:`devconsul.router`'s.

Limits (a client that sends an endless or oversized body, or holds connections open, must not exhaust the
server's memory or threads):

- a request body is bounded before it is read: a ``Content-Length`` that is not 1 to 10 ASCII digits is a
  400 (so are two that differ), one over :data:`MAX_BODY` a 413, a chunked body is cut at :data:`MAX_BODY`
  in total, a request with both is a 400 and a Transfer-Encoding other than one ``chunked`` a 501, as Go's
  net/http answers (request smuggling); a request answered before its body was read to the end (any of
  these, a 403, an error while reading) has its connection closed, so nothing after it is read as a request;
- the ACL decision is made from the headers, before the body is read;
- every connection has a socket timeout (:data:`CONNECTION_TIMEOUT_S`: headers, body and keep-alive
  idle), and at most ``max_connections`` are open at once (the next is answered 503 and closed).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devconsul.httpapi import ApiError, Request, Response, ascii_uint
from devconsul.router import authorize, forwarded, route

log = logging.getLogger("devconsul")
MAX_BODY = 8 * 1024 * 1024
CONNECTION_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1024


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # socketserver never joins daemon threads; close_connections/join_threads do
    allow_reuse_address = True
    request_queue_size = 1024  # listen backlog; the default 5 drops bursts of new connections

    def __init__(self, bind, handler, dev):
        self.dev = dev
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self._closing = False
        self._conn_threads: list[threading.Thread] = []
        self._slots = threading.BoundedSemaphore(dev.max_connections)
        if ":" in bind[0]:
            self.address_family = socket.AF_INET6
        super().__init__(bind, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):  # a cap on threads: slowloris cannot exhaust them
            try:
                request.settimeout(1.0)
                policy = self.dev.default_acl_policy().encode()  # on every response, as Consul
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 20\r\n"
                                b"X-Consul-Default-Acl-Policy: " + policy + b"\r\n"
                                b"Connection: close\r\n\r\ntoo many connections")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._process_and_release, args=(request, client_address),
                                  name="devconsul-conn", daemon=True)
        with self._conn_lock:
            self._conn_threads = [t for t in self._conn_threads if t.is_alive()]
            self._conn_threads.append(thread)
        thread.start()

    def _process_and_release(self, request, client_address) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def join_threads(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._conn_lock:
            threads = list(self._conn_threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def track(self, conn: socket.socket, open_: bool) -> None:
        with self._conn_lock:
            (self._connections.add if open_ else self._connections.discard)(conn)
            late = open_ and self._closing  # accepted just before shutdown: close it too
        if late:
            _shut(conn)

    def close_connections(self) -> None:
        with self._conn_lock:
            self._closing = True
            conns = list(self._connections)
        for conn in conns:
            _shut(conn)

    def handle_error(self, request, client_address) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server_version = "devconsul"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.dev.connection_timeout_s  # socket timeout: headers, body, idle keep-alive
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        # The request line may carry ?token=; log the method and path only.
        log.debug("%s %s", self.command, (self.path or "").split("?", 1)[0])

    def do_GET(self) -> None:
        self._serve()

    do_PUT = do_DELETE = do_POST = do_HEAD = do_PATCH = do_GET

    def _framing(self) -> tuple[bool, int | None]:
        """``(chunked, content_length)`` from the headers, as strictly as Go's net/http reads them: one
        Transfer-Encoding, ``chunked`` (any other is a 501), a Content-Length of ASCII digits (two that
        differ, or one with the chunked encoding, a 400). A request refused here has its connection closed:
        where its body ends is unknown, and what follows must not be read as the next request."""
        encodings = self.headers.get_all("Transfer-Encoding") or []
        if encodings and (len(encodings) > 1 or encodings[0].strip().lower() != "chunked"):
            raise ApiError(501, "Unsupported transfer encoding")
        lengths = {text.strip() for text in self.headers.get_all("Content-Length") or []}
        if len(lengths) > 1:
            raise ApiError(400, f"multiple Content-Length headers: {sorted(lengths)!r:.80}")
        if encodings and lengths:
            raise ApiError(400, "Content-Length and chunked Transfer-Encoding together")
        if not lengths:
            return bool(encodings), None
        length_text = lengths.pop()
        length = ascii_uint(length_text, max_digits=10)  # not isdigit: it takes "\u00b2", int() does not
        if length is None:  # negative, empty, signed or not a number: rfile.read(-1) reads to EOF
            raise ApiError(400, f"Invalid Content-Length {length_text[:40]!r}")
        return False, length

    def _read_body(self, chunked: bool, length: int | None) -> bytes:
        """The body, bounded before it is read (a huge Content-Length must not allocate)."""
        if chunked:
            return self._read_chunked()
        if not length:
            return b""
        if length > MAX_BODY:
            raise ApiError(413, f"Request body({length} bytes) too large, max size: {MAX_BODY} bytes")
        body = self.rfile.read(length)
        if len(body) < length:
            raise ApiError(400, f"Request body cut short ({len(body)} of {length} bytes)")
        return body

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ApiError(400, f"Invalid chunk size {size_text[:40]!r}") from None
            if size < 0 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                raise ApiError(400, f"Invalid chunk size {size_text[:40]!r}")
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                raise ApiError(413, f"Request body too large, max size: {MAX_BODY} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) < size:
                raise ApiError(400, "Request body cut short")
            chunks.append(chunk)
            self.rfile.readline(1024)

    def _serve(self) -> None:
        dev = self.server.dev
        unread = True  # a body may still be on the stream: the connection must not be reused
        try:
            chunked, length = self._framing()
            unread = chunked or bool(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            req = Request.parse(self.command, self.path, headers, b"")
            req.client = self.client_address[0] if self.client_address else ""
            authorize(dev, req)  # from the headers: an anonymous or bad token never gets its body read
            req.body = self._read_body(chunked, length)
            unread = False
            if req.method not in ("GET", "HEAD") and not forwarded(dev, req):  # forwarded: the server's store
                dev.refuse_if_not_durable()
            resp = route(dev, req)
            pretty = req.has("pretty")
        except ApiError as exc:
            resp, pretty = Response(exc.status, raw=exc.reason.encode(), content_type="text/plain; charset=utf-8",
                                    headers=exc.headers), False
            if exc.status in (400, 403, 413) and self.command not in ("GET", "HEAD"):
                self.close_connection = True  # a body may be left unread on the stream
        except Exception:
            log.exception("internal error serving %s %s", self.command, self.path.split("?", 1)[0])
            resp, pretty = Response(500, raw=b"internal error", content_type="text/plain; charset=utf-8"), False
        if unread:  # refused before or while its body was read: where the body ends is unknown
            self.close_connection = True
        self._send(resp, pretty)

    def _send(self, resp: Response, pretty: bool) -> None:
        data = resp.encode(pretty)
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Vary", "Accept-Encoding")
            for name, value in resp.headers.items():
                self.send_header(name, value)
            self.send_header("X-Consul-Default-Acl-Policy", self.server.dev.default_acl_policy())
            if self.close_connection:
                self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True
