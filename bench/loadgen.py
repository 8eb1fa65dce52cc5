"""How fast can ``clusterctl loadtest``'s generator send on time? Its ceiling, so a load test measures the
cluster, not itself.

The generator (operate/loadgen.py, asyncio, as ``clusterctl loadtest`` runs it) sends the production mix
(token-id prompts of ~327 / ~4,218 / ~12,842 tokens: ~12 KB of JSON per request on average) open-loop at
each rate for ``--duration`` seconds to a trivial upstream: an aiohttp server on 127.0.0.x in a process of
its own that reads each body and streams 4 tokens back at once. Per rate: the scheduling lag (actual send
minus planned, p50/p99/max), the generator's CPU per request (its process CPU time over the run / requests
sent: the upstream's CPU is not in it) and the errors.

Target: p99 lag <= 1 ms at >= 100 req/s of the production mix (a 4-node virtual cluster's goodput is a few
tens of requests per second; a 1,024-GPU cluster's A class alone is ~800 req/s, for which a load test
runs several generators).

    .venv/bin/python bench/loadgen.py [--rates 25,50,100,200,400] [--duration 10] [--results]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operate.loadgen import Generator, plan  # noqa: E402
from operate.scenario import load_scenario  # noqa: E402
from operate.stats import percentile  # noqa: E402

LAG_LIMIT_S = 0.001
TARGET_RATE = 100.0
UPSTREAM_HOST = "127.0.0.77"
EVENT = b'data: {"choices": [{"index": 0, "text": "tok ", "finish_reason": null}]}\n\n'


def serve(host: str) -> None:
    """The trivial upstream: reads the body, streams 4 tokens and [DONE]; prints its port, runs until killed."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT * 4 + b"data: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "trivial"}]})

    async def main() -> None:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(endpoint: str, rate: float, duration_s: float) -> dict:
    planned = plan(load_scenario(), rate, duration_s, seed=1)
    cpu0, wall0 = time.process_time(), time.monotonic()
    outcomes = asyncio.run(Generator(endpoint, "trivial", timeout_s=30.0).run(planned))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    lags = [o.lag_s for o in outcomes]
    return {"rate": rate, "requests": len(outcomes), "errors": sum(1 for o in outcomes if not o.ok),
            "lag_p50_ms": 1000 * percentile(lags, 50), "lag_p99_ms": 1000 * percentile(lags, 99),
            "lag_max_ms": 1000 * max(lags), "cpu_ms_per_request": 1000 * cpu / max(1, len(outcomes)),
            "cpu_share": cpu / wall}


def highest_held(rows: list[dict]) -> dict | None:
    """The highest rate held (p99 lag within the limit, no error) with every lower rate held too."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate"]):
        if row["lag_p99_ms"] > LAG_LIMIT_S * 1000 or row["errors"]:
            break
        best = row
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="25,50,100,200,400", help="req/s, ascending (default 25,50,100,200,400)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate (default 10)")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # the upstream's own process
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    upstream = subprocess.Popen([sys.executable, __file__, "--serve", UPSTREAM_HOST], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = f"http://{UPSTREAM_HOST}:{int(upstream.stdout.readline())}"
        rows = [measure(endpoint, float(r), args.duration) for r in args.rates.split(",") if r]
    finally:
        upstream.terminate()
        upstream.wait(10)
    print(f"{'rate/s':>7} {'requests':>8} {'errors':>6} {'lag p50 ms':>10} {'lag p99 ms':>10} {'lag max ms':>10} "
          f"{'CPU ms/req':>10} {'CPU share':>9}")
    for r in rows:
        print(f"{r['rate']:>7g} {r['requests']:>8} {r['errors']:>6} {r['lag_p50_ms']:>10.3f} {r['lag_p99_ms']:>10.3f} "
              f"{r['lag_max_ms']:>10.2f} {r['cpu_ms_per_request']:>10.3f} {100 * r['cpu_share']:>8.1f}%")
    best = highest_held(rows)
    if best is None:
        line = f"the lowest rate missed p99 lag <= {LAG_LIMIT_S * 1000:g} ms; target >= {TARGET_RATE:g} req/s: NOT met"
    else:
        verdict = "met" if best["rate"] >= TARGET_RATE else "NOT met"
        line = (f"highest rate with p99 scheduling lag <= {LAG_LIMIT_S * 1000:g} ms (and every lower one): "
                f"{best['rate']:g} req/s "
                f"(p99 {best['lag_p99_ms']:.3f} ms), CPU {best['cpu_ms_per_request']:.2f} ms per request; "
                f"target >= {TARGET_RATE:g} req/s: {verdict}")
    print(line)
    results.record(args.results, script=__file__, numbers={"rows": rows, "highest_rate": best and best["rate"]},
                   summary=line, target=f"p99 scheduling lag <= 1 ms at >= {TARGET_RATE:g} req/s of the production mix",
                   verdict=results.verdict_of(line), argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
                   measures="the load generator's ceiling: open-loop rate held with p99 send lag <= 1 ms, CPU/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
