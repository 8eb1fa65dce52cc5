"""HTTP plumbing shared by the endpoint modules: requests, responses, query metadata, ACLs, blocking.

Rules implemented here, from https://developer.hashicorp.com/consul/api-docs/api-structure and
https://developer.hashicorp.com/consul/api-docs/features/blocking:
- reads carry ``X-Consul-Index`` (never 0), ``X-Consul-KnownLeader``, ``X-Consul-LastContact`` and
  ``X-Consul-Effective-Consistency``; ``?stale`` and ``?consistent`` together are a 400;
- ``?index=N&wait=D`` holds the request until the result's index exceeds N, or for D (default 5 min,
  at most 10 min) plus up to D/16 of random jitter; a malformed index or wait is a 400;
- the token comes from ``X-Consul-Token``, ``Authorization: Bearer`` or ``?token=``; with ACLs on, a
  missing token acts as the anonymous token (no rights) and an unknown one gets 403 "ACL not found".
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

from devconsul.durations import parse_duration
from devconsul.watch import Filter

DEFAULT_WAIT = 300.0
MAX_WAIT = 600.0
ANONYMOUS_ACCESSOR = "00000000-0000-0000-0000-000000000002"


def ascii_uint(text: str, max_digits: int = 20) -> int | None:
    """``text`` as a decimal of 1 to ``max_digits`` ASCII digits, else None. Not ``str.isdigit``: it also
    takes "\u00b2" (superscript two, which ``int`` then refuses) and "\u0661" (which ``int`` reads as 1);
    Go's strconv, which Consul parses numbers with, takes ASCII digits only."""
    return int(text) if re.fullmatch(rf"[0-9]{{1,{max_digits}}}", text) else None


class ApiError(Exception):
    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes = b""
    authorized: bool = True  # set by the router: the token may do everything
    filtered: bool = False  # answer carries X-Consul-Results-Filtered-By-ACLs (list endpoints: devconsul.authz)
    sees_nothing: bool = False  # set by the router: the token may read nothing (blocking queries never park)
    client: str = ""  # the client's address (blocking queries are capped per client)

    @classmethod
    def parse(cls, method: str, target: str, headers: dict[str, str], body: bytes) -> Request:
        path, _, qs = target.partition("?")
        return cls(method, unquote(path), parse_qs(qs, keep_blank_values=True), headers, body)

    def has(self, name: str) -> bool:
        return name in self.query

    def get(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0] if values else default

    def flag(self, name: str) -> bool:
        """A presence flag that may carry a boolean (``?passing``, ``?passing=1``, ``?passing=false``)."""
        if name not in self.query:
            return False
        value = self.get(name).lower()
        if value in ("", "1", "t", "true"):
            return True
        if value in ("0", "f", "false"):
            return False
        raise ApiError(400, f"Invalid value for ?{name}")

    def json_body(self) -> object:
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise ApiError(400, f"Request decode failed: {exc}") from exc

    def token(self) -> str:
        token = self.headers.get("x-consul-token", "")
        auth = self.headers.get("authorization", "")
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return token or self.get("token")


@dataclass
class Response:
    status: int = 200
    payload: object = None
    raw: bytes | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self, pretty: bool) -> bytes:
        if self.raw is not None:
            return self.raw
        if pretty:
            return (json.dumps(self.payload, indent=4) + "\n").encode()
        return json.dumps(self.payload, separators=(",", ":")).encode()


def query_meta(req: Request, index: int) -> dict[str, str]:
    consistency = "leader"
    if req.has("stale"):
        consistency = "stale"
    elif req.has("consistent"):
        consistency = "consistent"
    headers = {
        "X-Consul-Index": str(max(index, 1)),
        "X-Consul-KnownLeader": "true",
        "X-Consul-LastContact": "0",
        "X-Consul-Effective-Consistency": consistency,
        "X-Consul-Query-Backend": "blocking-query",
    }
    if req.filtered:
        headers["X-Consul-Results-Filtered-By-ACLs"] = "true"
    return headers


def parse_blocking(req: Request) -> tuple[int, float]:
    """``(min_index, seconds to hold)`` from ``?index`` / ``?wait``; min_index 0 means do not block."""
    if req.has("stale") and req.has("consistent"):
        raise ApiError(400, "Cannot specify ?stale with ?consistent, conflicting semantics.")
    wait = DEFAULT_WAIT
    if req.get("wait"):  # http.go parseWait: an empty value counts as absent
        try:
            wait = parse_duration(req.get("wait"))
        except ValueError:
            raise ApiError(400, "Invalid wait time") from None
    min_index = 0
    if req.get("index"):
        min_index = ascii_uint(req.get("index"))
        if min_index is None or min_index >= 2**64:
            raise ApiError(400, "Invalid index")
    # blockingquery: a wait of zero or less means the default, and it is capped at 10 minutes
    wait = min(wait if wait > 0 else DEFAULT_WAIT, MAX_WAIT)
    return min_index, wait + random.uniform(0, wait / 16)


class ReadCache:
    """Encoded read results by (view, index).

    For every blocking endpoint the index identifies the state of the view it reports (any change to
    the view moves it), so the watchers woken by one write -- 256 of them in the benchmark -- share
    one build and one JSON encoding instead of repeating them. Callers hold the state lock.

    Bounded (a client must not grow it without limit): the key holds only the parameters some endpoint reads (``?junk=N`` cannot make
    a new entry per request), an entry is replaced when its view's index moves, and the cache holds at
    most ``size`` entries and ``max_bytes`` of encoded answers (oldest dropped first).
    """

    KEYED = frozenset(("recurse", "keys", "separator", "seperator", "raw", "passing", "tag", "filter", "pretty"))

    def __init__(self, size: int = 512, max_bytes: int = 64 * 2**20):
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0
        self._entries: dict[tuple, tuple[int, Response]] = {}

    def key(self, req: Request) -> tuple:
        query = tuple(sorted((k, tuple(v)) for k, v in req.query.items() if k in self.KEYED))
        # what a token may see differs: the resolved token is part of the view (devconsul.authz)
        return req.path, query, getattr(getattr(req, "authz", None), "accessor", "")

    def get(self, key: tuple, index: int) -> Response | None:
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] == index else None

    def put(self, key: tuple, index: int, resp: Response) -> None:
        size = len(resp.raw or b"")
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old[1].raw or b"")
        while self._entries and (len(self._entries) >= self.size or self.bytes + size > self.max_bytes):
            _, (_, dropped) = self._pop_oldest()
            self.bytes -= len(dropped.raw or b"")
        self._entries[key] = (index, resp)
        self.bytes += size

    def _pop_oldest(self):
        key = next(iter(self._entries))
        return key, self._entries.pop(key)


def blocking_read(
    server,
    req: Request,
    index_fn: Callable[[], int],
    build: Callable[[], Response],
    flt: Filter,
) -> Response:
    """Run a blocking query: wait for ``index_fn()`` to pass ``?index``, then ``build`` the response."""
    min_index, hold = parse_blocking(req)
    # A token that may read nothing (anonymous under ACLs) has nothing to wait for: answered at once (parked,
    # it would hold a thread for up to 10 minutes, for free).
    if min_index > 0 and not req.sees_nothing:
        def locked_index() -> int:
            with server.state.lock:
                return index_fn()

        with server.blocking_slot(req.client):
            server.state.feed.block(locked_index, min_index, hold, flt)
    cache_key = server.read_cache.key(req)
    with server.state.lock:
        index = index_fn()
        cached = server.read_cache.get(cache_key, index)
        if cached is None:
            cached = build()
            cached.raw = cached.encode(req.has("pretty"))
            server.read_cache.put(cache_key, index, cached)
    return Response(cached.status, raw=cached.raw, content_type=cached.content_type,
                    headers={**query_meta(req, index), **cached.headers})


def permission_denied(permission: str, resource: str) -> ApiError:
    return ApiError(
        403,
        f"Permission denied: token with AccessorID '{ANONYMOUS_ACCESSOR}' lacks permission "
        f"'{permission}' on \"{resource}\"",
    )
