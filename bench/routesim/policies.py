"""Routing policies that need no published scores: round-robin, least-connections, the oracle.

Each edge (router instance) owns one policy object; `pick(request, now)` returns an IU index,
`first_token(iu, rid, now)` tells it one of its streams got its first byte and `finished(iu, now, rid)` that
it completed there (these policies ignore the first byte). Ties are broken by the policy's own
seeded RNG so runs are deterministic and no IU is favoured by its position.
"""

from __future__ import annotations

import random

from sim.vllm.engine import InferenceUnit

from .workload import TraceRequest


class RoundRobin:
    def __init__(self, ius: int, start: int):
        self.ius = ius
        self.next = start % ius

    def pick(self, request: TraceRequest, now: float) -> int:
        chosen = self.next
        self.next = (self.next + 1) % self.ius
        return chosen

    def first_token(self, iu: int, rid: int, now: float) -> None:
        pass

    def finished(self, iu: int, now: float, rid: int | None = None) -> None:
        pass


class LeastConnections:
    """Each edge's own in-flight requests per IU (what Envoy's LEAST_REQUEST sees), ties at random."""

    def __init__(self, ius: int, rng: random.Random):
        self.inflight = [0] * ius
        self.rng = rng

    def pick(self, request: TraceRequest, now: float) -> int:
        low = min(self.inflight)
        ties = [i for i, n in enumerate(self.inflight) if n == low]
        chosen = ties[0] if len(ties) == 1 else ties[self.rng.randrange(len(ties))]
        self.inflight[chosen] += 1
        return chosen

    def first_token(self, iu: int, rid: int, now: float) -> None:
        pass

    def finished(self, iu: int, now: float, rid: int | None = None) -> None:
        self.inflight[iu] -= 1


class Oracle:
    """Sees every IU's true instantaneous state and picks the least estimated TTFT for this request
    (InferenceUnit.estimated_ttft). Greedy per request with perfect information: the bound a router
    with published, delayed scores approaches; not a global optimum over future arrivals."""

    def __init__(self, units: list[InferenceUnit], rng: random.Random):
        self.units = units
        self.rng = rng

    def pick(self, request: TraceRequest, now: float) -> int:
        best: list[int] = []
        best_wait = float("inf")
        for unit in self.units:
            wait = unit.estimated_ttft(request.prompt, now, request.blocks)
            if wait < best_wait - 1e-9:
                best, best_wait = [unit.index], wait
            elif wait <= best_wait + 1e-9:
                best.append(unit.index)
        return best[0] if len(best) == 1 else best[self.rng.randrange(len(best))]

    def first_token(self, iu: int, rid: int, now: float) -> None:
        pass

    def finished(self, iu: int, now: float, rid: int | None = None) -> None:
        pass
