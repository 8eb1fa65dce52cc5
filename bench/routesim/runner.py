"""Scenarios (policy + how it reads scores) and running one on a trace."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.vllm.roofline import IUModel

from .agents import AgentFleet, direct_scrapes
from .announce import AnnounceNodes, announce_edges
from .llmd import LlmdStyle
from .policies import LeastConnections, Oracle, RoundRobin
from .readers import AgentPoll, AgentPush, ConsulKVWatch, HealthFeed, ScoredEdge, new_view
from .sim import Pool, RunResult, measure, stable_seed
from .workload import TraceRequest

CONSUL_LATENCY_S = 0.005  # KV write (Raft commit on a LAN) + wake-up of the edges' blocking queries
NODES_PER_RACK = 4


@dataclass(frozen=True)
class Scenario:
    label: str
    policy: str  # round-robin | least-conn | seed | ours | oracle | llm-d
    feed: str = "consul"  # seed / ours: "push" (agents' blocking queries + the KV, as eas-edge ships),
    #                       "consul" (the KV only: eas-edge with push off or no agent reachable), "poll",
    #                       "announce" (push + the announce channel, eas-edge's default: routesim.announce)
    edges: int = 4
    interval_s: float = 0.2  # the agent's collection cycle
    poll_s: float = 0.05
    heartbeat_s: float = 2.0
    before: bool = False  # drain without its admitted-prefill term (routesim.agents.BeforeScorer)
    rng_label: str | None = None  # tie-break seeds of this row (default: label); "before" rows pair with `ours`
    prefix: bool = True  # ours: the edge's prefix index (edge.config's prefix_routing, on by default)

    @property
    def uses_agents(self) -> bool:
        return self.policy in ("seed", "ours")


SHIPPED = "ours (push + announce + Consul)"  # eas-edge's default with an announce token on edges and agents
SHIPPED_PUSH = "ours (push + Consul)"  # no announce token configured (or agents without the channel)
SHIPPED_CONSUL_ONLY = "ours (Consul only)"  # eas-edge --no-push, or every agent unreachable
FEED_OF = {SHIPPED: "announce", SHIPPED_PUSH: "push", SHIPPED_CONSUL_ONLY: "consul"}


def main_scenarios(edges: int) -> list[Scenario]:
    """Rows whose label starts with "ours" are exactly what eas-edge ships (edge.routing.Router), in its three
    modes: with the announce channel (the default when a token is configured), push only, Consul only."""
    return [
        Scenario("round-robin", "round-robin", edges=edges),
        Scenario("least-conn", "least-conn", edges=edges),
        Scenario("seed (argmin)", "seed", edges=edges),
        *(Scenario(label, "ours", feed=feed, edges=edges) for label, feed in FEED_OF.items()),
        Scenario("oracle", "oracle", edges=edges),
    ]


def edge_scenarios(counts: tuple[int, ...], shipped: str = SHIPPED) -> list[Scenario]:
    """``shipped`` (one of the `ours` modes) at each edge count; the main table's row at its edge count."""
    return [Scenario(f"{shipped}, {n} edge{'s' if n > 1 else ''}", "ours", feed=FEED_OF[shipped], edges=n,
                     rng_label=shipped if n == 4 else None) for n in counts]


def staleness_scenarios(ages_ms: tuple[int, ...], edges: int) -> list[Scenario]:
    """Score age without the announce channel: agents cycle every S and push each cycle's body (a score is
    0-S old when used, plus ~21 ms); the shipped agent cycles every 200 ms."""
    return [Scenario(f"push, agent cycle {ms} ms", "ours", feed="push", edges=edges, interval_s=ms / 1000,
                     heartbeat_s=max(2.0, ms / 1000)) for ms in ages_ms]


def misled_share(pool: Pool, edges: list[ScoredEdge], warmup_s: float, end_s: float,
                 long_wait_s: float = 0.5, looked_free_s: float = 0.1) -> dict:
    """Why score-based routing queues: of the measured requests that waited longer than `long_wait_s`, the
    share sent to an IU whose published score said it could start work within `looked_free_s`, and the
    median true wait (the oracle's estimate) of the chosen IU at that moment."""
    seen: dict[int, tuple[float | None, float]] = {}
    for edge in edges:
        seen.update(edge.seen)
    waited = [s for s in pool.finished
              if warmup_s <= s.arrival < end_s and s.first_token - s.arrival - s.own_prefill > long_wait_s]
    if not waited:
        return {"long_waits": 0}
    fooled = [s for s in waited if (seen[s.rid][0] or 0.0) < looked_free_s]
    true = sorted(pool.true_wait[s.rid] for s in waited)
    ages = sorted(seen[s.rid][1] for s in waited)
    return {"long_waits": len(waited), "looked_free": len(fooled) / len(waited),
            "true_wait_median_s": round(true[len(true) // 2], 3), "score_age_median_s": round(ages[len(ages) // 2], 3)}


def before_scenarios(edges: int) -> list[Scenario]:
    """The `ours` rows with the drain score as it was before the admitted-prefill term: before/after in one run."""
    return [
        Scenario("before (push + Consul)", "ours", feed="push", edges=edges, before=True, rng_label=SHIPPED_PUSH),
        Scenario("before (Consul only)", "ours", edges=edges, before=True, rng_label=SHIPPED_CONSUL_ONLY),
    ]


def run_scenario(scenario: Scenario, trace: list[TraceRequest], own_prefill: list[float], model: IUModel,
                 ius: int, ius_per_node: int, seed: int, warmup_s: float, end_s: float,
                 direct: bool = False) -> RunResult:
    pool = Pool(model, ius, ius_per_node)
    rng_label = scenario.rng_label or scenario.label  # same seeds: a before/after pair differs only in the score
    rngs = [random.Random(stable_seed(seed, rng_label, i)) for i in range(scenario.edges + 1)]
    fleet = None
    if scenario.policy == "round-robin":
        edges = [RoundRobin(ius, i * ius // scenario.edges) for i in range(scenario.edges)]
    elif scenario.policy == "least-conn":
        edges = [LeastConnections(ius, rngs[i]) for i in range(scenario.edges)]
    elif scenario.policy == "oracle":
        edges = [Oracle(pool.units, rngs[i]) for i in range(scenario.edges)]
    elif scenario.policy == "llm-d":
        edges = [LlmdStyle(pool.units, rngs[i]) for i in range(scenario.edges)]
    elif scenario.uses_agents:
        profile = "drain" if scenario.policy == "ours" else "seed"
        fleet = AgentFleet(pool.units, ius_per_node, NODES_PER_RACK, profile=profile, interval_s=scenario.interval_s,
                           heartbeat_s=scenario.heartbeat_s, loop=pool.loop, rng=rngs[-1], direct=direct,
                           before=scenario.before)
        design = AnnounceNodes(fleet, pool.loop) if scenario.feed == "announce" else None
        views = [new_view(pool.loop) for _ in range(scenario.edges)]
        HealthFeed(fleet, views, pool.loop, CONSUL_LATENCY_S)
        for i, view in enumerate(views):
            if scenario.feed == "poll":
                AgentPoll(fleet, view, pool.loop, scenario.poll_s, rngs[i])
            else:
                ConsulKVWatch(fleet, view, pool.loop, CONSUL_LATENCY_S)
                if scenario.feed == "push":  # "announce" pushes through routesim.announce.AnnouncePush
                    AgentPush(fleet, view, pool.loop)
        mode = "p2c" if scenario.policy == "ours" else "argmin"
        iu_ids = [u.iu_id for u in pool.units]
        if design:  # push the announce channel's bodies (cycle bodies plus announcements) and announce
            edges = announce_edges(fleet, views, pool.loop, rngs, iu_ids, design, scenario.prefix)
        else:
            edges = [ScoredEdge(view, rngs[i], iu_ids, mode, prefix=scenario.prefix) for i, view in enumerate(views)]
    else:
        raise ValueError(f"unknown policy {scenario.policy!r}")
    if fleet is not None:
        pool.true_wait = {}
    writes_at: dict[str, int] = {}
    if fleet is not None:
        for name, when in (("start", warmup_s), ("end", end_s)):
            pool.loop.schedule(when, lambda key, now: writes_at.__setitem__(key, fleet.writes), name)
    with direct_scrapes(direct and fleet is not None):
        pool.run(trace, edges, own_prefill, (warmup_s, end_s))
    extra: dict = {}
    if fleet is not None:
        modes: dict[str, int] = {}
        for edge in edges:
            for mode, count in edge.modes.items():
                modes[mode] = modes.get(mode, 0) + count
        extra["pick_modes"] = modes
        extra["misled"] = misled_share(pool, edges, warmup_s, end_s)
        if design:
            extra["announce"] = {"requests": len(trace), "batches": design.batches,
                                 "announcements": design.announcements,
                                 "announce_pushes": sum(p.announce_pushes for p in design.pushers),
                                 "placed_carried_per_edge": sum(p.placed_carried for p in design.pushers)
                                 / max(1, len(design.pushers)),
                                 "placed_learnt_per_edge": sum(e.view.relayed.read_total for e in edges)
                                 / max(1, len(edges))}
    queries = sum(u.counters.prefix_cache_queries for u in pool.units)
    extra["prefix_hit_rate"] = sum(u.counters.prefix_cache_hits for u in pool.units) / queries if queries else 0.0
    writes = writes_at["end"] - writes_at["start"] if fleet is not None else None
    return measure(scenario.label, pool, trace, warmup_s, end_s, writes, extra)
