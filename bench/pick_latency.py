"""pick() latency over a pool of IUs (default 256): target <= 50 us median.

Builds a reader view from synthetic KV bodies (64 nodes x 4 IUs, scores from a lognormal), then times
single pick() calls with perf_counter_ns, in the loop an edge runs: pick, then record the send. Cases:
all fresh (the common path), some stale (the freshness filter runs), a third de-weighted (rejection
sampling), and no fresh score (fail-open scan).

Then what feeds those picks: the view folding in pushed bodies (``apply_polled``, the edge's flush every
20 ms), timed side by side for a flush that carries a new body from a tenth of the nodes (what an edge of
128 nodes at 5 bodies/s per node folds per 20 ms) and one that carries every node's (a full rebuild).
The flushes are reference numbers, no target: the edge's CPU is what they move.

    .venv/bin/python bench/pick_latency.py [--ius 256] [--calls 100000] [--flushes 400]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import results  # bench/, the script's own dir

from consul_io import layout
from eas_wire.scorebody import IUScore, ScoreBody
from edge.pool import AnomalyDetector, EdgeLedger, PoolView, pick
from edge.pool.view import STALE_HEARTBEATS


def build_view(
    ius: int, now: float, rng: random.Random, stale_fraction: float = 0.0, no_scores: bool = False
):
    view = PoolView(detector=AnomalyDetector(), clock=lambda: now)
    per_node = 4
    health, kv = [], []
    for n in range(ius // per_node):
        node = f"r{n // 8:02d}n{n % 8:02d}"
        stale = rng.random() < stale_fraction
        ts = now - (STALE_HEARTBEATS * 2.0 + 1 if stale else rng.uniform(0, 2.0))
        ius_of_node = {}
        for i in range(per_node):
            iu = layout.iu_id(node, i)
            score = None if no_scores else round(rng.lognormvariate(-1.0, 1.0), 4)
            ius_of_node[iu] = IUScore(
                score=score, status="passing",
                components={"request_cost_s": 0.08, "tokens_total": 1e6, "running": 10},
            )
            health.append(
                {
                    "Node": {"Node": node},
                    "Service": {"Service": layout.iu_service(node), "ID": iu, "Address": "127.0.0.1", "Port": 8000 + i},
                    "Checks": [{"CheckID": layout.health_check_id(iu), "Status": "passing"}],
                }
            )
        body = ScoreBody(node=node, rack=node[:3], ts=ts, heartbeat_s=2.0, seq=1, ius=ius_of_node)
        kv.append({"Key": layout.score_key(layout.DEFAULT_DATACENTER, node), "Value": body.dumps().encode()})
    view.apply_health(health)
    view.apply_kv(kv)
    return view


def time_picks(view, now: float, calls: int, rng: random.Random, deweight: float = 0.0) -> list[int]:
    snapshot = view.snapshot()
    if deweight:
        from dataclasses import replace

        scored = tuple(replace(e, weight=0.3) if rng.random() < deweight else e for e in snapshot.scored)
        snapshot = replace(snapshot, scored=scored)
    ledger = EdgeLedger()
    samples = []
    clock = time.perf_counter_ns
    for k in range(calls):
        t_now = now + k * 1e-5
        start = clock()
        choice = pick(snapshot, ledger, t_now, rng)
        samples.append(clock() - start)
        ledger.on_sent(choice.iu_id, t_now)
        ledger.on_done(choice.iu_id)
    return samples


def time_flushes(ius: int, flushes: int, changed_fraction: float, rng: random.Random) -> list[int]:
    """ns per ``apply_polled`` of a new body from ``changed_fraction`` of the nodes, the clock 20 ms on each."""
    clock = [1_000_000.0]
    view = PoolView(detector=AnomalyDetector(), clock=lambda: clock[0])
    nodes = [f"r{n // 8:02d}n{n % 8:02d}" for n in range(ius // 4)]
    view.apply_health([{"Node": {"Node": node}, "Service": {"Service": layout.iu_service(node), "ID": layout.iu_id(node, i), "Address": "127.0.0.1", "Port": 8000 + i},
                        "Checks": [{"CheckID": layout.health_check_id(layout.iu_id(node, i)), "Status": "passing"}]}
                       for node in nodes for i in range(4)])

    def body(node: str, seq: int) -> ScoreBody:
        return ScoreBody(node=node, rack=node[:3], ts=clock[0], heartbeat_s=2.0, seq=seq, ius={
            layout.iu_id(node, i): IUScore(score=round(rng.lognormvariate(-1.0, 1.0), 4), status="passing",
                                           components={"request_cost_s": 0.08, "tokens_total": 1e3 * seq, "running": 10})
            for i in range(4)})

    view.apply_polled([body(node, 1) for node in nodes])
    per_flush = max(1, round(changed_fraction * len(nodes)))
    samples = []
    for seq in range(2, flushes + 2):
        clock[0] += 0.02
        bodies = [body(node, seq) for node in rng.sample(nodes, per_flush)]
        start = time.perf_counter_ns()
        view.apply_polled(bodies)
        samples.append(time.perf_counter_ns() - start)
    return samples


TARGET_US = 50.0


def median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def row(name: str, samples: list[int]) -> str:
    samples = sorted(samples)
    p = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] / 1000  # noqa: E731
    mean = statistics.fmean(samples) / 1000
    return f"| {name:36} | {p(0.5):7.2f} | {p(0.9):7.2f} | {p(0.99):7.2f} | {mean:7.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ius", type=int, default=256)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--flushes", type=int, default=400)
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    rng = random.Random(1)
    now = 1_000_000.0
    print(f"pick() latency, {args.ius} IUs, {args.calls} calls per case (microseconds)\n")
    print("| case                                 |  median |     p90 |     p99 |    mean |")
    print("|--------------------------------------|---------|---------|---------|---------|")
    fresh = build_view(args.ius, now, rng)
    fresh_samples = time_picks(fresh, now, args.calls, rng)
    print(row("all fresh (p2c)", fresh_samples))
    print(
        row("1/3 de-weighted (rejection sampling)", time_picks(fresh, now, args.calls, rng, deweight=1 / 3))
    )
    stale = build_view(args.ius, now, rng, stale_fraction=0.1)
    print(row("10% of nodes stale (filter runs)", time_picks(stale, now, args.calls, rng)))
    none = build_view(args.ius, now, rng, no_scores=True)
    scan_samples = time_picks(none, now, args.calls // 10, rng)
    print(row("no fresh score (fail-open scan)", scan_samples))
    print(f"\nthe view folding in pushed bodies, {args.ius} IUs ({args.ius // 4} nodes), {args.flushes} flushes per case "
          "(microseconds)\n")
    print("| case                                 |  median |     p90 |     p99 |    mean |")
    print("|--------------------------------------|---------|---------|---------|---------|")
    tenth = time_flushes(args.ius, args.flushes, 0.1, rng)
    every = time_flushes(args.ius, args.flushes, 1.0, rng)
    print(row("a tenth of the nodes' bodies new", tenth))
    print(row("every node's body new", every))
    print(f"\na tenth / every node, median: {statistics.median(tenth) / statistics.median(every):.2f}")
    median = median_us(fresh_samples)
    verdict = "met" if median <= TARGET_US else "not met"
    print(f"target: pick() median {median:.2f} us over {args.ius} IUs (<= {TARGET_US:g} us): {verdict.replace('not', 'NOT')}")
    results.record(args.results, script=__file__, target=f"pick() median <= {TARGET_US:g} us", verdict=verdict,
                   numbers={"pick_median_us": round(median, 2), "fail_open_scan_median_us": round(median_us(scan_samples), 2),
                            "flush_median_us": {"a tenth of the nodes' bodies new": round(median_us(tenth)),
                                                "every node's body new": round(median_us(every))}},
                   summary=f"pick() median {median:.1f} us, fail-open scan {median_us(scan_samples):.1f} us; a flush of "
                           f"a tenth of the nodes' bodies {median_us(tenth):,.0f} us, of every node's {median_us(every):,.0f} us")


if __name__ == "__main__":
    main()
