#!/usr/bin/env python3
"""What the edge's prefix routing costs at 128 nodes x 2 IUs: CPU per request and the index's memory.

    .venv/bin/python bench/prefix_cost.py --results

Per request the edge hashes the prompt (in the body summary: ``prompt_prefix`` of the chat messages) and
routes it (``Router.choose`` then ``Router.sent``, which records it in the index). Both are timed for the
same requests with ``prefix_routing`` on and off (off: no hashing, no index), on a snapshot of 256 IUs whose
index holds the edge's recent traffic: multi-turn conversations (8 system prompts of ~2,400 characters,
turns adding ~500-character messages) until every IU's index is full. Memory: tracemalloc of the index at
its bound (``DEFAULT_MAX_BLOCKS_PER_IU`` per IU).

The relay (eas_wire/placed.py): every edge reads every edge's placements in the agents' /scores bodies. Per
placement: the bytes it adds to a body, the CPU of reading it in a body (JSON decode and the body's checks,
with and without ``RELAYED`` placements of ``MAX_BLOCKS`` blocks each; the first time, and again in a later
body, where the reader skips what it holds) and of learning it into a full index.
The relay per request the edge routes, at 1, 4 and 16 edges: one node's agent (the shipped
``NodeAnnouncements`` and ``AgentHttpServer``'s serialization, not serving) receives ``--node-rate``
placements per second (Poisson) and makes a body after every announce batch and every 200 ms cycle, as the
agent does; an edge reads those bodies as a blocking query's answers (every body the whole relay window)
and as the stream's lines (each placement once), through the shipped ``EdgeView.parse`` and
``read_placed``, then learns them. The relay's CPU per placement is that reading less the same bodies'
without placements, plus the learning; every edge reads every placement of the pool and routes 1/N of its
requests, so per request it routes N placements.

Every time is the CPU time of the measuring thread (``time.thread_time_ns``), not the wall clock: on a shared
host the other processes' share of the cores is not the edge's cost.

Target: the edge's CPU per request with prefix routing and the relay, at 16 edges, <= 1.5x without: the whole
edge's CPU per request measured by ``edge_proxy.py`` (bench/results/edge_proxy.json) plus what is added here.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402

from consul_io import layout  # noqa: E402
from eas_agent.announce import NodeAnnouncements  # noqa: E402
from eas_agent.http import AgentHttpServer, AgentMetrics, stream_line  # noqa: E402
from eas_wire.announce import Announcement  # noqa: E402
from eas_wire.placed import Placement  # noqa: E402
from eas_wire.scorebody import IUScore, ScoreBody  # noqa: E402
from eas_wire.stream import frame, read_frame  # noqa: E402
from edge.feed import EdgeView  # noqa: E402
from edge.pool import AnomalyDetector, PoolView  # noqa: E402
from edge.pool.prefix import PrefixIndex, prompt_prefix, relay_blocks  # noqa: E402
from edge.routing import Router  # noqa: E402
from edge.tokens import estimate_prompt_tokens, prompt_parts  # noqa: E402

LIMIT = 1.5


def pool(nodes: int, rng: random.Random) -> PoolView:
    clock = [1_000_000.0]
    view = PoolView(detector=AnomalyDetector(), clock=lambda: clock[0])
    names = [f"r{n // 16:02d}n{n % 16:02d}" for n in range(nodes)]
    view.apply_health([{"Node": {"Node": node},
                        "Service": {"Service": layout.iu_service(node), "ID": layout.iu_id(node, i),
                                    "Address": "127.0.74.1", "Port": 8000 + i, "Meta": {"node": node, "rack": node[:3]}},
                        "Checks": [{"CheckID": layout.health_check_id(layout.iu_id(node, i)), "Status": "passing"}]}
                       for node in names for i in range(2)])
    view.apply_polled([ScoreBody(node=node, rack=node[:3], ts=clock[0], heartbeat_s=2.0, seq=1, ius={
        layout.iu_id(node, i): IUScore(score=round(rng.uniform(0.05, 0.5), 4), status="passing", components={
            "request_cost_s": 0.08, "prefill_tps": 12_600.0, "tokens_total": 1e6, "running": 10,
            "prefix_hit_rate": 0.5}) for i in range(2)}) for node in names])
    return view


def conversations(rng: random.Random, count: int) -> list[dict]:
    """Chat bodies: turns of conversations, each turn the whole conversation so far."""
    systems = ["".join(rng.choice("abcdefgh ") for _ in range(2400)) for _ in range(8)]
    bodies = []
    while len(bodies) < count:
        messages = [{"role": "system", "content": rng.choice(systems)}]
        for _ in range(rng.randint(2, 10)):
            messages.append({"role": "user", "content": "".join(rng.choice("ijklmnop ") for _ in range(500))})
            bodies.append({"model": "m", "messages": list(messages)})
            messages.append({"role": "assistant", "content": "".join(rng.choice("qrstuv ") for _ in range(800))})
    return bodies[:count]


def per_request_us(view: PoolView, bodies: list[dict], prefix_on: bool) -> list[float]:
    router = Router(random.Random(1), prefix=PrefixIndex() if prefix_on else None)
    snapshot = view.snapshot()
    now = 1_000_000.01
    samples = []
    for k, body in enumerate(bodies):
        start = time.thread_time_ns()
        tokens = estimate_prompt_tokens(body, True)
        if prefix_on:
            prefix = prompt_prefix(prompt_parts(body, True))
            decision = router.choose(snapshot, now, tokens, prefix=prefix)
            router.sent(decision.iu_id, now, decision.cost_s, k, decision.expected_s, None, prefix.hashes)
        else:
            decision = router.choose(snapshot, now, tokens)
            router.sent(decision.iu_id, now, decision.cost_s, k, decision.expected_s)
        router.done(decision.iu_id, k)
        samples.append((time.thread_time_ns() - start) / 1000)
    return samples


def index_memory(ius: list[str], rng: random.Random) -> tuple[int, int]:
    """(bytes, entries) of an index filled to its bound with distinct prompts on every IU."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    index = PrefixIndex()
    for iu_id in ius:
        for _ in range(index.max_blocks // 8 + 1):
            index.record(iu_id, tuple(rng.getrandbits(64) for _ in range(64)))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return used, index.entries()


RELAYED = 8  # placements in one body: a busy node's second of requests


def relay_cost(rng: random.Random, reps: int = 2000) -> dict:
    """Per relayed placement: body bytes, µs to read it in a body (the first time; again, when the reader skips
    it), µs to learn it into a full index."""
    ius = {layout.iu_id("r00n00", i): IUScore(score=0.1, status="passing", components={
        "request_cost_s": 0.08, "prefill_tps": 12_600.0, "running": 10}) for i in range(2)}
    placed = tuple(Placement(k + 1, layout.iu_id("r00n00", k % 2),
                             relay_blocks(tuple(rng.getrandbits(64) for _ in range(rng.randint(200, 1500)))))
                   for k in range(RELAYED))
    texts = [ScoreBody(node="r00n00", ts=1e9, ius=ius, placed=p).dumps() for p in ((), placed)]

    def read_us(text: str, after: int = 0) -> float:
        start = time.thread_time_ns()
        for _ in range(reps):
            ScoreBody.from_json(json.loads(text), placed_after=after)
        return (time.thread_time_ns() - start) / 1000 / reps

    without = min(read_us(texts[0]) for _ in range(3))
    with_placed = min(read_us(texts[1]) for _ in range(3))
    repeated = min(read_us(texts[1], RELAYED) for _ in range(3))  # every placement read before: skipped
    index = PrefixIndex()
    for iu_id in ius:
        for _ in range(index.max_blocks // 8 + 1):
            index.record(iu_id, tuple(rng.getrandbits(64) for _ in range(64)))
    router = Router(random.Random(1), prefix=index)
    learnt = [(p.iu, p.blocks) for p in placed] * (reps // RELAYED)
    start = time.thread_time_ns()
    router.learn(learnt)
    learn_us = (time.thread_time_ns() - start) / 1000 / len(learnt)
    return {"bytes_per_placement": round((len(texts[1]) - len(texts[0])) / RELAYED),
            "read_us_per_placement": round((with_placed - without) / RELAYED, 2),
            "reread_us_per_placement": round((repeated - without) / RELAYED, 2),
            "learn_us_per_placement": round(learn_us, 2)}


EDGE_COUNTS = (1, 4, 16)
CYCLE_S = 0.2  # the agent's cycle


def node_bodies(rng: random.Random, node_rate: float, seconds: float) -> dict[str, list[bytes]]:
    """One node's bodies over ``seconds``, each in three forms: ``window`` (a blocking query's answer: the
    whole relay window), ``stream`` (the line a stream follower gets: each placement once), ``bare`` (the
    same body without placements); and ``placements`` (how many the node relayed)."""
    ius = {layout.iu_id("r00n00", i): IUScore(score=0.1, status="passing", components={
        "request_cost_s": 0.08, "prefill_tps": 12_600.0, "running": 10}) for i in range(2)}
    node = NodeAnnouncements(list(ius))
    server = AgentHttpServer("127.0.71.1", 0, AgentMetrics())  # its serialization only: never started
    t0 = 1e9
    events = [(t0 + k * CYCLE_S, None) for k in range(int(seconds / CYCLE_S))]
    t = t0
    while (t := t + rng.expovariate(node_rate)) < t0 + seconds:
        events.append((t, rng.choice(list(ius))))
    forms: dict[str, list[bytes]] = {"window": [], "stream": [], "bare": []}
    base, sent, relayed = ScoreBody(node="r00n00", ts=t0, ius=ius, seq=0), 0, 0
    for t, iu in sorted(events, key=lambda e: e[0]):
        if iu is None:  # a cycle: a new scrape; the announce bodies until the next one start from it
            base = ScoreBody(node="r00n00", ts=t, ius=ius, seq=base.seq + 1)
        else:
            relayed += 1
            blocks = relay_blocks(tuple(rng.getrandbits(64) for _ in range(rng.randint(200, 1500))))
            node.receive(f"edge-{relayed % 16}.bench", [Announcement(iu, 900, relayed, t, blocks)], t)
        server.set_scores(node.body(base))
        forms["window"].append(frame(server.scores_json))
        line, sent = stream_line(server.scores_bare, server.scores_placed, server.scores_fragments, sent)
        forms["stream"].append(line)
        forms["bare"].append(frame(server.scores_bare))
    server.server.server_close()
    return {**forms, "placements": relayed}


def read_us(lines: list[bytes]) -> tuple[float, EdgeView]:
    """µs to read ``lines`` as the edge's feed does (decode, check, read the placements), and the view."""
    view = EdgeView(detector=AnomalyDetector())
    start = time.thread_time_ns()
    for line in lines:
        body = view.parse(read_frame(line), "bench")
        view.read_placed(body)
    return (time.thread_time_ns() - start) / 1000, view


def relay_at_edges(rng: random.Random, node_rate: float, seconds: float = 300.0) -> dict:
    """Per placement of the pool: µs an edge spends on it, read from window bodies and from stream lines."""
    forms = node_bodies(rng, node_rate, seconds)
    placements = forms["placements"]
    best = {form: math.inf for form in ("bare", "window", "stream")}
    for _ in range(7):  # interleaved, the least of each: the difference is small beside reading the bodies
        for form in best:
            best[form] = min(best[form], read_us(forms[form])[0])
    _, view = read_us(forms["stream"])
    learnt = view.relayed.take()
    if len(learnt) != placements:
        raise SystemExit(f"prefix_cost: the stream's lines gave {len(learnt)} of {placements} placements")
    index = PrefixIndex()
    for iu_id in {iu for iu, _ in learnt}:
        for _ in range(index.max_blocks // 8 + 1):
            index.record(iu_id, tuple(rng.getrandbits(64) for _ in range(64)))
    router = Router(random.Random(1), prefix=index)
    start = time.thread_time_ns()
    router.learn(learnt)
    learn_us = (time.thread_time_ns() - start) / 1000 / placements
    carried = {form: sum(len(json.loads(line).get("placed", ())) for line in forms[form]) / placements
               for form in ("window", "stream")}
    return {"node_rate_per_s": node_rate, "bodies_per_s": round(len(forms["bare"]) / seconds, 1),
            **{f"{form}_bodies_per_placement": round(carried[form], 2) for form in carried},
            **{f"{form}_us_per_placement": round((best[form] - best["bare"]) / placements + learn_us, 2)
               for form in ("window", "stream")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--node-rate", type=float, default=6.0,
                        help="placements per second a node's agent relays (route_sim at 80%%: 6.0-6.6)")
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    rng = random.Random(1)
    view = pool(args.nodes, rng)
    bodies = conversations(rng, args.requests)
    # interleaved rounds, so a busy neighbour on the host shifts both sides alike
    off, on = [], []
    for round_ in range(4):
        part = bodies[round_::4]
        off += per_request_us(view, part, False)
        on += per_request_us(view, part, True)
    added_ms = (statistics.median(on) - statistics.median(off)) / 1000
    edge_ms = json.loads((Path(__file__).parent / "results" / "edge_proxy.json").read_text())["numbers"][
        "edge_cpu_ms_per_request"]
    ratio = (edge_ms + added_ms) / edge_ms
    ius = [e.iu_id for e in view.snapshot().healthy]
    if len(ius) != 2 * args.nodes:
        raise SystemExit(f"prefix_cost: {len(ius)} of {2 * args.nodes} IUs routable: the pool is not what it measures")
    used, entries = index_memory(ius, rng)
    relay = relay_cost(rng)
    at = relay_at_edges(rng, args.node_rate)
    # per request an edge routes at N edges: N placements of the pool read and learnt
    ratios = {form: {n: (edge_ms + added_ms + n * at[f"{form}_us_per_placement"] / 1000) / edge_ms
                     for n in EDGE_COUNTS} for form in ("window", "stream")}
    worst = ratios["stream"][max(EDGE_COUNTS)]
    verdict = "met" if worst <= LIMIT else "not met"
    print(f"CPU per request (tokens estimate + hashing + choose + sent), median: prefix routing off "
          f"{statistics.median(off):.1f} us, on {statistics.median(on):.1f} us (p99 "
          f"{sorted(off)[int(0.99 * len(off))]:.1f} / {sorted(on)[int(0.99 * len(on))]:.1f} us)")
    print(f"the edge's CPU per request (edge_proxy.py) {edge_ms:.2f} ms -> {edge_ms + added_ms:.2f} ms "
          f"({ratio:.2f}x) without the relay")
    print(f"index at its bound over {len(ius)} IUs: {entries:,} hashes, {used / 2**20:.1f} MiB")
    print(f"relay, per placement: {relay['bytes_per_placement']} bytes in a body, read in a body "
          f"{relay['read_us_per_placement']:.1f} us the first time, {relay['reread_us_per_placement']:.1f} us "
          f"again (skipped), learnt {relay['learn_us_per_placement']:.1f} us")
    print(f"relay at {at['node_rate_per_s']:g} placements/s per node ({at['bodies_per_s']:g} bodies/s):")
    print("| read as | bodies per placement | us per placement | " +
          " | ".join(f"edge CPU per request, {n} edge{'s' if n > 1 else ''}" for n in EDGE_COUNTS) + " |")
    print("|---|---:|---:|" + "---:|" * len(EDGE_COUNTS))
    for form, label in (("window", "whole window per body (a blocking query)"), ("stream", "stream lines")):
        print(f"| {label} | {at[f'{form}_bodies_per_placement']:.2f} | {at[f'{form}_us_per_placement']:.1f} | " +
              " | ".join(f"{ratios[form][n]:.2f}x" for n in EDGE_COUNTS) + " |")
    print(f"target: the edge's CPU per request with prefix routing and the relay at {max(EDGE_COUNTS)} edges "
          f"{worst:.2f}x without (<= {LIMIT:g}x): {verdict.replace('not', 'NOT')}")
    summary_ratios = " / ".join(f"{ratios['stream'][n]:.2f}x" for n in EDGE_COUNTS)
    results.record(args.results, script=__file__,
                   target=f"the edge's CPU per request with prefix routing and the relay at {max(EDGE_COUNTS)} "
                          f"edges <= {LIMIT:g}x without prefix routing",
                   verdict=verdict,
                   numbers={"off_median_us": round(statistics.median(off), 1),
                            "on_median_us": round(statistics.median(on), 1), "edge_cpu_ms": edge_ms,
                            "ratio": round(ratio, 3),
                            "index_entries": entries, "index_mib": round(used / 2**20, 2), **relay, **at,
                            **{f"{form}_ratio_{n}_edges": round(ratios[form][n], 3)
                               for form in ratios for n in EDGE_COUNTS}},
                   summary=f"{len(ius)} IUs: hashing + routing {statistics.median(off):.0f} -> "
                           f"{statistics.median(on):.0f} us per request; edge {edge_ms:.2f} -> "
                           f"{edge_ms + added_ms:.2f} ms CPU per request ({ratio:.2f}x) without the relay; index at "
                           f"its bound {entries:,} hashes, {used / 2**20:.1f} MiB; relay per placement "
                           f"{relay['bytes_per_placement']} bytes, {at['stream_us_per_placement']:.1f} us read from "
                           f"stream lines ({at['window_us_per_placement']:.1f} us from whole-window bodies); edge "
                           f"CPU per request with the relay at {' / '.join(map(str, EDGE_COUNTS))} edges: {summary_ratios}")

if __name__ == "__main__":
    main()
