"""The edge's own resource bounds: file descriptors, client connections, header deadlines, capped reads.

- :func:`raise_fd_limit`: at start the soft ``RLIMIT_NOFILE`` goes up to the hard one (systemd's default
  soft limit, 1024, is reached at a few hundred streams: each takes a client and an IU socket).
- :class:`CappedSite`: the listener. Past ``max_connections`` open client connections a new one is answered
  ``503`` (reason ``edge_connections``) and closed at once, so idle or dripping sockets cannot use up the
  edge's descriptors; a connection that has not sent a whole request head within ``header_timeout_s`` of
  opening is closed (later requests on a kept-alive connection are bounded by aiohttp's
  ``keepalive_timeout``, which also closes idle connections).
- :func:`is_local_resource_error`: an ``OSError`` that is the edge's own shortage (out of descriptors,
  buffers, local ports), never the IU's fault: the proxy answers 503 and ejects nobody.
- :func:`read_capped`: an answer's body read up to a byte cap, so a hostile or broken peer cannot make the
  edge buffer hundreds of MiB.
- :class:`MalformedHeadLog`: aiohttp logs a request head it refuses (a header line over the cap, bytes no
  header may hold) with a traceback whose message quotes the client's bytes: a session key, an API key. The
  filter keeps one line (the peer, the error's class and status) without them.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from edge.errors import REASON_HEADER, error_body

log = logging.getLogger("edge.limits")
# errnos that mean the edge itself ran short (descriptors, kernel buffers, local ports, memory)
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.EADDRNOTAVAIL, errno.ENOMEM})
FDS_PER_CONNECTION = 2  # the client's socket and the IU's
FDS_RESERVED = 128  # Consul watchers, agent feeds and announce connections, logs, the listener


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(configured: int, fd_limit: int) -> int:
    """``max_connections``, lowered to what the descriptor limit can carry (each connection may hold an IU
    socket too)."""
    fits = max(1, (fd_limit - FDS_RESERVED) // FDS_PER_CONNECTION)
    if configured > fits:
        log.warning("max_connections %d lowered to %d: the descriptor limit is %d", configured, fits, fd_limit)
    return min(configured, fits)


def is_local_resource_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the OSError it wraps) is the edge's own shortage rather than the IU's failure."""
    seen = 0
    while exc is not None and seen < 4:
        os_error = getattr(exc, "os_error", None)
        if isinstance(os_error, OSError) and os_error.errno in LOCAL_ERRNOS:
            return True
        if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class BodyTooLong(Exception):
    pass


async def read_capped(answer: aiohttp.ClientResponse, cap: int) -> bytes:
    """``answer``'s body, or :class:`BodyTooLong` as soon as it is known to exceed ``cap`` bytes (from its
    Content-Length, or after ``cap`` bytes have arrived); the connection is then closed, not drained."""
    if answer.content_length is not None and answer.content_length > cap:
        answer.close()
        raise BodyTooLong(f"{answer.content_length} bytes announced (more than {cap})")
    chunks, size = [], 0
    while chunk := await answer.content.readany():
        size += len(chunk)
        if size > cap:
            answer.close()
            raise BodyTooLong(f"more than {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _refusal() -> bytes:
    body = json.dumps(error_body(503, "this edge is at its client connection limit", "edge_connections")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" + REASON_HEADER.encode() +
            b": edge_connections\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


class _Refuse(asyncio.Protocol):
    """A connection past the cap: one 503 and the socket is closed, without reading anything."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(_refusal())
        transport.close()


class CappedSite(web.TCPSite):
    """aiohttp's TCP site with a cap on open client connections and a deadline for the first request head.

    ``awaiting_head``: the connections (aiohttp's handlers) whose first request head has not arrived; the
    application removes a connection when its first request starts (:func:`head_arrived`). The cap counts
    connections aiohttp has set up, so a burst of simultaneous connects can pass it by up to one accept
    batch (asyncio accepts up to the listen backlog at once) before the count catches up. ``refused``
    counts connections answered 503 at the cap, ``head_timeouts`` those closed for a late head."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 header_timeout_s: float, awaiting_head: set, **kwargs):
        super().__init__(runner, host, port, **kwargs)
        self.max_connections, self.header_timeout_s = max_connections, header_timeout_s
        self.awaiting_head = awaiting_head
        self.refused = self.head_timeouts = 0

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site; TCPSite.start would open aiohttp's own listener
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def connection() -> asyncio.Protocol:
            if len(server.connections) >= self.max_connections:
                self.refused += 1
                return _Refuse()
            handler = server()
            self.awaiting_head.add(handler)
            loop.call_later(self.header_timeout_s, self._head_deadline, handler)
            return handler

        self._server = await loop.create_server(connection, self._host, self._port, ssl=self._ssl_context,
                                                backlog=self._backlog, reuse_address=self._reuse_address,
                                                reuse_port=self._reuse_port)

    def _head_deadline(self, handler) -> None:
        if handler not in self.awaiting_head:
            return
        self.awaiting_head.discard(handler)
        transport = handler.transport
        if transport is not None and not transport.is_closing():
            self.head_timeouts += 1
            transport.close()


def head_arrived(awaiting_head: set, request: web.BaseRequest) -> None:
    """A request head arrived on its connection: no head deadline for it any more."""
    awaiting_head.discard(request.protocol)


class MalformedHeadLog(logging.Filter):
    """On ``aiohttp.server``: a refused request head is logged as one line without the client's bytes (see the
    module docstring); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "refused a malformed request head from %s: %s (%s)", (
                peer, type(exc).__name__, exc.code)
            record.exc_info = record.exc_text = None
        return True


MALFORMED_HEAD_LOG = MalformedHeadLog()


def quiet_malformed_heads() -> None:
    """Install :class:`MalformedHeadLog` on aiohttp's server logger (once, however often called)."""
    logging.getLogger("aiohttp.server").addFilter(MALFORMED_HEAD_LOG)
