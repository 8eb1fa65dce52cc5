"""A small continuous-batching model of one vLLM instance, advanced in simulated time.

What it reproduces (the signals the agent scores on): Poisson arrivals; a chunked-prefill token budget per
engine step shared with decode (vLLM V1 scheduler: running requests first, then waiting ones FCFS while
slots, budget and KV blocks allow); paged KV blocks filled by prompt and generated tokens; preemption by
recompute when a decode step finds no free block (the newest running request is evicted, as vLLM does);
step time growing with batch size and prefill tokens.

Default sizes are those of Llama-3-70B (80 layers, 8 KV heads, head_dim 128: config.json of
meta-llama/Meta-Llama-3-70B) in BF16 on 4 x H100-80GB with gpu_memory_utilization 0.9: KV bytes per token =
2 x 80 x 8 x 128 x 2 = 320 KiB; 288 GB x 0.9 - 141 GB weights - ~8 GB activations ~ 110 GB of KV ->
~360k tokens = 22,500 blocks of 16. Step-time coefficients are assumptions of the right order for that
setup (tens of ms per decode step, ~10k prompt tokens/s); change them for other hardware.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ModelParams:
    num_gpu_blocks: int = 22_500
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_base_s: float = 0.012  # fixed cost of one engine step (kernel launches, sampling, scheduling)
    step_per_seq_s: float = 0.00012  # decode cost per running sequence
    step_per_prefill_token_s: float = 0.00008  # ~12.5k prompt tokens/s when prefill-bound
    prompt_mean_tokens: float = 900.0  # lognormal request lengths (chat-like traffic)
    prompt_sigma: float = 0.9
    output_mean_tokens: float = 220.0
    output_sigma: float = 0.8
    max_model_len: int = 32_768
    prefix_hit_fraction: float = 0.25  # share of prompt tokens served from the prefix cache


@dataclass
class Request:
    prompt: int
    output: int
    arrival: float
    prefilled: int = 0
    generated: int = 0
    blocks: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None


@dataclass
class Events:
    """What happened since the last drain, for the exposition's histograms."""

    finished: list[tuple[Request, float]] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)  # TTFT values
    iteration_tokens: list[int] = field(default_factory=list)


class LoadModel:
    def __init__(
        self, params: ModelParams | None = None, arrival_rate: float = 1.0, seed: int = 0, start: float = 0.0
    ):
        self.p = params or ModelParams()
        self.rng = random.Random(seed)
        self.arrival_rate = arrival_rate  # requests/s
        self.now = start
        self.next_arrival = start + self._interarrival()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_blocks = self.p.num_gpu_blocks
        self.hung = False
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.success_total = 0
        self.prefix_queries_total = 0
        self.prefix_hits_total = 0
        self.finished_prompt_sum = 0  # what vllm:request_prompt_tokens / _generation_tokens histograms sum
        self.finished_generation_sum = 0
        self.events = Events()

    # -- controls -----------------------------------------------------------------------------------
    def set_arrival_rate(self, rate: float) -> None:
        self.arrival_rate = rate
        self.next_arrival = self.now + self._interarrival()

    def submit(self, prompt: int, output: int) -> Request:
        """An explicit request (a routing benchmark or the demo's edge sends these instead of Poisson arrivals)."""
        request = Request(prompt=prompt, output=output, arrival=self.now)
        self.waiting.append(request)
        return request

    # -- gauges -------------------------------------------------------------------------------------
    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.p.num_gpu_blocks

    def drain_events(self) -> Events:
        events, self.events = self.events, Events()
        return events

    # -- simulation ---------------------------------------------------------------------------------
    def _interarrival(self) -> float:
        return math.inf if self.arrival_rate <= 0 else self.rng.expovariate(self.arrival_rate)

    def _lognormal(self, mean: float, sigma: float, cap: int) -> int:
        mu = math.log(mean) - sigma * sigma / 2
        return max(1, min(cap, int(self.rng.lognormvariate(mu, sigma))))

    def _arrivals_until(self, t: float) -> None:
        while self.next_arrival <= t:
            prompt = self._lognormal(
                self.p.prompt_mean_tokens, self.p.prompt_sigma, self.p.max_model_len // 2
            )
            output = self._lognormal(
                self.p.output_mean_tokens, self.p.output_sigma, self.p.max_model_len // 4
            )
            self.waiting.append(Request(prompt=prompt, output=output, arrival=self.next_arrival))
            self.next_arrival += self._interarrival()

    def advance(self, t: float) -> None:
        """Run engine steps until simulated time ``t``; an idle engine jumps to the next arrival."""
        while self.now < t:
            if self.hung:  # a hung engine core: stats stop updating (gauges and counters freeze at their last
                # values, so it can look idle); new requests stall in the API server, invisible to /metrics
                self.now = t
                self.next_arrival = max(self.next_arrival, t)
                return
            self._arrivals_until(self.now)
            if not self.running and not self.waiting:
                self.now = min(t, self.next_arrival)
                continue
            self.now += self._step()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.p.block_size)

    def _grow(self, request: Request, tokens: int) -> bool:
        need = self._blocks_for(tokens) - request.blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        request.blocks += need
        return True

    def _free(self, request: Request) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _step(self) -> float:
        budget = self.p.max_num_batched_tokens
        decoded = prefilled = 0
        # 1. running requests: decode one token each (or continue a chunked prefill)
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if request.prefilled < request.prompt:
                chunk = min(budget, request.prompt - request.prefilled)
                if chunk > 0 and self._grow(request, request.prefilled + chunk):
                    request.prefilled += chunk
                    prefilled += chunk
                    budget -= chunk
                i += 1
                continue
            if budget <= 0:
                i += 1
                continue
            while not self._grow(request, request.prompt + request.generated + 1):
                victim = self.running.pop()  # preempt the newest request (recompute later)
                self._free(victim)
                victim.prefilled = victim.generated = 0
                self.waiting.appendleft(victim)
                self.preemptions_total += 1
                if victim is request:
                    break
            else:
                request.generated += 1
                decoded += 1
                budget -= 1
            i += 1
        # 2. admit waiting requests FCFS while slots, budget and blocks allow
        while self.waiting and budget > 0 and len(self.running) < self.p.max_num_seqs:
            request = self.waiting[0]
            chunk = min(budget, request.prompt)
            if not self._grow(request, chunk):
                break
            self.waiting.popleft()
            request.scheduled_at = self.now
            request.prefilled = chunk
            prefilled += chunk
            budget -= chunk
            self.running.append(request)
            hits = int(chunk * self.p.prefix_hit_fraction)
            self.prefix_queries_total += request.prompt
            self.prefix_hits_total += hits
        step_s = (
            self.p.step_base_s
            + self.p.step_per_seq_s * len(self.running)
            + self.p.step_per_prefill_token_s * prefilled
        )
        end = self.now + step_s
        # 3. first tokens and completions
        still = []
        for request in self.running:
            if request.prefilled >= request.prompt and request.first_token_at is None:
                request.first_token_at = end
                self.events.first_tokens.append(end - request.arrival)
            if request.generated >= request.output:
                request.finished_at = end
                self._free(request)
                self.success_total += 1
                self.finished_prompt_sum += request.prompt
                self.finished_generation_sum += request.generated
                self.events.finished.append((request, end))
            else:
                still.append(request)
        self.running = still
        self.prompt_tokens_total += prefilled
        self.generation_tokens_total += decoded
        self.events.iteration_tokens.append(prefilled + decoded)
        return step_s
