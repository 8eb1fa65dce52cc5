#!/usr/bin/env python3
"""Routing-quality benchmark: a deterministic discrete-event simulation of an IU pool routed by several policies.

    .venv/bin/python bench/route_sim.py --quick --jobs 2   # seeds 1,2,3 at 80% load (~4 CPU-min per seed)
    .venv/bin/python bench/route_sim.py                    # full: 50/80/95% load, 180 s traces, 3 seeds
    .venv/bin/python bench/route_sim.py --seed 7 --json out.json --plot out.png   # one seed only

Seeds and noise: one 40 s trace decides a p99 ratio to about +-0.06 (identical configurations with other
tie-break seeds differ by 5%), so every run covers several seeds (`--seeds`, default 1,2,3), each with its
own arrival traces and tie-break seeds. The tables show the mean over seeds of every number; the "P99
TTFT per seed" table shows the spread behind them. Each target is computed per seed (both policies of a
ratio on that seed's same trace) and the verdict is on the MEAN of the per-seed values, printed with every
per-seed value, their sample standard deviation and the 95% Student-t interval of the mean; the line says
whether that interval lies within the limit, beyond it, or straddles it (then the verdict is not sure:
more seeds or longer traces would settle it).

Pool: 32 IUs (16 hosts × 2 IUs), each 4× H100 SXM5 with TP=4 serving Llama-3-70B in BF16 (sim/vllm/roofline.py
has every constant and its source). Service model, per engine step (vLLM V1 continuous batching):
  - prefill is compute-bound: 2 × 70.6e9 FLOPs per token + attention 4 × 80 layers × 8192 × context, at
    989 TFLOPS dense BF16 per GPU × 4 GPUs × MFU 0.45 ≈ 12,600 prompt tokens/s per IU;
  - decode is bandwidth-bound: each step streams the 141 GB of weights plus every running sequence's KV
    (327,680 B per token: 2 × 80 layers × 8 KV heads × 128 × 2 B) at 4 × 3.35 TB/s × 0.75 efficiency, plus
    3 ms per step (160 NVLink all-reduces + the engine's CPU loop): 17 ms per step for one sequence;
  - a step is max(compute, memory) + overhead over all its tokens: decode tokens of every running sequence
    plus prefill chunks within max_num_batched_tokens 8,192 (vLLM's H100 default), so a long prefill stalls
    every decode on that IU and short requests queue behind it;
  - KV capacity 4 × (85.5 GB × 0.9 − 35.3 GB weights − 5 GB activations) = 447k tokens; max_num_seqs 256;
    when a step finds no KV slot the newest running request is preempted and later recomputed.
Workload (routesim/workload.py): the production request mix — A 65% ~327 prompt tokens, B 30%
~4,218, C 5% ~12,842 (lognormal, sigma 0.35) — with our output lengths: lognormal medians 128/256/512,
sigma 0.6. Poisson arrivals at 50/80/95% of pool capacity, where capacity = 32 × the completion rate of one
IU that always has queued work (vLLM's benchmark_throughput method; routesim/capacity.py).

Policies, all on the same arrival trace per load: round-robin; least-connections (each edge's own in-flight);
seed (the design's EAS: argmin of the `seed` entropy score); the `ours` rows are exactly what eas-edge ships
(edge.routing.Router: `drain` score + pick()'s power of two choices with the request's own prefill + the
edge's ledger of the prefill seconds it sent since the score's timestamp, per-IU cap): "ours (push + Consul)"
is the default (each agent answers the edge's blocking query on /scores on every 200 ms cycle, ~21 ms to
the view, plus the KV watch), "ours (Consul only)" the degraded mode (push off or no agent reachable: KV
through rate-limited blocking queries); oracle (true instantaneous state: least estimated TTFT). The
score-based policies run the real eas_agent code:
Agent.cycle (vLLM /metrics parsing, NVML and NIC collectors, Scorer) and Publisher.step (quantized levels,
hysteresis, min write interval, urgent rises, the 0.95/s write token bucket, 2 s heartbeat, CAS into
sim.memstore.MemoryStore) for each simulated host every 200 ms of simulated time, and
EdgeView/AnomalyDetector/Router/pick per edge (routesim/agents.py, routesim/readers.py). Measured: requests arriving after the warm-up; a run ends when all have finished.

Also printed: "before" rows, the `ours` rows with `drain` as it was before its admitted-prefill term
(prefill_s = prompt tokens admitted but not yet prefilled / prefill rate; routesim.agents.BeforeScorer),
on the same trace, for a before/after in one run (--no-before skips them); a "why" line per `ours`/"before" row
(of the requests that queued > 500 ms, how many went to an IU whose published score said it was free, and its
true wait then). Agents get the parsed /metrics values by default; --scrape text makes them parse
the text with their own parser (same numbers, 2x the CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402
from rich.console import Console  # noqa: E402
from routesim import prefixrun  # noqa: E402
from routesim.capacity import saturated_rate  # noqa: E402
from routesim.report import SeedRows, as_json, mean_rows, plot, print_report, summarize  # noqa: E402
from routesim.runner import (  # noqa: E402
    SHIPPED,
    before_scenarios,
    edge_scenarios,
    main_scenarios,
    run_scenario,
    staleness_scenarios,
)
from routesim.sessions import WORKLOADS  # noqa: E402
from routesim.sim import own_prefill_time, stable_seed  # noqa: E402
from routesim.workload import mean_shape, poisson_trace  # noqa: E402

from sim.vllm.roofline import IUModel  # noqa: E402

QUICK = {"duration": 40.0, "warmup": 15.0, "loads": "0.8"}
FULL = {"duration": 180.0, "warmup": 30.0, "loads": "0.5,0.8,0.95"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", default="1,2,3",
                        help="seeds, each with its own traces and tie-breaks; tables show means, targets the mean "
                             "of the per-seed ratios with its spread (default 1,2,3)")
    parser.add_argument("--seed", type=int, help="one seed only (instead of --seeds)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (default 1)")
    parser.add_argument("--quick", action="store_true", help="80%% load only, 40 s traces")
    parser.add_argument("--ius", type=int, default=32, help="IUs in the pool (default 32)")
    parser.add_argument("--ius-per-node", type=int, default=2, help="IUs per host (default 2: 8 GPUs, TP=4)")
    parser.add_argument("--edges", type=int, default=4, help="edges (routers) for the main table (default 4)")
    parser.add_argument("--loads", help="loads as fractions of capacity (quick 0.8, full 0.5,0.8,0.95)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals per load (quick 40, full 180)")
    parser.add_argument("--warmup", type=float, help="seconds of arrivals not measured (quick 15, full 30)")
    parser.add_argument("--requests", type=int,
                        help="size the traces by request count at 80%% load instead of --duration (tests)")
    parser.add_argument("--edge-counts", default="1,4,16", help="edge sensitivity (default 1,4,16; '' skips)")
    parser.add_argument("--staleness-ms", default="50,200,1000", help="score-age sensitivity ('' skips)")
    parser.add_argument("--no-before", action="store_true",
                        help="skip the 'before' rows (drain without its admitted-prefill term)")
    parser.add_argument("--scrape", choices=("text", "direct"), default="direct",
                        help="agents get the parsed /metrics values (default; equal to parsing the text, "
                             "tests/bench checks it) or parse the text with the agent's parser (2x slower)")
    parser.add_argument("--json", dest="json_path", help="write every summary as JSON here")
    parser.add_argument("--plot", dest="plot_path", default="route_sim.png", help="PNG path ('' skips)")
    parser.add_argument("--workloads", default="mix,multi-turn,shared-prefix",
                        help="mix: the tables above; multi-turn, shared-prefix: prompts sharing prefixes "
                             "(routesim/sessions.py) at 80%% load with the llm-d-style baseline, and the mix's "
                             "shipped router against the prefix index off (default: all three)")
    parser.add_argument("--check-targets", action="store_true", help="exit 1 when a target is not met")
    results.add_argument(parser, __file__)
    return parser.parse_args(argv)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _seeds(args: argparse.Namespace) -> tuple[int, ...]:
    if args.seed is not None:
        return (args.seed,)
    seeds = _ints(args.seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"route_sim: --seeds {args.seeds!r}: give distinct integers, e.g. 1,2,3")
    return seeds


def run_seed(args: argparse.Namespace, seed: int, loads: tuple[float, ...], duration: float, warmup: float,
             capacity: float) -> SeedRows:
    """Every table's rows for one seed: its own traces (one per load) and tie-break seeds."""
    model = IUModel()
    direct = args.scrape == "direct"
    err = Console(stderr=True)
    main_rows, edge_rows, stale_rows, before_rows = [], [], [], []
    sens_load = 0.8 if 0.8 in loads else loads[0]
    for load in loads:
        trace = poisson_trace(load * capacity, duration, stable_seed(seed, f"trace at {load}", 0))
        own = [own_prefill_time(model, r.prompt) for r in trace]

        def run(scenario, load=load, trace=trace, own=own):
            t0 = time.process_time()
            result = run_scenario(scenario, trace, own, model, args.ius, args.ius_per_node, seed, warmup,
                                  duration, direct=direct)
            err.print(f"  seed {seed} {load:.0%} {scenario.label}: {len(result.records)} requests, "
                      f"{time.process_time() - t0:.1f} s CPU", highlight=False)
            return summarize(result, load)

        err.print(f"seed {seed} load {load:.0%}: {len(trace)} requests at {load * capacity:.1f} req/s",
                  highlight=False)
        rows = [run(s) for s in main_scenarios(args.edges)]
        main_rows += rows
        if load != sens_load:
            continue
        for scenario in edge_scenarios(_ints(args.edge_counts)):
            if scenario.edges == args.edges:  # the main table already ran exactly this
                same = next(r for r in rows if r.label == SHIPPED)
                edge_rows.append(type(same)(**{**same.__dict__, "label": scenario.label}))
            else:
                edge_rows.append(run(scenario))
        stale_rows += [run(s) for s in staleness_scenarios(_ints(args.staleness_ms), args.edges)]
        if not args.no_before:
            before_rows += [run(s) for s in before_scenarios(args.edges)]
    return SeedRows(seed, main_rows, edge_rows, stale_rows, before_rows)


TARGETS = ("80% load: <= 1.2x oracle, <= 0.85x least-conn (the Consul-only fallback also <= 1.0x); 16 edges / 1 "
           "edge <= 1.1; 95% load: <= 1.0x least-conn; Consul <= 1 write/node/s and <= 100/s at 128 nodes; "
           "multi-turn and shared-prefix p99 TTFT <= 0.6x the prefix index off and <= 0.85x llm-d style, "
           "multi-turn 16 / 1 edge <= 1.1; mix <= 1.02x the prefix index off")


def shipped_result(checks) -> dict:
    """What a result file records of a run (:class:`routesim.report.SeedCheck` per target and reference):
    each one's mean over seeds and 95% interval, and the verdict of the edge's default mode (all of its
    targets met or not); the fallback modes' numbers are recorded beside it."""
    def interval(check) -> list[float] | None:
        low, high = check.ci95
        return None if math.isnan(low) else [round(low, 4), round(high, 4)]

    default = [c for c in checks if SHIPPED in c.name and c.limit is not None]
    seeds = ",".join(map(str, checks[0].seeds)) if checks else ""
    return {"numbers": {c.name: {"mean": round(c.mean, 4), "ci95": interval(c)} for c in checks},
            "verdict": "met" if default and all(c.met for c in default) else "not met",
            "summary": f"seeds {seeds}, {SHIPPED}: "
                       + "; ".join(f"{c.name.replace(SHIPPED, '').replace('  ', ' ').strip(' ,')} {c.mean:.3f}"
                                   for c in default)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = QUICK if args.quick else FULL
    loads = tuple(float(x) for x in (args.loads or mode["loads"]).split(","))
    warmup = args.warmup if args.warmup is not None else mode["warmup"]
    seeds = _seeds(args)
    direct = args.scrape == "direct"
    out, err = Console(width=max(150, Console().width)), Console(stderr=True)
    started = time.monotonic()

    model = IUModel()
    per_iu = saturated_rate(model)
    capacity = per_iu * args.ius
    if args.requests:
        duration = warmup + args.requests / (0.8 * capacity)
    else:
        duration = args.duration if args.duration is not None else mode["duration"]
    prompt_mean, output_mean = mean_shape()
    header = [
        f"model: {model.model.name} on {model.engine.gpus}x {model.gpu.name}, TP={model.engine.gpus}; "
        f"prefill {model.prefill_tokens_per_s:,.0f} tok/s/IU, KV {model.kv_capacity_tokens:,} tokens/IU, "
        f"max_num_seqs {model.engine.max_num_seqs}, max_num_batched_tokens {model.engine.max_num_batched_tokens}",
        f"mix: mean prompt {prompt_mean:,.0f} tokens, mean output {output_mean:,.0f} tokens; capacity "
        f"{per_iu:.2f} req/s per IU x {args.ius} IUs = {capacity:.1f} req/s",
        f"seeds {','.join(map(str, seeds))} (each: its own traces and tie-breaks; tables are means over seeds, "
        f"verdicts on the mean of the per-seed ratios); {duration:.0f} s of arrivals per load, first "
        f"{warmup:.0f} s not measured; {args.edges} edges; agent scrapes: {'parsed values' if direct else '/metrics text'}",
    ]

    jobs = max(1, min(args.jobs, len(seeds)))
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = set(workloads) - {"mix", *WORKLOADS}
    if unknown:
        raise SystemExit(f"route_sim: --workloads: unknown {', '.join(sorted(unknown))}")
    per_seed = []
    if "mix" in workloads:
        if jobs == 1:
            per_seed = [run_seed(args, seed, loads, duration, warmup, capacity) for seed in seeds]
        else:  # each seed is independent and deterministic: a process per seed gives the same rows
            with ProcessPoolExecutor(jobs) as pool:
                per_seed = list(pool.map(run_seed, *zip(*[(args, seed, loads, duration, warmup, capacity)
                                                           for seed in seeds], strict=True)))
    checks = print_report(out, header, per_seed) if per_seed else []
    shared = tuple(w for w in workloads if w != "mix")
    if shared:  # the mix's shipped-vs-today comparison rides along with the prefix workloads
        shared = ("mix", *shared)
        job_args = [(seed, shared, 0.8, duration, warmup, args.ius, args.ius_per_node, args.edges) for seed in seeds]
        if jobs == 1:
            prefix_rows = dict(prefixrun.run_seed(*a) for a in job_args)
        else:
            with ProcessPoolExecutor(jobs) as pool:
                prefix_rows = dict(pool.map(prefixrun.run_seed, *zip(*job_args, strict=True)))
        checks += prefixrun.print_prefix_report(out, prefix_rows, shared)
    if per_seed and args.plot_path:
        means = mean_rows(per_seed)
        problem = plot(args.plot_path, means.main, means.edges, means.staleness)
        err.print(problem or f"plot: {args.plot_path}", highlight=False)
    if per_seed and args.json_path:
        means = mean_rows(per_seed)
        Path(args.json_path).write_text(json.dumps({
            "seeds": list(seeds), "capacity_req_s": round(capacity, 3), "duration_s": duration, "warmup_s": warmup,
            "main": as_json(means.main), "edges": as_json(means.edges), "staleness": as_json(means.staleness),
            "before": as_json(means.before),
            "per_seed": [{"seed": r.seed, "main": as_json(r.main), "edges": as_json(r.edges),
                          "staleness": as_json(r.staleness), "before": as_json(r.before)} for r in per_seed],
            "targets": [c.as_json() for c in checks],
        }, indent=1, default=str))
    results.record(args.results, script=__file__, target=TARGETS, **shipped_result(checks),
                   argv=[__file__, *(sys.argv[1:] if argv is None else argv)])
    err.print(f"done in {time.monotonic() - started:.0f} s ({time.process_time():.0f} s CPU in this process)",
              highlight=False)
    if args.check_targets and any(c.met is False for c in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
