"""The production request mix and its Poisson arrival trace.

Mix (the deployment's expected traffic; its shares and mean prompt lengths are these): A short-text summaries 65% at ~327 prompt tokens, B long documents 30% at
~4,218, C very long papers 5% at ~12,842. Only the means are given; prompts here are lognormal
around those means (sigma 0.35, so most prompts sit within ×0.5-×2 of the mean) and clipped to the deployment's max_model_len 32,768.
Output lengths are ours (none are given): lognormal with medians 128 (A, summaries), 256 (B,
contract analyses) and 512 (C, paper reading notes), sigma 0.6 (a long right tail: P95 ≈ 2.7×
the median), clipped to [1, 4,096]. Means: 153 / 307 / 614 tokens.

Every request is drawn once per run from one seeded RNG, so all policies see the same trace.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MAX_MODEL_LEN = 32768
MAX_OUTPUT = 4096


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float
    prompt_mean: float
    output_median: float
    prompt_sigma: float = 0.35
    output_sigma: float = 0.6


PRODUCTION_MIX: tuple[RequestClass, ...] = (
    RequestClass("A", 0.65, 327, 128),
    RequestClass("B", 0.30, 4218, 256),
    RequestClass("C", 0.05, 12842, 512),
)


@dataclass(frozen=True)
class TraceRequest:
    rid: int
    arrival: float
    klass: str
    prompt: int
    output: int
    edge_u: float  # uniform in [0, 1): the edge is int(edge_u × edges), so runs with 1, 4 or 16 edges
    #                share every other property of the trace

    def edge(self, edges: int) -> int:
        return int(self.edge_u * edges)


def _lognormal_mean(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2.0, sigma)


def draw_request_shape(rng: random.Random, mix: tuple[RequestClass, ...] = PRODUCTION_MIX) -> tuple[str, int, int]:
    """(class, prompt tokens, output tokens) of one request of the mix."""
    u = rng.random()
    chosen = mix[-1]
    for klass in mix:
        if u < klass.share:
            chosen = klass
            break
        u -= klass.share
    output = int(round(rng.lognormvariate(math.log(chosen.output_median), chosen.output_sigma)))
    output = min(MAX_OUTPUT, max(1, output))
    prompt = int(round(_lognormal_mean(rng, chosen.prompt_mean, chosen.prompt_sigma)))
    prompt = min(MAX_MODEL_LEN - output, max(1, prompt))
    return chosen.name, prompt, output


def poisson_trace(rate: float, duration: float, seed: int,
                  mix: tuple[RequestClass, ...] = PRODUCTION_MIX) -> list[TraceRequest]:
    """Requests arriving as a Poisson process of `rate`/s for `duration` s, each at a uniformly drawn edge."""
    rng = random.Random(seed)
    trace: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return trace
        klass, prompt, output = draw_request_shape(rng, mix)
        trace.append(TraceRequest(len(trace), t, klass, prompt, output, rng.random()))


def mean_shape(mix: tuple[RequestClass, ...] = PRODUCTION_MIX) -> tuple[float, float]:
    """Analytic mean prompt and output tokens of the mix (before clipping)."""
    prompt = sum(k.share * k.prompt_mean for k in mix)
    output = sum(k.share * k.output_median * math.exp(k.output_sigma ** 2 / 2.0) for k in mix)
    return prompt, output
