"""Workloads whose prompts share prefixes: multi-turn chat sessions and templated prompts.

Each prompt is a list of segments (content id, tokens) and carries its block hashes
(sim.vllm.prefixcache.block_hashes), which both the engines' prefix caches and the edges' prefix indexes
use (the edge's own hashing of text is edge/pool/prefix.py; here both sides see the same block boundaries).

- ``multi-turn``: conversations start as a Poisson process. A conversation opens with one of
  ``SYSTEM_PROMPTS`` system prompts (lognormal, mean 600 tokens) and a first user message (mean 800 tokens:
  pasted text), then each turn adds the previous reply and a user message (mean 120); turns per conversation
  2 + geometric (mean 6 more), think time between turns 3 s + exponential (mean 7 s). Replies: lognormal
  median 200 tokens, sigma 0.6. A turn's prompt is the whole conversation so far; a conversation ends
  early when it would pass 24k tokens. Arrivals are fixed in advance (open loop, as for the mix): the next
  turn comes ``think`` after the previous one arrived, whatever the router did, so every policy sees the
  same requests.
- ``shared-prefix``: ``TEMPLATES`` templates of 1,000-4,000 tokens (uniform) in front of a short question
  (lognormal, mean 150 tokens); answers median 150. Poisson arrivals, templates drawn with Zipf(1) weights.

Load: a trace is sized so its *uncached* work is the given fraction of capacity (capacity measured as for
the mix: one IU's saturated completion rate on this workload's own request shapes, prefix caching off,
routesim.capacity). A router that keeps prefixes where they are cached runs the pool below that load.
"""

from __future__ import annotations

import math
import random

from sim.vllm.prefixcache import block_hashes

from .workload import MAX_MODEL_LEN, TraceRequest

SYSTEM_PROMPTS = 8
TEMPLATES = 256
MAX_CONTEXT = 24_000
WORKLOADS = ("multi-turn", "shared-prefix")


def _lognormal(rng: random.Random, mean: float, sigma: float) -> int:
    return max(1, int(round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2.0, sigma))))


def _reply(rng: random.Random, median: float) -> int:
    return min(2048, max(1, int(round(rng.lognormvariate(math.log(median), 0.6)))))


def multi_turn_trace(rate: float, duration: float, seed: int) -> list[TraceRequest]:
    """Turns of conversations at ``rate`` requests/s on average over ``duration`` s."""
    rng = random.Random(seed)
    ids = iter(range(1_000, 10**12))
    systems = [(next(ids), _lognormal(rng, 600, 0.5)) for _ in range(SYSTEM_PROMPTS)]
    mean_turns = 2 + 6
    session_rate = rate / mean_turns
    raw: list[tuple[float, int, int, tuple, tuple, float]] = []
    t = -40.0  # conversations already under way when the trace starts
    while True:
        t += rng.expovariate(session_rate)
        if t >= duration:
            break
        turns = 2 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / 7.0))
        segments = [systems[int(rng.random() * SYSTEM_PROMPTS)], (next(ids), _lognormal(rng, 800, 0.8))]
        at = t
        for _ in range(turns):
            prompt = sum(n for _, n in segments)
            output = _reply(rng, 200)
            if prompt + output > min(MAX_CONTEXT, MAX_MODEL_LEN):
                break
            reply = (next(ids), output)
            edge_u = rng.random()  # each turn at any edge: a client keeps its edge only by chance
            if 0.0 <= at < duration:
                key = hash(tuple(s[0] for s in segments[:2 if len(segments) > 2 else 1])) or 1
                raw.append((at, prompt, output, tuple(segments), reply, edge_u, prompt - segments[-1][1], key))
            segments = [*segments, reply, (next(ids), _lognormal(rng, 120, 0.6))]
            at += 3.0 + rng.expovariate(1 / 7.0)
    raw.sort(key=lambda r: r[0])
    return [TraceRequest(i, at, "T", prompt, output, edge_u, block_hashes(segments),
                         block_hashes((*segments, reply)), context, key)
            for i, (at, prompt, output, segments, reply, edge_u, context, key) in enumerate(raw)]


def shared_prefix_trace(rate: float, duration: float, seed: int) -> list[TraceRequest]:
    """Short questions behind a few long templates at ``rate`` requests/s for ``duration`` s."""
    rng = random.Random(seed)
    ids = iter(range(1_000, 10**12))
    templates = [(next(ids), int(rng.uniform(1000, 4000))) for _ in range(TEMPLATES)]
    weights = [1.0 / (k + 1) for k in range(TEMPLATES)]
    total = sum(weights)
    trace: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return trace
        u, k = rng.random() * total, 0
        while u >= weights[k] and k < TEMPLATES - 1:
            u -= weights[k]
            k += 1
        segments = (templates[k], (next(ids), _lognormal(rng, 150, 0.6)))
        output = _reply(rng, 150)
        prompt = sum(n for _, n in segments)
        trace.append(TraceRequest(len(trace), t, f"P{k}", prompt, output, rng.random(), block_hashes(segments),
                                  block_hashes((*segments, (next(ids), output))), segments[0][1],
                                  hash((segments[0][0],)) or 1))


def workload_trace(name: str, rate: float, duration: float, seed: int) -> list[TraceRequest]:
    if name == "multi-turn":
        return multi_turn_trace(rate, duration, seed)
    if name == "shared-prefix":
        return shared_prefix_trace(rate, duration, seed)
    raise ValueError(f"unknown workload {name!r} (one of {', '.join(WORKLOADS)})")
