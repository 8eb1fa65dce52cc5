"""A rollout's gate metrics: read from the edges, Consul and the agents, judged against the plan's gates.

- Edges (``GET /metrics`` on each edge's admin listener): ``eas_edge_rollout_requests``, ``_errors`` and
  ``_ttft_seconds`` by revision (edge/rollout.py), summed over the edges. A gate is judged on the difference
  between now and the step's start (:meth:`EdgeTotals.since`): everything the step has seen so far, per edge,
  so an edge that restarted (counters back at 0) counts from its restart. The p99 is read from the
  histogram's buckets (interpolated within the bucket, 25% wide: within 12.5%). Cross-unit jitter: per IU, the
  mean time to first byte in the step (``eas_edge_rollout_unit_ttft_seconds``' sum / count over the edges); a
  side's spread is the standard deviation of its IUs' means over their mean (IUs with at least a quarter of
  ``min_requests`` in the step; two such IUs at least, and ``min_requests`` on each side as every edge gate),
  and the gate is the canary's spread minus stable's.
- Consul: each evaluation samples the canary IUs' checks (passing or not).
- The agents' score bodies (Consul KV): the canary IUs' ``gpu_util_pct`` (variance across them, as a fraction
  0..1), the IUs an agent holds ``critical`` for volatile uncorrectable ECC errors, and the XID events their
  GPUs had in the step: the declared term ``xid_events`` is a counter per IU (the agent's since it started,
  eas_wire/scorebody.py), counted from its value at the step's first sample (:meth:`ConsulSamples.sample`
  takes one as the step begins); a counter that fell is an agent that restarted, counted from 0 again.

A gate is ``inconclusive`` when its data is not there (fewer than ``min_requests`` requests on a side, no
reachable edge, no canary body): never a pass, never a failure.
"""

from __future__ import annotations

import json
import math
import statistics
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from consul_io import layout
from consul_io.client import ConsulIO
from eas_wire.scorebody import BodyError, IUScore
from operate.rollout_plan import RolloutPlan

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
UTIL_COMPONENT = "gpu_util_pct"
MAX_METRICS_BYTES = 4 << 20


@dataclass
class EdgeTotals:
    """Per edge, per revision: requests, errors and the TTFT histogram's cumulative bucket counts."""

    requests: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    buckets: dict[str, dict[str, dict[float, float]]] = field(default_factory=dict)
    units: dict[str, dict[str, dict[str, tuple[float, float]]]] = field(default_factory=dict)  # IU (sum, count)
    unreachable: list[str] = field(default_factory=list)

    def since(self, base: EdgeTotals) -> EdgeTotals:
        """What happened between ``base`` and these totals (an edge whose counters fell restarted: all of its)."""
        out = EdgeTotals(unreachable=list(self.unreachable))
        for edge, now in self.requests.items():
            before = base.requests.get(edge, {})
            restarted = any(now.get(r, 0) < v for r, v in before.items())
            b = {} if restarted else before
            be = {} if restarted else base.errors.get(edge, {})
            bb = {} if restarted else base.buckets.get(edge, {})
            bu = {} if restarted else base.units.get(edge, {})
            out.requests[edge] = {r: v - b.get(r, 0) for r, v in now.items()}
            out.errors[edge] = {r: v - be.get(r, 0) for r, v in self.errors.get(edge, {}).items()}
            out.buckets[edge] = {r: {le: c - bb.get(r, {}).get(le, 0) for le, c in hist.items()}
                                 for r, hist in self.buckets.get(edge, {}).items()}
            out.units[edge] = {r: _difference(ius, bu.get(r, {})) for r, ius in self.units.get(edge, {}).items()}
        return out

    def total(self, revision: str) -> tuple[float, float, dict[float, float]]:
        """(requests, errors, cumulative buckets) of ``revision`` over every edge."""
        requests = sum(e.get(revision, 0) for e in self.requests.values())
        errors = sum(e.get(revision, 0) for e in self.errors.values())
        hist: dict[float, float] = defaultdict(float)
        for per_edge in self.buckets.values():
            for le, count in per_edge.get(revision, {}).items():
                hist[le] += count
        return requests, errors, dict(hist)

    def unit_means(self, revision: str, least: float) -> list[float]:
        """The mean TTFT of each IU of ``revision`` that served at least ``least`` requests, over every edge."""
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for per_edge in self.units.values():
            for iu, (total, count) in per_edge.get(revision, {}).items():
                sums[iu][0] += total
                sums[iu][1] += count
        return [total / count for total, count in sums.values() if count >= least and count > 0]


def _difference(now: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]]):
    """Per IU, (sum, count) now less (sum, count) before."""
    return {iu: (total - before.get(iu, (0.0, 0.0))[0], n - before.get(iu, (0.0, 0.0))[1])
            for iu, (total, n) in now.items()}


def parse_edge_metrics(text: str):
    """(requests, errors, TTFT buckets) by revision and (sum, count) of TTFT by revision and IU."""
    requests: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(dict)
    units: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            revision = sample.labels.get("revision")
            if revision is None:
                continue
            if sample.name == "eas_edge_rollout_requests_total":
                requests[revision] += sample.value
            elif sample.name == "eas_edge_rollout_errors_total":
                errors[revision] += sample.value
            elif sample.name == "eas_edge_rollout_ttft_seconds_bucket":
                buckets[revision][float(sample.labels["le"])] = sample.value
            elif sample.name in ("eas_edge_rollout_unit_ttft_seconds_sum", "eas_edge_rollout_unit_ttft_seconds_count"):
                units[revision][sample.labels.get("iu", "")][sample.name.endswith("_count")] = sample.value
    return (dict(requests), dict(errors), dict(buckets),
            {r: {iu: (v[0], v[1]) for iu, v in ius.items()} for r, ius in units.items()})


def scrape_edges(edges: tuple[str, ...], timeout_s: float = 2.0) -> EdgeTotals:
    totals = EdgeTotals()
    for edge in edges:
        try:
            with urllib.request.urlopen(f"http://{edge}/metrics", timeout=timeout_s) as answer:  # noqa: S310
                text = answer.read(MAX_METRICS_BYTES).decode("utf-8", "replace")
            (totals.requests[edge], totals.errors[edge], totals.buckets[edge],
             totals.units[edge]) = parse_edge_metrics(text)
        except (OSError, ValueError) as exc:  # an unreachable edge leaves its share out (inconclusive, not failed)
            totals.unreachable.append(f"{edge}: {type(exc).__name__}")
    return totals


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``le`` -> count), interpolated within its bucket."""
    ordered = sorted(buckets.items())
    total = ordered[-1][1] if ordered else 0
    if total <= 0:
        return None
    rank, low, below = q * total, 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return low
            share = (rank - below) / (count - below) if count > below else 1.0
            return low + (le - low) * share
        low, below = le, count
    return low


@dataclass
class ConsulSamples:
    """The canary IUs' check samples and agent readings of one step (accumulated by :meth:`sample`)."""

    passing: int = 0
    total: int = 0
    util: dict[str, float] = field(default_factory=dict)  # canary IU -> GPU utilisation 0..1 (latest)
    ecc: set[str] = field(default_factory=set)  # canary IUs critical for ECC errors in this step
    units: dict[str, int] = field(default_factory=dict)  # revision -> registered IUs (latest listing)
    xid_counters: dict[str, list[float]] = field(default_factory=dict)  # canary IU -> [first seen, latest]
    xid_carried: dict[str, float] = field(default_factory=dict)  # canary IU -> events before its agent restarted
    xid_last: dict[str, int] = field(default_factory=dict)  # canary IU -> the XID of its latest new event

    def sample(self, io: ConsulIO, plan: RolloutPlan, datacenter: str) -> None:
        _, listing = io.health_service()
        canary_ius = set()
        self.units = units_by_revision(listing)
        for entry in listing:
            service = entry.get("Service") or {}
            if (service.get("Meta") or {}).get("revision") != plan.canary:
                continue
            canary_ius.add(service.get("ID"))
            self.total += 1
            self.passing += all(c.get("Status") == "passing" for c in entry.get("Checks") or [])
        _, bodies = io.kv_list(layout.score_prefix(datacenter))
        for entry in bodies:
            try:
                body = json.loads(entry.get("Value") or "null")
            except ValueError:
                continue
            for iu, unit in ((body or {}).get("ius") or {}).items() if isinstance(body, dict) else ():
                if iu not in canary_ius or not isinstance(unit, dict):
                    continue
                util = (unit.get("components") or {}).get(UTIL_COMPONENT)
                if isinstance(util, (int, float)) and not isinstance(util, bool) and 0 <= util <= 100:
                    self.util[iu] = util / 100.0
                if unit.get("status") == "critical" and "ECC" in str(unit.get("reason", "")):
                    self.ecc.add(iu)
                try:
                    terms = IUScore.from_json(unit, blank_bad_score=True).terms
                except BodyError:
                    continue
                if terms.xid_events is not None:
                    self._count_xids(iu, terms.xid_events, terms.xid_last)

    def _count_xids(self, iu: str, counter: float, last: float | None) -> None:
        seen = self.xid_counters.get(iu)
        if seen is None:
            self.xid_counters[iu] = [counter, counter]
            return
        previous = seen[1]
        if counter < previous:  # the agent restarted: its counter began again at 0
            self.xid_carried[iu] = self.xid_carried.get(iu, 0.0) + previous - seen[0]
            seen[0] = previous = 0.0
        if counter > previous and last is not None:
            self.xid_last[iu] = int(last)
        seen[1] = counter

    def new_xids(self) -> dict[str, float]:
        """Canary IU -> XID events since the step's first sample (IUs that publish a counter)."""
        return {iu: self.xid_carried.get(iu, 0.0) + latest - first
                for iu, (first, latest) in self.xid_counters.items()}


def units_by_revision(listing: list) -> dict[str, int]:
    """Revision -> IUs registered with it (``Meta.revision``; IUs without one are left out)."""
    units: dict[str, int] = defaultdict(int)
    for entry in listing if isinstance(listing, list) else ():
        revision = ((entry.get("Service") or {}).get("Meta") or {}).get("revision") if isinstance(entry, dict) else None
        if isinstance(revision, str) and revision:
            units[revision] += 1
    return dict(units)


@dataclass(frozen=True)
class GateResult:
    metric: str
    verdict: str  # pass | fail | inconclusive
    value: float | None
    gate: str  # "ttft_p99_ratio <= 1.5"
    detail: str = ""

    def to_json(self) -> dict:
        return {"metric": self.metric, "verdict": self.verdict, "value": self.value, "gate": self.gate,
                "detail": self.detail}


def measure(plan: RolloutPlan, edges: EdgeTotals, consul: ConsulSamples) -> dict[str, tuple[float | None, str]]:
    """metric -> (value or None, what it was computed from)."""
    s_req, s_err, s_hist = edges.total(plan.stable)
    c_req, c_err, c_hist = edges.total(plan.canary)
    enough = c_req >= plan.min_requests and s_req >= plan.min_requests
    basis = f"canary {c_req:.0f} requests, {c_err:.0f} failed; stable {s_req:.0f}, {s_err:.0f} failed"
    if edges.unreachable:
        basis += f"; unreachable: {', '.join(edges.unreachable)}"
    c_p99, s_p99 = quantile(c_hist, 0.99), quantile(s_hist, 0.99)
    c_rate = c_err / c_req if c_req else None
    s_rate = s_err / s_req if s_req else None
    out: dict[str, tuple[float | None, str]] = {}
    ratio = c_p99 / s_p99 if enough and c_p99 is not None and s_p99 else None
    p99s = f"p99 canary {_ms(c_p99)}, stable {_ms(s_p99)}; {basis}"
    out["ttft_p99_ratio"] = (ratio, p99s)
    out["ttft_p99_s"] = (c_p99 if c_req >= plan.min_requests else None, p99s)
    out["error_rate"] = (c_rate if c_req >= plan.min_requests else None, basis)
    out["error_rate_delta"] = (c_rate - s_rate if enough and c_rate is not None and s_rate is not None else None,
                               basis)
    out["ttft_jitter_delta"] = _jitter(plan, edges)
    out["health_check_success"] = (consul.passing / consul.total if consul.total else None,
                                   f"{consul.passing} of {consul.total} canary check samples passing")
    utils = list(consul.util.values())
    out["gpu_util_variance"] = (statistics.pvariance(utils) if len(utils) >= 2 else None,
                                f"{len(utils)} canary IUs with GPU utilisation")
    out["ecc_events"] = (float(len(consul.ecc)) if consul.total else None,
                         f"critical for ECC: {', '.join(sorted(consul.ecc)) or 'none'}")
    xids = consul.new_xids()
    out["xid_events"] = (sum(xids.values()) if xids else None, _xid_detail(xids, consul.xid_last))
    return out


def _spread(means: list[float]) -> float | None:
    mean = statistics.fmean(means) if len(means) >= 2 else 0.0
    return statistics.pstdev(means) / mean if mean > 0 else None


def _jitter(plan: RolloutPlan, edges: EdgeTotals) -> tuple[float | None, str]:
    least = max(1.0, plan.min_requests / 4)
    canary, stable = edges.unit_means(plan.canary, least), edges.unit_means(plan.stable, least)
    c, s = _spread(canary), _spread(stable)
    shown = [f"{name} {'-' if v is None else f'{v:.3f}'} over {len(m)} IUs"
             for name, v, m in (("canary", c, canary), ("stable", s, stable))]
    enough = min(edges.total(plan.canary)[0], edges.total(plan.stable)[0]) >= plan.min_requests
    return (c - s if enough and c is not None and s is not None else None,
            f"spread of the IUs' mean TTFT (stdev/mean): {', '.join(shown)} (IUs with >= {least:g} requests "
            f"in the step)")


def _xid_detail(xids: dict[str, float], last: dict[str, int]) -> str:
    if not xids:
        return "no canary IU publishes an XID count (no agent has NVML's XID events)"
    new = [f"{iu} {n:g} (latest Xid {last[iu]})" if iu in last else f"{iu} {n:g}"
           for iu, n in sorted(xids.items()) if n]
    return f"new XID events: {', '.join(new) or 'none'} over {len(xids)} canary IUs"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def evaluate(plan: RolloutPlan, edges: EdgeTotals, consul: ConsulSamples) -> list[GateResult]:
    measured = measure(plan, edges, consul)
    results = []
    for gate in plan.gates:
        value, detail = measured[gate.metric]
        if value is None:
            results.append(GateResult(gate.metric, INCONCLUSIVE, None, gate.describe(), detail))
        else:
            verdict = PASS if gate.holds(value) else FAIL
            results.append(GateResult(gate.metric, verdict, round(value, 6), gate.describe(), detail))
    return results


def verdict_of(results: list[GateResult]) -> str:
    """fail when any gate failed, else inconclusive when any was, else pass."""
    verdicts = {r.verdict for r in results}
    return FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS
