"""Consul write load of the agents' publishing vs naive per-IU writes at 5 Hz, in simulated time.

Drives the real scoring and publishing code (VllmCollector rates -> Scorer(drain) -> Publisher) over a
simulated clock against the in-memory store (same CAS semantics as Consul), with one vLLM load model per
IU. Load trace: each IU has a base rate drawn in [3, 9] req/s (one IU of the model saturates near 9),
modulated by a compressed day (period 600 s, 10%..100% of base), re-drawn +-20% every 10 s, plus a 2x
burst on a random IU every 30 s for 10 s ("x1.0"; "x1.4" and "x1.8" scale every rate, so peaks exceed
one IU's capacity and queues build). Targets: <= 1 write/s per node steady, >= 10x fewer than naive,
reader-side score age p99 <= one heartbeat.

Counted as Consul (Raft) writes: the KV puts, the agent's only writes (it keeps no TTL checks).

    .venv/bin/python bench/consul_load.py [--nodes 32] [--duration 600]
"""

from __future__ import annotations

import argparse
import math
import random
import time

import results  # bench/, the script's own dir

from consul_io import layout
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.publisher import QUANTIZER_BASE, QUANTIZER_MIN_CHANGE, Publisher, Quantizer
from eas_agent.score import IUInputs, Scorer
from sim.memstore import MemoryStore
from sim.vllm.exposition import model_metrics
from sim.vllm.loadmodel import LoadModel

INTERVAL_S = 0.2
IUS_PER_NODE = 2
WARMUP_S = 30.0
MAX_WRITES_PER_NODE_S = 1.0  # the write budget
MIN_FEWER_THAN_NAIVE = 10.0
MAX_AGE_P99_S = 2.0  # one heartbeat


class Trace:
    def __init__(self, rng: random.Random, ius: int, scale: float = 1.0):
        self.rng = rng
        self.base = [scale * rng.uniform(3.0, 9.0) for _ in range(ius)]
        self.phase = [rng.uniform(0, 2 * math.pi) * 0.2 for _ in range(ius)]
        self.noise = [1.0] * ius
        self.burst_iu, self.burst_until = -1, -1.0

    def rates(self, t: float) -> list[float]:
        if int(t) % 10 == 0:
            self.noise = [self.rng.uniform(0.8, 1.2) for _ in self.noise]
        if int(t) % 30 == 0 and t > self.burst_until:
            self.burst_iu, self.burst_until = self.rng.randrange(len(self.base)), t + 10
        day = [0.55 + 0.45 * math.sin(2 * math.pi * t / 600 + p) for p in self.phase]
        return [
            b * d * n * (2.0 if i == self.burst_iu and t < self.burst_until else 1.0)
            for i, (b, d, n) in enumerate(zip(self.base, day, self.noise, strict=True))
        ]


def run(
    nodes: int,
    duration: float,
    seed: int,
    *,
    hysteresis: float = 0.3,
    min_change: float = QUANTIZER_MIN_CHANGE["drain"],
    min_write_interval_s: float = 1.0,
    heartbeat_s: float = 2.0,
    load_scale: float = 1.0,
) -> dict:
    rng = random.Random(seed)
    ius = nodes * IUS_PER_NODE
    models = [LoadModel(arrival_rate=1.0, seed=seed * 1000 + i) for i in range(ius)]
    collectors = [VllmCollector(fetch=lambda: "") for _ in range(ius)]
    scorers = [Scorer("drain") for _ in range(ius)]
    store = MemoryStore()
    publishers = []
    for n in range(nodes):
        ids = [layout.iu_id(f"n{n:03d}", i) for i in range(IUS_PER_NODE)]
        pub = Publisher(
            store,
            key=layout.score_key(layout.DEFAULT_DATACENTER, f"n{n:03d}"),
            node=f"n{n:03d}",
            rack="r",
            iu_ids=ids,
            heartbeat_s=heartbeat_s,
            min_write_interval_s=min_write_interval_s,
            cycle_s=INTERVAL_S,
            rng=random.Random(n),
        )
        pub.quantizer = Quantizer(QUANTIZER_BASE["drain"], 1.25, hysteresis, min_change)
        publishers.append(pub)
    trace = Trace(rng, ius, load_scale)
    ages: list[float] = []
    scores: list[float] = []
    steps = int(duration / INTERVAL_S)
    writes_before = 0
    for k in range(1, steps + 1):
        t = k * INTERVAL_S
        if k % 25 == 0:  # every 5 s of simulated time
            for model, rate in zip(models, trace.rates(t), strict=True):
                model.advance(t)
                model.set_arrival_rate(rate)
        for n, pub in enumerate(publishers):
            results = {}
            for i in range(IUS_PER_NODE):
                j = n * IUS_PER_NODE + i
                models[j].advance(t)
                reading = collectors[j].observe(t, model_metrics(models[j]))
                results[pub.iu_ids[i]] = scorers[j].score(IUInputs(pub.iu_ids[i], reading), t)
                if k % 5 == 0 and results[pub.iu_ids[i]].score is not None:
                    scores.append(results[pub.iu_ids[i]].score)
            pub.step(t, results)
            # the reader samples between cycles: the age of what it would read now
            if t >= WARMUP_S:
                ages.append(t + rng.uniform(0, INTERVAL_S) - pub.stats.last_write)
        if abs(t - WARMUP_S) < 1e-9:
            writes_before = store.writes
    steady_writes = store.writes - writes_before
    steady_s = duration - WARMUP_S
    ages.sort()
    reasons: dict[str, int] = {}
    for pub in publishers:
        for reason, count in pub.stats.write_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + count
    return {
        "kv_per_node_s": steady_writes / nodes / steady_s,
        "raft_per_node_s": steady_writes / nodes / steady_s,
        "naive_per_node_s": 5.0 * IUS_PER_NODE,
        "age_p50": ages[len(ages) // 2],
        "age_p99": ages[int(len(ages) * 0.99)],
        "age_max": ages[-1],
        "reasons": reasons,
        "score_quantiles": [sorted(scores)[int(q * (len(scores) - 1))] for q in (0.1, 0.5, 0.9, 0.99)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    started = time.perf_counter()
    print(
        f"{args.nodes} nodes x {IUS_PER_NODE} IUs, {args.duration:.0f} s simulated, "
        f"cycles every {INTERVAL_S} s, "
        f"steady = after {WARMUP_S:.0f} s\n"
    )
    print(
        "| publishing                             | KV writes/node/s | Raft writes/node/s | vs naive | "
        "age p50 s | age p99 s | age max s |"
    )
    print(
        "|----------------------------------------|------------------|--------------------|----------|"
        "-----------|-----------|-----------|"
    )
    cases = [
        ("x1.0 trace: levels+hysteresis (default)", {}),
        ("x1.0 trace: no min change", {"min_change": 0.0}),
        ("x1.0 trace: 0.5 s, no min change", {"min_change": 0.0, "min_write_interval_s": 0.5}),
        ("x1.0 trace: levels, no hysteresis", {"hysteresis": 0.0}),
        ("x1.0 trace: no min write interval", {"min_write_interval_s": 0.0}),
        ("x1.4 trace (peaks over capacity)", {"load_scale": 1.4}),
        ("x1.8 trace (sustained overload)", {"load_scale": 1.8}),
    ]
    quantiles = {}
    for name, kwargs in cases:
        r = run(args.nodes, args.duration, args.seed, **kwargs)
        print(
            f"| {name:38} | {r['kv_per_node_s']:16.3f} | {r['raft_per_node_s']:18.3f} | "
            f"{r['naive_per_node_s'] / r['raft_per_node_s']:7.1f}x | {r['age_p50']:9.2f} | "
            f"{r['age_p99']:9.2f} | "
            f"{r['age_max']:9.2f} |"
        )
        quantiles[name.split(":")[0].split(" (")[0]] = r["score_quantiles"]
        if not kwargs:
            default = r
    print(
        f"| naive: every IU every cycle (5 Hz)     | {5.0 * IUS_PER_NODE:16.3f} | "
        f"{5.0 * IUS_PER_NODE:18.3f} | "
        f"{1.0:7.1f}x | {INTERVAL_S / 2:9.2f} | {INTERVAL_S:9.2f} | {INTERVAL_S:9.2f} |"
    )
    print(f"\nwrite reasons (default case): {default['reasons']}")
    for trace, q in quantiles.items():
        print(
            f"drain score over the {trace}, s (p10 / p50 / p90 / p99): " + " / ".join(f"{v:.3f}" for v in q)
        )
    print(
        f"256 IUs ({256 // IUS_PER_NODE} nodes): naive {256 * 5} writes/s; default "
        f"{256 / IUS_PER_NODE * default['raft_per_node_s']:.0f} writes/s  "
        f"(bench wall time {time.perf_counter() - started:.0f} s)"
    )
    fewer = default["naive_per_node_s"] / default["raft_per_node_s"]
    met = (default["kv_per_node_s"] <= MAX_WRITES_PER_NODE_S and fewer >= MIN_FEWER_THAN_NAIVE
           and default["age_p99"] <= MAX_AGE_P99_S)
    print(f"target: default {default['kv_per_node_s']:.3f} KV writes/node/s (<= {MAX_WRITES_PER_NODE_S:g}), "
          f"{fewer:.1f}x fewer than naive (>= {MIN_FEWER_THAN_NAIVE:g}x), score age p99 {default['age_p99']:.2f} s "
          f"(<= {MAX_AGE_P99_S:g} s): {'met' if met else 'NOT met'}")
    results.record(args.results, script=__file__, verdict="met" if met else "not met",
                   target=f"<= {MAX_WRITES_PER_NODE_S:g} write/s per node, >= {MIN_FEWER_THAN_NAIVE:g}x fewer than naive, "
                          f"score age p99 <= one heartbeat ({MAX_AGE_P99_S:g} s)",
                   numbers={"kv_writes_per_node_s": round(default["kv_per_node_s"], 3),
                            "fewer_than_naive": round(fewer, 1), "score_age_p50_s": round(default["age_p50"], 2),
                            "score_age_p99_s": round(default["age_p99"], 2), "write_reasons": default["reasons"]},
                   summary=f"{default['kv_per_node_s']:.3f} KV writes/node/s, {fewer:.1f}x fewer than naive, score age "
                           f"p50 / p99 {default['age_p50']:.2f} / {default['age_p99']:.2f} s")


if __name__ == "__main__":
    main()
