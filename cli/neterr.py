"""One line for a network error: what could not be reached, why in a few words, and what to do.

Library errors (``ConsulUnavailable`` from py-consul/requests, urllib's ``URLError``) carry the whole
exception chain as text (``HTTPConnectionPool(...): Max retries exceeded ... [Errno 111] ...``); a
person needs "connection refused". :func:`reason` walks the chain for the first cause it recognises.
"""

from __future__ import annotations

import socket


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def reason(exc: BaseException) -> str:
    """``connection refused``, ``timed out``, ``name not resolved``, ... (else the innermost message)."""
    text = ""
    for link in _chain(exc):
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, socket.gaierror):
            return "name not resolved"
        if isinstance(link, TimeoutError | socket.timeout):
            return "timed out"
        if isinstance(link, ConnectionResetError | BrokenPipeError):
            return "connection reset"
        text = str(link)
    lowered = text.lower()
    for needle, short in (("refused", "connection refused"), ("timed out", "timed out"),
                          ("timeout", "timed out"), ("name or service not known", "name not resolved"),
                          ("permission denied", "permission denied (ACL token?)"),
                          ("403", "permission denied (ACL token?)"), ("no route", "no route to host")):
        if needle in lowered:
            return short
    return " ".join(text.split())[:160] or type(exc).__name__


def unreachable(what: str, address: str, exc: BaseException, hint: str) -> str:
    """``cannot reach Consul at 127.0.0.1:8500 (connection refused); <hint>``"""
    return f"cannot reach {what} at {address} ({reason(exc)}); {hint}"
