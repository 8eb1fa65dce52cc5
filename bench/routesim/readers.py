"""Edges that route on published scores through the real reader library (eas_agent.scheduler).

Each edge owns a `PoolView` (with its own `AnomalyDetector`) and an `EdgeLedger`, exactly as an edge
process would; `pick()` is called with the simulated clock and the edge's seeded RNG. How the view is fed:

- ConsulKVWatch: the timing of `ConsulWatcher._loop` in simulated time — a blocking query on the KV prefix
  returns `consul_latency_s` after a write that changes the index (Raft commit plus the wake-up of the
  blocked HTTP request; a few ms on a LAN), the view applies the whole prefix, and the next query starts no
  sooner than `min_interval_s` (0.1 s, the watcher's default) after the previous one started.
- AgentPoll: the edge GETs every agent's `/scores` every `period_s` and applies the bodies (the same body
  shape and the same code that fills the KV key); an unchanged set of bodies is not re-applied.
Health (`health/service/vllm-iu`) reaches every edge `consul_latency_s` after a check status changes.
"""

from __future__ import annotations

import json
import random

from eas_agent.scheduler import EdgeLedger, PoolView, pick

from .agents import DATACENTER, KV_PREFIX, AgentFleet
from .loop import EventLoop
from .workload import TraceRequest


class ScoredEdge:
    """`mode` "p2c": the reader library's pick(); "argmin": the design's EAS rule (lowest score wins)."""

    def __init__(self, view: PoolView, rng: random.Random, iu_ids: list[str], mode: str):
        self.view, self.rng, self.mode = view, rng, mode
        self.ledger = EdgeLedger()
        self.iu_ids = iu_ids
        self.index_of = {iu: i for i, iu in enumerate(iu_ids)}
        self.modes: dict[str, int] = {}
        self.seen: dict[int, tuple[float | None, float]] = {}  # rid -> (published score, its age) at pick

    def _argmin(self, now: float) -> str | None:
        snapshot = self.view.snapshot()
        fresh = [e for e in snapshot.scored if now <= e.stale_after]
        if not fresh:
            return pick(snapshot, self.ledger, now, self.rng).iu_id  # the library's fail-open path
        low = min(e.score for e in fresh)
        ties = [e for e in fresh if e.score == low]
        return ties[int(self.rng.random() * len(ties))].iu_id

    def pick(self, request: TraceRequest, now: float) -> int:
        iu_id = self._choose(now)
        entry = next((e for e in self.view.snapshot().entries if e.iu_id == iu_id), None)
        self.seen[request.rid] = (entry.score, now - entry.ts) if entry is not None else (None, 0.0)
        self.ledger.on_sent(iu_id, now)
        return self.index_of[iu_id]

    def _choose(self, now: float) -> str:
        if self.mode == "argmin":
            iu_id, mode = self._argmin(now), "argmin"
        else:
            choice = pick(self.view.snapshot(), self.ledger, now, self.rng)
            iu_id, mode = choice.iu_id, choice.mode
        if iu_id is None:  # nothing known yet (the first instants of a run): any IU
            iu_id, mode = self.iu_ids[int(self.rng.random() * len(self.iu_ids))], "none"
        self.modes[mode] = self.modes.get(mode, 0) + 1
        return iu_id

    def finished(self, iu: int, now: float) -> None:
        self.ledger.on_done(self.iu_ids[iu])


def new_view(loop: EventLoop) -> PoolView:
    return PoolView(clock=lambda: loop.now)


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
                cached = self.texts[node] = (agent.sink.version, json.dumps(agent.sink.body))
            entries.append({"Key": f"{KV_PREFIX}/{DATACENTER}/{node}", "Value": cached[1]})
        self.view.apply_kv(entries)
        self.updates += 1
