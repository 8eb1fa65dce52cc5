#!/usr/bin/env python3
"""What pushing scores to E edges costs one node agent: blocking queries against a stream, side by side.

    .venv/bin/python bench/push_fanout.py                    # 1, 4, 16 edges; 10 s per row
    .venv/bin/python bench/push_fanout.py --edges 16 --window 5   # quick

One process is a node agent's HTTP side (the shipped ``eas_agent.http.AgentHttpServer`` on 127.0.203.1)
serving a new 2-IU body ``--bodies-per-s`` times a second: 5 cycles (one per 200 ms) plus what the announce
channel adds, one body per announcement, ~6 a second per node at the pool's capacity in
``bench/announce_cost.py``'s setting (11 by default). Another process holds E edges' push feeds (the shipped
``edge.feed.AgentFeed``, one session and one view each, so E connections) following that agent, either with
blocking queries (``stream=False``: one HTTP request per body per edge, what agents before streams serve)
or with one stream each (``/scores?stream=1``: one line per body per edge). The two modes alternate for
each E on the same agent process; the agent's CPU with no edge at all is measured first and subtracted.

Printed per row: the agent's CPU for the push (% of one core, and per body per edge), the edges' CPU per
body per edge, bodies delivered per body served (a blocking query that is not back in time for the next
body skips to the latest), and the age of a body when its edge has it (p50 / p99, ms). Target: at 16 edges
the stream costs the agent at most half of what blocking queries cost it (``met`` only when it does). The
machine's other load shows in every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results  # noqa: E402
from measure import cpu_seconds, percentile  # noqa: E402
from verdict import shown  # noqa: E402

HOST = "127.0.203.1"  # clear of edge_proxy's 127.0.201.N and announce_cost's 127.202.0.N
TARGET_RATIO = 0.5  # stream / blocking queries, the agent's push CPU at the largest E

AGENT = r'''
import sys, time
from consul_io import layout
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.scorebody import IUScore, ScoreBody
host, rate = sys.argv[1], float(sys.argv[2])
# every edge of this bench follows from one address; on a site each edge has its own (the per-address caps)
http = AgentHttpServer(host, 0, AgentMetrics(), per_address=4096, streams_per_address=4096)
http.start()
print(http.server.server_address[1], flush=True)
ius = (layout.iu_id("node000", 0), layout.iu_id("node000", 1))
seq, interval, due = 0, 1.0 / rate, time.monotonic()
while True:
    seq += 1
    http.set_scores(ScoreBody(node="node000", rack="r1", profile="drain", seq=seq, ts=time.time(), ius={
        iu: IUScore(score=0.05 * k + 0.001 * (seq % 7), level=k, status="passing", components={
            "prefill_tps": 12000.0, "request_cost_s": 0.18, "queue_s": 0.0, "kv_s": 0.0, "step_s": 0.02,
            "prefill_s": 0.0, "waiting": 0, "running": 3}) for k, iu in enumerate(ius)}))
    due += interval
    time.sleep(max(0.0, due - time.monotonic()))
'''

EDGES = r'''
import asyncio, json, sys, time
import aiohttp
from consul_io import layout
from edge.pool import AnomalyDetector
from edge.feed import AgentFeed, EdgeView
host, port, edges, stream = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "stream"
settle, window = float(sys.argv[5]), float(sys.argv[6])
counting, ages, delivered = False, [], [0] * edges

def follower():
    view = EdgeView(detector=AnomalyDetector())
    view.apply_health([{"Node": {"Node": "node000"}, "Service": {"Service": layout.iu_service("node000"), "ID": layout.iu_id("node000", i), "Address": host, "Port": 8000 + i,
                                    "Meta": {"node": "node000"}},
                        "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]} for i in (0, 1)])
    return view

async def main():
    global counting
    sessions, feeds = [], []
    for k in range(edges):
        session = aiohttp.ClientSession()
        feed = AgentFeed(follower(), session, port, reconcile_s=3600.0, stream=stream)
        received = feed._received
        def counted(node, agent, body, k=k, received=received):
            if counting:
                delivered[k] += 1
                ages.append(time.time() - body["ts"])
            received(node, agent, body)
        feed._received = counted
        sessions.append(session)
        feeds.append(feed.start())
    await asyncio.sleep(settle)
    counting, cpu0, t0 = True, time.process_time(), time.monotonic()
    print("counting", flush=True)
    await asyncio.sleep(window)
    counting, cpu, wall = False, time.process_time() - cpu0, time.monotonic() - t0
    errors = sum(sum(f.errors.values()) for f in feeds)
    for feed in feeds:
        await feed.stop()
    for session in sessions:
        await session.close()
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "delivered": delivered, "ages": ages, "errors": errors}),
          flush=True)
asyncio.run(main())
'''


def agent_cpu_during(agent: subprocess.Popen, edges: int, mode: str, port: int, settle: float, window: float
                     ) -> dict:
    """One row: E edges in ``mode`` follow the agent; its CPU over their counting window."""
    followers = subprocess.Popen([sys.executable, "-c", EDGES, HOST, str(port), str(edges), mode, str(settle),
                                  str(window)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        if followers.stdout.readline().strip() != "counting":
            raise SystemExit("the edges' process did not start")
        a0, t0 = cpu_seconds(agent.pid), time.monotonic()
        result = json.loads(followers.stdout.readline())
        agent_cpu, wall = cpu_seconds(agent.pid) - a0, time.monotonic() - t0
    finally:
        followers.wait(30)
    result.update(edges=edges, mode=mode, agent_cpu_s=agent_cpu, agent_wall_s=wall)
    return result


def run(edges: list[int], rate: float, window: float, settle: float = 1.5) -> tuple[float, list[dict]]:
    """(the agent's own CPU fraction with no edge, the rows)."""
    agent = subprocess.Popen([sys.executable, "-c", AGENT, HOST, str(rate)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        port = int(agent.stdout.readline())
        time.sleep(settle)
        a0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(window)
        idle = (cpu_seconds(agent.pid) - a0) / (time.monotonic() - t0)
        rows = []
        for count in edges:
            for mode in ("poll", "stream"):
                rows.append(agent_cpu_during(agent, count, mode, port, settle, window))
        return idle, rows
    finally:
        agent.terminate()
        agent.wait(10)


def report(idle: float, rows: list[dict], rate: float, numbers: dict | None = None) -> list[str]:
    """The printed table and target line; ``numbers`` (when given) receives what a result file records."""
    lines = [f"one agent, {rate:g} bodies/s; its CPU with no edge {100 * idle:.2f}% of a core (subtracted below)",
             "| edges | mode | agent push, % of a core | agent us / body / edge | edges us / body / edge "
             "| delivered / served | body age at the edge p50 / p99 ms | errors |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    by_key = {}
    for row in rows:
        push = row["agent_cpu_s"] / row["agent_wall_s"] - idle
        served = rate * row["wall_s"] * row["edges"]
        delivered = sum(row["delivered"])
        by_key[(row["edges"], row["mode"])] = push
        lines.append(f"| {row['edges']} | {'blocking queries' if row['mode'] == 'poll' else 'stream'} "
                     f"| {100 * push:.2f} | {1e6 * push / rate / row['edges']:.0f} "
                     f"| {1e6 * row['cpu_s'] / max(1, delivered):.0f} | {delivered / served:.2f} "
                     f"| {1000 * percentile(row['ages'], 50):.2f} / {1000 * percentile(row['ages'], 99):.2f} "
                     f"| {row['errors']} |")
    largest = max(row["edges"] for row in rows)
    poll, stream = by_key[(largest, "poll")], by_key[(largest, "stream")]
    ratio = stream / poll if poll > 0 else float("inf")
    lines.append(f"{largest} edges: the stream costs the agent {shown(ratio, TARGET_RATIO)}x what blocking queries cost it "
                 f"(target <= {TARGET_RATIO}): {'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    if numbers is not None:
        numbers["bodies_per_s"] = rate
        numbers["agent_push_pct_of_a_core"] = {
            f"{edges} edge{'s' if edges != 1 else ''}": {"blocking" if mode == "poll" else "stream": round(100 * push, 2)
                               for (count, mode), push in by_key.items() if count == edges}
            for edges in sorted({count for count, _ in by_key})}
        numbers[f"stream_over_blocking_{largest}_edges"] = round(ratio, 3)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", default="1,4,16", help="edge counts (default 1,4,16)")
    parser.add_argument("--bodies-per-s", type=float, default=11.0,
                        help="bodies the agent serves per second (default 11: 5 cycles + 6 announcements)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per row (default 10)")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    edges = sorted({int(e) for e in args.edges.split(",")})
    if not edges or edges[0] < 1 or not 0 < args.bodies_per_s <= 1000 or not 0 < args.window <= 600:
        parser.error("--edges must be positive counts, --bodies-per-s in (0, 1000], --window in (0, 600]")
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    load = f"load average {os.getloadavg()[0]:.1f} at start"
    idle, rows = run(edges, args.bodies_per_s, args.window)
    numbers: dict = {}
    lines = report(idle, rows, args.bodies_per_s, numbers)
    for line in lines:
        print(line)
    largest = max(edges)
    ratio = numbers[f"stream_over_blocking_{largest}_edges"]
    results.record(args.results, script=__file__, numbers=numbers, host=load,
                   argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
                   target=f"at {largest} edges the stream's agent cost <= {TARGET_RATIO}x blocking queries'",
                   verdict="met" if ratio <= TARGET_RATIO else "not met", summary=lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
