"""The rollout file (YAML): which revisions, which steps, which gates. Parsed strictly: one error line naming
the file, the field and the value (:class:`RolloutPlanError`, exit 2), before anything is written to Consul.

::

    name: vllm-0.7                    # the rollout's name (in the document, the status and the report)
    stable: vllm-0.6.6.post1+llama-3.1-70b-instruct+driver-550.127.08   # IUs' Meta.revision
    canary: vllm-0.7.0+llama-3.1-70b-instruct+driver-550.127.08
    steps:                            # the canary's share in percent, strictly rising; the last is 100
      - {weight: 5, hold: 48h}        # hold: s, m, h or d; the step passes when it is over and its gates held
      - {weight: 100, hold: 0s}
    interval: 5m                      # gates are evaluated this often, over everything since the step began
    min_requests: 200                 # per side, before an edge gate's evaluation is conclusive
    failure_limit: 0                  # failed evaluations tolerated; one more and the rollout is aborted
    inconclusive: pause               # a step whose hold ended without a conclusive pass: pause | continue | abort
    edges: [edge1.cluster.example:9180]  # the edges' admin listeners (their /metrics)
    gates:
      - {metric: ttft_p99_ratio, max: 1.5}

Metrics a gate may name (:data:`METRICS`): what the edges' ``eas_edge_rollout_*`` metrics, Consul's checks and
the agents' score bodies reach.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.errors import UsageError
from eas_wire.rollout import REVISION_RE
from eas_wire.rollout import RolloutError as DocumentError
from operate.scenario import FieldReader, yaml_problem

INCONCLUSIVE = ("pause", "continue", "abort")
# metric -> (what it is, where it comes from, the bound a gate on it takes: max or min)
METRICS = {
    "ttft_p99_ratio": ("canary p99 TTFT / stable p99 TTFT", "edges", "max"),
    "ttft_p99_s": ("canary p99 TTFT, seconds", "edges", "max"),
    "error_rate": ("canary's failed requests / its requests", "edges", "max"),
    "error_rate_delta": ("canary error rate - stable error rate", "edges", "max"),
    "ttft_jitter_delta": ("spread (stdev/mean) of canary IUs' mean TTFT - the same of stable's", "edges", "max"),
    "health_check_success": ("share of canary IUs' Consul check samples passing", "consul", "min"),
    "gpu_util_variance": ("variance of canary IUs' GPU utilisation (fraction 0..1)", "agents", "max"),
    "ecc_events": ("canary IUs the agents report critical for volatile uncorrectable ECC errors", "agents", "max"),
    "xid_events": ("critical XID events on canary IUs' GPUs in the step (NVML's XID events)", "agents", "max"),
}
_TOP = {"name", "stable", "canary", "steps", "interval", "min_requests", "failure_limit", "inconclusive", "edges",
        "gates", "description"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_HOSTPORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")


class RolloutPlanError(UsageError):
    """A rollout file or a start that cannot be used: one line naming the file, the field and the value."""


@dataclass(frozen=True)
class Step:
    weight: float  # the canary's share, 0..1
    hold_s: float


@dataclass(frozen=True)
class Gate:
    metric: str
    bound: str  # max | min
    threshold: float

    def holds(self, value: float) -> bool:
        return value <= self.threshold if self.bound == "max" else value >= self.threshold

    def describe(self) -> str:
        return f"{self.metric} {'<=' if self.bound == 'max' else '>='} {self.threshold:g}"


@dataclass(frozen=True)
class RolloutPlan:
    name: str
    stable: str
    canary: str
    steps: tuple[Step, ...]
    interval_s: float
    min_requests: int
    failure_limit: int
    inconclusive: str
    edges: tuple[str, ...]
    gates: tuple[Gate, ...]
    source: str = "<rollout>"


def parse_duration(text, field: str, read: FieldReader) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool) and text >= 0:
        return float(text)
    match = _DURATION.fullmatch(str(text).strip()) if isinstance(text, str) else None
    if match is None:
        raise read.fail(field, "expected a duration like 30s, 5m, 48h or 2d", text)
    return float(match.group(1)) * _UNITS[match.group(2)]


def _revision(read: FieldReader, top: dict, field: str) -> str:
    value = read.text(top[field], field)
    if not REVISION_RE.fullmatch(value):
        raise read.fail(field, "not a revision (1-200 of A-Z a-z 0-9 . _ + : / @ -)", value)
    return value


def _steps(read: FieldReader, value) -> tuple[Step, ...]:
    if not isinstance(value, list) or not value:
        raise read.fail("steps", "expected a list of {weight, hold}", value)
    steps, last = [], 0.0
    for n, item in enumerate(value):
        field = f"steps[{n}]"
        data = read.mapping(item, field, {"weight", "hold"}, {"weight", "hold"})
        weight = read.number(data["weight"], f"{field}.weight", 0, 100, low_open=True)
        if weight <= last:
            raise read.fail(f"{field}.weight", f"weights must rise step by step (the step before is {last:g})",
                            data["weight"])
        last = weight
        steps.append(Step(weight / 100.0, parse_duration(data["hold"], f"{field}.hold", read)))
    if last != 100:
        raise read.fail(f"steps[{len(value) - 1}].weight", "the last step must be 100 (the canary takes all)", last)
    return tuple(steps)


def _gates(read: FieldReader, value) -> tuple[Gate, ...]:
    if not isinstance(value, list) or not value:
        raise read.fail("gates", "expected a list of {metric, max or min}", value)
    gates = []
    for n, item in enumerate(value):
        field = f"gates[{n}]"
        data = read.mapping(item, field, {"metric", "max", "min"}, {"metric"})
        metric = data["metric"]
        if metric not in METRICS:
            raise read.fail(f"{field}.metric", f"unknown metric; expected one of {', '.join(METRICS)}", metric)
        bound = METRICS[metric][2]
        if set(data) - {"metric"} != {bound}:
            raise read.fail(field, f"{metric} takes a {bound} (and nothing else)", {k: v for k, v in data.items()
                                                                                    if k != "metric"})
        gates.append(Gate(metric, bound, read.number(data[bound], f"{field}.{bound}", -1e9, 1e9)))
    return tuple(gates)


def parse_plan(data, source: str = "<rollout>") -> RolloutPlan:
    read = FieldReader(source, RolloutPlanError)
    top = read.mapping(data, "", _TOP, {"name", "stable", "canary", "steps", "gates"})
    stable, canary = _revision(read, top, "stable"), _revision(read, top, "canary")
    if stable == canary:
        raise read.fail("canary", "the same revision as stable", canary)
    edges = top.get("edges", [])
    if not isinstance(edges, list) or not all(isinstance(e, str) and _HOSTPORT.fullmatch(e) for e in edges):
        raise read.fail("edges", "expected a list of HOST:PORT (each edge's admin listener)", edges)
    inconclusive = top.get("inconclusive", "pause")
    if inconclusive not in INCONCLUSIVE:
        raise read.fail("inconclusive", f"expected one of {', '.join(INCONCLUSIVE)}", inconclusive)
    gates = _gates(read, top["gates"])
    if not edges and any(METRICS[g.metric][1] == "edges" for g in gates):
        raise read.fail("edges", "gates on the edges' metrics need the edges' admin HOST:PORT listed", edges)
    interval = parse_duration(top.get("interval", "1m"), "interval", read)
    if interval < 0.2:
        raise read.fail("interval", "at least 0.2 s", top.get("interval"))
    return RolloutPlan(
        name=read.text(top["name"], "name"), stable=stable, canary=canary, steps=_steps(read, top["steps"]),
        interval_s=interval, min_requests=read.integer(top.get("min_requests", 200), "min_requests", 1, 10**9),
        failure_limit=read.integer(top.get("failure_limit", 0), "failure_limit", 0, 1000),
        inconclusive=inconclusive, edges=tuple(edges), gates=gates, source=source)


def load_plan(path: str | Path) -> RolloutPlan:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RolloutPlanError(f"{path}: cannot read the rollout file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RolloutPlanError(f"{path}: {yaml_problem(exc)}") from None
    return parse_plan(data, str(path))


def document_error(exc: DocumentError, key: str) -> RolloutPlanError:
    """A rollout document in Consul that does not parse, as one line naming the key."""
    return RolloutPlanError(f"{key}: {exc}")
