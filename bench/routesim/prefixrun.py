"""route_sim's prefix-sharing workloads (routesim/sessions.py): the rows, the targets and their table.

Rows per workload, all at ``edges`` edges on one trace per seed: least-connections, the llm-d-style
baseline (routesim/llmd.py), today's router (the shipped push + announce + Consul path with the prefix
index off: ``prefix_routing: false``), the shipped router (prefix index on, the default) and the oracle
(every IU's true state, its prefix cache included). Multi-turn also runs the shipped router at 1 and 16
edges. Goodput: requests per second whose TTFT met ``SLO_TTFT_S``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from sim.vllm.roofline import IUModel

from .capacity import burst_rate, saturated_rate
from .report import SeedCheck, percentile
from .runner import SHIPPED, Scenario, run_scenario
from .sessions import workload_trace
from .sim import own_prefill_time, stable_seed
from .workload import poisson_trace

SLO_TTFT_S = 2.0
TODAY = "today's router (prefix index off)"
LLMD = "llm-d style"
PREFIX_TARGETS = ((TODAY, 0.6), (LLMD, 0.85))


@dataclass
class PrefixRow:
    workload: str
    label: str
    requests: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    goodput_req_s: float
    slo_share: float
    hit_rate: float


def scenarios(workload: str, edges: int) -> list[Scenario]:
    if workload == "mix":  # the article's mix: the shipped router against today's on the same trace
        return [Scenario(TODAY, "ours", feed="announce", edges=edges, prefix=False, rng_label=SHIPPED),
                Scenario(SHIPPED, "ours", feed="announce", edges=edges)]
    rows = [
        Scenario("least-conn", "least-conn", edges=edges),
        Scenario(LLMD, "llm-d", edges=edges),
        Scenario(TODAY, "ours", feed="announce", edges=edges, prefix=False, rng_label=SHIPPED),
        Scenario(SHIPPED, "ours", feed="announce", edges=edges),
        Scenario("oracle", "oracle", edges=edges),
    ]
    if workload == "multi-turn":
        rows += [Scenario(f"{SHIPPED}, {n} edge{'s' if n > 1 else ''}", "ours", feed="announce", edges=n,
                          rng_label=SHIPPED) for n in (1, 16) if n != edges]
    return rows


def capacity_of(model: IUModel, workload: str, seed: int, ius: int) -> float:
    """Pool requests/s at 100% load: one IU's saturated rate on this workload's shapes, caching off."""
    sample = workload_trace(workload, 40.0, 120.0, stable_seed(seed, f"capacity {workload}", 0))
    return ius * burst_rate(model, [(r.prompt, r.output) for r in sample[:3000]])


def run_workload(workload: str, seed: int, load: float, duration: float, warmup: float, ius: int,
                 ius_per_node: int, edges: int, err: Console) -> list[PrefixRow]:
    model = IUModel()
    if workload == "mix":  # route_sim's own trace of that seed and load
        capacity = saturated_rate(model) * ius
        trace = poisson_trace(load * capacity, duration, stable_seed(seed, f"trace at {load}", 0))
    else:
        capacity = capacity_of(model, workload, seed, ius)
        trace = workload_trace(workload, load * capacity, duration, stable_seed(seed, f"{workload} at {load}", 0))
    own = [own_prefill_time(model, r.prompt) for r in trace]
    err.print(f"seed {seed} {workload} {load:.0%}: {len(trace)} requests at {load * capacity:.1f} req/s",
              highlight=False)
    rows = []
    for scenario in scenarios(workload, edges):
        t0 = time.process_time()
        result = run_scenario(scenario, trace, own, model, ius, ius_per_node, seed, warmup, duration, direct=True)
        ttft = [r.ttft for r in result.records]
        good = sum(1 for t in ttft if t <= SLO_TTFT_S)
        rows.append(PrefixRow(workload, scenario.label, len(ttft), 1e3 * percentile(ttft, 50),
                              1e3 * percentile(ttft, 99), good / result.window_s, good / max(1, len(ttft)),
                              result.extra.get("prefix_hit_rate", 0.0)))
        relay = result.extra.get("announce", {})
        carried = (f", relay: each edge read {relay['placed_learnt_per_edge']:,.0f} placements, "
                   f"{relay['placed_carried_per_edge'] / max(1, relay['placed_learnt_per_edge']):.1f} bodies each"
                   if relay.get("placed_learnt_per_edge") else "")
        err.print(f"  seed {seed} {workload} {scenario.label}: p99 {rows[-1].ttft_p99_ms:,.0f} ms, "
                  f"{time.process_time() - t0:.1f} s CPU{carried}", highlight=False)
    return rows


def checks(per_seed: dict[int, list[PrefixRow]], workloads: tuple[str, ...]) -> list[SeedCheck]:
    seeds = tuple(sorted(per_seed))
    found = []

    def p99(seed, workload, label):
        return next(r.ttft_p99_ms for r in per_seed[seed] if r.workload == workload and r.label == label)

    if "mix" in workloads:
        found.append(SeedCheck(f"mix: p99 TTFT {SHIPPED} / {TODAY}", seeds,
                               tuple(p99(s, "mix", SHIPPED) / p99(s, "mix", TODAY) for s in seeds), 1.02))
    for workload in (w for w in workloads if w != "mix"):
        for other, limit in PREFIX_TARGETS:
            found.append(SeedCheck(f"{workload}: p99 TTFT {SHIPPED} / {other}", seeds,
                                   tuple(p99(s, workload, SHIPPED) / p99(s, workload, other) for s in seeds), limit))
        found.append(SeedCheck(f"{workload}: p99 TTFT {SHIPPED} / oracle", seeds,
                               tuple(p99(s, workload, SHIPPED) / p99(s, workload, "oracle") for s in seeds), None))
    if "multi-turn" in workloads:
        found.append(SeedCheck(f"multi-turn: p99 TTFT {SHIPPED}, 16 edges / 1 edge", seeds,
                               tuple(p99(s, "multi-turn", f"{SHIPPED}, 16 edges")
                                     / p99(s, "multi-turn", f"{SHIPPED}, 1 edge") for s in seeds), 1.1))
    return found


def table(per_seed: dict[int, list[PrefixRow]], workload: str) -> Table:
    t = Table(title=f"{workload}: means over seeds {','.join(map(str, sorted(per_seed)))}; "
                    f"goodput = requests/s with TTFT <= {SLO_TTFT_S:g} s")
    for column in ("policy", "requests", "TTFT p50 ms", "TTFT p99 ms", "goodput req/s", "within SLO",
                   "prefix hit rate"):
        t.add_column(column, justify="left" if column == "policy" else "right")
    labels = [r.label for r in next(iter(per_seed.values())) if r.workload == workload]
    for label in labels:
        rows = [r for rows in per_seed.values() for r in rows if r.workload == workload and r.label == label]
        n = len(rows)
        t.add_row(label, f"{sum(r.requests for r in rows) / n:,.0f}", f"{sum(r.ttft_p50_ms for r in rows) / n:,.0f}",
                  f"{sum(r.ttft_p99_ms for r in rows) / n:,.0f}", f"{sum(r.goodput_req_s for r in rows) / n:.1f}",
                  f"{sum(r.slo_share for r in rows) / n:.1%}", f"{sum(r.hit_rate for r in rows) / n:.1%}")
    return t


def run_seed(seed: int, workloads: tuple[str, ...], load: float, duration: float, warmup: float, ius: int,
             ius_per_node: int, edges: int) -> tuple[int, list[PrefixRow]]:
    err = Console(stderr=True)
    rows = []
    for workload in workloads:
        rows += run_workload(workload, seed, load, duration, warmup, ius, ius_per_node, edges, err)
    return seed, rows


def print_prefix_report(out: Console, per_seed: dict[int, list[PrefixRow]], workloads: tuple[str, ...],
                        ) -> list[SeedCheck]:
    for workload in workloads:
        out.print(table(per_seed, workload))
    found = checks(per_seed, workloads)
    for check in found:
        out.print(check.line(), highlight=False)
    return found
