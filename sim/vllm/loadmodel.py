"""One simulated vLLM instance advanced in wall-clock (or any monotonic) time: the engine of
``sim.vllm.engine`` (the one engine model, shared with ``bench/route_sim.py``) plus Poisson arrivals, a hang
fault and what the server's ``/metrics`` exposition reads.

The engine is vLLM V1's continuous batching as the route simulator runs it: chunked prefill within
max_num_batched_tokens shared with decode, FCFS admission while max_num_seqs and KV allow, preemption by
recompute of the newest running request, step times from the roofline of Llama-3-70B on 4 x H100 (TP=4,
``sim.vllm.roofline``: ~12,600 prompt tokens/s, ~17 ms per decode step, 447k KV tokens). Until the route
simulator's engine moved to ``sim.vllm``, this server had its own step-time coefficients and block
accounting (two models of one engine that could drift apart); now the numbers the agent scores on here are the numbers route_sim routes on.

Differences from the engine alone, and why:
- Poisson arrivals with a chat-like lognormal request shape (``ModelParams``), so an idle demo IU still
  shows live metrics; explicit requests (``submit``: the demo's edge, the OpenAI API) join the same queue.
- ``num_gpu_blocks``: a smaller KV cache than the roofline's (tests of KV pressure); KV is tracked in
  tokens and reported in blocks of 16 (vLLM's default block size).
- A hung engine core (``hung = True``): engine time stops (gauges and counters freeze at their last values,
  so it can look idle) and requests submitted meanwhile stall in the API server, invisible to /metrics;
  on recovery engine time resumes where it stopped. ``Request`` times are engine times, so their
  differences (TTFT, e2e) exclude the hang.
- Prefix-cache hits: a request submitted with its prompt's token ids (the OpenAI API's prompts) is hashed
  in blocks as vLLM hashes it (``sim.vllm.prefixcache.token_block_hashes``), so the engine's prefix cache
  decides its hits: a conversation's next turn hits the blocks of the turn before, unique prompts miss. A
  prompt of unknown content (the Poisson arrivals, a request sized by ``prompt_tokens`` alone) has no
  blocks to look up; ``prefix_hit_fraction`` of its looked-up tokens count as hits, so an idle IU's
  background load still shows a hit rate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.vllm.engine import InferenceUnit, Seq
from sim.vllm.eventloop import EventLoop
from sim.vllm.prefixcache import token_block_hashes
from sim.vllm.roofline import IUModel


@dataclass
class ModelParams:
    num_gpu_blocks: int | None = None  # None: the roofline's KV capacity (447,700 tokens = 27,981 blocks)
    block_size: int = 16
    prompt_mean_tokens: float = 900.0  # lognormal request lengths of the Poisson arrivals (chat-like traffic)
    prompt_sigma: float = 0.9
    output_mean_tokens: float = 220.0
    output_sigma: float = 0.8
    max_model_len: int = 32_768
    prefix_hit_fraction: float = 0.25  # hits among looked-up tokens of prompts of unknown content
    engine: IUModel = field(default_factory=IUModel)


class Request:
    """A submitted request as the server sees it (times in engine seconds)."""

    __slots__ = ("seq", "_model")

    def __init__(self, seq: Seq, model: LoadModel):
        self.seq, self._model = seq, model

    @property
    def prompt(self) -> int:
        return self.seq.prompt

    @property
    def output(self) -> int:
        return self.seq.output

    @property
    def arrival(self) -> float:
        return self.seq.arrival

    @property
    def generated(self) -> int:
        return self._model.unit.tokens_of(self.seq, self._model.engine_now)

    @property
    def scheduled_at(self) -> float | None:
        return self.seq.scheduled

    @property
    def first_token_at(self) -> float | None:
        return self.seq.first_token

    @property
    def finished_at(self) -> float | None:
        return self.seq.done_at


@dataclass
class Events:
    """What happened since the last drain, for the exposition's histograms."""

    finished: list[tuple[Request, float]] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)  # TTFT values
    iteration_tokens: list[int] = field(default_factory=list)


ITERATIONS_KEPT = 256  # per drain: the exposition reads the last 64; a long decode group must not grow this


class LoadModel:
    def __init__(
        self, params: ModelParams | None = None, arrival_rate: float = 1.0, seed: int = 0, start: float = 0.0
    ):
        self.p = params or ModelParams()
        capacity = None if self.p.num_gpu_blocks is None else self.p.num_gpu_blocks * self.p.block_size
        self.loop = EventLoop()
        self.loop.now = start
        self.unit = InferenceUnit(0, "sim", self.p.engine, self.loop.schedule, self._finished,
                                  kv_capacity_tokens=capacity, on_first_token=self._first_token,
                                  on_steps=self._steps)
        self.rng = random.Random(seed)
        self.arrival_rate = arrival_rate  # requests/s
        self.now = start  # the caller's clock
        self.engine_now = start  # the engine's clock: behind `now` by the time spent hung
        self._hung = False
        self._stalled: list[tuple[int, int, Seq]] = []
        self._arrivals = 0  # version of the scheduled Poisson arrival (a rate change supersedes it)
        self._ids = 0
        self._requests: dict[int, Request] = {}
        self.finished_generation_sum = 0
        self.events = Events()
        self._schedule_arrival()

    # -- controls -----------------------------------------------------------------------------------
    def set_arrival_rate(self, rate: float) -> None:
        self.arrival_rate = rate
        self._schedule_arrival()

    def submit(self, prompt: int, output: int, token_ids: Sequence[int] | None = None) -> Request:
        """An explicit request (a routing benchmark or the demo's edge sends these instead of Poisson arrivals);
        ``token_ids``: the prompt's (its first ``prompt`` ids are hashed for the prefix cache), None when its
        content is unknown."""
        if prompt < 1 or output < 1 or prompt + output > self.p.max_model_len:
            # a sequence longer than max_model_len could be re-prefilled forever on a KV cache too small for it
            raise ValueError(f"a request needs >= 1 prompt and output token and at most max_model_len "
                             f"{self.p.max_model_len} in all, got {prompt} and {output}")
        self._ids += 1
        blocks = None if token_ids is None else token_block_hashes(token_ids[:prompt], self.unit.cache.block_size)
        seq = Seq(self._ids, prompt, output, self.engine_now, 0.0, 0, blocks)
        request = self._requests[seq.rid] = Request(seq, self)
        if self._hung:
            self._stalled.append(seq)
        else:
            self.unit.submit(seq, self.engine_now)
        return request

    @property
    def hung(self) -> bool:
        return self._hung

    @hung.setter
    def hung(self, value: bool) -> None:
        if self._hung and not value:
            stalled, self._stalled = self._stalled, []
            for seq in stalled:
                seq.arrival = self.engine_now
                self.unit.submit(seq, self.engine_now)
        self._hung = bool(value)

    # -- gauges and counters (what the exposition reads) ----------------------------------------------
    @property
    def waiting(self):
        return self.unit.waiting

    @property
    def running(self):
        return self.unit.running

    @property
    def num_gpu_blocks(self) -> int:
        return self.unit.capacity // self.p.block_size

    @property
    def kv_usage(self) -> float:
        return min(1.0, (self.unit.kv_used + self.unit.decode_progress(self.engine_now)) / self.unit.capacity)

    @property
    def preemptions_total(self) -> int:
        return self.unit.counters.preemptions

    @property
    def prompt_tokens_total(self) -> int:
        return self.unit.counters.prompt_tokens

    @property
    def generation_tokens_total(self) -> int:
        return self.unit.counters.generation_tokens + self.unit.decode_progress(self.engine_now)

    @property
    def success_total(self) -> int:
        return self.unit.counters.requests_finished

    @property
    def finished_prompt_sum(self) -> int:
        return self.unit.counters.finished_prompt_tokens

    @property
    def prefix_queries_total(self) -> int:
        return self.unit.counters.prefix_cache_queries

    @property
    def prefix_hits_total(self) -> int:
        """The engine's own hits (prompts whose token ids were hashed) plus ``prefix_hit_fraction`` of the
        looked-up tokens of prompts of unknown content (the load generator's have none)."""
        c = self.unit.counters
        return c.prefix_cache_hits + int(c.prefix_cache_queries_unknown * self.p.prefix_hit_fraction)

    @property
    def prefix_hit_rate(self) -> float:
        """Hits over looked-up tokens since the start (V0's ``vllm:gpu_prefix_cache_hit_rate``; 0 before any)."""
        queries = self.prefix_queries_total
        return self.prefix_hits_total / queries if queries else 0.0

    def drain_events(self) -> Events:
        events, self.events = self.events, Events()
        return events

    # -- simulation ---------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Run the engine until the caller's time ``t`` (a hung engine's time stands still)."""
        if t <= self.now:
            return
        if not self._hung:
            self.engine_now += t - self.now
            self.loop.run(until=self.engine_now)
            self.loop.now = self.engine_now  # run() leaves it at the last event when the heap empties
        self.now = t

    def _schedule_arrival(self) -> None:
        self._arrivals += 1
        if self.arrival_rate > 0:
            self.loop.schedule(self.engine_now + self.rng.expovariate(self.arrival_rate), self._arrive,
                               self._arrivals)

    def _arrive(self, version: int, when: float) -> None:
        if version != self._arrivals:
            return  # superseded by a rate change
        prompt = self._lognormal(self.p.prompt_mean_tokens, self.p.prompt_sigma, self.p.max_model_len // 2)
        output = self._lognormal(self.p.output_mean_tokens, self.p.output_sigma, self.p.max_model_len // 4)
        self._ids += 1
        seq = Seq(self._ids, prompt, output, when, 0.0, 0, None)
        self._requests[seq.rid] = Request(seq, self)
        self.unit.submit(seq, when)
        self.loop.schedule(when + self.rng.expovariate(self.arrival_rate), self._arrive, version)

    def _lognormal(self, mean: float, sigma: float, cap: int) -> int:
        mu = math.log(mean) - sigma * sigma / 2
        return max(1, min(cap, int(self.rng.lognormvariate(mu, sigma))))

    def _first_token(self, seq: Seq, now: float) -> None:
        self.events.first_tokens.append(now - seq.arrival)

    def _steps(self, tokens: int, steps: int) -> None:
        kept = self.events.iteration_tokens
        kept.extend([tokens] * min(steps, ITERATIONS_KEPT))
        if len(kept) > ITERATIONS_KEPT:
            del kept[:-ITERATIONS_KEPT]

    def _finished(self, seq: Seq, now: float) -> None:
        request = self._requests.pop(seq.rid)
        self.finished_generation_sum += seq.generated
        self.events.finished.append((request, now))
