"""Edges that route on published scores through the shipped edge's own code.

Each edge owns an `edge.feed.EdgeView` (the reader library's PoolView with the edge's input checks, its own
`AnomalyDetector`) and an `edge.routing.Router` (per-IU cap, the ledger in seconds of prefill, `pick()` with
the request's prompt size), exactly as an `eas-edge` process does, called with the simulated clock and the
edge's seeded RNG. How the view is fed:

- ConsulKVWatch: the timing of `ConsulWatcher._loop` in simulated time — a blocking query on the KV prefix
  returns `consul_latency_s` after a write that changes the index (Raft commit plus the wake-up of the
  blocked HTTP request; a few ms on a LAN), the view applies the whole prefix, and the next query starts no
  sooner than `min_interval_s` (0.1 s, the watcher's default) after the previous one started.
- AgentPush: `edge.feed.AgentFeed`'s timing in simulated time: each agent writes its cycle's body to the
  edge's stream on `/scores?stream=1` as soon as it exists; the body reaches the edge `latency_s` later
  (a LAN one-way trip and the JSON of a 2-IU body, ~1 ms) and is folded into the view with the other
  nodes' bodies that arrived within `apply_interval_s` (the shipped default, 20 ms). The edge watches the KV
  too (ConsulKVWatch): per node the newer body wins, as in the edge.
- AgentPoll (not shipped; kept for comparisons): GET every agent's `/scores` every `period_s`.
Health (`health/service/vllm-iu`) reaches every edge `consul_latency_s` after a check status changes.
"""

from __future__ import annotations

import random

from consul_io import layout
from edge.config import EdgeConfig, PushConfig
from edge.feed import EdgeView
from edge.pool import PoolView, pick
from edge.pool.prefix import PrefixIndex, PromptPrefix
from edge.routing import Decision, Router
from sim.vllm.eventloop import EventLoop

from .agents import DATACENTER, KV_PREFIX, AgentFleet, SimNodeAgent
from .workload import TraceRequest


class ScoredEdge:
    """`mode` "p2c": the reader library's pick(); "argmin": the design's EAS rule (lowest score wins)."""

    def __init__(self, view: PoolView, rng: random.Random, iu_ids: list[str], mode: str, announcing: bool = False,
                 prefix: bool = EdgeConfig().prefix_routing):
        self.view, self.rng, self.mode = view, rng, mode
        defaults = EdgeConfig()
        self.router = Router(rng, defaults.max_inflight_per_iu, defaults.eject_s, announcing=announcing,
                             prefix=PrefixIndex() if prefix else None)
        self.ledger = self.router.ledger
        self.iu_ids = iu_ids
        self.index_of = {iu: i for i, iu in enumerate(iu_ids)}
        self.modes: dict[str, int] = {}
        self.seen: dict[int, tuple[float | None, float]] = {}  # rid -> (published score, its age) at pick
        self.decision: Decision | None = None  # the router's, for the last request picked (None: argmin, fail-open)

    def _argmin(self, now: float) -> str | None:
        snapshot = self.view.snapshot()
        fresh = [e for e in snapshot.scored if now <= e.stale_after]
        if not fresh:
            return pick(snapshot, self.ledger, now, self.rng).iu_id  # the library's fail-open path
        low = min(e.score for e in fresh)
        ties = [e for e in fresh if e.score == low]
        return ties[int(self.rng.random() * len(ties))].iu_id

    def pick(self, request: TraceRequest, now: float) -> int:
        self.decision = None
        if self.mode == "argmin":
            iu_id, mode, cost, expected, queued_as = self._argmin(now), "argmin", None, None, None
        else:
            prefix = PromptPrefix(request.blocks, request.home_key, request.context)
            self.router.learn(self.view.relayed.take())  # as edge/proxy.py's decide: the agents' relay
            decision = self.router.choose(self.view.snapshot(), now, request.prompt, prefix=prefix)
            iu_id, mode, cost, expected = decision.iu_id, decision.mode, decision.cost_s, decision.expected_s
            self.decision = decision if iu_id is not None else None
            queued_as = decision.queued_as_s
        if iu_id is None:  # nothing known yet (the first instants of a run), or every IU at the cap: any IU
            iu_id, mode = self.iu_ids[int(self.rng.random() * len(self.iu_ids))], mode if mode != "none" else "none"
        self.modes[mode] = self.modes.get(mode, 0) + 1
        entry = next((e for e in self.view.snapshot().entries if e.iu_id == iu_id), None)
        self.seen[request.rid] = (entry.score, now - entry.ts) if entry is not None else (None, 0.0)
        self.router.sent(iu_id, now, cost, request.rid, expected, queued_as, request.blocks)
        return self.index_of[iu_id]

    def first_token(self, iu: int, rid: int, now: float) -> None:
        self.router.first_byte(self.iu_ids[iu], rid)

    def finished(self, iu: int, now: float, rid: int | None = None) -> None:
        self.router.done(self.iu_ids[iu], rid)


def new_view(loop: EventLoop) -> PoolView:
    return EdgeView(clock=lambda: loop.now)


PUSH_LATENCY_S = 0.001  # a body on the agent's stream: a LAN one-way trip + JSON of a 2-IU body


class AgentPush:
    """One edge's streams from every agent's /scores (edge.feed.AgentFeed), simulated."""

    def __init__(self, fleet: AgentFleet, view: PoolView, loop: EventLoop, latency_s: float = PUSH_LATENCY_S,
                 apply_interval_s: float = PushConfig().apply_interval_s):
        self.view, self.loop = view, loop
        self.latency_s, self.apply_interval_s = latency_s, apply_interval_s
        self.pending: dict[str, dict] = {}
        self.flush_scheduled = False
        self.updates = 0
        fleet.cycle_listeners.append(self._on_cycle)

    def _on_cycle(self, agent: SimNodeAgent, now: float) -> None:
        if agent.sink.body is not None:
            # what the edge decodes from the agent's /scores answer; its EdgeView parses it as production does
            self.loop.schedule(now + self.latency_s, self._arrive, (agent.config.node, agent.sink.body.to_json()))

    def _arrive(self, item, now: float) -> None:
        node, body = item
        self.pending[node] = body
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.schedule(now + self.apply_interval_s, self._flush)

    def _flush(self, _arg, now: float) -> None:
        self.flush_scheduled = False
        bodies, self.pending = list(self.pending.values()), {}
        self.view.apply_polled(bodies)
        self.updates += 1


class HealthFeed:
    def __init__(self, fleet: AgentFleet, views: list[PoolView], loop: EventLoop, latency_s: float):
        self.fleet, self.views, self.loop, self.latency_s = fleet, views, loop, latency_s
        fleet.health_listeners.append(lambda now: loop.schedule(now + latency_s, self._deliver))

    def _deliver(self, _arg, now: float) -> None:
        entries = self.fleet.health_entries()
        for view in self.views:
            view.apply_health(entries)


class ConsulKVWatch:
    """One edge's rate-limited blocking query on the score prefix (ConsulWatcher's loop, simulated)."""

    def __init__(self, fleet: AgentFleet, view: PoolView, loop: EventLoop, latency_s: float,
                 min_interval_s: float = 0.1):
        self.fleet, self.view, self.loop = fleet, view, loop
        self.latency_s, self.min_interval_s = latency_s, min_interval_s
        self.seen_index = 0
        self.query_start = 0.0
        self.blocked = True  # the first query is outstanding from t=0
        self.answer_scheduled = False
        self.updates = 0
        fleet.write_listeners.append(self._on_write)

    def _on_write(self, now: float) -> None:
        if self.blocked and not self.answer_scheduled:
            self.answer_scheduled = True
            self.loop.schedule(now + self.latency_s, self._answer)

    def _answer(self, _arg, now: float) -> None:
        self.answer_scheduled = self.blocked = False
        index = self.fleet.store.index
        if index != self.seen_index:
            self.view.apply_kv(self.fleet.kv_entries())
            self.seen_index = index
            self.updates += 1
        self.loop.schedule(max(now, self.query_start + self.min_interval_s), self._query)

    def _query(self, _arg, now: float) -> None:
        self.query_start = now
        if self.fleet.store.index != self.seen_index:
            self.answer_scheduled = True
            self.loop.schedule(now + self.latency_s, self._answer)
        else:
            self.blocked = True


class AgentPoll:
    """One edge polling every agent's /scores every `period_s`."""

    def __init__(self, fleet: AgentFleet, view: PoolView, loop: EventLoop, period_s: float, rng: random.Random):
        self.fleet, self.view, self.loop, self.period_s = fleet, view, loop, period_s
        self.seen: tuple[int, ...] = ()
        self.texts: dict[str, tuple[int, str]] = {}
        self.updates = 0
        loop.schedule(rng.uniform(0.0, period_s), self._poll)

    def _poll(self, _arg, now: float) -> None:
        self.loop.schedule(now + self.period_s, self._poll)
        versions = tuple(agent.sink.version for agent in self.fleet.agents)
        if versions == self.seen:
            return
        self.seen = versions
        entries = []
        for agent in self.fleet.agents:
            if agent.sink.body is None:
                continue
            node = agent.config.node
            cached = self.texts.get(node)
            if cached is None or cached[0] != agent.sink.version:
                cached = self.texts[node] = (agent.sink.version, agent.sink.body.dumps())
            entries.append({"Key": layout.score_key(DATACENTER, node, KV_PREFIX), "Value": cached[1]})
        self.view.apply_kv(entries)
        self.updates += 1
