"""A baseline after llm-d's documented default scheduling (its EPP: filter -> score -> pick).

What llm-d documents (llm-d/llm-d-router and https://llm-d.ai/blog/sticky-until-saturated-token-aware-routing,
2026-08): the code default profile scores endpoints with the queue scorer x2, the KV-cache-utilization
scorer x2 and the prefix-cache scorer x3 (``pkg/epp/config/loader/defaults.go``) and picks the maximum
score; the v1.0 guides put a prefix-cache-affinity filter in front ("sticky until saturated"): endpoints
whose prefix match passes ``affinityThreshold`` are kept unless the best of them is saturated, its
estimated wait (uncached tokens in flight / the peak prefill rate) past the best cold endpoint's by more
than a limit, and then every endpoint competes on load.

Here, per edge (one EPP replica each; llm-d's approximate prefix mode keeps its index per replica):
- prefix scorer: matched blocks / the prompt's blocks, from the same kind of index as the shipped edge's
  (edge.pool.prefix.PrefixIndex of what this edge sent where);
- queue scorer: (max - q) / (max - min) over the endpoints of vLLM's waiting requests (1 when all equal),
  KV scorer: 1 - KV usage; both read from the engines' true state at pick (fresher than llm-d's 50 ms
  scrape: in the baseline's favour);
- affinity filter: threshold 0.5 and a saturation limit of 1 s (our values: the documents name the
  parameters, not numbers for this pool); in-flight uncached tokens are this edge's own (llm-d accounts
  its in-flight requests synchronously), the peak prefill rate the model's.
"""

from __future__ import annotations

import random

from edge.pool.prefix import PrefixIndex, cached_tokens
from sim.vllm.engine import InferenceUnit

from .workload import TraceRequest

QUEUE_WEIGHT, KV_WEIGHT, PREFIX_WEIGHT = 2.0, 2.0, 3.0
AFFINITY_THRESHOLD = 0.5
SATURATION_LIMIT_S = 1.0


class LlmdStyle:
    def __init__(self, units: list[InferenceUnit], rng: random.Random):
        self.units, self.rng = units, rng
        self.ids = [u.iu_id for u in units]
        self.index = PrefixIndex()
        self.inflight_tokens = [0] * len(units)
        self.sent: dict[int, tuple[int, int]] = {}  # rid -> (unit, uncached tokens)
        self.peak_tps = units[0].model.prefill_tokens_per_s

    def pick(self, request: TraceRequest, now: float) -> int:
        blocks = self.index.match(request.blocks)[0] if request.blocks else {}
        n = max(1, len(request.blocks))
        prefix = [blocks.get(iu, 0) / n for iu in self.ids]
        hits = [cached_tokens(blocks.get(iu, 0), request.prompt, None) for iu in self.ids]
        wait = [(self.inflight_tokens[i] + request.prompt - hits[i]) / self.peak_tps for i in range(len(self.ids))]
        candidates = list(range(len(self.units)))
        sticky = [i for i in candidates if prefix[i] >= AFFINITY_THRESHOLD]
        if sticky and min(wait[i] for i in sticky) <= min(wait) + SATURATION_LIMIT_S:
            candidates = sticky
        queues = [len(self.units[i].waiting) for i in candidates]
        low, high = min(queues), max(queues)
        best: list[int] = []
        best_score = -1.0
        for i, q in zip(candidates, queues, strict=True):
            unit = self.units[i]
            queue_score = 1.0 if high == low else (high - q) / (high - low)
            kv_score = 1.0 - min(1.0, unit.kv_used / unit.capacity)
            score = QUEUE_WEIGHT * queue_score + KV_WEIGHT * kv_score + PREFIX_WEIGHT * prefix[i]
            if score > best_score + 1e-12:
                best, best_score = [i], score
            elif score >= best_score - 1e-12:
                best.append(i)
        chosen = best[0] if len(best) == 1 else best[self.rng.randrange(len(best))]
        uncached = request.prompt - hits[chosen]
        self.inflight_tokens[chosen] += uncached
        self.sent[request.rid] = (chosen, uncached)
        self.index.record(self.ids[chosen], request.blocks)
        return chosen

    def first_token(self, iu: int, rid: int, now: float) -> None:
        sent = self.sent.pop(rid, None)
        if sent is not None:  # its prefill is done: no longer in flight as prefill work
            self.inflight_tokens[sent[0]] -= sent[1]

    def finished(self, iu: int, now: float, rid: int | None = None) -> None:
        if rid is not None:
            self.first_token(iu, rid, now)
