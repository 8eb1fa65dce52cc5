"""Pool capacity from the model: the completion rate of one IU that always has queued work.

This is how vLLM's own `benchmarks/benchmark_throughput.py` defines serving capacity: submit every request
at once and divide completions by time. One IU gets `requests` draws of the production mix at t=0, runs at
the largest batch its KV cache and max_num_seqs allow (admitting prefills whenever KV frees up, preempting
when it runs out), and the rate is measured between the 20th and the 80th percentile of completions, so the
ramp-up and the draining tail do not count. Pool capacity = IUs × that rate; "80% load" is a Poisson rate of
0.8 × pool capacity. A single IU fed Poisson arrivals just below this rate keeps a bounded queue; well
above it the queue grows and preemptions appear.
"""

from __future__ import annotations

import random

from sim.vllm.engine import InferenceUnit, Seq
from sim.vllm.eventloop import EventLoop
from sim.vllm.roofline import IUModel

from .workload import draw_request_shape


def saturated_rate(model: IUModel, seeds: tuple[int, ...] = (1, 2, 3, 4), requests: int = 6000) -> float:
    """Requests per second one IU completes when it never runs out of queued work (mean over `seeds`:
    one burst's rate moves by a few percent with its draw of long C requests)."""
    return sum(_burst_rate(model, seed, requests) for seed in seeds) / len(seeds)


def _burst_rate(model: IUModel, seed: int, requests: int) -> float:
    rng = random.Random(seed)
    return burst_rate(model, [draw_request_shape(rng)[1:] for _ in range(requests)])


def burst_rate(model: IUModel, shapes: list[tuple[int, int]]) -> float:
    """Completions/s of one IU given every (prompt, output) of ``shapes`` at t=0, prefix caching off (the
    uncached work: a workload's capacity before any prefix is reused)."""
    loop = EventLoop()
    done: list[float] = []
    unit = InferenceUnit(0, "capacity", model, loop.schedule, lambda seq, now: done.append(now),
                         prefix_caching=False)
    requests = len(shapes)
    for rid, (prompt, output) in enumerate(shapes):
        unit.submit(Seq(rid, prompt, output, 0.0, 0.0, 0), 0.0)
    loop.run()
    lo, hi = int(requests * 0.2), int(requests * 0.8)
    return (hi - lo) / (done[hi] - done[lo])
