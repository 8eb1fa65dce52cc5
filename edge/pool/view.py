"""The edge's local view of the pool: per-node KV score bodies + Consul health, folded into a snapshot.

:class:`PoolView` is pure state (``apply_kv`` / ``apply_health`` take the decoded Consul answers,
``apply_polled`` the bodies of agents' ``GET /scores``, ``snapshot`` builds the immutable :class:`Snapshot`
that ``pick`` reads); per node the newer of the KV and the polled body is used. What keeps it fresh
(:class:`~edge.pool.watch.ConsulWatcher`, :class:`~edge.pool.watch.ScoresPoller`, the
edge's push feed) lives elsewhere and only calls those methods.

Nothing read from the KV or from ``/scores`` is trusted: each body is checked against
:class:`~eas_wire.scorebody.ScoreBody`'s schema, a body must name the node its key names, each IU in it must be
named as one of that node's IUs (``<node>-iu<k>``), and a body's timestamp counts as at most
:data:`TS_TOLERANCE_S` after the moment this reader first saw it. Bad bodies and IU entries are skipped and
counted (``rejected_bodies``, ``rejected_ius``, the last reasons in ``problems``), each on its own: whatever
one entry holds never stops the others.

Nor is what a registrant writes into a service: GPU nodes run third-party model code, so any node's tokens
may be an attacker's. An IU belongs to the catalog node it is registered on (``Node.Node``, which only that
node's agent token may write), and the health map is keyed by (catalog node, service ID). A registration is
never routable, and is counted by reason in ``rejected_registrations`` (``eas_edge_registrations_rejected``),
when its service is not its catalog node's own ``vllm-iu-<node>`` (the name only that node's registration
token may write: another node's token can still place an instance of its own name on any catalog node
through ``catalog/register``), when its ID is not ``<catalog node>-iu<k>``, when its ``Meta.node`` or a ``node:`` tag names another node,
or when the same ID is registered on more than one node (every copy is dropped: the reader cannot tell which
is the impostor). Addresses, and with them the agent each node is followed at, come only from registrations
that pass.

Health is read without ``?passing``: that filter would also hide IUs in ``warning`` (score unknown), which
the fail-open path must still see; the view derives passing / warning / critical / maintenance itself.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from consul_io import layout
from eas_wire.scorebody import DEFAULT_HEARTBEAT_S, BodyError, ScoreBody, ScoreTerms
from edge.pool.anomaly import AnomalyDetector
from edge.pool.prefix import RelayedPlacements

log = logging.getLogger("edge.pool")
STALE_HEARTBEATS = 3
# A body's ts may be ahead of this reader's clock by clock skew and transit, not by more: a spoofed
# far-future ts would otherwise keep a body fresh (and steering traffic) for as long as it likes.
TS_TOLERANCE_S = 2.0
MAX_BODY_BYTES = 1 << 20  # one node's body is ~1-4 KB
LOG_EVERY_S = 60.0
SEVERITY = {"passing": 0, "warning": 1, "critical": 2}
# An IU whose body carries no request_cost_s (an agent on the seed profile, an older one): a new request
# there is counted at this much of prefill until its next score
DEFAULT_REQUEST_COST_S = 0.1


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
    components: dict = field(default_factory=dict, compare=False)  # every component, for display
    address: str | None = None
    port: int | None = None
    weight: float = 1.0  # anomaly de-weighting: 0 = gated, (0, 1) = sampled less often
    ramp_start: float | None = None  # new/recovered IU: weight ramps up from here
    anomaly: str | None = None
    revision: str | None = None  # what the IU runs (its service's Meta.revision; a rollout's stable or canary)
    # the last of this edge's announce sequence numbers the score counts (the body's ``announced``; 0: none)
    acked: int = field(default=0, compare=False)
    # the components readers act on, typed and range-checked (None: read from ``components``)
    terms: ScoreTerms | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.terms is None:
            object.__setattr__(self, "terms", ScoreTerms.of(self.components)[0])

    @property
    def stale_after(self) -> float:
        return self.ts + STALE_HEARTBEATS * self.heartbeat_s

    @property
    def request_cost_s(self) -> float:
        cost = self.terms.request_cost_s
        return DEFAULT_REQUEST_COST_S if cost is None else cost

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
        if layout.is_maintenance_check(check_id):
            return "maintenance"
        if SEVERITY.get(check.get("Status"), 2) > SEVERITY[status]:
            status = check.get("Status") if check.get("Status") in SEVERITY else "critical"
    return status


class PoolView:
    # The edge's reading (edge.feed.EdgeView): a nonsense score makes the IU's score unknown instead of
    # dropping the IU, so the fail-open path can still use a healthy IU.
    blank_bad_scores = False

    def __init__(self, detector: AnomalyDetector | None = None, clock=time.time):
        self.ignored: Counter[str] = Counter()  # reason -> bodies and scores ignored (eas_edge_scores_ignored)
        self.detector = detector if detector is not None else AnomalyDetector()
        self.clock = clock
        self.bodies: dict[str, _Seen] = {}  # node -> last valid KV body
        self.polled: dict[str, _Seen] = {}  # node -> last valid body from the agent's /scores
        # (catalog node, IU id) -> (health, service) of the registrations that passed the ownership checks
        self.health: dict[tuple[str, str], tuple[str, dict]] = {}
        self.rejected_registrations: Counter[str] = Counter()  # reason -> registrations in Consul's last listing
        self.health_known = False
        self.lock = threading.Lock()
        self._snapshot = Snapshot((), (), (), 0.0, 0.0)
        self.version = 0
        self.rejected_bodies = 0
        self.rejected_ius = 0
        self.problems: deque[str] = deque(maxlen=50)
        self._last_log = -float("inf")
        self.edge_id: str | None = None  # the reading edge's announce id: entries carry the body's ack of it
        # node -> (the body, the health map and the edge id its entries were built from, those entries): a
        # rebuild builds entries only for nodes whose body (or Consul's health) changed since the last one
        self._built: dict[str, tuple[_Seen, dict, str | None, list[IUEntry]]] = {}
        self.relayed = RelayedPlacements()  # the announce channel's placements, for the router's prefix index

    def _reject(self, what: str, problem: str) -> None:
        """Count and remember a skipped body or IU entry; log at most once a minute (a writer can repeat it
        every cycle)."""
        if what == "body":
            self.rejected_bodies += 1
        elif what == "iu":
            self.rejected_ius += 1
        self.problems.append(problem)
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("ignoring score %s: %s", what, problem)

    def _reader_error(self, where: str, exc: Exception) -> None:
        self.ignored["reader_error"] += 1
        self._reject("body", f"{where}: reader error {type(exc).__name__}: {str(exc)[:200]}")

    def parse(self, raw, where: str) -> ScoreBody | None:
        """The typed body of ``raw`` (decoded JSON), None when it is unusable (counted and remembered)."""
        if isinstance(raw, ScoreBody):
            return raw
        try:
            node = raw.get("node") if isinstance(raw, dict) else None
            after = self.relayed.last_seq.get(node, 0) if isinstance(node, str) else 0
            body, problems = ScoreBody.from_json(raw, blank_bad_scores=self.blank_bad_scores, counts=self.ignored,
                                                 placed_after=after)
        except BodyError as exc:
            self.ignored[exc.reason] += 1
            self._reject("body", f"{where}: {exc}")
            return None
        except Exception as exc:  # a body the checks cannot handle (a reader bug) is that body's problem only
            self._reader_error(where, exc)
            return None
        for problem in problems:
            self._reject("iu", f"{where}: {problem}")
        return body

    def _validated(self, raw, where: str, previous: dict[str, _Seen], received: float) -> _Seen | None:
        body = self.parse(raw, where)
        if body is None:
            return None
        seen = previous.get(body.node)
        if seen is not None and seen.body == body:
            return seen  # unchanged: keeps the time it was first seen (the ts clamp counts from there)
        return _Seen(body, received)

    # -- inputs -------------------------------------------------------------------------------------
    def apply_kv(self, entries: list[dict]) -> None:
        """The whole KV prefix listing (replaces what Consul said before). Each entry is checked on its own:
        whatever one entry holds costs that entry, never the others (a node's writer may be an attacker)."""
        received = self.clock()
        bodies: dict[str, _Seen] = {}
        for entry in entries if isinstance(entries, list) else ():
            try:
                checked = self._kv_body(entry, received)
            except Exception as exc:  # e.g. a Value that is no string: that entry only (see the docstring)
                self._reader_error(f"key {str(entry.get('Key'))[:200]}", exc)  # _kv_body took non-dicts
                continue
            if checked is not None:
                bodies[checked[0]] = checked[1]
        with self.lock:
            self.bodies = bodies
        self._rebuild()

    def _kv_body(self, entry, received: float) -> tuple[str, _Seen] | None:
        """(node, body) of one KV listing entry, None when it holds no usable body (counted)."""
        if not isinstance(entry, dict):
            self._reject("body", f"KV listing entry is {type(entry).__name__}, not an object")
            return None
        key = str(entry.get("Key", ""))
        value = entry.get("Value")
        if not value:
            return None
        if len(value) > MAX_BODY_BYTES:
            self.ignored["body_too_large"] += 1
            self._reject("body", f"key {key}: {len(value)} bytes (more than {MAX_BODY_BYTES})")
            return None
        try:
            raw = json.loads(value)
        except (ValueError, TypeError, RecursionError):  # RecursionError: "[[[[..." nested too deep
            self.ignored["body_unparseable"] += 1
            self._reject("body", f"key {key}: not JSON")
            return None
        seen = self._validated(raw, f"key {key}", self.bodies, received)
        if seen is None:
            return None
        key_node = key.rsplit("/", 1)[-1]
        if seen.body.node != key_node:
            self._reject("body", f"key {key}: body names node {seen.body.node!r}, the key {key_node!r}")
            return None
        return key_node, seen

    def read_placed(self, body: ScoreBody) -> None:
        """The relayed placements of one pushed body (checked by :meth:`parse`), as it arrives: a stream line
        carries each placement once (eas_agent/http.py), so they are read before a newer body of the node
        replaces this one in the feed's queue (:meth:`apply_polled` reads them again: nothing twice)."""
        with self.lock:
            self.relayed.read(body.node, body.placed)

    def apply_polled(self, bodies: list) -> None:
        """Bodies from agents' ``GET /scores`` (decoded JSON in the KV's shape, or already a
        :class:`ScoreBody`): used where newer than the KV's. Each is checked on its own (:meth:`parse`)."""
        received = self.clock()
        valid = [s for s in (self._validated(b, "/scores", self.polled, received) for b in bodies) if s]
        with self.lock:
            for seen in valid:
                self.polled[seen.body.node] = seen
                self.relayed.read(seen.body.node, seen.body.placed)
        self._rebuild()

    def _bodies(self) -> dict[str, _Seen]:
        merged = dict(self.bodies)
        for node, seen in self.polled.items():
            # a pushed body wins a tie: the KV body of the same cycle has no announcements in it
            if node not in merged or seen.body.ts >= merged[node].body.ts:
                merged[node] = seen
        return merged

    def apply_health(self, entries: list[dict]) -> None:
        """Consul's listing of every IU instance with its checks (replaces the one before). Ownership is the
        catalog node's; see the module docstring for what is dropped and counted."""
        accepted: dict[tuple[str, str], tuple[str, dict]] = {}
        rejected: Counter[str] = Counter()
        problems: list[str] = []
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, dict):
                continue
            service = entry.get("Service")
            if not isinstance(service, dict) or not isinstance(service.get("ID"), str):
                continue
            node, iu_id = _catalog_node(entry), service["ID"]
            reason = registration_problem(node, service)
            if reason is not None:
                rejected[reason] += 1
                problems.append(f"registration {iu_id!r} on node {node!r}: {reason}")
                continue
            checks = entry.get("Checks")
            checks = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
            accepted[(node, iu_id)] = (health_of(checks), service)
        nodes_of: dict[str, list[str]] = {}
        for node, iu_id in accepted:
            nodes_of.setdefault(iu_id, []).append(node)
        for iu_id, nodes in nodes_of.items():
            if len(nodes) > 1:  # a node cannot prove which copy is its own: none of them is used
                for node in nodes:
                    del accepted[(node, iu_id)]
                rejected["id_on_two_nodes"] += len(nodes)
                problems.append(f"registration {iu_id!r}: on nodes {sorted(nodes)}")
        with self.lock:
            self.health, self.health_known = accepted, True
            self.rejected_registrations = rejected
            for problem in problems:
                self._reject("registration", problem)
        self._rebuild()

    # -- output -------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _entries_of(self, node: str, seen: _Seen) -> list[IUEntry]:
        """The IU entries of one node's body (under the lock): pure given the body, the health map and the
        edge id, which is what lets :meth:`_rebuild` keep them while those are the same objects."""
        body = seen.body
        ts = min(body.ts - (body.clock_offset_s or 0.0), seen.received + TS_TOLERANCE_S)
        acked = body.announced.get(self.edge_id, 0) if self.edge_id and body.announced else 0
        entries = []
        for iu_id, iu in body.ius.items():
            if not layout.is_iu_of(iu_id, node):
                self._reject("iu", f"node {node}: IU {iu_id} is not named as one of its IUs")
                continue
            health, service = self.health.get((node, iu_id), ("unknown", {}))
            entries.append(
                IUEntry(
                    iu_id=iu_id,
                    node=node,
                    rack=body.rack,
                    score=iu.score,
                    status=iu.status,
                    reason=iu.reason,
                    ts=ts,
                    heartbeat_s=body.heartbeat_s,
                    health=health,
                    components=iu.components,
                    terms=iu.terms,
                    address=_address(service),
                    port=_port(service),
                    revision=_revision(service),
                    acked=acked,
                )
            )
        return entries

    def _rebuild(self) -> None:
        now = self.clock()
        with self.lock:
            entries = []
            built: dict[str, tuple[_Seen, dict, str | None, list[IUEntry]]] = {}
            for node, seen in self._bodies().items():
                previous = self._built.get(node)
                if previous is not None and previous[0] is seen and previous[1] is self.health \
                        and previous[2] == self.edge_id:
                    built[node] = previous
                else:
                    built[node] = (seen, self.health, self.edge_id, self._entries_of(node, seen))
                entries.extend(built[node][3])
            self._built = built
            known = {(e.node, e.iu_id) for e in entries}
            for (owner, iu_id), (health, service) in self.health.items():  # registered but never scored
                if (owner, iu_id) not in known:
                    meta = service.get("Meta") if isinstance(service.get("Meta"), dict) else {}
                    rack = meta.get("rack", "")
                    entries.append(
                        IUEntry(
                            iu_id=iu_id,
                            node=owner,
                            rack=rack if isinstance(rack, str) else "",
                            score=None,
                            status="warning",
                            reason="no score published",
                            ts=0.0,
                            heartbeat_s=DEFAULT_HEARTBEAT_S,
                            health=health,
                            address=_address(service),
                            port=_port(service),
                        )
                    )
            verdicts = self.detector.observe(entries, now)
            entries = [_with_verdict(e, verdicts.get(e.iu_id)) for e in entries]
            entries.sort(key=lambda e: e.iu_id)
            scored = tuple(e for e in entries if e.routable and e.score is not None and e.weight > 0)
            healthy = tuple(e for e in entries if e.routable)
            fresh_until = min((e.stale_after for e in scored), default=float("inf"))
            self._snapshot = Snapshot(tuple(entries), scored, healthy, fresh_until, now)
            self.version += 1


@dataclass(frozen=True)
class _Seen:
    body: ScoreBody
    received: float  # reader's clock when this exact body was first seen


def _catalog_node(entry: dict) -> str:
    node = entry.get("Node")
    name = node.get("Node") if isinstance(node, dict) else None
    return name if isinstance(name, str) else ""


def registration_problem(node: str, service: dict) -> str | None:
    """Why an IU registration on catalog node ``node`` must not be routed (a reason label), None when its
    service name, ID, ``Meta.node`` and ``node:`` tags agree with the catalog."""
    if not node:
        return "no_catalog_node"
    if service.get("Service") != layout.iu_service(node):
        return "service_not_of_node"
    if not layout.is_iu_of(service["ID"], node):
        return "id_not_of_node"
    meta = service.get("Meta")
    claimed = meta.get("node") if isinstance(meta, dict) else None
    if claimed is not None and claimed != node:
        return "meta_node_mismatch"
    tags = service.get("Tags")
    for tag in tags if isinstance(tags, list) else ():
        if isinstance(tag, str) and layout.tagged_node(tag) not in (None, node):
            return "node_tag_mismatch"
    return None


def _address(service: dict) -> str | None:
    address = service.get("Address")
    return address if isinstance(address, str) and address else None


def _port(service: dict) -> int | None:
    port = service.get("Port")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


def _revision(service: dict) -> str | None:
    meta = service.get("Meta")
    revision = meta.get("revision") if isinstance(meta, dict) else None
    return revision if isinstance(revision, str) and revision else None


def _with_verdict(entry: IUEntry, verdict) -> IUEntry:
    """``entry`` with the detector's verdict; itself when the verdict is the entry's default (no flag, full
    weight, no ramp: most IUs most of the time), which spares a dataclass copy per IU per rebuild (7% of an
    edge's event loop at 128 nodes with the announce channel, py-spy)."""
    if verdict is None or (verdict.flag is None and verdict.weight == 1.0 and verdict.ramp_start is None):
        return entry
    return replace(entry, weight=verdict.weight, ramp_start=verdict.ramp_start, anomaly=verdict.flag)
