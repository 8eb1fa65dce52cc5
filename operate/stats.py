"""Per class latency percentiles and the SLO verdict of one load-test run (pure: outcomes in, numbers out).

A failed request (an HTTP error, a cut stream, a timeout) counts as an infinitely slow one in the
percentiles its SLOs are judged on: a run that fails 2% of class A meets no p99 target for A, however fast
the other 98% were. Requests still in flight when a run is stopped are not counted at all.

A class with fewer than :data:`MIN_SAMPLES` requests is judged ``too_few``: a p99 of 20 samples is their
maximum, not a percentile, and such a verdict is not "met".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from operate.loadgen import Outcome
from operate.scenario import Scenario

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "e2e", "itl")
MIN_SAMPLES = 50
MET, MISSED, TOO_FEW = "met", "not met", "too few"


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (sorted or not); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class ClassStats:
    name: str
    requests: int = 0
    ok: int = 0
    errors: Counter = field(default_factory=Counter)
    # metric -> {50: s, 90: s, 99: s}; failed requests are +inf in ttft and e2e
    latency: dict[str, dict[int, float | None]] = field(default_factory=dict)
    output_tokens_per_s: float = 0.0

    def as_dict(self) -> dict:
        def num(v):
            return None if v is None else ("inf" if math.isinf(v) else round(v, 4))

        return {"requests": self.requests, "ok": self.ok, "errors": dict(self.errors),
                "latency_s": {m: {f"p{q}": num(v) for q, v in by_q.items()} for m, by_q in self.latency.items()}}


@dataclass(frozen=True)
class SloVerdict:
    klass: str
    metric: str  # ttft | e2e
    limit_s: float
    p99_s: float | None
    samples: int
    verdict: str  # met | not met | too few

    @property
    def met(self) -> bool:
        return self.verdict == MET

    def as_dict(self) -> dict:
        p99 = None if self.p99_s is None else ("inf" if math.isinf(self.p99_s) else round(self.p99_s, 4))
        return {"class": self.klass, "metric": self.metric, "limit_s": self.limit_s, "p99_s": p99,
                "samples": self.samples, "verdict": self.verdict}


def class_stats(outcomes: Iterable[Outcome], scenario: Scenario, elapsed_s: float) -> dict[str, ClassStats]:
    by_class = {k.name: ClassStats(k.name) for k in scenario.classes}
    values: dict[str, dict[str, list[float]]] = {k: {m: [] for m in METRICS} for k in by_class}
    tokens: Counter = Counter()
    for o in outcomes:
        stats = by_class.setdefault(o.klass, ClassStats(o.klass))
        per = values.setdefault(o.klass, {m: [] for m in METRICS})
        stats.requests += 1
        if o.ok:
            stats.ok += 1
            per["ttft"].append(o.ttft_s)
            per["e2e"].append(o.e2e_s)
            if o.itl_s is not None:
                per["itl"].append(o.itl_s)
            tokens[o.klass] += o.tokens
        else:
            stats.errors[o.error] += 1
            per["ttft"].append(math.inf)
            per["e2e"].append(math.inf)
    for name, stats in by_class.items():
        stats.latency = {m: {q: percentile(values[name][m], q) for q in PERCENTILES} for m in METRICS}
        stats.output_tokens_per_s = tokens[name] / elapsed_s if elapsed_s > 0 else 0.0
    return by_class


def verdicts(stats: dict[str, ClassStats], scenario: Scenario, min_samples: int = MIN_SAMPLES) -> list[SloVerdict]:
    """One verdict per SLO the scenario sets, in the scenario's order."""
    out = []
    for klass in scenario.classes:
        s = stats.get(klass.name) or ClassStats(klass.name)
        for metric, limit in klass.slo.limits().items():
            p99 = (s.latency.get(metric) or {}).get(99)
            if s.requests < min_samples:
                verdict = TOO_FEW
            else:
                verdict = MET if p99 is not None and p99 <= limit else MISSED
            out.append(SloVerdict(klass.name, metric, limit, p99, s.requests, verdict))
    return out


def all_met(results: list[SloVerdict]) -> bool:
    return bool(results) and all(v.met for v in results)


def lag_summary(outcomes: Iterable[Outcome]) -> dict[str, float | None]:
    """The generator's own send lateness: p50/p99/max in seconds."""
    lags = [o.lag_s for o in outcomes]
    return {"p50_s": percentile(lags, 50), "p99_s": percentile(lags, 99), "max_s": max(lags) if lags else None}
