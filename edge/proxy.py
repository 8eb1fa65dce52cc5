"""The reverse proxy (aiohttp): OpenAI-compatible endpoints in front of the pool, plus /metrics and /healthz.

``POST /v1/completions`` and ``/v1/chat/completions``: the body is read (bounded), parsed (a malformed one
is a 400 carrying the parse error, in vLLM's error shape), sized (:mod:`edge.tokens`), routed
(:class:`edge.routing.Router`) and sent unchanged to the chosen IU; the answer is passed through chunk by
chunk as it arrives (SSE streams and plain JSON alike; nothing is buffered), with ``X-Eas-IU`` naming the IU
and the pick's view of it (:func:`routing_headers`: what ``clusterctl edge calibrate`` checks the scores by).
Whatever the IU answers (a 404 for an unknown model, a 400) is the client's answer, as from vLLM itself.
``GET /v1/models`` is answered by one routable IU.

Faults:
- connection failure (refused, reset, timed out before the answer's headers) before any byte reached the
  client: the IU is ejected for ``eject_s`` and the request is retried once on another IU; never after;
- the IU dies mid-stream: the client's stream ends with an SSE ``error`` event, and the IU is ejected;
- every routable IU at ``max_inflight_per_iu``: the request waits in a bounded FIFO queue (``max_queue``,
  ``queue_timeout_s``); a full queue, a wait that runs out, or no routable IU at all -> 503 with
  ``Retry-After`` and a one-line reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from edge.announce import AnnounceSender
from edge.config import EdgeConfig
from edge.feed import AgentFeed, EdgeView
from edge.metrics import EdgeMetrics
from edge.routing import Decision, Router
from edge.tokens import estimate_prompt_tokens

log = logging.getLogger("edge.proxy")
MAX_BODY_BYTES = 64 * 1024 * 1024  # a 128k-token prompt as text is ~0.5 MB; token-id lists are bigger
FORWARD_HEADERS = ("Content-Type", "Authorization", "Accept", "OpenAI-Organization", "X-Request-Id")
MODELS_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
             asyncio.TimeoutError)


class Unavailable(Exception):
    """No IU can take the request now: answered 503 + Retry-After."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def error_response(code: int, message: str, kind: str, headers: dict | None = None) -> web.Response:
    """vLLM's ErrorResponse shape, so clients handle the edge's errors like the engine's."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
    return web.json_response(body, status=code, headers=headers)


@dataclass
class EdgeState:
    config: EdgeConfig
    view: EdgeView
    router: Router
    metrics: EdgeMetrics
    watcher: object | None = None  # edge.pool.ConsulWatcher (threads)
    feed: AgentFeed | None = None
    announcer: AnnounceSender | None = None  # announce.token_file set: each request told to its node agent
    session: aiohttp.ClientSession | None = None
    waiters: deque = field(default_factory=deque)
    active: int = 0  # requests being handled (graceful shutdown waits for 0)
    draining: bool = False

    # -- slots --------------------------------------------------------------------------------------
    def decide(self, prompt_tokens: int | None, exclude: set[str]) -> Decision:
        return self.router.choose(self.view.snapshot(), time.time(), prompt_tokens, exclude)

    async def acquire(self, prompt_tokens: int | None, exclude: set[str], handle=None) -> Decision:
        """An IU with a free slot for this request (recorded in the ledger), waiting in the queue if needed.
        ``handle``: a streamed request's token; the ledger awaits its first byte (:meth:`first_byte`). A
        non-streamed answer's first byte comes at its end, so it is never awaited."""
        started = None
        while True:
            decision = self.decide(prompt_tokens, exclude)
            if decision.iu_id is not None:
                now = time.time()
                seq = self.router.sent(decision.iu_id, now, decision.cost_s, handle, decision.expected_s,
                                       decision.queued_as_s)
                if seq:
                    self.announce(decision, prompt_tokens, seq, now)
                if started is not None:
                    self.metrics.queued.observe(time.monotonic() - started)
                self.metrics.picks_of[decision.mode].inc()
                if decision.entry is not None and decision.entry.score is not None:
                    self.metrics.score_age.observe(max(0.0, now - decision.entry.ts))
                return decision
            if decision.mode == "none":
                if self.view.snapshot().healthy:
                    raise Unavailable("no_healthy_iu", f"no healthy IU: every routable IU failed within the last "
                                      f"{self.config.eject_s:g} s (ejected) or was tried for this request")
                raise Unavailable("no_healthy_iu", "no healthy IU: every IU is critical, in maintenance or "
                                  "unregistered in Consul")
            if started is None:
                started = time.monotonic()
            remaining = self.config.queue_timeout_s - (time.monotonic() - started)
            if len(self.waiters) >= self.config.max_queue:
                raise Unavailable("queue_full", f"every IU is at {self.config.max_inflight_per_iu} requests "
                                  f"in flight and {len(self.waiters)} requests are queued")
            if remaining <= 0:
                raise Unavailable("queue_timeout", f"no IU slot freed within {self.config.queue_timeout_s:g} s")
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                pass
            finally:
                if not waiter.done():
                    waiter.cancel()
                try:
                    self.waiters.remove(waiter)
                except ValueError:
                    pass

    def announce(self, decision: Decision, prompt_tokens: int | None, seq: int, now: float) -> None:
        """Queue request ``seq``'s announcement for its IU's node agent (the push feed's agent address for that
        node, else the IU's service address at the push port). A request whose prompt size is unknown, or
        whose IU has no node or address, is not announced: the ledger counts it by time."""
        entry, sender = decision.entry, self.announcer
        agent = None
        if sender is not None and entry is not None and entry.node and prompt_tokens and prompt_tokens >= 1:
            followed = self.feed.tasks.get(entry.node) if self.feed is not None else None
            if followed is not None:
                agent = followed[0]
            elif entry.address:
                agent = f"{entry.address}:{self.config.push.agent_port}"
        if agent is None:
            self.router.ledger.unannounce((seq,))
            return
        sender.announce(entry.node, agent, decision.iu_id, prompt_tokens, seq, now)

    def release(self, iu_id: str, failed: bool = False, handle=None) -> None:
        self.router.done(iu_id, handle)
        if failed:
            self.router.eject(iu_id, time.time())
        while self.waiters:  # a slot freed: the oldest waiter tries again
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break


def routing_headers(decision: Decision) -> dict[str, str]:
    """How the pick saw the chosen IU: ``X-Eas-Pick`` (the mode), ``X-Eas-Score`` (its published score, s),
    ``X-Eas-Expected-S`` (the TTFT pick predicted there: score + work sent since + own prefill) and
    ``X-Eas-Prefill-S`` (this request's own prefill there, from the IU's published prefill rate)."""
    headers = {"X-Eas-Pick": decision.mode}
    if decision.entry is not None and decision.entry.score is not None:
        headers["X-Eas-Score"] = f"{decision.entry.score:.4f}"
    if decision.expected_s is not None:
        headers["X-Eas-Expected-S"] = f"{decision.expected_s:.4f}"
    if decision.cost_s is not None:
        headers["X-Eas-Prefill-S"] = f"{decision.cost_s:.4f}"
    return headers


def _upstream_url(entry, path: str) -> str:
    return f"http://{entry.address}:{entry.port}{path}"


async def _completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    endpoint = request.path
    arrived = time.monotonic()
    if state.draining:  # decided before the first await: a request started before the drain is served
        response = _unavailable(state, Unavailable("draining", "this edge is shutting down"))
    else:
        state.active += 1
        try:
            response = await _proxy_completion(state, request, arrived)
        finally:
            state.active -= 1
    state.metrics.requests_of[endpoint, str(response.status)].inc()
    return response


async def _proxy_completion(state: EdgeState, request: web.Request, arrived: float) -> web.StreamResponse:
    chat = request.path.startswith("/v1/chat/")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"request body over {MAX_BODY_BYTES} bytes", "BadRequestError")
    try:
        body = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        return error_response(400, f"invalid JSON body: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return error_response(400, f"invalid JSON body: expected an object, got {type(body).__name__}",
                              "BadRequestError")
    prompt_tokens = estimate_prompt_tokens(body, chat)
    stream = bool(body.get("stream"))
    headers = {h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}
    tried: set[str] = set()
    handle = object() if stream else None  # this request in the ledger's awaited first bytes
    for attempt in (1, 2):
        try:
            decision = await state.acquire(prompt_tokens, tried, handle)
        except Unavailable as exc:
            return _unavailable(state, exc)
        iu_id, entry = decision.iu_id, decision.entry
        tried.add(iu_id)
        if entry is None or not entry.address or not entry.port:
            state.release(iu_id, failed=True, handle=handle)
            state.metrics.upstream_errors_of[iu_id, "no_address"].inc()
            continue
        try:
            upstream = await state.session.post(_upstream_url(entry, request.path), data=raw, headers=headers)
        except RETRYABLE as exc:
            state.release(iu_id, failed=True, handle=handle)
            state.metrics.upstream_errors_of[iu_id, "connect"].inc()
            log.warning("IU %s: %s before any byte was sent; %s", iu_id, type(exc).__name__,
                        "retrying on another IU" if attempt == 1 else "giving up")
            if attempt == 1:
                state.metrics.retries.inc()
            continue
        except aiohttp.ClientError as exc:  # the IU answered something that is not HTTP: not retried
            state.release(iu_id, failed=True, handle=handle)
            state.metrics.upstream_errors_of[iu_id, "protocol"].inc()
            return error_response(502, f"IU {iu_id} answered with a broken response: {type(exc).__name__}",
                                  "BadGatewayError")
        except BaseException:  # cancelled (shutdown cut the request): the slot must not leak
            state.release(iu_id, handle=handle)
            raise
        return await _relay(state, request, upstream, iu_id, arrived, stream, handle, routing_headers(decision))
    return error_response(502, "the IUs tried did not accept the connection (retried once)", "BadGatewayError")


def _unavailable(state: EdgeState, exc: Unavailable) -> web.Response:
    state.metrics.rejected_of[exc.reason].inc()
    retry_after = str(max(1, round(state.config.retry_after_s)))
    return error_response(503, str(exc), "ServiceUnavailableError", {"Retry-After": retry_after})


async def _relay(state: EdgeState, request: web.Request, upstream: aiohttp.ClientResponse, iu_id: str,
                 arrived: float, stream: bool, handle=None, routing: dict | None = None) -> web.StreamResponse:
    """Pass the IU's answer through as it arrives; the slot is released however it ends."""
    failed = False
    headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json"), "X-Eas-IU": iu_id,
               **(routing or {})}
    if "Content-Encoding" in upstream.headers:  # bytes pass through undecoded (auto_decompress=False)
        headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
    response = web.StreamResponse(status=upstream.status, headers=headers)
    sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    first = True
    try:
        await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()  # whatever arrived: no buffering beyond one read
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                failed = True
                state.metrics.upstream_errors_of[iu_id, "mid_stream"].inc()
                log.warning("IU %s failed mid-answer: %s", iu_id, type(exc).__name__)
                if not sse:  # a plain answer cannot carry an error after its status: cut it, never "complete"
                    if request.transport is not None:
                        request.transport.close()
                    return response
                event = {"error": {"object": "error", "message": f"upstream IU {iu_id} failed mid-stream: "
                                   f"{type(exc).__name__}", "type": "UpstreamError", "code": 502}}
                await response.write(b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n")
                break
            if not chunk:
                break
            await response.write(chunk)
            if first:
                first = False
                state.router.first_byte(iu_id, handle)  # no longer overdue, whatever the status
                if upstream.status == 200:  # an error answer's first byte is not a first token
                    state.metrics.ttft_of["true" if stream else "false"].observe(time.monotonic() - arrived)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away (our write failed); the IU is fine
    finally:
        if upstream.content.at_eof():
            upstream.release()  # keep-alive to the IU
        else:
            upstream.close()  # unfinished (the client left): closing tells the engine to abort the request
        state.release(iu_id, failed=failed, handle=handle)
    return response


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    healthy = [e for e in state.view.snapshot().healthy if e.address and e.port]
    for entry in healthy[:2]:
        try:
            async with state.session.get(_upstream_url(entry, "/v1/models"), timeout=MODELS_TIMEOUT) as answer:
                return web.Response(body=await answer.read(), status=answer.status,
                                    content_type=answer.content_type)
        except RETRYABLE:
            state.metrics.upstream_errors_of[entry.iu_id, "connect"].inc()
    return _unavailable(state, Unavailable("no_healthy_iu", "no healthy IU answered /v1/models"))


async def _metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(body=generate_latest(state.metrics.registry),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _healthz(request: web.Request) -> web.Response:
    """200 while this edge can route (some routable IU); 503 while draining or with no routable IU."""
    state = request.app[STATE]
    snapshot = state.view.snapshot()
    routable = len(snapshot.healthy)
    status = "draining" if state.draining else ("ok" if routable else "no_routable_iu")
    fresh = sum(1 for e in snapshot.scored if time.time() <= e.stale_after)
    return web.json_response({"status": status, "routable_ius": routable, "fresh_scores": fresh,
                              "inflight": state.active, "queued": len(state.waiters)},
                             status=200 if status == "ok" else 503)


STATE = web.AppKey("state", EdgeState)


def make_app(state: EdgeState) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app
