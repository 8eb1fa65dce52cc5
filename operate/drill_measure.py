"""What a drill measured, from what was recorded (pure: outcomes and samples in, numbers out).

Times are seconds after the load started; a request's time is when it was sent (planned + the generator's
lag). Which unit a request went to is the edge's ``X-Eas-IU`` answer header (the edge's ``debug_headers``),
so "routed to the faulted unit" means the unit the edge finally sent it to.

Per fault (``at``: the step returned, the fault in effect; ``undone``: the undo returned):

- ``route_away_s``: the last request routed to a faulted unit, sent in [at, undone), minus ``at``
  (0 when none was; ``still_routed`` when one was sent in the last second before the undo: never stopped);
- ``consul_critical_s``: the first Consul sample at or after ``at`` showing a faulted unit critical, minus ``at``
  (None: not seen);
- failed requests of the fault's segment (from the previous undo to the next fault), split into
  ``failed_streaming`` (from a faulted unit, after a token had arrived: the stream the client was reading was
  cut), ``failed_not_streaming`` (no token yet, on a faulted unit or none named: the edge could have sent it
  elsewhere) and ``blast_radius_errors`` (failed on another unit); across that split, ``failed_in_flight``:
  those sent before ``at`` (in flight when the fault took effect: an edge's drain promises them an answer);
- ``served_during_fault``: requests a faulted unit answered in full, sent in [at, undone);
- p99 TTFT of the answered requests before the first fault (the baseline) and during [at, undone), and their
  ratio;
- ``recover_s``: the first request a faulted unit answered in full sent at or after ``undone``, minus
  ``undone`` (None: not back before the load ended);
- ``serving_again_s``: when a faulted unit next produced a first token for a request sent after ``at``, minus
  ``at``: the whole outage as clients saw it, whoever ended it (systemd's restart of a crashed unit within
  the hold, or the undo).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from operate.loadgen import Outcome
from operate.stats import percentile

STILL_ROUTED_S = 1.0
CRITICAL = "critical"


@dataclass(frozen=True)
class FaultWindow:
    kind: str
    target: str
    at: float
    undone: float


@dataclass(frozen=True)
class ConsulSample:
    t: float
    iu: str
    status: str  # passing | warning | critical | missing (the instance is not in the catalog)


@dataclass(frozen=True)
class FaultMeasure:
    kind: str
    target: str
    at_s: float
    undone_s: float
    requests_during_fault: int
    route_away_s: float
    still_routed: bool
    consul_critical_s: float | None
    failed_not_streaming: int
    failed_streaming: int
    failed_in_flight: int
    blast_radius_errors: int
    served_during_fault: int
    ttft_p99_baseline_s: float | None
    ttft_p99_fault_s: float | None
    recover_s: float | None
    serving_again_s: float | None = None

    @property
    def ttft_p99_ratio(self) -> float | None:
        if not self.ttft_p99_baseline_s or self.ttft_p99_fault_s is None:
            return None
        return self.ttft_p99_fault_s / self.ttft_p99_baseline_s

    def value(self, check: str) -> float | None:
        """The measured value a check (operate.drill_scenario.CHECKS) bounds."""
        key = check.removesuffix("_max")
        return self.ttft_p99_ratio if key == "ttft_p99_ratio" else getattr(self, key)

    def as_dict(self) -> dict:
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        ratio = self.ttft_p99_ratio
        out["ttft_p99_ratio"] = None if ratio is None else round(ratio, 3)
        return out


@dataclass(frozen=True)
class CheckVerdict:
    fault: int
    check: str
    limit: float
    value: float | None

    @property
    def met(self) -> bool:
        return self.value is not None and self.value <= self.limit

    def as_dict(self) -> dict:
        value = None if self.value is None else round(self.value, 4)
        return {"fault": self.fault, "check": self.check, "limit": self.limit, "value": value, "met": self.met}


def sent_at(outcome: Outcome) -> float:
    return outcome.at + outcome.lag_s


def measure(outcomes: Sequence[Outcome], windows: Sequence[FaultWindow], faulted: Iterable[str],
            consul: Sequence[ConsulSample] = ()) -> list[FaultMeasure]:
    faulted = set(faulted)
    first = windows[0].at if windows else math.inf
    baseline = percentile([o.ttft_s for o in outcomes if o.ok and sent_at(o) < first], 99)
    measures = []
    for i, w in enumerate(windows):
        seg_start = windows[i - 1].undone if i else -math.inf
        seg_end = windows[i + 1].at if i + 1 < len(windows) else math.inf
        during = [o for o in outcomes if w.at <= sent_at(o) < w.undone]
        routed = [sent_at(o) for o in during if o.iu in faulted]
        last = max(routed) if routed else None
        failed = [o for o in outcomes if not o.ok and seg_start <= sent_at(o) < seg_end]
        streaming = sum(1 for o in failed if o.iu in faulted and o.streamed)
        elsewhere = sum(1 for o in failed if o.iu is not None and o.iu not in faulted)
        critical = [s.t for s in consul if s.t >= w.at and s.iu in faulted and s.status == CRITICAL]
        back = [sent_at(o) for o in outcomes if o.ok and o.iu in faulted and sent_at(o) >= w.undone]
        first_tokens = [sent_at(o) + o.ttft_s for o in outcomes
                        if o.ok and o.iu in faulted and o.ttft_s is not None and sent_at(o) >= w.at]
        measures.append(FaultMeasure(
            kind=w.kind, target=w.target, at_s=w.at, undone_s=w.undone, requests_during_fault=len(during),
            route_away_s=0.0 if last is None else last - w.at,
            still_routed=last is not None and last >= w.undone - STILL_ROUTED_S,
            consul_critical_s=min(critical) - w.at if critical else None,
            failed_not_streaming=len(failed) - streaming - elsewhere, failed_streaming=streaming,
            failed_in_flight=sum(1 for o in failed if sent_at(o) < w.at),
            blast_radius_errors=elsewhere,
            served_during_fault=sum(1 for o in during if o.ok and o.iu in faulted),
            ttft_p99_baseline_s=baseline,
            ttft_p99_fault_s=percentile([o.ttft_s for o in during if o.ok], 99),
            recover_s=min(back) - w.undone if back else None,
            serving_again_s=min(first_tokens) - w.at if first_tokens else None))
    return measures


def judge(measures: Sequence[FaultMeasure], checks: dict[str, float]) -> list[CheckVerdict]:
    return [CheckVerdict(i, check, limit, m.value(check)) for i, m in enumerate(measures)
            for check, limit in checks.items()]


def timeline(outcomes: Sequence[Outcome], faulted: Iterable[str], duration_s: float, bin_s: float = 1.0) -> dict:
    """Per ``bin_s`` of send time: requests sent, failed, p99 TTFT of the answered (s) and the faulted unit's
    share of the requests."""
    faulted = set(faulted)
    bins = max(1, math.ceil(duration_s / bin_s))
    sent, failed, share, p99 = [0] * bins, [0] * bins, [0.0] * bins, []
    ttfts: list[list[float]] = [[] for _ in range(bins)]
    on_faulted = [0] * bins
    for o in outcomes:
        b = min(bins - 1, max(0, int(sent_at(o) // bin_s)))
        sent[b] += 1
        failed[b] += not o.ok
        on_faulted[b] += o.iu in faulted
        if o.ok and o.ttft_s is not None:
            ttfts[b].append(o.ttft_s)
    for b in range(bins):
        share[b] = on_faulted[b] / sent[b] if sent[b] else 0.0
        p99.append(percentile(ttfts[b], 99))
    return {"bin_s": bin_s, "t": [b * bin_s for b in range(bins)], "sent": sent, "failed": failed,
            "ttft_p99_s": p99, "faulted_share": share}
