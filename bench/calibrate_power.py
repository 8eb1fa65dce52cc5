"""Does ``edge calibrate`` find the lying unit, and leave the honest ones alone, on a busy machine?

The pool of the integration test (tests/integration/operate/pool.py): three simulated vLLM IUs (``--nodes``),
the real agent of each node, the real edge in front, a dev Consul; the third node's agent believes in prefill
and decode rates 20 times its engine's. Each run is one ``calibrate.run`` as the test calls it (production
prompts at the test's lengths, ~12-token answers, the test's rate and first round, more rounds while a unit is undecided at the
detection scale, each run its own seed); the runs under load have
``--burners`` processes spinning a core each at nice 0 beside it (the host has 2 cores; the bench itself
runs at the nice it was started with).

Per run: was the liar flagged (a miss when not), was an honest unit flagged (a false flag), units left
undecided (insufficient evidence after every extension), requests sent, rerouted answers, the liar's clean
answers, its scale against the pool's median, the standard error of that log ratio, and the detection power
at that ratio: the chance it is flagged at the standard error at which calibrate would clear a unit instead
(``calibrate.max_log_se`` at the test's detection scale), or its own when that is smaller.

Target: over every run, no miss and no false flag (the test asserts both in every CI run).

``--baseline FILE`` shows beside this run's the rows another run printed (one JSON object a line, as this
script prints them), e.g. this script at an earlier commit under the same burners: the table then compares
the two, the verdict is this run's alone.

Everything listens on 127.0.72.N (``--net`` names another 127.0.R)::

    .venv/bin/python bench/calibrate_power.py --runs 4
    .venv/bin/python bench/calibrate_power.py --runs 20 --loaded 10 --results
    .venv/bin/python bench/calibrate_power.py --runs 10 --loaded 10 --baseline before.jsonl --results
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results  # noqa: E402
from devconsul.server import DevConsulServer  # noqa: E402
from operate import calibrate  # noqa: E402
from tests.integration.operate.pool import live_pool  # noqa: E402
from tests.integration.operate.test_calibrate import (  # noqa: E402
    DETECT_SCALE,
    LIAR,
    LIAR_DECODE_PRIOR,
    LIAR_PRIOR,
    MAX_REQUESTS,
    NODES,
    RATE,
    REQUESTS,
    production_prompts_short_outputs,
)

NET = "127.0.72"
MEASURES = ("edge calibrate on the integration test's pool (3 simulated IUs, one agent believing its engine 20x "
            "faster in prefill and decode), quiet and beside 2 CPU burners: misses, false flags, undecided units")
TARGET = "no miss (the liar flagged in every run) and no false flag (no honest unit flagged), quiet and loaded"


def burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["nice", "-n", "0", sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def one_run(seed: int, net: str, requests: int, max_requests: int, decode_prior: float, nodes: int = NODES,
            rate: float = RATE, detect_scale: float = DETECT_SCALE) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, DevConsulServer(addr=f"{net}.20:0") as consul, \
            live_pool(Path(tmp), consul.address, nodes=nodes, liar=2, liar_prior=LIAR_PRIOR, net=net,
                      liar_decode_prior=decode_prior) as (edge, _):
        result = calibrate.run(f"http://{edge.address}", production_prompts_short_outputs(), rate=rate,
                               requests=requests, max_requests=max_requests, detect_scale=detect_scale,
                               seed=seed)
    by_unit = {u.unit: u for u in result.units}
    liar = by_unit.get(LIAR)
    scales = [u.scale for u in result.units if u.scale]
    median = statistics.median(scales) if scales else None
    se = calibrate.log_scale_se(result.samples_by_unit.get(LIAR, []))
    clear_se = calibrate.max_log_se(detect_scale)
    ratio = liar.scale / median if liar and liar.scale and median else None
    return {"seed": seed, "nodes": nodes, "requests": result.requests, "rerouted": result.rerouted,
            "liar_flags": list(liar.flags) if liar else [],
            "scales": {u.unit: None if u.scale is None else round(u.scale, 3) for u in result.units},
            "liar_flagged": LIAR in result.flagged, "false_flags": [u for u in result.flagged if u != LIAR],
            "undecided": result.undecided, "rounds": result.rounds,
            "liar_samples": liar.samples if liar else 0,
            "liar_scale_vs_pool": None if ratio is None else round(ratio, 3), "liar_log_se": round(se, 3),
            # calibrate clears a unit not flagged only at a standard error <= max_log_se: the liar's chance of
            # a miss is its chance to be cleared there
            "detection_power": None if ratio is None else round(detection_power(ratio, min(se, clear_se)), 6), "wall_s": round(time.monotonic() - started, 1)}


def detection_power(ratio: float, log_se: float) -> float:
    """The chance that a unit whose scale is ``ratio`` x the pool's is flagged at standard error ``log_se``:
    its estimated log ratio, normal around the true one, past calibrate's limit by the one-sided 95% margin."""
    if log_se <= 0:
        return 1.0
    margin = abs(math.log(ratio)) - math.log(calibrate.SCALE_LIMIT) - calibrate.Z_ONE_SIDED_95 * log_se
    return statistics.NormalDist().cdf(margin / log_se)


def table(rows: list[dict]) -> str:
    """One line per code ("this run", or a baseline's label) and load."""
    lines = ["| runs of | load | runs | misses | false flags | undecided units | requests (min-max) | "
             "wall s (median, max) | rerouted (max) | liar's clean answers (min-median) | "
             "liar scale / pool (max) | liar log SE (max) | detection power (min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for code in dict.fromkeys(r.get("code", "this run") for r in rows):
        for load in ("quiet", "loaded"):
            part = [r for r in rows if r["load"] == load and r.get("code", "this run") == code]
            if not part:
                continue
            n = [r["liar_samples"] for r in part]
            wall = [r["wall_s"] for r in part]
            lines.append(
                f"| {code} | {load} | {len(part)} | {sum(not r['liar_flagged'] for r in part)} | "
                f"{sum(bool(r['false_flags']) for r in part)} | {sum(len(r['undecided']) for r in part)} | "
                f"{min(r['requests'] for r in part)}-{max(r['requests'] for r in part)} | "
                f"{statistics.median(wall):.0f}, {max(wall):.0f} | "
                f"{max(r['rerouted'] for r in part)} | {min(n)}-{statistics.median(n):g} | "
                f"{max((r['liar_scale_vs_pool'] or math.inf) for r in part):.3f} | "
                f"{max(r['liar_log_se'] for r in part):.3f} | "
                f"{min((r['detection_power'] or 0.0) for r in part):.4f} |")
    return "\n".join(lines)


def baseline_rows(path: Path | None, label: str) -> list[dict]:
    if path is None:
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**row, "code": label} for row in rows]


def _terminated(signum, frame):
    raise SystemExit(f"calibrate_power: signal {signum}")  # the burners are stopped on the way out


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--loaded", type=int, default=None, help="runs of --runs under CPU load (default half)")
    parser.add_argument("--burners", type=int, default=2, help="CPU-spinning processes beside a loaded run")
    parser.add_argument("--requests", type=int, default=REQUESTS, help="requests to start with (calibrate.run)")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="requests in all, at most")
    parser.add_argument("--net", default=NET)
    parser.add_argument("--nodes", type=int, default=NODES, help="pool size (the liar is the third node)")
    parser.add_argument("--rate", type=float, default=RATE, help="requests per second")
    parser.add_argument("--detect-scale", type=float, default=DETECT_SCALE,
                        help="calibrate's --detect-scale: the evidence a unit needs before it is cleared")
    parser.add_argument("--baseline", type=Path, default=None, metavar="FILE",
                        help="rows another run printed (JSON lines), shown beside this run's in the table")
    parser.add_argument("--baseline-label", default="baseline", help="the baseline's name in the table")
    parser.add_argument("--liar-decode-prior", type=float, default=LIAR_DECODE_PRIOR,
                        help="the liar's decode rate prior, tokens/s")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    loaded = args.runs // 2 if args.loaded is None else args.loaded
    rows = []
    # interleaved (odd runs first): the host's own drift hits both kinds
    loaded_at = set([*range(1, args.runs, 2), *range(0, args.runs, 2)][:loaded])
    for i in range(args.runs):
        load = "loaded" if i in loaded_at else "quiet"
        procs = burners(args.burners) if load == "loaded" else []
        try:
            row = {"load": load, **one_run(i + 1, args.net, args.requests, args.max_requests, args.liar_decode_prior,
                                           args.nodes, args.rate, args.detect_scale)}
        finally:
            stop(procs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    baseline = baseline_rows(args.baseline, args.baseline_label)
    print(table(baseline + rows))
    misses = sum(not r["liar_flagged"] for r in rows)
    false_flags = sum(bool(r["false_flags"]) for r in rows)
    met = misses == 0 and false_flags == 0
    line = (f"{len(rows)} runs ({loaded} with {args.burners} CPU burners): {misses} misses, {false_flags} false "
            f"flags; target {TARGET}: {'met' if met else 'NOT met'}")
    print(line)
    return results.record_met(args.results, met, script=__file__, argv=argv, numbers={"runs": rows, "baseline": baseline, "table": table(baseline + rows)},
                              target=TARGET, summary=line, measures=MEASURES)


if __name__ == "__main__":
    results.exit_with(main, __file__)
