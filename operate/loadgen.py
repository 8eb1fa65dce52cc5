"""The open-loop load generator: requests sent at Poisson arrival times, whatever the answers do.

Open loop: each request is sent at its planned time (:func:`plan`) whether earlier ones have been answered
or not, as independent users do; a closed loop (N users each waiting for its answer) slows down with the
system it measures and hides its queues. How late the generator itself sent each request is measured
(``lag_s``: actual send minus plan), so a run can show that it measured the cluster, not itself
(bench/loadgen.py measures the ceiling).

Requests: ``POST /v1/completions`` with ``stream: true`` and the prompt as a list of token ids, so a prompt
is exactly the planned number of tokens without a tokenizer (vLLM accepts token ids as ``prompt``; the
edge prices them exactly, edge/tokens.py); ``ignore_eos`` (a vLLM extension) makes the output exactly
``max_tokens`` long. The ids are drawn from a pool of ordinary vocabulary ids (below 30,000, inside every
current model's vocabulary) at a random offset per request, so two prompts share no prefix the engine
could cache.

Per request: time to first token (first content chunk), end to end (last byte), mean inter-token latency
((last token - first token) / (tokens - 1)), and on failure its kind: ``http_<status>``, ``cut_stream``
(the stream ended without ``[DONE]``, or with the edge's ``error`` event), ``timeout`` or ``connect``.
The edge's routing headers (``X-Eas-IU``, ``X-Eas-Score``, ``X-Eas-Expected-S``, ``X-Eas-Prefill-S``,
``X-Eas-Tried``) are kept for calibration.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from operate.scenario import Scenario

TOKEN_POOL = 1 << 16
# The event loop's timers wake late by up to ~1 ms (epoll's timeout is whole milliseconds, rounded up): the
# generator sleeps until this much before a send and yields to the loop for the rest, so sends keep time.
SPIN_S = 0.0015
FINISH_POLL_S = 0.25
TOKEN_ID_RANGE = (1000, 30000)
EDGE_HEADERS = {"iu": "X-Eas-IU", "score": "X-Eas-Score", "expected_s": "X-Eas-Expected-S",
                "prefill_s": "X-Eas-Prefill-S", "tried": "X-Eas-Tried"}


@dataclass(frozen=True)
class Planned:
    index: int
    at: float  # seconds after the run's start
    klass: str
    prompt_tokens: int
    output_tokens: int
    offset: int  # where its prompt starts in the token pool


@dataclass
class Outcome:
    index: int
    klass: str
    at: float  # planned send, seconds after the start
    lag_s: float  # actual send - planned send
    prompt_tokens: int
    output_tokens: int  # requested
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: float | None = None
    tokens: int = 0  # generated, as the answer reports it
    error: str | None = None
    streamed: bool = False  # a content chunk arrived: a failure after it cut a stream the client was reading
    iu: str | None = None
    score: float | None = None
    expected_s: float | None = None
    prefill_s: float | None = None
    tried: float | None = None  # IUs the edge tried for it: above 1, its TTFT began at another IU

    @property
    def ok(self) -> bool:
        return self.error is None


def plan(scenario: Scenario, rate: float, duration_s: float, seed: int) -> list[Planned]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``, each drawn from the scenario's mix."""
    if rate <= 0 or duration_s <= 0:
        return []
    rng = random.Random(seed)
    planned, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return planned
        klass, prompt, output = scenario.draw(rng)
        planned.append(Planned(len(planned), t, klass, prompt, output, rng.randrange(TOKEN_POOL)))


class TokenPool:
    """Token ids as JSON text, so a request's prompt is one slice and one join (no per-request encoding)."""

    def __init__(self, seed: int = 0, size: int = TOKEN_POOL):
        rng = random.Random(seed)
        self.items = [str(rng.randrange(*TOKEN_ID_RANGE)) for _ in range(size)]

    def prompt_json(self, offset: int, tokens: int) -> str:
        size = len(self.items)
        out = []
        while tokens > 0:
            take = min(tokens, size - offset)
            out.append(",".join(self.items[offset:offset + take]))
            tokens -= take
            offset = 0
        return "[" + ",".join(out) + "]"


def request_body(pool: TokenPool, request: Planned, model: str | None) -> bytes:
    head = {"max_tokens": request.output_tokens, "stream": True, "ignore_eos": True}
    if model:
        head["model"] = model
    return (json.dumps(head)[:-1] + ', "prompt": ' + pool.prompt_json(request.offset, request.prompt_tokens)
            + "}").encode()


def _float_header(headers, name: str) -> float | None:
    value = headers.get(name)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _event_tokens(event: dict) -> tuple[bool, bool]:
    """(carries content, says finish_reason length) of one streamed completion event."""
    choices = event.get("choices") or []
    content = any((c.get("text") or (c.get("delta") or {}).get("content")) for c in choices if isinstance(c, dict))
    finished = any(isinstance(c, dict) and c.get("finish_reason") == "length" for c in choices)
    return content, finished


def request_headers(api_key: str | None = None) -> dict[str, str]:
    """A request's headers: JSON, and the client key as a bearer token when the edge wants one (its
    ``client_keys``)."""
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}


async def send(session: aiohttp.ClientSession, url: str, body: bytes, outcome: Outcome, start: float,
               timeout_s: float, headers: dict[str, str] | None = None) -> Outcome:
    """One streamed request; fills ``outcome`` (times from ``start``, the monotonic time of its send)."""
    first = last = None
    chunks, done, finished_length, cut = 0, False, False, False
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers or request_headers()) as answer:
                for key, header in EDGE_HEADERS.items():
                    if key == "iu":
                        outcome.iu = answer.headers.get(header)
                    else:
                        setattr(outcome, key, _float_header(answer.headers, header))
                if answer.status != 200:
                    await answer.read()
                    outcome.error = f"http_{answer.status}"
                    return outcome
                async for raw in answer.content:
                    line = raw.strip()
                    if line.startswith(b"event: error"):
                        cut = True
                        continue
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        continue
                    if "error" in event:
                        cut = True
                        continue
                    content, finished = _event_tokens(event)
                    usage = event.get("usage") or {}
                    if isinstance(usage.get("completion_tokens"), int):
                        outcome.tokens = usage["completion_tokens"]
                    if content:
                        now = time.monotonic()
                        first = now if first is None else first
                        outcome.streamed = True
                        last = now
                        chunks += 1
                    finished_length = finished_length or finished
    except TimeoutError:
        outcome.error = "timeout"
        return outcome
    except aiohttp.ClientConnectorError:
        outcome.error = "connect"
        return outcome
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        cut = True
    end = time.monotonic()
    if cut or not done:
        outcome.error = "cut_stream"
        return outcome
    if not outcome.tokens:  # no usage: a length finish means max_tokens; else one token per chunk
        outcome.tokens = outcome.output_tokens if finished_length else chunks
    outcome.e2e_s = end - start
    if first is not None:
        outcome.ttft_s = first - start
        if outcome.tokens > 1 and last > first:
            outcome.itl_s = (last - first) / (outcome.tokens - 1)
    else:
        outcome.error = "no_tokens"
    return outcome


class Generator:
    """Sends a plan open-loop against ``endpoint`` (``http://host:port``); ``stop()`` ends it early (the
    requests in flight cancelled), ``finish()`` sends no more of it (those in flight run to their end)."""

    def __init__(self, endpoint: str, model: str | None = None, timeout_s: float = 60.0, seed: int = 0,
                 api_key: str | None = None):
        self.url = endpoint.rstrip("/") + "/v1/completions"
        self.headers = request_headers(api_key)
        self.model, self.timeout_s = model, timeout_s
        self.pool = TokenPool(seed)
        self.outcomes: list[Outcome] = []
        self.inflight = 0
        self.sent = 0
        self.stopped = False
        self.finishing = False
        self.started: float | None = None

    def stop(self) -> None:
        self.stopped = True

    def finish(self) -> None:
        """Send nothing more of the plan; the requests in flight run to their end."""
        self.finishing = True

    async def run(self, planned: list[Planned], on_done: Callable[[Outcome], None] | None = None,
                  session: aiohttp.ClientSession | None = None) -> list[Outcome]:
        """Send every planned request at its time; returns the finished outcomes (all of them unless
        stopped: then those finished, the rest cancelled)."""
        own = session is None
        if own:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                            timeout=aiohttp.ClientTimeout(total=None))
        tasks: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        self.started = start = loop.time()

        async def one(request: Planned, body: bytes) -> None:
            outcome = Outcome(request.index, request.klass, request.at, loop.time() - start - request.at,
                              request.prompt_tokens, request.output_tokens)
            self.inflight += 1
            try:
                await send(session, self.url, body, outcome, time.monotonic(), self.timeout_s, self.headers)
            finally:
                self.inflight -= 1
            self.outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)

        try:
            for request in planned:
                if self.stopped or self.finishing:
                    break
                body = request_body(self.pool, request, self.model)  # built before its time, not after
                due = start + request.at
                while due - loop.time() > SPIN_S and not self.finishing:  # a finish is seen within a wake
                    await asyncio.sleep(min(due - loop.time() - SPIN_S, FINISH_POLL_S))
                while loop.time() < due and not self.finishing:  # the last stretch: yield to the loop until due
                    await asyncio.sleep(0)
                if self.stopped or self.finishing:
                    break
                self.sent += 1
                task = asyncio.create_task(one(request, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks and not self.stopped:
                await asyncio.wait(set(tasks), timeout=0.1)
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if own:
                await session.close()
        return self.outcomes
