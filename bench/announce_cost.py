#!/usr/bin/env python3
"""What the announce channel costs an edge and the agents, at 128 nodes x 2 IUs, measured side by side.

    .venv/bin/python bench/announce_cost.py                       # 128 nodes, 200 req/s, 20 s per mode
    .venv/bin/python bench/announce_cost.py --nodes 16 --window 5 # quick

One process runs 128 node agents' HTTP side (``eas_agent.http.AgentHttpServer`` with the shipped
``NodeAnnouncements`` behind ``POST /announce``, one per loopback address 127.0.202.N, each serving a 2-IU
body every 200 ms as an agent's cycle does); another runs their 256 stand-in IUs on the same addresses
(streamed completions, 8 chunks 5 ms apart: bench/edge_proxy.py's stand-in); a dev Consul lists them.
One real ``eas-edge`` process follows every agent (push) and routes an open-loop Poisson stream of streamed
completions at ``--rate`` (this process), first with the announce channel off (``push``), then on
(``announce``: ``--announce-token-file``), each for ``--window`` seconds on the same agents and IUs.

Printed per mode: the edge's CPU per request, the agents' CPU per request (all 128 together: the
announcements they count and the extra bodies they push), announce batches and pushed bodies per request,
the edge's sockets, and time to first byte through the edge (p50 / p99). The difference between the rows
is what the channel costs; a request's announcement is one small POST on a kept-alive connection to its
node's agent and one extra pushed body back from that agent to each edge. No verdict: the cost is
measured and reported, with no limit set for it. The machine's other load shows in every number.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from edge_procs import CHUNK_GAP_S, CHUNKS, STREAMED_COMPLETION, DevConsul, start_edge  # noqa: E402
from edge_proxy import drive  # noqa: E402
from measure import cpu_seconds, percentile, tcp_connections  # noqa: E402

NET = 202  # 127.202.0.N: clear of edge_proxy's 127.0.201.N push agents

AGENTS = r'''
import secrets, sys, threading, time
from dataclasses import replace
from consul_io import layout
from eas_agent.announce import NodeAnnouncements
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.scorebody import IUScore, ScoreBody
nodes, port, net, token = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.stdin.readline().strip()

class Node:
    """An agent's HTTP side: Agent.announce's work (count the batch, serve a new body at once)."""
    def __init__(self, n):
        self.name = f"node{n:03d}"
        self.ius = [layout.iu_id(self.name, k) for k in (0, 1)]
        self.channel = NodeAnnouncements(self.ius)
        self.base = None
        self.lock = threading.Lock()
        self.http = AgentHttpServer(f"127.{net}.0.{n + 1}", port, AgentMetrics(), announce=self.announce,
                                    announce_token=token)
    def announce(self, obj):
        accepted, ignored, ignored_seqs = self.channel.receive_batch(obj, time.time())
        if accepted:
            with self.lock:
                if self.base is not None:
                    self.http.set_scores(self.channel.body(self.base))
        return accepted, ignored, ignored_seqs
    def cycle(self, seq):
        body = ScoreBody(node=self.name, rack="r1", profile="drain", seq=seq, ts=round(time.time(), 3), ius={
            iu: IUScore(score=0.05 * k, level=k, status="passing", components={
                "prefill_tps": 12000.0, "request_cost_s": 0.18, "queue_s": 0.0, "kv_s": 0.0, "step_s": 0.02,
                "prefill_s": 0.0, "waiting": 0, "running": 3}) for k, iu in enumerate(self.ius)})
        for iu in self.ius:  # the scrape: nothing waiting, the announcements so far are in the score now
            self.channel.prompts[iu].reconcile(0, body.ts, 12000.0, 0.18)
        with self.lock:
            self.base = body
            self.http.set_scores(self.channel.body(body))

agents = [Node(n) for n in range(nodes)]
for a in agents:
    a.http.start()
print("ready", flush=True)
seq = 0
while True:
    seq += 1
    for a in agents:
        a.cycle(seq)
    time.sleep(0.2)
'''

IUS = STREAMED_COMPLETION + r'''
nodes, net, CHUNKS, GAP = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
async def main():
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for n in range(nodes):
        for k in (0, 1):
            await web.TCPSite(runner, f"127.{net}.0.{n + 1}", 8000 + k).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def edge_counters(address: str) -> dict[str, float]:
    """The announce and push counters of the edge's /metrics."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("eas_edge_announce_batches_total", "eas_edge_announcements_total")):
            name, value = line.rsplit(" ", 1)
            counts[name] = float(value)
    return counts


def measure(mode: str, consul: str, port: int, token_file: Path, rate: float, window: float,
            agents: subprocess.Popen, nodes: int) -> dict:
    extra = ["--agent-port", str(port), "--max-inflight-per-iu", "4096"]
    if mode == "announce":
        extra += ["--announce-token-file", str(token_file)]
    edge, address = start_edge(consul, extra)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every IU routable and scored, every feed connected
            try:
                urllib.request.urlopen(f"http://{address}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(3.0)
        a0, e0 = cpu_seconds(agents.pid), cpu_seconds(edge.pid)
        result = asyncio.run(drive([f"http://{address}/v1/completions"], rate, window, seed=7))
        agents_cpu, edge_cpu = cpu_seconds(agents.pid) - a0, cpu_seconds(edge.pid) - e0
        counters = edge_counters(address)
        sockets = tcp_connections(edge.pid)
    finally:
        edge.terminate()
        edge.wait(30)
    answered = max(1, len(result["ttfb"]))
    batches = sum(v for k, v in counters.items() if k.startswith("eas_edge_announce_batches_total"))
    announced = counters.get('eas_edge_announcements_total{result="sent"}', 0.0)
    return {"mode": mode, "requests": len(result["ttfb"]), "errors": result["errors"],
            "edge_ms_per_request": 1000 * edge_cpu / answered, "agents_ms_per_request": 1000 * agents_cpu / answered,
            "batches_per_request": batches / answered, "announced_per_request": announced / answered,
            "edge_sockets": sockets, "ttfb_p50_ms": 1000 * percentile(result["ttfb"], 50),
            "ttfb_p99_ms": 1000 * percentile(result["ttfb"], 99), "nodes": nodes}


def run(nodes: int, rate: float, window: float) -> list[dict]:
    """The push row, then the announce row."""
    from consul_io import layout
    from consul_io.client import ConsulIO
    from sim.vllm.registration import IUService, register_on_catalog_node

    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    port = free_port()
    token = os.urandom(32).hex()
    with tempfile.TemporaryDirectory() as tmp, DevConsul() as consul:
        token_file = Path(tmp) / "announce.token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        agents = subprocess.Popen([sys.executable, "-c", AGENTS, str(nodes), str(port), str(NET)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        agents.stdin.write(token + "\n")  # the token on stdin, never on a command line
        agents.stdin.flush()
        ius = subprocess.Popen([sys.executable, "-c", IUS, str(nodes), str(NET), str(CHUNKS), str(CHUNK_GAP_S)],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            if agents.stdout.readline().strip() != "ready" or ius.stdout.readline().strip() != "ready":
                raise SystemExit("agents or stand-in IUs did not start")
            io = ConsulIO(consul.address)
            for n in range(nodes):
                node = f"node{n:03d}"
                for k in (0, 1):
                    register_on_catalog_node(io, IUService(layout.iu_id(node, k), node, "r1", f"127.{NET}.0.{n + 1}",
                                                           8000 + k, (k,), k), f"127.{NET}.0.{n + 1}")
            return [measure(mode, consul.address, port, token_file, rate, window, agents, nodes)
                    for mode in ("push", "announce")]
        finally:
            for process in (agents, ius):
                process.terminate()
                process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--rate", type=float, default=200.0, help="req/s through the edge (default 200)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per mode (default 20)")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 250:
        parser.error(f"--nodes {args.nodes}: 1 to 250 (one loopback address 127.{NET}.0.N each)")
    rows = run(args.nodes, args.rate, args.window)
    print(f"{args.nodes} nodes x 2 IUs, one edge, {args.rate:.0f} req/s of streamed completions, "
          f"{args.window:.0f} s per mode:")
    print("| mode | requests (errors) | edge CPU ms/request | agents CPU ms/request (all) | announce batches / "
          "request | announced / request | edge sockets | TTFB p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']} ({r['errors']}) | {r['edge_ms_per_request']:.3f} | "
              f"{r['agents_ms_per_request']:.3f} | {r['batches_per_request']:.2f} | {r['announced_per_request']:.2f} | "
              f"{r['edge_sockets']} | {r['ttfb_p50_ms']:.1f} / {r['ttfb_p99_ms']:.1f} |")
    push, announce = rows
    print(f"announce - push: edge {announce['edge_ms_per_request'] - push['edge_ms_per_request']:+.3f} ms CPU per "
          f"request ({announce['edge_ms_per_request'] / max(1e-9, push['edge_ms_per_request']):.2f}x), agents "
          f"{announce['agents_ms_per_request'] - push['agents_ms_per_request']:+.3f} ms CPU per request, "
          f"edge sockets {announce['edge_sockets'] - push['edge_sockets']:+d}, "
          f"TTFB p99 {announce['ttfb_p99_ms'] - push['ttfb_p99_ms']:+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
