"""The edge's local view of the pool: per-node KV score bodies + Consul health, folded into a snapshot.

:class:`PoolView` is pure state (``apply_kv`` / ``apply_health`` take the decoded Consul answers, ``snapshot``
builds the immutable :class:`Snapshot` that ``pick`` reads). :class:`ConsulWatcher` keeps it fresh with
blocking queries on the KV prefix and on ``health/service/vllm-iu``, each loop waiting at least
``min_interval_s`` between queries so a busy index cannot turn the watch into a busy loop.

:class:`ScoresPoller` optionally overlays bodies polled from the agents' ``GET /scores`` (fresher: every
cycle instead of level changes and heartbeats); per node the newer of the two is used.

Health is read without ``?passing``: that filter would also hide IUs in ``warning`` (score unknown), which
the fail-open path must still see; the view derives passing / warning / critical / maintenance itself.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field, replace

from eas_agent.consul_io import ConsulIO, ConsulUnavailable
from eas_agent.scheduler.anomaly import AnomalyDetector

log = logging.getLogger("eas_agent.scheduler")
STALE_HEARTBEATS = 3
SEVERITY = {"passing": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class IUEntry:
    iu_id: str
    node: str
    rack: str
    score: float | None
    status: str  # what the agent published: passing | warning | critical
    reason: str
    ts: float  # when the node's agent wrote this score (its clock, corrected by its published NTP offset)
    heartbeat_s: float
    health: str  # Consul: passing | warning | critical | maintenance | unknown
    components: dict = field(default_factory=dict, compare=False)
    address: str | None = None
    port: int | None = None
    weight: float = 1.0  # anomaly de-weighting: 0 = gated, (0, 1) = sampled less often
    ramp_start: float | None = None  # new/recovered IU: weight ramps up from here
    anomaly: str | None = None

    @property
    def stale_after(self) -> float:
        return self.ts + STALE_HEARTBEATS * self.heartbeat_s

    @property
    def request_cost_s(self) -> float:
        return float(self.components.get("request_cost_s") or 0.1)

    @property
    def routable(self) -> bool:
        return self.health in ("passing", "warning") and self.status != "critical"


@dataclass(frozen=True)
class Snapshot:
    entries: tuple[IUEntry, ...]
    scored: tuple[IUEntry, ...]  # routable, with a score, not gated
    healthy: tuple[IUEntry, ...]  # routable (fail-open candidates)
    fresh_until: float  # every entry of ``scored`` is fresh until then
    built: float
    # pick()'s memo of the fresh subset once some entries went stale: (valid_from, valid_until, entries)
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def by_id(self) -> dict[str, IUEntry]:
        return {e.iu_id: e for e in self.entries}


def health_of(checks: list[dict]) -> str:
    status = "passing"
    for check in checks:
        check_id = check.get("CheckID", "")
        if check_id.startswith("_service_maintenance") or check_id == "_node_maintenance":
            return "maintenance"
        if SEVERITY.get(check.get("Status"), 2) > SEVERITY[status]:
            status = check.get("Status") if check.get("Status") in SEVERITY else "critical"
    return status


class PoolView:
    def __init__(self, detector: AnomalyDetector | None = None, clock=time.time, require_health: bool = True):
        """``require_health=False``: IUs without Consul health count as passing (simulations)."""
        self.require_health = require_health
        self.detector = detector if detector is not None else AnomalyDetector()
        self.clock = clock
        self.bodies: dict[str, dict] = {}  # node -> last KV body
        self.polled: dict[str, dict] = {}  # node -> last body from the agent's /scores
        self.health: dict[str, tuple[str, dict]] = {}  # iu -> (health, service)
        self.health_known = False
        self.lock = threading.Lock()
        self._snapshot = Snapshot((), (), (), 0.0, 0.0)
        self.version = 0

    # -- inputs -------------------------------------------------------------------------------------
    def apply_kv(self, entries: list[dict]) -> None:
        """The whole KV prefix listing (replaces what Consul said before)."""
        bodies = {}
        for entry in entries:
            try:
                body = json.loads(entry["Value"]) if entry.get("Value") else None
            except (ValueError, TypeError):
                log.warning("ignoring unparseable score key %s", entry.get("Key"))
                continue
            if isinstance(body, dict) and isinstance(body.get("ius"), dict):
                bodies[body.get("node") or entry["Key"].rsplit("/", 1)[-1]] = body
        with self.lock:
            self.bodies = bodies
        self._rebuild()

    def apply_polled(self, bodies: list[dict]) -> None:
        """Bodies from agents' ``GET /scores`` (same shape as the KV): used where newer than the KV's."""
        with self.lock:
            for body in bodies:
                if isinstance(body, dict) and isinstance(body.get("ius"), dict) and body.get("node"):
                    self.polled[body["node"]] = body
        self._rebuild()

    def _bodies(self) -> dict[str, dict]:
        merged = dict(self.bodies)
        for node, body in self.polled.items():
            if node not in merged or float(body.get("ts", 0)) > float(merged[node].get("ts", 0)):
                merged[node] = body
        return merged

    def apply_health(self, entries: list[dict]) -> None:
        health = {}
        for entry in entries:
            service = entry.get("Service") or {}
            if service.get("ID"):
                health[service["ID"]] = (health_of(entry.get("Checks") or []), service)
        with self.lock:
            self.health, self.health_known = health, True
        self._rebuild()

    # -- output -------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _rebuild(self) -> None:
        now = self.clock()
        with self.lock:
            entries = []
            for node, body in self._bodies().items():
                offset = body.get("clock_offset_s") or 0.0
                ts = float(body.get("ts", 0.0)) - offset
                for iu_id, iu in body["ius"].items():
                    health, service = self.health.get(
                        iu_id, ("unknown" if self.require_health else "passing", {})
                    )
                    entries.append(
                        IUEntry(
                            iu_id=iu_id,
                            node=node,
                            rack=body.get("rack", ""),
                            score=iu.get("score"),
                            status=iu.get("status", "warning"),
                            reason=iu.get("reason", ""),
                            ts=ts,
                            heartbeat_s=float(body.get("heartbeat_s", 2.0)),
                            health=health,
                            components=iu.get("components") or {},
                            address=service.get("Address"),
                            port=service.get("Port"),
                        )
                    )
            known = {e.iu_id for e in entries}
            for iu_id, (health, service) in self.health.items():  # registered but never scored
                if iu_id not in known:
                    meta = service.get("Meta") or {}
                    entries.append(
                        IUEntry(
                            iu_id=iu_id,
                            node=meta.get("node", ""),
                            rack=meta.get("rack", ""),
                            score=None,
                            status="warning",
                            reason="no score published",
                            ts=0.0,
                            heartbeat_s=2.0,
                            health=health,
                            address=service.get("Address"),
                            port=service.get("Port"),
                        )
                    )
            verdicts = self.detector.observe(entries, now)
            entries = [e if e.iu_id not in verdicts else _with_verdict(e, verdicts[e.iu_id]) for e in entries]
            entries.sort(key=lambda e: e.iu_id)
            scored = tuple(e for e in entries if e.routable and e.score is not None and e.weight > 0)
            healthy = tuple(e for e in entries if e.routable)
            fresh_until = min((e.stale_after for e in scored), default=float("inf"))
            self._snapshot = Snapshot(tuple(entries), scored, healthy, fresh_until, now)
            self.version += 1


def _with_verdict(entry: IUEntry, verdict) -> IUEntry:
    return replace(entry, weight=verdict.weight, ramp_start=verdict.ramp_start, anomaly=verdict.flag)


class ConsulWatcher:
    """Two threads of rate-limited blocking queries feeding a :class:`PoolView`."""

    def __init__(
        self,
        view: PoolView,
        io: ConsulIO,
        *,
        kv_prefix: str = "clusterctl/eas",
        dc: str = "dc1",
        wait_s: float = 5.0,
        min_interval_s: float = 0.1,
        max_backoff_s: float = 5.0,
    ):
        self.view, self.io = view, io
        self.prefix = f"{kv_prefix.strip('/')}/{dc}/"
        self.wait_s, self.min_interval_s, self.max_backoff_s = wait_s, min_interval_s, max_backoff_s
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors = 0
        self.updates = 0

    def refresh_once(self) -> None:
        """One non-blocking read of both (the CLI's one-shot table). Raises ConsulUnavailable."""
        _, kv = self.io.kv_list(self.prefix)
        _, health = self.io.health_service()
        self.view.apply_health(health)
        self.view.apply_kv(kv)

    def _loop(self, fetch, apply) -> None:
        index, failures, rng = None, 0, random.Random()
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                new_index, entries = fetch(index)
            except ConsulUnavailable as exc:
                failures += 1
                self.errors += 1
                if failures == 1:
                    log.warning("consul watch failed: %s", exc)
                index = None
                self.stopping.wait(rng.uniform(0.5, 1.0) * min(self.max_backoff_s, 0.2 * 2**failures))
                continue
            failures = 0
            if new_index < (index or 0):  # Consul's index went backwards (server restore): start over
                new_index = 0
            if new_index != index:
                apply(entries)
                self.updates += 1
            index = new_index or None
            self.stopping.wait(max(0.0, self.min_interval_s - (time.monotonic() - started)))

    def start(self) -> ConsulWatcher:
        loops = [
            (lambda i: self.io.kv_list(self.prefix, index=i, wait_s=self.wait_s), self.view.apply_kv),
            (lambda i: self.io.health_service(index=i, wait_s=self.wait_s), self.view.apply_health),
        ]
        for n, (fetch, apply) in enumerate(loops):
            thread = threading.Thread(
                target=self._loop, args=(fetch, apply), name=f"eas-watch-{n}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopping.set()


class ScoresPoller:
    """Polls agents' ``GET /scores`` (for edges that want 200 ms freshness; Consul stays the discovery and
    health source). Same numbers as the KV, computed by the same code, just not held back by hysteresis."""

    def __init__(self, view: PoolView, agents: list[str], interval_s: float = 0.2, timeout_s: float = 0.15):
        self.view, self.agents = view, list(agents)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.stopping = threading.Event()
        self.errors = 0

    def poll_once(self) -> None:
        import urllib.error
        import urllib.request

        bodies = []
        for agent in self.agents:
            try:
                with urllib.request.urlopen(f"http://{agent}/scores", timeout=self.timeout_s) as response:
                    bodies.append(json.load(response))
            except (OSError, ValueError, urllib.error.URLError):
                self.errors += 1  # that agent's node falls back to its KV body
        self.view.apply_polled(bodies)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.poll_once()
            self.stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> ScoresPoller:
        threading.Thread(target=self._loop, name="eas-scores-poller", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
