"""The reverse proxy (aiohttp): OpenAI-compatible endpoints in front of the pool, plus /healthz. /metrics is on
the admin listener (:mod:`edge.admin`); client keys are checked before any body is read (:mod:`edge.auth`).

``POST /v1/completions`` and ``/v1/chat/completions``: the body is read (at most ``max_body_bytes``: 413
beyond) and summarised (:mod:`edge.body`: a malformed or too deeply nested one is a 400), routed among the
IUs serving its ``model`` (an IU's Consul ``Meta.model``; a model no IU serves is a 404 ``model_not_found``)
by :class:`edge.routing.Router`, and sent unchanged to the chosen IU; once the IU's first body chunk has come
the answer is passed through chunk by chunk as it arrives (:mod:`edge.upstream`), with ``X-Eas-IU`` naming
the IU when the config's ``debug_headers`` is on, with the pick's view of it (:func:`routing_headers`: what
``clusterctl edge calibrate`` checks the scores by).
An IU's error answer (a 404 for an unknown model, a 400) is the client's answer, rewritten into OpenAI's
error shape (:mod:`edge.errors`), as is every error the edge answers itself (with ``X-Edge-Reason``).
``GET /v1/models`` is answered by one routable IU.

Faults:
- an IU that fails before its first body chunk (refused, reset, timed out, a 5xx, a stalled first token):
  the request moves to another IU, up to ``max_attempts`` (:mod:`edge.upstream`); a stream cut mid-way is
  resumed on another IU when the edge can (:mod:`edge.resume`); the IU's results decide its ejection
  (:mod:`edge.ejection`);
- the edge's own shortage (out of descriptors, buffers, local ports) on connecting: 503 ``edge_resources``,
  no IU ejected, ``/healthz`` 503 for a few seconds;
- a non-streamed answer past ``upstream_timeout_s`` (the edge's own deadline) is cut without blaming its IU;
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

from edge.admission import Admission, Busy, Unavailable
from edge.announce import AnnounceSender
from edge.auth import Authenticator
from edge.body import BodyReader, BodySummary, BodyTooLarge
from edge.config import EdgeConfig
from edge.eligible import excluded
from edge.errors import MAX_UPSTREAM_ERROR_BYTES, error_response, normalise_upstream_error
from edge.feed import AgentFeed, EdgeView
from edge.limits import BodyTooLong, head_arrived, read_capped
from edge.metrics import EdgeMetrics
from edge.pool.prefix import NO_PREFIX, PromptPrefix, relay_blocks
from edge.rollout import RolloutFollower, placement_of
from edge.routing import Decision, Router
from edge.upstream import RETRYABLE, Answered, Call, open_first, probe_due, relay

log = logging.getLogger("edge.proxy")
# Never the client's Authorization: the IUs take the edge's own key (upstream_api_key_file), and a client's
# key must not reach a node that runs third-party model code.
FORWARD_HEADERS = ("Content-Type", "Accept", "OpenAI-Organization", "X-Request-Id")
MODELS_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
MAX_MODELS_BYTES = 1 << 20  # an IU's /v1/models (a few hundred bytes per model)
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
    announcer: AnnounceSender | None = None  # announce.key_file set: each request told to its node agent
    session: aiohttp.ClientSession | None = None
    admission: Admission | None = None
    bodies: BodyReader | None = None
    auth: Authenticator | None = None  # client keys (None: not checked)
    upstream_headers: dict = field(default_factory=dict)  # the IUs' key as Authorization, when configured
    probes: set = field(default_factory=set)  # half-open probes in flight (edge/ejection.py)
    awaiting_head: set = field(default_factory=set)  # client connections before their first request head
    active: int = 0  # requests being handled (graceful shutdown waits for 0)
    draining: bool = False
    local_trouble_until: float = 0.0  # monotonic: the edge ran short of descriptors or buffers until then
    not_serving_of: tuple = (None, {})  # (the IU -> model map they were made from, model -> _not_serving)
    rollout: RolloutFollower = field(default_factory=RolloutFollower)  # the traffic split (edge/rollout.py)

    def __post_init__(self):
        if self.admission is None:
            self.admission = Admission(self.config.max_queue, self.config.queue_timeout_s)
        if self.bodies is None:
            self.bodies = BodyReader(self.config.max_body_bytes)

    @property
    def waiters(self) -> list:
        """Every queued request (all queues)."""
        return [waiter for queue in self.admission.queues.values() for waiter in queue]

    def iu_headers(self, iu_id: str) -> dict[str, str]:
        """``X-Eas-IU`` naming the IU that answered, only with ``debug_headers`` on: IU ids are internal."""
        return {"X-Eas-IU": iu_id} if self.config.debug_headers else {}

    @property
    def stream_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s,
                                     sock_read=self.config.stream_idle_timeout_s)

    # -- slots --------------------------------------------------------------------------------------
    def decide(self, prompt_tokens: int | None, exclude: set[str], prefix: PromptPrefix = NO_PREFIX) -> Decision:
        self.router.learn(self.view.relayed.take())  # what the other edges sent, relayed by the agents
        return self.router.choose(self.view.snapshot(), time.time(), prompt_tokens, exclude, prefix)

    async def acquire(self, prompt_tokens: int | None, exclude: set[str], handle=None,
                      not_serving: frozenset[str] = frozenset(), prefix: PromptPrefix = NO_PREFIX) -> Decision:
        """An IU with a free slot for this request (recorded in the ledger), waiting in the FIFO queue if
        needed (:mod:`edge.admission`). ``handle``: a streamed request's token; the ledger awaits its first
        byte (:meth:`first_byte`); a non-streamed answer's first byte comes at its end, so it is never
        awaited. ``not_serving``: IUs that serve another model than the request's."""
        started = time.monotonic()
        blocked = exclude | not_serving if not_serving else exclude
        if self.router.outliers.records or self.router.outliers.ejected:
            probe_due(self)

        def attempt(queued: bool) -> Decision | None:
            decision = self.decide(prompt_tokens, blocked, prefix)
            if decision.iu_id is not None:
                self._sent(decision, prompt_tokens, handle, started if queued else None, prefix.hashes)
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

    def _sent(self, decision: Decision, prompt_tokens: int | None, handle, queued_since: float | None,
              prefix_hashes=()) -> None:
        now = time.time()
        seq = self.router.sent(decision.iu_id, now, decision.cost_s, handle, decision.expected_s,
                               decision.queued_as_s, prefix_hashes)
        if seq:
            self.announce(decision, prompt_tokens, seq, now, prefix_hashes)
        if queued_since is not None:
            self.metrics.queued.observe(time.monotonic() - queued_since)
        self.metrics.picks_of[decision.mode].inc()
        if decision.entry is not None and decision.entry.score is not None:
            self.metrics.score_age.observe(max(0.0, now - decision.entry.ts))

    def announce(self, decision: Decision, prompt_tokens: int | None, seq: int, now: float,
                 prefix_hashes=()) -> None:
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
        sender.announce(entry.node, agent, decision.iu_id, decision.prefill_tokens(prompt_tokens), seq, now,
                        relay_blocks(prefix_hashes) if self.router.prefix is not None else ())

    def release(self, iu_id: str, outcome: str = "ok", handle=None, status: int = 0) -> None:
        """Free ``iu_id``'s slot; ``outcome`` (ok, failed, definitive, neutral) feeds outlier ejection and the
        rollout's error count, ``status`` an IU's own HTTP error status."""
        self.router.done(iu_id, handle)
        self.rollout.finished(iu_id, outcome == "failed", status)
        pool_size = len(self.view.snapshot().healthy)
        if self.router.outcome(iu_id, time.time(), outcome, pool_size):
            self.metrics.ejections_of[outcome].inc()
            log.warning("IU %s ejected (%s failure)", iu_id, outcome)
        self.admission.released()  # a slot freed: the oldest waiter tries again

    # what edge/upstream.py needs of the proxy's answers
    def unavailable(self, exc: Unavailable | Busy) -> web.Response:
        return _unavailable(self, exc)

    def local_trouble(self, exc: BaseException) -> web.Response:
        return _local_trouble(self, exc)

    async def upstream_error(self, upstream: aiohttp.ClientResponse, iu_id: str, handle) -> web.Response:
        return await _upstream_error(self, upstream, iu_id, handle)

    @staticmethod
    def upstream_url(entry, path: str) -> str:
        return _upstream_url(entry, path)

    def routing_headers(self, decision: Decision, tried: int = 1) -> dict[str, str]:
        """The pick's view of the IU, only with ``debug_headers`` on: internal scores, like IU ids."""
        return routing_headers(decision, tried) if self.config.debug_headers else {}


def routing_headers(decision: Decision, tried: int = 1) -> dict[str, str]:
    """How the pick saw the chosen IU: ``X-Eas-Pick`` (the mode), ``X-Eas-Score`` (its published score, s),
    ``X-Eas-Expected-S`` (the TTFT pick predicted there: score + work sent since + own prefill),
    ``X-Eas-Prefill-S`` (this request's own prefill there, from the IU's published prefill rate) and
    ``X-Eas-Tried`` (how many IUs were tried for the request, this one included: above 1, its wait began at
    another IU, so its TTFT is not this IU's alone)."""
    headers = {"X-Eas-Pick": decision.mode, "X-Eas-Tried": str(tried)}
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


async def _proxy_completion(state: EdgeState, request: web.Request, arrived: float) -> web.StreamResponse:
    chat = request.path.startswith("/v1/chat/")
    try:
        raw = await state.bodies.read(request)
    except BodyTooLarge:
        return error_response(413, f"request body over {state.config.max_body_bytes} bytes", "body_too_large")
    summary: BodySummary = await state.bodies.summarize(raw, chat)
    if summary.error is not None:
        return error_response(400, summary.error, summary.reason)
    key, by = placement_of(request.headers, request.path, summary.user_session, summary.body_digest,
                           state.config.rollout_request_key)
    not_serving = excluded(state, summary.model, key, by)
    if not_serving is None:
        return error_response(404, f"The model `{summary.model}` does not exist.", "model_not_found", "model")
    headers = {**{h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}, **state.upstream_headers}
    call = Call(request.path, raw, headers, summary.stream, summary.prompt_tokens, not_serving, arrived,
                object() if summary.stream else None,  # a stream's token in the ledger's awaited first bytes
                prefix=summary.prefix)
    try:
        opened = await open_first(state, call, raw)
    except Answered as answer:
        return answer.response
    return await relay(state, request, call, opened, chat)


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
    """An IU's error answer (status >= 400), read within a cap and passed on in OpenAI's shape; a 5xx
    counts against the IU (edge/ejection.py), a 4xx is the request's."""
    try:
        raw = await read_capped(upstream, MAX_UPSTREAM_ERROR_BYTES)
    except BodyTooLong:
        raw = b""
    except (TimeoutError, aiohttp.ClientError):
        raw = b""
    finally:
        upstream.release()
        state.router.first_byte(iu_id, handle)
        state.release(iu_id, "failed" if upstream.status >= 500 else "ok", handle, status=upstream.status)
    return web.Response(body=normalise_upstream_error(upstream.status, raw), status=upstream.status,
                        content_type="application/json", headers=state.iu_headers(iu_id))


async def _models(request: web.Request) -> web.Response:
    """One routable IU's model list (two are tried), read within a cap; its error in OpenAI's shape."""
    state = request.app[STATE]
    healthy = [e for e in state.view.snapshot().healthy if e.address and e.port]
    for entry in healthy[:2]:
        try:
            async with state.session.get(_upstream_url(entry, "/v1/models"), timeout=MODELS_TIMEOUT,
                                         headers=state.upstream_headers) as answer:
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
    checks = [state.auth.middleware] if state.auth is not None else []
    app = web.Application(client_max_size=state.config.max_body_bytes, middlewares=[_edge_middleware, *checks])
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    return app
