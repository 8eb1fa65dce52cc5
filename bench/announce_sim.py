#!/usr/bin/env python3
"""The announce channel against the push path without it, in route_sim's simulation, over several seeds.

    .venv/bin/python bench/announce_sim.py --quick --jobs 2      # seeds 1,2,3, 80% load, 40 s traces

Both rows are what eas-edge ships (bench/routesim/announce.py drives the shipped agent and edge classes):
`ours (push + announce + Consul)`, the default when edges and agents hold an announce token, and
`ours (push + Consul)`, without a token. Per seed, on that seed's one trace (route_sim's: same arrivals, and
at 4 edges the same tie-break seeds as route_sim's main table): least-conn and the oracle at 4 edges and
both modes at each edge count. Printed: p99 TTFT per seed and its mean, the 4-edge rows' ratios to the
oracle and to least-conn, most edges / one edge, each per seed with its mean and 95% t interval, and what
the channel cost (announce batches and pushes per request).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routesim.capacity import saturated_rate  # noqa: E402
from routesim.report import SeedCheck, summarize  # noqa: E402
from routesim.runner import SHIPPED, SHIPPED_PUSH, Scenario, edge_scenarios, run_scenario  # noqa: E402
from routesim.sim import own_prefill_time, stable_seed  # noqa: E402
from routesim.workload import poisson_trace  # noqa: E402

from sim.vllm.roofline import IUModel  # noqa: E402

REFERENCE_EDGES = 4  # route_sim's main table: least-conn, oracle and the shipped row at 4 edges


FAMILIES = ("announce", "push")
SHIPPED_OF = {"announce": SHIPPED, "push": SHIPPED_PUSH}


def scenarios(counts: tuple[int, ...], families: tuple[str, ...]) -> list[tuple[str, Scenario]]:
    """(family, scenario); route_sim's labels (its tie-break seeds) for every row it also runs."""
    rows = [("least-conn", Scenario("least-conn", "least-conn", edges=REFERENCE_EDGES)),
            ("oracle", Scenario("oracle", "oracle", edges=REFERENCE_EDGES))]
    by_family = {family: edge_scenarios(counts, SHIPPED_OF[family]) for family in families}
    for i in range(len(counts)):
        rows += [(family, by_family[family][i]) for family in families]
    return rows


def run_seed(seed: int, load: float, duration: float, warmup: float, counts: tuple[int, ...],
             families: tuple[str, ...]) -> dict:
    model = IUModel()
    capacity = saturated_rate(model) * 32
    trace = poisson_trace(load * capacity, duration, stable_seed(seed, f"trace at {load}", 0))
    own = [own_prefill_time(model, r.prompt) for r in trace]
    rows = {}
    for family, scenario in scenarios(counts, families):
        t0 = time.process_time()
        result = run_scenario(scenario, trace, own, model, 32, 2, seed, warmup, duration, direct=True)
        summary = summarize(result, load)
        rows[f"{family}/{scenario.edges}"] = {"label": scenario.label, "p99_ms": summary.ttft_p99_ms,
                                               "p50_ms": summary.ttft_p50_ms, "requests": summary.requests,
                                               "announce": result.extra.get("announce")}
        print(f"  seed {seed} {scenario.label}: p99 {summary.ttft_p99_ms:,.0f} ms, "
              f"{time.process_time() - t0:.0f} s CPU", file=sys.stderr, flush=True)
    return {"seed": seed, "rows": rows}


def report(per_seed: list[dict], counts: tuple[int, ...], families: tuple[str, ...]) -> tuple[list[str], list[dict]]:
    seeds = tuple(r["seed"] for r in per_seed)
    keys = list(per_seed[0]["rows"])
    lines = [f"p99 TTFT ms per seed ({', '.join(map(str, seeds))}) and mean:"]
    width = max(len(row["label"]) for row in per_seed[0]["rows"].values())
    for key in keys:
        values = [r["rows"][key]["p99_ms"] for r in per_seed]
        lines.append(f"  {per_seed[0]['rows'][key]['label']:<{width}} " + " / ".join(f"{v:7,.0f}" for v in values)
                     + f"   mean {sum(values) / len(values):7,.0f}")

    def p99(r: dict, key: str) -> float:
        return r["rows"][key]["p99_ms"]

    checks = []
    low, high = min(counts), max(counts)
    for family in families:
        ref = f"{family}/{REFERENCE_EDGES}"
        if ref in keys:
            checks.append(SeedCheck(f"{family} {REFERENCE_EDGES} edges / oracle", seeds,
                                    tuple(p99(r, ref) / p99(r, "oracle/4") for r in per_seed), 1.2))
            checks.append(SeedCheck(f"{family} {REFERENCE_EDGES} edges / least-conn", seeds,
                                    tuple(p99(r, ref) / p99(r, "least-conn/4") for r in per_seed), 0.85))
        if low != high:
            checks.append(SeedCheck(f"{family} {high} edges / {low} edge", seeds,
                                    tuple(p99(r, f"{family}/{high}") / p99(r, f"{family}/{low}") for r in per_seed),
                                    1.1))
    lines += [c.line() for c in checks]
    lines.append("announce channel cost (whole run, per request sent):")
    for key in keys:
        cost = per_seed[0]["rows"][key]["announce"]
        if key.startswith("announce") and cost:
            sums = {k: sum(r["rows"][key]["announce"][k] for r in per_seed) for k in cost}
            lines.append(f"  {key}: {sums['batches'] / sums['requests']:.3f} announce messages "
                         f"(batches), {sums['announce_pushes'] / sums['requests']:.2f} extra pushed bodies "
                         f"({sums['announce_pushes'] / max(1, sums['batches']):.1f} per batch)")
    return lines, [c.as_json() for c in checks]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes")
    parser.add_argument("--quick", action="store_true", help="40 s traces, 15 s warm-up (route_sim --quick)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals (quick 40, else 180)")
    parser.add_argument("--warmup", type=float, help="seconds not measured (quick 15, else 30)")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--edge-counts", default="1,4,16")
    parser.add_argument("--families", default="announce,push",
                        help=f"row families, of {','.join(FAMILIES)} (least-conn and the oracle always run)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    counts = tuple(int(s) for s in args.edge_counts.split(",") if s.strip())
    families = tuple(f for f in args.families.split(",") if f.strip())
    if not families or set(families) - set(FAMILIES):
        raise SystemExit(f"announce_sim: --families {args.families!r}: give some of {','.join(FAMILIES)}")
    duration = args.duration if args.duration is not None else (40.0 if args.quick else 180.0)
    warmup = args.warmup if args.warmup is not None else (15.0 if args.quick else 30.0)
    started = time.monotonic()
    work = [(seed, args.load, duration, warmup, counts, families) for seed in seeds]
    if args.jobs > 1 and len(seeds) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(seeds))) as pool:
            per_seed = list(pool.map(run_seed, *zip(*work, strict=True)))
    else:
        per_seed = [run_seed(*w) for w in work]
    lines, checks = report(per_seed, counts, families)
    print(f"{args.load:.0%} load, {duration:.0f} s of arrivals, first {warmup:.0f} s not measured, seeds "
          f"{','.join(map(str, seeds))}")
    print("\n".join(lines))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"per_seed": per_seed, "checks": checks}, indent=1))
    print(f"done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
