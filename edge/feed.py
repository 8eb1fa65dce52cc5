"""What the edge knows about the pool: Consul's view (reader library) plus scores pushed by the agents.

Consul stays the source of truth for membership, health and maintenance, and for a bounded-rate score
snapshot (the agents' KV writes, <= 1 per node per second steady): ``ConsulWatcher`` (rate-limited blocking
queries, its own threads) feeds an :class:`EdgeView`.

Freshness: :class:`AgentFeed` holds one stream open to each node's agent, ``GET http://<node
address>:<agent_port>/scores?stream=1`` (docs/contracts/scores-stream.md): the agent writes each cycle's
body (every 200 ms) and each body the announce channel adds as one line as soon as it exists, so each score
reaches the edge a one-way trip after it was computed, unquantized and without a Consul write. An agent from before streams
answers that request with one plain body: the feed then follows it with blocking queries
(``/scores?index=N&wait_s=W``, one request per body) instead. Node addresses come from the IUs' Consul
services (vLLM runs on the node; the agent listens there on ``agent_port``). Bodies are folded into the view
at most every ``apply_interval_s`` (one rebuild for many nodes). Per node the newer body (KV or pushed)
wins, so when an agent cannot be reached its pushed body ages and the KV snapshot takes over; when both are
older than 3 heartbeats ``pick()`` fails open to least-in-flight.

Nonsense from an agent (a negative, NaN or non-numeric score, a body that is not the score shape) is
ignored and counted by reason (``eas_edge_scores_ignored_total``): the IU's score counts as unknown, which
keeps it out of the power-of-two choice but lets the fail-open path still use a healthy IU. A plain body
longer than the view's ``MAX_BODY_BYTES`` (1 MiB; a real one is 1-4 KB) is refused as it arrives, never
buffered whole, and counts as a failed query.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from urllib.parse import urlencode

import aiohttp

from eas_wire.scorebody import ScoreBody
from eas_wire.signing import SIGNATURE_HEADER, Ed25519PrivateKey, request_message, sign
from eas_wire.stream import (
    INDEX_HEADER,
    SCORES_PATH,
    STREAM_CONTENT_TYPE,
    STREAM_HEARTBEAT_S,
    STREAM_PARAMS,
    blocking_params,
    read_frame,
)
from edge.limits import read_capped
from edge.pool import PoolView
from edge.pool.view import MAX_BODY_BYTES

log = logging.getLogger("edge.feed")


class EdgeView(PoolView):
    """The edge's PoolView: every body (KV listing and pushed) is read as a typed
    :class:`~eas_wire.scorebody.ScoreBody` (:meth:`PoolView.parse`), nonsense scores made unknown and
    counted by reason in ``ignored``."""

    blank_bad_scores = True

    def node_addresses(self) -> dict[str, str]:
        """node -> the address of its IUs' services (where its agent listens): only registrations on that
        catalog node that passed the view's ownership checks, so no node can name another's agent address."""
        addresses: dict[str, str] = {}
        with self.lock:
            services = list(self.health.items())
        for (node, _iu), (_health, service) in services:
            address = service.get("Address")
            if node and address:
                addresses.setdefault(node, address)
        return addresses

    def unit_models(self) -> dict[str, str | None]:
        """IU id -> the model it serves (its Consul service's ``Meta.model``; None: not declared, any model).
        Kept while Consul's health answer is the same object, so a request does not rebuild it. Read
        without the view's lock (the watcher threads hold it while rebuilding, and the event loop must not
        wait for them): ``apply_health`` replaces the dict whole, never changes it in place."""
        health = self.health
        cached = getattr(self, "_models", None)
        if cached is not None and cached[0] is health:
            return cached[1]
        models = {}
        for (_node, iu_id), (_health, service) in health.items():
            meta = service.get("Meta")
            model = meta.get("model") if isinstance(meta, dict) else None
            models[iu_id] = model if isinstance(model, str) and model else None
        self._models = (health, models)
        return models


class AgentFeed:
    """One task per node's agent following its stream of bodies; bodies are applied to the view in batches.

    ``wait_s``: how long a blocking query waits (agents without streams); a stream silent (not even a
    heartbeat) for ``wait_s`` + the agent's heartbeat interval is reopened. ``stream=False`` follows every
    agent with blocking queries, as for agents from before streams (bench/push_fanout.py compares the two)."""

    def __init__(self, view: EdgeView, session: aiohttp.ClientSession, agent_port: int, *, wait_s: float = 10.0,
                 apply_interval_s: float = 0.02, reconcile_s: float = 1.0, max_backoff_s: float = 5.0,
                 stream: bool = True, key: Ed25519PrivateKey | None = None):
        """``key``: this edge's announce key, which signs each stream request (the agent serves signed
        streams from slots anonymous clients cannot take, for as long as it serves any stream)."""
        self.view, self.session, self.agent_port, self.stream = view, session, agent_port, stream
        self.key = key
        self.wait_s, self.apply_interval_s, self.reconcile_s = wait_s, apply_interval_s, reconcile_s
        self.max_backoff_s = max_backoff_s
        self.tasks: dict[str, tuple[str, asyncio.Task]] = {}  # node -> (agent address, task)
        self.pending: dict[str, ScoreBody] = {}
        self.flush_scheduled = False
        self.updates = 0
        self.errors: Counter[str] = Counter()  # node -> failed streams and queries
        self.connected: dict[str, bool] = {}
        self.streaming: dict[str, bool] = {}  # node -> followed over a stream (False: blocking queries)
        self.last_push: dict[str, float] = {}  # node -> monotonic time of its last pushed body
        self.stopping = False
        self.rng = random.Random()
        self.runner: asyncio.Task | None = None

    def start(self) -> AgentFeed:
        self.runner = asyncio.get_running_loop().create_task(self._reconcile_loop())
        return self

    async def stop(self) -> None:
        self.stopping = True
        tasks = [t for _, t in self.tasks.values()] + ([self.runner] if self.runner else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reconcile_loop(self) -> None:
        while not self.stopping:
            try:
                self.reconcile()
            except Exception:  # a bug here must not end the feed: the next round tries again
                log.exception("reconciling the agent feed failed")
            await asyncio.sleep(self.reconcile_s)

    def reconcile(self) -> None:
        """One running task per node Consul lists (with its current address): tasks of nodes gone are
        cancelled, a task that ended (it never should: :meth:`_follow` survives any answer) is replaced."""
        wanted = {node: f"{address}:{self.agent_port}" for node, address in self.view.node_addresses().items()}
        for node, (agent, task) in list(self.tasks.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("agent feed of %s ended: %r; restarting it", node, task.exception())
            if wanted.get(node) != agent or task.done():
                task.cancel()
                del self.tasks[node]
                self.connected.pop(node, None)
                self.streaming.pop(node, None)
        loop = asyncio.get_running_loop()
        for node, agent in wanted.items():
            if node not in self.tasks:
                self.tasks[node] = (agent, loop.create_task(self._follow(node, agent), name=f"feed-{node}"))

    async def _follow(self, node: str, agent: str) -> None:
        """Follow one agent until stopped: any failure (unreachable, a hostile answer, a bug) backs off and
        starts over; so does a stream that ended without a body (an agent closing streams at once must not
        turn this into a busy loop). An agent that answers the stream request with a plain body is followed
        with blocking queries until a query fails (the agent restarted: perhaps upgraded), then asked for a
        stream again."""
        index, failures, stream = None, 0, self.stream
        url = f"http://{agent}{SCORES_PATH}"
        timeout = aiohttp.ClientTimeout(total=self.wait_s + 5.0, sock_connect=1.0)
        while not self.stopping:
            try:
                if stream:
                    bodies, stream, index = await self._read_stream(node, agent, url)
                    if stream and not bodies:
                        raise ConnectionResetError("the stream ended without a body")
                else:
                    index = await self._next(node, agent, url, timeout, index)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. JSON nested too deep for the decoder (RecursionError)
                failures += 1
                self.errors[node] += 1
                self.connected[node] = False
                if failures == 1:
                    log.warning("agent %s (%s): %s; using its Consul snapshot", node, agent, type(exc).__name__)
                index, stream = None, self.stream  # an agent upgraded in between streams from its restart on
                await asyncio.sleep(self.rng.uniform(0.5, 1.0) * min(self.max_backoff_s, 0.2 * 2**min(failures, 10)))
                continue
            failures = 0

    async def _read_stream(self, node: str, agent: str, url: str) -> tuple[int, bool, int | None]:
        """Read one stream until the agent ends it: (bodies read, still streaming, index). Not streaming: the
        agent answered with one plain body (from before streams), which was used; ``index`` is its
        ``X-Eas-Index`` for the blocking query that follows."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=1.0, sock_read=self.wait_s + STREAM_HEARTBEAT_S)
        headers = {}
        if self.key is not None:
            target = f"{SCORES_PATH}?{urlencode(STREAM_PARAMS)}"
            headers[SIGNATURE_HEADER] = sign(self.key, request_message("GET", target), time.time())
        async with self.session.get(url, params=STREAM_PARAMS, timeout=timeout, headers=headers) as answer:
            if answer.status != 200:
                raise aiohttp.ClientResponseError(answer.request_info, (), status=answer.status)
            if answer.content_type != STREAM_CONTENT_TYPE:
                index = int(answer.headers.get(INDEX_HEADER, "0"))
                # the stream's timeout has no total (wait_for, not asyncio.timeout: the edge runs on 3.10)
                body = json.loads(await asyncio.wait_for(read_capped(answer, MAX_BODY_BYTES), self.wait_s + 5.0))
                self.connected[node], self.streaming[node] = True, False
                if not index:  # 0: the agent's first cycle has not ended ("{}")
                    return 0, False, index
                self._received(node, agent, body)
                return 1, False, index
            self.connected[node], self.streaming[node] = True, True
            bodies = 0
            # a line longer than aiohttp's buffer limit (~128 KiB; a body is 1-4 KB) raises: a failure
            while line := await answer.content.readline():
                body = read_frame(line)
                if body is not None:  # None: the agent's heartbeat
                    bodies += 1
                    self._received(node, agent, body)
            return bodies, True, None

    async def _next(self, node: str, agent: str, url: str, timeout: aiohttp.ClientTimeout, index: int | None
                    ) -> int | None:
        """One blocking query; the body it answers (when new) goes to the view. Returns the index to ask next."""
        async with self.session.get(url, params=blocking_params(index, self.wait_s), timeout=timeout) as answer:
            if answer.status != 200:
                raise aiohttp.ClientResponseError(answer.request_info, (), status=answer.status)
            new_index = int(answer.headers.get(INDEX_HEADER, "0"))
            body = json.loads(await read_capped(answer, MAX_BODY_BYTES))
        self.connected[node] = True
        if new_index == index:
            return index  # the wait ran out without a new cycle (a stalled agent): ask again
        if new_index == 0:  # the agent's first cycle has not ended ("{}"): wait for it, nothing to parse
            return 0
        self._received(node, agent, body)
        return new_index

    def _received(self, node: str, agent: str, body) -> None:
        """One decoded body from ``node``'s agent: checked, then queued for the next flush."""
        typed = self.view.parse(body, f"/scores of {node} ({agent})")
        if typed is None:
            return
        if typed.node != node:  # a mis-addressed agent must not overwrite another node's scores
            self.view.ignored["node_mismatch"] += 1
            return
        self.view.read_placed(typed)  # now: a newer line of the node replaces this body before the flush
        self.pending[node] = typed
        self.last_push[node] = time.monotonic()
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_later(self.apply_interval_s, self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.pending:
            bodies, self.pending = list(self.pending.values()), {}
            self.view.apply_polled(bodies)
            self.updates += 1
