"""What the edge knows about the pool: Consul's view (reader library) plus scores pushed by the agents.

Consul stays the source of truth for membership, health and maintenance, and for a bounded-rate score
snapshot (the agents' KV writes, <= 1 per node per second steady): ``ConsulWatcher`` (rate-limited blocking
queries, its own threads) feeds an :class:`EdgeView`.

Freshness: :class:`AgentFeed` holds one blocking query per node open to that node's agent,
``GET http://<node address>:<agent_port>/scores?index=N&wait_s=W`` (eas_agent/http.py): the agent answers
as soon as its next cycle's body exists (every 200 ms), so each score reaches the edge a round trip after
it was computed, unquantized and without a Consul write. Node addresses come from the IUs' Consul services
(vLLM runs on the node; the agent listens there on ``agent_port``). Bodies are folded into the view at most
every ``apply_interval_s`` (one rebuild for many nodes). Per node the newer body (KV or pushed) wins, so
when an agent cannot be reached its pushed body ages and the KV snapshot takes over; when both are older
than 3 heartbeats ``pick()`` fails open to least-in-flight.

Nonsense from an agent (a negative, NaN or non-numeric score, a body that is not the score shape) is
ignored and counted by reason (``eas_edge_scores_ignored_total``): the IU's score counts as unknown, which
keeps it out of the power-of-two choice but lets the fail-open path still use a healthy IU.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter

import aiohttp

from eas_agent.scheduler import PoolView
from eas_agent.scorebody import ScoreBody

log = logging.getLogger("edge.feed")


class EdgeView(PoolView):
    """The edge's PoolView: every body (KV listing and pushed) is read as a typed
    :class:`~eas_agent.scorebody.ScoreBody` (:meth:`PoolView.parse`), nonsense scores made unknown and
    counted by reason in ``ignored``."""

    blank_bad_scores = True

    def node_addresses(self) -> dict[str, str]:
        """node -> the address of its IUs' services (where its agent listens)."""
        addresses: dict[str, str] = {}
        with self.lock:
            services = list(self.health.values())
        for _health, service, node in services:  # node: the IU's owner as the view resolved it
            address = service.get("Address")
            if node and address:
                addresses.setdefault(node, address)
        return addresses


class AgentFeed:
    """One long-poll task per node's agent; pushed bodies are applied to the view in batches."""

    def __init__(self, view: EdgeView, session: aiohttp.ClientSession, agent_port: int, *, wait_s: float = 10.0,
                 apply_interval_s: float = 0.02, reconcile_s: float = 1.0, max_backoff_s: float = 5.0):
        self.view, self.session, self.agent_port = view, session, agent_port
        self.wait_s, self.apply_interval_s, self.reconcile_s = wait_s, apply_interval_s, reconcile_s
        self.max_backoff_s = max_backoff_s
        self.tasks: dict[str, tuple[str, asyncio.Task]] = {}  # node -> (agent address, task)
        self.pending: dict[str, ScoreBody] = {}
        self.flush_scheduled = False
        self.updates = 0
        self.errors: Counter[str] = Counter()  # node -> failed queries
        self.connected: dict[str, bool] = {}
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
        loop = asyncio.get_running_loop()
        for node, agent in wanted.items():
            if node not in self.tasks:
                self.tasks[node] = (agent, loop.create_task(self._follow(node, agent), name=f"feed-{node}"))

    async def _follow(self, node: str, agent: str) -> None:
        """Follow one agent until stopped: any failure (unreachable, a hostile answer, a bug) backs off and
        asks again without an index."""
        index, failures = None, 0
        url = f"http://{agent}/scores"
        timeout = aiohttp.ClientTimeout(total=self.wait_s + 5.0, sock_connect=1.0)
        while not self.stopping:
            try:
                index = await self._next(node, agent, url, timeout, index)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. JSON nested too deep for the decoder (RecursionError)
                failures += 1
                self.errors[node] += 1
                self.connected[node] = False
                if failures == 1:
                    log.warning("agent %s (%s): %s; using its Consul snapshot", node, agent, type(exc).__name__)
                index = None
                await asyncio.sleep(self.rng.uniform(0.5, 1.0) * min(self.max_backoff_s, 0.2 * 2**min(failures, 10)))
                continue
            failures = 0

    async def _next(self, node: str, agent: str, url: str, timeout: aiohttp.ClientTimeout, index: int | None
                    ) -> int | None:
        """One blocking query; the body it answers (when new) goes to the view. Returns the index to ask next."""
        params = {} if index is None else {"index": str(index), "wait_s": str(self.wait_s)}
        async with self.session.get(url, params=params, timeout=timeout) as answer:
            if answer.status != 200:
                raise aiohttp.ClientResponseError(answer.request_info, (), status=answer.status)
            new_index = int(answer.headers.get("X-Eas-Index", "0"))
            body = await answer.json(content_type=None)
        self.connected[node] = True
        if new_index == index:
            return index  # the wait ran out without a new cycle (a stalled agent): ask again
        if new_index == 0:  # the agent's first cycle has not ended ("{}"): wait for it, nothing to parse
            return 0
        typed = self.view.parse(body, f"/scores of {node} ({agent})")
        if typed is None:
            return new_index
        if typed.node != node:  # a mis-addressed agent must not overwrite another node's scores
            self.view.ignored["node_mismatch"] += 1
            return new_index
        self.pending[node] = typed
        self.last_push[node] = time.monotonic()
        self._schedule_flush()
        return new_index

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
