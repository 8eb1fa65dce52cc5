"""The reverse proxy (aiohttp): OpenAI-compatible endpoints in front of the pool, plus /metrics and /healthz.

``POST /v1/completions`` and ``/v1/chat/completions``: the body is read (at most ``max_body_bytes``: 413
beyond) and summarised (:mod:`edge.body`: a malformed or too deeply nested one is a 400), routed among the
IUs serving its ``model`` (an IU's Consul ``Meta.model``; a model no IU serves is a 404 ``model_not_found``)
by :class:`edge.routing.Router`, and sent unchanged to the chosen IU; the answer is passed through chunk by
chunk as it arrives (SSE streams and plain JSON alike; nothing is buffered), with ``X-Eas-IU`` naming the IU
and the pick's view of it (:func:`routing_headers`: what ``clusterctl edge calibrate`` checks the scores by).
An IU's error answer (a 404 for an unknown model, a 400) is the client's answer, rewritten into OpenAI's
error shape (:mod:`edge.errors`), as is every error the edge answers itself (with ``X-Edge-Reason``).
``GET /v1/models`` is answered by one routable IU.

Faults:
- connection failure (refused, reset, timed out before the answer's headers) before any byte reached the
  client: the IU is ejected for ``eject_s`` and the request is retried once on another IU; never after;
- the edge's own shortage (out of descriptors, buffers, local ports) on connecting: 503 ``edge_resources``,
  no IU ejected, ``/healthz`` 503 for a few seconds;
- the IU dies mid-stream or a stream is silent for ``stream_idle_timeout_s``: the client's stream ends with
  an SSE ``error`` event, and the IU is ejected; a non-streamed answer past ``upstream_timeout_s`` (the
  edge's own deadline) is cut without ejecting its IU;
- the client leaves: its handler is cancelled (aiohttp's ``handler_cancellation``), which closes the IU's
  connection (the engine aborts the request) or takes the request out of the queue before it is sent;
- every routable IU at ``max_inflight_per_iu``: the request waits in a bounded FIFO queue
  (:mod:`edge.admission`); a full queue or a wait that runs out is a 429 with the predicted wait as
  ``Retry-After``; no routable IU at all is a 503 with ``Retry-After``; both carry a one-line reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from edge.admission import Admission, Busy, Unavailable
from edge.announce import AnnounceSender
from edge.body import BodyReader, BodySummary, BodyTooLarge
from edge.config import EdgeConfig
from edge.errors import MAX_UPSTREAM_ERROR_BYTES, error_response, normalise_upstream_error, sse_error_event
from edge.feed import AgentFeed, EdgeView
from edge.limits import BodyTooLong, head_arrived, is_local_resource_error, read_capped
from edge.metrics import EdgeMetrics
from edge.routing import Decision, Router

log = logging.getLogger("edge.proxy")
FORWARD_HEADERS = ("Content-Type", "Authorization", "Accept", "OpenAI-Organization", "X-Request-Id")
MODELS_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
MAX_MODELS_BYTES = 1 << 20  # an IU's /v1/models (a few hundred bytes per model)
RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
             asyncio.TimeoutError)
MODELS_CACHED = 64
LOCAL_TROUBLE_S = 5.0  # /healthz answers 503 this long after the edge ran short of its own resources
__all__ = ["Busy", "EdgeState", "Unavailable", "make_app"]


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
    admission: Admission | None = None
    bodies: BodyReader | None = None
    awaiting_head: set = field(default_factory=set)  # client connections before their first request head
    active: int = 0  # requests being handled (graceful shutdown waits for 0)
    draining: bool = False
    local_trouble_until: float = 0.0  # monotonic: the edge ran short of descriptors or buffers until then
    not_serving_of: tuple = (None, {})  # (the IU -> model map they were made from, model -> _not_serving)

    def __post_init__(self):
        if self.admission is None:
            self.admission = Admission(self.config.max_queue, self.config.queue_timeout_s)
        if self.bodies is None:
            self.bodies = BodyReader(self.config.max_body_bytes)

    @property
    def waiters(self) -> list:
        """Every queued request (all queues)."""
        return [waiter for queue in self.admission.queues.values() for waiter in queue]

    @property
    def stream_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s,
                                     sock_read=self.config.stream_idle_timeout_s)

    # -- slots --------------------------------------------------------------------------------------
    def decide(self, prompt_tokens: int | None, exclude: set[str]) -> Decision:
        return self.router.choose(self.view.snapshot(), time.time(), prompt_tokens, exclude)

    async def acquire(self, prompt_tokens: int | None, exclude: set[str], handle=None,
                      not_serving: frozenset[str] = frozenset()) -> Decision:
        """An IU with a free slot for this request (recorded in the ledger), waiting in the FIFO queue if
        needed (:mod:`edge.admission`). ``handle``: a streamed request's token; the ledger awaits its first
        byte (:meth:`first_byte`); a non-streamed answer's first byte comes at its end, so it is never
        awaited. ``not_serving``: IUs that serve another model than the request's."""
        started = time.monotonic()
        blocked = exclude | not_serving if not_serving else exclude

        def attempt(queued: bool) -> Decision | None:
            decision = self.decide(prompt_tokens, blocked)
            if decision.iu_id is not None:
                self._sent(decision, prompt_tokens, handle, started if queued else None)
                return decision
            if decision.mode == "none":
                if not self.view.snapshot().healthy:
                    raise Unavailable("no_healthy_iu", "no healthy IU: every IU is critical, in maintenance "
                                      "or unregistered in Consul")
                raise Unavailable("no_healthy_iu", f"no healthy IU{' serving this model' if not_serving else ''}"
                                  f": every routable IU failed within the last {self.config.eject_s:g} s "
                                  "(ejected) or was tried for this request")
            return None

        return await self.admission.admit(attempt, lambda: self.decide(prompt_tokens, not_serving).iu_id is not None,
                                          key=not_serving)

    def _sent(self, decision: Decision, prompt_tokens: int | None, handle, queued_since: float | None) -> None:
        now = time.time()
        seq = self.router.sent(decision.iu_id, now, decision.cost_s, handle, decision.expected_s,
                               decision.queued_as_s)
        if seq:
            self.announce(decision, prompt_tokens, seq, now)
        if queued_since is not None:
            self.metrics.queued.observe(time.monotonic() - queued_since)
        self.metrics.picks_of[decision.mode].inc()
        if decision.entry is not None and decision.entry.score is not None:
            self.metrics.score_age.observe(max(0.0, now - decision.entry.ts))

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
        self.admission.released()  # a slot freed: the oldest waiter tries again


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
        except asyncio.CancelledError:  # the client left (handler cancellation) or shutdown cut it
            state.metrics.rejected_of["client_gone"].inc()
            raise
        finally:
            state.active -= 1
    state.metrics.requests_of[endpoint, str(response.status)].inc()
    return response


def _not_serving(state: EdgeState, model: str | None) -> frozenset[str] | None:
    """The IUs that declare another model than ``model`` (empty: none do, or the request names none); None
    when every registered IU declares its model and none is ``model``."""
    models = state.view.unit_models()
    if not model or not models:
        return frozenset()
    seen, by_model = state.not_serving_of
    # a new Consul answer invalidates the sets; the model field is the client's, so it cannot grow them
    if seen is not models or len(by_model) >= MODELS_CACHED:
        by_model = {}
        state.not_serving_of = (models, by_model)
    if model not in by_model:
        by_model[model] = _not_serving_in(models, model)
    return by_model[model]


def _not_serving_in(models: dict[str, str | None], model: str) -> frozenset[str] | None:
    if model in models.values():
        return frozenset(iu for iu, served in models.items() if served is not None and served != model)
    if None in models.values():  # some IUs take any model: vLLM answers for the name
        return frozenset(iu for iu, served in models.items() if served is not None)
    return None


async def _proxy_completion(state: EdgeState, request: web.Request, arrived: float) -> web.StreamResponse:
    chat = request.path.startswith("/v1/chat/")
    try:
        raw = await state.bodies.read(request)
    except BodyTooLarge:
        return error_response(413, f"request body over {state.config.max_body_bytes} bytes", "body_too_large")
    summary: BodySummary = await state.bodies.summarize(raw, chat)
    if summary.error is not None:
        return error_response(400, summary.error, summary.reason)
    not_serving = _not_serving(state, summary.model)
    if not_serving is None:
        return error_response(404, f"The model `{summary.model}` does not exist.", "model_not_found", "model")
    prompt_tokens, stream = summary.prompt_tokens, summary.stream
    headers = {h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}
    # streams are judged by idle time, not total time; a non-streamed answer by the session's total
    timeout = {"timeout": state.stream_timeout} if stream else {}
    tried: set[str] = set()
    handle = object() if stream else None  # this request in the ledger's awaited first bytes
    for attempt in (1, 2):
        try:
            decision = await state.acquire(prompt_tokens, tried, handle, not_serving)
        except (Unavailable, Busy) as exc:
            return _unavailable(state, exc)
        iu_id, entry = decision.iu_id, decision.entry
        tried.add(iu_id)
        if entry is None or not entry.address or not entry.port:
            state.release(iu_id, failed=True, handle=handle)
            state.metrics.upstream_errors_of[iu_id, "no_address"].inc()
            continue
        try:
            upstream = await state.session.post(_upstream_url(entry, request.path), data=raw, headers=headers,
                                                **timeout)
        except RETRYABLE as exc:
            if is_local_resource_error(exc):  # the edge's own shortage: no IU is blamed, nothing retried
                state.release(iu_id, handle=handle)
                return _local_trouble(state, exc)
            if _own_deadline(exc):  # a non-streamed answer still generating at upstream_timeout_s
                state.release(iu_id, handle=handle)
                state.metrics.upstream_errors_of[iu_id, "deadline"].inc()
                return error_response(504, f"IU {iu_id} did not answer within upstream_timeout_s "
                                      f"({state.config.upstream_timeout_s:g} s)", "upstream_deadline")
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
                                  "upstream_protocol")
        except BaseException:  # cancelled (the client left, or shutdown cut the request): no slot may leak
            state.release(iu_id, handle=handle)
            raise
        if upstream.status >= 400:
            return await _upstream_error(state, upstream, iu_id, handle)
        return await _relay(state, request, upstream, iu_id, arrived, stream, handle, routing_headers(decision))
    return error_response(502, "the IUs tried did not accept the connection (retried once)", "upstream_connect")


def _own_deadline(exc: BaseException) -> bool:
    """The session's total timeout (the edge's own deadline), not a connect or idle timeout (the IU's)."""
    return isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ServerTimeoutError)


def _unavailable(state: EdgeState, exc: Unavailable | Busy) -> web.Response:
    """Busy (the queue is full or the wait ran out): 429 with the predicted wait; unavailable: 503."""
    state.metrics.rejected_of[exc.reason].inc()
    if isinstance(exc, Busy):
        return error_response(429, str(exc), exc.reason, headers={"Retry-After": str(exc.retry_after_s)})
    retry_after = str(max(1, round(state.config.retry_after_s)))
    return error_response(503, str(exc), exc.reason, headers={"Retry-After": retry_after})


def _local_trouble(state: EdgeState, exc: BaseException) -> web.Response:
    """The edge ran out of its own descriptors or buffers: 503, no IU ejected, /healthz 503 for a while."""
    state.local_trouble_until = time.monotonic() + LOCAL_TROUBLE_S
    log.error("the edge itself is short of resources: %s", exc)
    return _unavailable(state, Unavailable("edge_resources", f"this edge is short of resources ({exc}); "
                                           "no inference unit is at fault"))


async def _upstream_error(state: EdgeState, upstream: aiohttp.ClientResponse, iu_id: str, handle
                          ) -> web.Response:
    """An IU's error answer (status >= 400), read within a cap and passed on in OpenAI's shape."""
    try:
        raw = await read_capped(upstream, MAX_UPSTREAM_ERROR_BYTES)
    except BodyTooLong:
        raw = b""
    except (TimeoutError, aiohttp.ClientError):
        raw = b""
    finally:
        upstream.release()
        state.router.first_byte(iu_id, handle)
        state.release(iu_id, handle=handle)
    return web.Response(body=normalise_upstream_error(upstream.status, raw), status=upstream.status,
                        content_type="application/json", headers={"X-Eas-IU": iu_id})


async def _relay(state: EdgeState, request: web.Request, upstream: aiohttp.ClientResponse, iu_id: str,
                 arrived: float, stream: bool, handle=None, routing: dict | None = None) -> web.StreamResponse:
    """Pass the IU's answer through as it arrives; the slot is released however it ends. An IU silent for
    ``stream_idle_timeout_s`` mid-stream is cut and ejected; a non-streamed answer past the edge's own
    ``upstream_timeout_s`` is cut without blaming the IU."""
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
                idle = isinstance(exc, aiohttp.SocketTimeoutError)
                own_deadline = _own_deadline(exc)
                failed = not own_deadline  # the edge's own deadline is not the IU's failure
                kind = "deadline" if own_deadline else ("idle" if idle else "mid_stream")
                state.metrics.upstream_errors_of[iu_id, kind].inc()
                log.warning("IU %s: answer cut (%s): %s", iu_id, kind, type(exc).__name__)
                if not sse:  # a plain answer cannot carry an error after its status: cut it, never "complete"
                    if request.transport is not None:
                        request.transport.close()
                    return response
                what = f"silent for {state.config.stream_idle_timeout_s:g} s" if idle else type(exc).__name__
                await response.write(sse_error_event(f"upstream IU {iu_id} failed mid-stream: {what}",
                                                     f"upstream_{kind}"))
                break
            if not chunk:
                break
            await response.write(chunk)
            if first:
                first = False
                state.router.first_byte(iu_id, handle)  # no longer overdue, whatever the status
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
    """One routable IU's model list (two are tried), read within a cap; its error in OpenAI's shape."""
    state = request.app[STATE]
    healthy = [e for e in state.view.snapshot().healthy if e.address and e.port]
    for entry in healthy[:2]:
        try:
            async with state.session.get(_upstream_url(entry, "/v1/models"), timeout=MODELS_TIMEOUT) as answer:
                body = await read_capped(answer, MAX_MODELS_BYTES)
                if answer.status >= 400:
                    return web.Response(body=normalise_upstream_error(answer.status, body[:MAX_UPSTREAM_ERROR_BYTES]),
                                        status=answer.status, content_type="application/json")
                return web.Response(body=body, status=answer.status, content_type=answer.content_type)
        except RETRYABLE:
            state.metrics.upstream_errors_of[entry.iu_id, "connect"].inc()
        except (BodyTooLong, aiohttp.ClientError):
            state.metrics.upstream_errors_of[entry.iu_id, "protocol"].inc()
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
    if state.draining:
        status = "draining"
    elif time.monotonic() < state.local_trouble_until:
        status = "edge_resources"  # out of descriptors or buffers: a load balancer should send elsewhere
    else:
        status = "ok" if routable else "no_routable_iu"
    fresh = sum(1 for e in snapshot.scored if time.time() <= e.stale_after)
    return web.json_response({"status": status, "routable_ius": routable, "fresh_scores": fresh,
                              "inflight": state.active, "queued": len(state.admission)},
                             status=200 if status == "ok" else 503)


STATE = web.AppKey("state", EdgeState)


@web.middleware
async def _edge_middleware(request: web.Request, handler):
    """Every request: its head arrived (no head deadline for its connection); an unknown path or method is
    a 404/405 in OpenAI's shape, not aiohttp's plain text."""
    head_arrived(request.app[STATE].awaiting_head, request)
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        return error_response(405, f"{request.method} is not allowed on {request.path}", "method_not_allowed",
                              headers={"Allow": ",".join(sorted(exc.allowed_methods))})
    except web.HTTPNotFound:
        return error_response(404, f"no such endpoint: {request.method} {request.path}", "unknown_endpoint")


def make_app(state: EdgeState) -> web.Application:
    app = web.Application(client_max_size=state.config.max_body_bytes, middlewares=[_edge_middleware])
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app
