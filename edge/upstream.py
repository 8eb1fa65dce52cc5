"""One completion request to the IUs: reselection until a first body chunk, the relay, mid-stream resumption.

Reselection (:func:`open_first`): an IU is chosen (never one already tried for this request), the request
sent, and the answer's first body chunk awaited before anything goes to the client. A refusal, reset or
timeout up to that chunk, a 5xx answer, or a streamed first byte later than :func:`edge.ejection.
stalled_first_byte` allows (a stalled engine: the kernel still accepts its connections) moves the request
to another IU: at most ``max_attempts`` IUs, within ``upstream_timeout_s`` of its arrival.
``eas_edge_retries_total{reason}`` counts the moves.

The trade-off: the client's 200 and headers wait for the IU's first chunk (for vLLM's SSE, the first
token's event; for a plain answer, the answer), so an IU that dies between its headers and its first token
costs the client nothing but time. What the edge holds back is one chunk, for the time to first token.

The relay (:func:`relay`) passes each chunk on as it arrives. A stream it can resume (edge/resume.py) is
relayed in whole events and, when its IU dies mid-way or is silent past ``stream_stall_s``, continued on
another IU (``eas_edge_resumed_total{reason}``); the client sees one stream with the same id, announced by
``X-Edge-Resumable: 1`` at its start and an SSE comment ``: resumed ...`` where it was spliced.
A stream that cannot be resumed, or that no IU continued, ends in an SSE ``error`` event.

Outcomes feed outlier ejection (edge/ejection.py): ``ok``, ``failed``, ``definitive`` or ``neutral`` (the
edge's own deadline or shortage, a client that left: never an IU's fault).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from edge.admission import Busy, Unavailable
from edge.ejection import stalled_first_byte
from edge.errors import error_response, sse_error_event
from edge.limits import is_local_resource_error
from edge.liveness import first_byte_due
from edge.pool.prefix import NO_PREFIX, PromptPrefix
from edge.resume import StreamText

log = logging.getLogger("edge.upstream")
RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
             asyncio.TimeoutError)
CUT = (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)


@dataclass
class Call:
    """One client request on its way through the IUs."""

    path: str
    raw: bytes
    headers: dict
    stream: bool
    prompt_tokens: int | None
    not_serving: frozenset
    arrived: float
    handle: object = None
    tried: set = field(default_factory=set)
    prefix: PromptPrefix = NO_PREFIX  # the prompt's block hashes (cache-aware routing, edge/pool/prefix.py)


@dataclass
class Opened:
    iu_id: str
    upstream: aiohttp.ClientResponse
    first: bytes
    routing: dict  # the pick's view of the IU (edge/proxy.py routing_headers; empty without debug_headers)
    ttft_s: float  # from sending the request to its first chunk


class Answered(Exception):
    """No IU will answer: ``response`` is the client's answer."""

    def __init__(self, response: web.Response):
        super().__init__(response.status)
        self.response = response


def own_deadline(exc: BaseException) -> bool:
    """The session's total timeout (the edge's own deadline), not a connect or idle timeout (the IU's)."""
    return isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ServerTimeoutError)


def _deadline_answer(state, iu_id: str) -> web.Response:
    state.metrics.upstream_errors_of[iu_id, "deadline"].inc()
    return error_response(504, f"IU {iu_id} did not answer within upstream_timeout_s "
                          f"({state.config.upstream_timeout_s:g} s)", "upstream_deadline")


async def open_first(state, call: Call, body: bytes) -> Opened:
    """An IU's answer to ``body`` with its first chunk read (see the module docstring); raises
    :class:`Answered` with the client's answer when there is none to relay."""
    url_of = state.upstream_url
    timeout = {"timeout": state.stream_timeout} if call.stream else {}
    last_error = None  # the last IU's 5xx answer: the client's when no other IU answers
    moved = None  # why the last IU was left: counted once the request goes to another
    for attempt in range(1, state.config.max_attempts + 1):
        if attempt > 1 and time.monotonic() - call.arrived > state.config.upstream_timeout_s:
            break
        try:
            decision = await state.acquire(call.prompt_tokens, call.tried, call.handle, call.not_serving,
                                           call.prefix)
        except Unavailable as exc:
            if call.tried:  # every IU left has been tried for this request
                break
            raise Answered(state.unavailable(exc)) from None
        except Busy as exc:
            raise Answered(state.unavailable(exc)) from None
        iu_id, entry = decision.iu_id, decision.entry
        call.tried.add(iu_id)
        if moved is not None:
            state.metrics.retries_of[moved].inc()
            moved = None
        if entry is None or not entry.address or not entry.port:
            state.release(iu_id, "failed", call.handle)
            state.metrics.upstream_errors_of[iu_id, "no_address"].inc()
            continue
        # a streamed first byte is due by the stall rule, and sooner on an IU whose streams all went silent
        # (edge/liveness.py); any request leaves an IU ejected meanwhile
        sent = time.monotonic()
        watch = Watch(iu_id, sent + stalled_first_byte(decision.expected_s), sent + first_byte_due(
            decision.expected_s, state.router.liveness.ttft.get(iu_id))) if call.stream else Watch(iu_id)
        try:
            upstream = await _watched(state, watch, state.session.post(
                url_of(entry, call.path), data=body, headers=call.headers, **timeout))
        except Stalled as exc:
            moved = _moved(state, call, iu_id, exc.outcome, exc.reason, None)
            continue
        except RETRYABLE as exc:
            if is_local_resource_error(exc):  # the edge's own shortage: no IU is blamed, nothing retried
                state.release(iu_id, "neutral", call.handle)
                raise Answered(state.local_trouble(exc)) from None
            if own_deadline(exc):
                state.release(iu_id, "neutral", call.handle)
                raise Answered(_deadline_answer(state, iu_id)) from None
            refused = isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error,
                                                                                   ConnectionRefusedError)
            moved = _moved(state, call, iu_id, "definitive" if refused else "failed", "connect", exc)
            continue
        except aiohttp.ClientError as exc:  # the IU answered something that is not HTTP: not retried
            state.release(iu_id, "failed", call.handle)
            state.metrics.upstream_errors_of[iu_id, "protocol"].inc()
            raise Answered(error_response(502, f"IU {iu_id} answered with a broken response: "
                                          f"{type(exc).__name__}", "upstream_protocol")) from None
        except BaseException:  # cancelled (the client left, or shutdown cut the request): no slot may leak
            state.release(iu_id, "neutral", call.handle)
            raise
        if upstream.status >= 500 and attempt < state.config.max_attempts:
            last_error = await state.upstream_error(upstream, iu_id, call.handle)  # released as failed
            state.metrics.upstream_errors_of[iu_id, "status_5xx"].inc()
            moved = "status_5xx"
            continue
        if upstream.status >= 400:
            raise Answered(await state.upstream_error(upstream, iu_id, call.handle))
        try:
            first = await _watched(state, watch, upstream.content.readany())
        except Stalled as exc:
            upstream.close()
            moved = _moved(state, call, iu_id, exc.outcome, exc.reason, None)
            continue
        except CUT as exc:
            upstream.close()
            if own_deadline(exc):
                state.release(iu_id, "neutral", call.handle)
                raise Answered(_deadline_answer(state, iu_id)) from None
            moved = _moved(state, call, iu_id, "failed", "first_byte", exc)
            continue
        except BaseException:
            upstream.close()
            state.release(iu_id, "neutral", call.handle)
            raise
        state.router.first_byte(iu_id, call.handle)
        return Opened(iu_id, upstream, first, state.routing_headers(decision, len(call.tried)),
                      time.monotonic() - sent)
    if last_error is not None:
        raise Answered(last_error)
    raise Answered(error_response(502, f"no IU answered: {len(call.tried)} tried, each failed before its "
                                  "first byte", "upstream_connect"))


PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
WATCH_SLICE_S = 0.1  # how often a request awaiting its first byte looks whether its IU was ejected or silent


@dataclass(frozen=True)
class Watch:
    """What ends a request's wait for its first byte on ``iu_id`` (monotonic times; None: no such rule)."""

    iu_id: str
    stalled_at: float | None = None  # the stall rule (edge/ejection.py): the IU's failure
    silent_after: float | None = None  # moved from then on while the IU is silent (edge/liveness.py)


class Stalled(Exception):
    """No first byte by the stall rule (the IU's failure), or the IU was ejected meanwhile (already judged),
    or went silent (a sign, not yet a judgement)."""

    def __init__(self, reason: str, outcome: str):
        super().__init__(reason)
        self.reason, self.outcome = reason, outcome


async def _watched(state, watch: Watch, awaitable):
    """``awaitable``'s result, unless the stall rule's time passes first, or the IU is ejected while it waits
    (its other streams went silent past ``stream_stall_s``), or is silent now and the request waited past
    its first byte's due time: in both, this request is stuck behind the same stalled engine."""
    task = asyncio.ensure_future(awaitable)
    liveness, iu_id = state.router.liveness, watch.iu_id
    try:
        while True:
            now = time.monotonic()
            left = WATCH_SLICE_S if watch.stalled_at is None else min(WATCH_SLICE_S, watch.stalled_at - now)
            if left <= 0:
                raise Stalled("stalled", "definitive")
            done, _ = await asyncio.wait((task,), timeout=left)
            if done:
                return task.result()
            if state.router.outliers.is_out(iu_id):
                raise Stalled("ejected", "neutral")
            if (watch.silent_after is not None and time.monotonic() >= watch.silent_after and iu_id in
                    liveness.relaying and liveness.is_silent(iu_id, len(state.view.snapshot().healthy))):
                raise Stalled("silent", "neutral")
    except BaseException:
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None and hasattr(task.result(), "close"):
            task.result().close()  # the answer came just as the request gave up on it
        raise


def probe_due(state) -> None:
    """Send the half-open probes that are due (edge/ejection.py): ``GET /health`` to each IU whose ejection
    ran out; its answer decides whether it is back."""
    due = state.router.outliers.due(time.time())
    if not due:
        return
    by_id = state.view.snapshot().by_id()
    for iu_id in due:
        task = asyncio.get_running_loop().create_task(_probe(state, iu_id, by_id.get(iu_id)))
        state.probes.add(task)
        task.add_done_callback(state.probes.discard)


async def _probe(state, iu_id: str, entry) -> None:
    if entry is None or not entry.address or not entry.port:
        state.router.outcome(iu_id, time.time(), "ok", 0)  # gone from the pool: nothing to hold out
        return
    try:
        async with state.session.get(state.upstream_url(entry, "/health"), timeout=PROBE_TIMEOUT,
                                     headers=state.upstream_headers) as answer:
            outcome = "ok" if answer.status == 200 else "failed"
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome = "neutral" if is_local_resource_error(exc) else "failed"
    state.metrics.probes_of[outcome].inc()
    if state.router.outcome(iu_id, time.time(), outcome, len(state.view.snapshot().healthy)):
        state.metrics.ejections_of["probe"].inc()
    if outcome == "ok":
        state.admission.released()  # an IU is back: a waiter may have a slot


def _moved(state, call: Call, iu_id: str, outcome: str, reason: str, exc: BaseException | None) -> str:
    state.release(iu_id, outcome, call.handle)
    state.metrics.upstream_errors_of[iu_id, reason].inc()
    log.warning("IU %s: %s before the first byte (%s); trying another IU", iu_id, reason,
                type(exc).__name__ if exc is not None else "")
    return reason


async def _next_chunk(upstream: aiohttp.ClientResponse, stall_s: float | None) -> bytes:
    if stall_s is None:
        return await upstream.content.readany()
    return await asyncio.wait_for(upstream.content.readany(), stall_s)


def _finish(upstream: aiohttp.ClientResponse) -> None:
    if upstream.content.at_eof():
        upstream.release()  # keep-alive to the IU
    else:
        upstream.close()  # unfinished (the client left): closing tells the engine to abort the request


async def relay(state, request: web.Request, call: Call, opened: Opened, chat: bool) -> web.StreamResponse:
    """Pass the answer on as it arrives; every IU slot is released however it ends (module docstring)."""
    upstream, iu_id = opened.upstream, opened.iu_id
    sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    text = StreamText(_json(call.raw), chat) if sse and call.stream else None
    resumable = text is not None and text.resumable
    headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json"), **state.iu_headers(iu_id),
               **opened.routing}
    if "Content-Encoding" in upstream.headers:  # bytes pass through undecoded (auto_decompress=False)
        headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
        resumable = False
    if resumable:
        headers["X-Edge-Resumable"] = "1"
    response = web.StreamResponse(status=upstream.status, headers=headers)
    outcome, splice = "ok", False
    stall_s = state.config.stream_stall_s if resumable else None
    chunk = opened.first
    liveness = state.router.liveness if sse else None  # a stream's bytes tell whether its engine steps
    if liveness is not None:
        liveness.started(iu_id, opened.ttft_s)
    state.metrics.ttft_of["true" if call.stream else "false"].observe(time.monotonic() - call.arrived)
    state.rollout.first_byte(iu_id, time.monotonic() - call.arrived)
    try:
        await response.prepare(request)
        while True:
            if not chunk:
                if not upstream.content.at_eof():
                    raise aiohttp.ClientPayloadError("empty read before the end")
                break
            await response.write(text.relay(chunk, splice) if resumable else chunk)
            try:
                chunk = await _next_chunk(upstream, stall_s)
                if liveness is not None:
                    liveness.byte(iu_id)
                continue
            except CUT as exc:
                kind, outcome = _cut_kind(exc, stall_s is not None)
                state.metrics.upstream_errors_of[iu_id, kind].inc()
                log.warning("IU %s: answer cut (%s): %s", iu_id, kind, type(exc).__name__)
            upstream.close()
            state.release(iu_id, outcome, call.handle)
            if liveness is not None:
                liveness.ended(iu_id)
            cut_from, upstream = iu_id, None
            if not sse:  # a plain answer cannot carry an error after its status: cut it, never "complete"
                if request.transport is not None:
                    request.transport.close()
                return response
            opened = await _resume(state, call, text, kind) if resumable and outcome != "neutral" else None
            if opened is None:
                what = f"silent for {_silence(state, kind):g} s" if kind in ("idle", "stalled") else kind
                await response.write(sse_error_event(f"upstream IU {cut_from} failed mid-stream: {what}",
                                                     f"upstream_{kind}"))
                break
            upstream, iu_id, chunk, splice, outcome = opened.upstream, opened.iu_id, opened.first, True, "ok"
            liveness.started(iu_id, opened.ttft_s)
            await response.write(_splice_comment(state, iu_id, cut_from, kind))
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        outcome = "neutral"  # the client went away (our write failed); the IU is fine
    except BaseException:
        outcome = "neutral"
        raise
    finally:
        if upstream is not None:
            _finish(upstream)
            state.release(iu_id, outcome if upstream.content.at_eof() else "neutral", call.handle)
            if liveness is not None:
                liveness.ended(iu_id)
    return response


def _cut_kind(exc: BaseException, watched: bool) -> tuple[str, str]:
    """(the metric's kind, the IU's outcome) of a relay cut by ``exc``; ``watched``: the relay's own
    silence watch (``stream_stall_s``) was on, so a plain timeout is it, not the edge's total deadline (a
    stream has none)."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return "idle", "definitive"
    if own_deadline(exc):
        return ("stalled", "definitive") if watched else ("deadline", "neutral")
    return "mid_stream", "failed"


def _splice_comment(state, iu_id: str, cut_from: str, kind: str) -> bytes:
    """The SSE comment where a resumed stream was spliced; IU ids only with ``debug_headers`` (internal)."""
    where = f" on {iu_id} after {cut_from}" if state.config.debug_headers else " after"
    return f": resumed{where} {kind}\n\n".encode()


def _silence(state, kind: str) -> float:
    return state.config.stream_stall_s if kind == "stalled" else state.config.stream_idle_timeout_s


async def _resume(state, call: Call, text: StreamText, kind: str) -> Opened | None:
    body = text.continuation()
    if body is None:
        return None
    call.prompt_tokens = None  # the continuation's prompt is longer: priced by the IU's mean request
    try:
        opened = await open_first(state, call, json.dumps(body).encode())
    except Answered as exc:
        log.warning("stream cut (%s) and not resumed: %s", kind, exc.response.status)
        return None
    state.metrics.resumed_of[kind].inc()
    return opened


def _json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
