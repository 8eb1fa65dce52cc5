"""The score body: what an agent writes under ``clusterctl/eas/<dc>/<node>`` and serves on ``GET /scores``
(the contract: docs/contracts/score-body.md).

One typed shape for both sides. The publisher builds a :class:`ScoreBody` and writes :meth:`ScoreBody.dumps`
(strict JSON: ``allow_nan=False``, so a non-finite number can never reach a reader as ``NaN``/``Infinity``);
the edge reader turns whatever it finds under the prefix back into one with :meth:`ScoreBody.from_json`,
which checks every field. The reader's rules (why each exists):

- A number is finite when a float holds it: an integer beyond float's range (JSON has no limit) is not.
- The body must be an object with a ``node`` (a hostname-shaped string), a finite ``ts`` and an ``ius``
  object; anything else rejects the whole body (there is nothing of it to trust).
- ``heartbeat_s`` is clamped to [:data:`MIN_HEARTBEAT_S`, :data:`MAX_HEARTBEAT_S`] and ``clock_offset_s``
  must be within :data:`MAX_CLOCK_OFFSET_S`: both decide when the body goes stale, so an unbounded value
  would keep a body fresh forever.
- Each IU entry is checked on its own: ``score`` null or a finite number >= 0, ``status`` one of
  passing/warning/critical, ``level`` null or an integer, ``reason`` a string (cut to 500 characters),
  ``components`` an object of which only finite numbers and nulls are kept (and, of the components readers
  act on, :class:`ScoreTerms`, only values within their declared range), ``collectors`` (optional: older
  agents do not write it) at most :data:`MAX_COLLECTORS` collector names, each ``{"ok": bool, "duration_s":
  number in [0, MAX_COLLECTOR_DURATION_S], "error": null or string}`` (the error cut to
  :data:`MAX_COLLECTOR_ERROR` characters). A bad entry is dropped with a reason naming the node, the IU and
  the field; the body's other IUs are kept.

Each node's agent may write only its own key (its token's policy, consul_io/acl.py), but a node running
third-party model code may be an attacker's, so a body is never trusted beyond its node: the reader's
further checks (the key names the body's node, each IU is named as that node's and is registered on it in
Consul's catalog, ``ts`` clamped to now plus a tolerance) live in the edge's reader (edge/pool/view.py),
which knows the key and the catalog.

**Score terms.** ``components`` stays a free object on the wire: the agent publishes each profile's terms and
their inputs, and ``clusterctl scores`` shows them all. The few that readers act on are declared in
:class:`ScoreTerms`, each with its range: a reader asks ``entry.terms.prefill_tps`` (a number > 0 or None),
never ``components.get(...)`` with a default of its own, and a declared component outside its range is
dropped when the body is read (counted ``component_invalid``): a negative ``request_cost_s`` would make
an IU look cheaper the more work it was sent. Undeclared components are kept as they are (display only).
A body without some declared component reads as before: that term is None.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from eas_wire.placed import PlacedError, Placement, placed_from_json

STATUSES = ("passing", "warning", "critical")
DEFAULT_HEARTBEAT_S = 2.0  # a body without heartbeat_s (and an IU never scored) is read with this one
MIN_HEARTBEAT_S = 0.1
MAX_HEARTBEAT_S = 60.0
MAX_CLOCK_OFFSET_S = 3600.0
MAX_IUS = 256  # a node has at most 8-16 GPUs; more entries than this is not an agent's body
MAX_REASON = 500
_NODE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")
MAX_COLLECTORS = 16  # an agent runs four per IU (vllm, gpu, network, kernel_log)
MAX_COLLECTOR_ERROR = 200
MAX_COLLECTOR_DURATION_S = 3600.0
_COLLECTOR_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# An edge's announce id: its name and a per-start nonce (edge/announce.py); bounded so that a body's
# acknowledgements stay small whatever edges come and go.
EDGE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,79}")
MAX_ANNOUNCED_EDGES = 64
MAX_SEQ = (1 << 53) - 1  # an integer every JSON reader holds exactly


class BodyError(ValueError):
    """The body (or one IU entry) is unusable; the message names the field and value, ``reason`` is the
    counter key the edge exports (``eas_edge_scores_ignored_total{reason=...}``)."""

    def __init__(self, message: str, reason: str = "body_malformed"):
        super().__init__(message)
        self.reason = reason


def score_problem(score) -> str | None:
    """Why ``score`` is not null or a finite number >= 0 (a counter key), None when it is."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return "score_not_a_number"
    if not _finite(score):
        return "score_not_finite"
    if score < 0:
        return "score_negative"
    return None


def _finite(value) -> bool:
    """A JSON number a float holds. JSON reads ``1`` followed by 400 zeros as an int that no float holds
    (``math.isfinite`` raises OverflowError on it): that is not finite here, like ``1e400``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class CollectorRun:
    """How one collector's run went in the cycle that computed an IU's entry (``ius.*.collectors.<name>``)."""

    ok: bool
    duration_s: float
    error: str | None = None  # what went wrong, at most MAX_COLLECTOR_ERROR characters

    def to_json(self) -> dict:
        return {"ok": self.ok, "duration_s": self.duration_s, "error": self.error}

    @classmethod
    def from_json(cls, name: str, obj) -> CollectorRun:
        """Raises :class:`BodyError` (``collectors_invalid``) naming the collector and the field."""
        if not isinstance(obj, dict):
            raise BodyError(f"collectors.{name} is {type(obj).__name__}, not an object", "collectors_invalid")
        ok, duration, error = obj.get("ok"), obj.get("duration_s"), obj.get("error")
        if not isinstance(ok, bool):
            raise BodyError(f"collectors.{name}.ok {str(ok)[:40]!r} is not true or false", "collectors_invalid")
        if not (_finite(duration) and 0 <= duration <= MAX_COLLECTOR_DURATION_S):
            raise BodyError(f"collectors.{name}.duration_s {str(duration)[:40]!r} is not a number of seconds in "
                            f"[0, {MAX_COLLECTOR_DURATION_S:g}]", "collectors_invalid")
        if error is not None and not isinstance(error, str):
            raise BodyError(f"collectors.{name}.error {str(error)[:40]!r} is not null or a string",
                            "collectors_invalid")
        return cls(ok, float(duration), None if error is None else error[:MAX_COLLECTOR_ERROR])


class TermRange(NamedTuple):
    """What a declared component may hold: a finite number in [minimum, maximum] (``above``: strictly above
    minimum)."""

    minimum: float
    above: bool = False
    maximum: float = sys.float_info.max  # also keeps out infinities and integers no float holds
    unit: str = ""


class ScoreTerms(NamedTuple):
    """The components of an IU entry that readers act on, typed and range-checked (:data:`DECLARED_TERMS`)
    when the body is read (docs/contracts/score-body.md, "Declared components"). None: the body does not
    carry it (an older agent, the other profile, an unknown score). A tuple: every body's every IU gets one
    on the edge's event loop."""

    request_cost_s: float | None = None  # one mean request's prefill on this IU
    prefill_tps: float | None = None  # the IU's measured prefill rate
    announced_s: float | None = None  # /scores only: prefill seconds announcements added since the scrape
    tokens_total: float | None = None  # prompt + generated tokens, a counter
    running: float | None = None  # vLLM's running requests
    waiting: float | None = None  # vLLM's waiting requests
    kv_usage: float | None = None  # vLLM's KV-cache usage, a fraction
    admitted_prefill_tokens: float | None = None  # admitted, prefill not yet done
    prefix_hit_rate: float | None = None  # prefix-cache hits / queries (tokens); -1: caching off (vLLM V0)
    xid_events: float | None = None  # the IU's GPUs' critical XID events since its agent started, a counter
    xid_last: float | None = None  # the latest of them, its XID number
    # when xid_last happened (NVML's drain or the kernel log record's stamp): unix seconds on the agent's clock;
    # absent from an older agent's body (read as None: the XID's age unknown)
    xid_last_at: float | None = None

    @classmethod
    def of(cls, components: Mapping) -> tuple[ScoreTerms, list[str]]:
        """(the declared terms of ``components``, the names of those outside their range: read as None)."""
        values, bad = [], []
        get = components.get
        for name, (minimum, above, maximum, _unit) in _RANGES:
            value = get(name)
            if value is not None:
                kind = type(value)  # int or float, not bool; NaN fails every comparison
                if not ((kind is float or kind is int) and (minimum < value if above else minimum <= value)
                        and value <= maximum):
                    bad.append(name)
                    value = None
            values.append(value)  # an int stays one (JSON counts print as counts)
        return tuple.__new__(cls, values), bad


DECLARED_TERMS: dict[str, TermRange] = {
    "request_cost_s": TermRange(0.0, above=True, unit="s"),
    "prefill_tps": TermRange(0.0, above=True, unit="tokens/s"),
    "announced_s": TermRange(0.0, unit="s"),
    "tokens_total": TermRange(0.0, unit="tokens"),
    "running": TermRange(0.0, unit="requests"),
    "waiting": TermRange(0.0, unit="requests"),
    "kv_usage": TermRange(0.0, maximum=1.0),
    "admitted_prefill_tokens": TermRange(0.0, unit="tokens"),
    "prefix_hit_rate": TermRange(-1.0, maximum=1.0),
    "xid_events": TermRange(0.0, unit="events"),
    "xid_last": TermRange(0.0, maximum=float(2**32 - 1)),
    "xid_last_at": TermRange(0.0, above=True, unit="s"),
}
_RANGES = tuple((name, DECLARED_TERMS[name]) for name in ScoreTerms._fields)  # KeyError: a term without a range
NO_TERMS = ScoreTerms()


NO_COLLECTORS: Mapping[str, CollectorRun] = MappingProxyType({})


def no_collectors() -> Mapping[str, CollectorRun]:
    return NO_COLLECTORS  # shared and read-only: an entry without collectors allocates nothing for them


def collectors_from_json(obj) -> Mapping[str, CollectorRun]:
    """An IU entry's ``collectors`` (absent or null: an older agent, none). Raises :class:`BodyError`."""
    if obj is None:
        return NO_COLLECTORS
    if not isinstance(obj, dict):
        raise BodyError(f"collectors {str(obj)[:80]!r} is not an object", "collectors_invalid")
    if len(obj) > MAX_COLLECTORS:
        raise BodyError(f"collectors has {len(obj)} entries (more than {MAX_COLLECTORS})", "collectors_invalid")
    runs = {}
    for name, run in obj.items():
        if not _COLLECTOR_NAME.fullmatch(name):
            raise BodyError(f"collectors key {name[:40]!r} is not a collector name ([a-z][a-z0-9_]{{0,31}})",
                            "collectors_invalid")
        runs[name] = CollectorRun.from_json(name, run)
    return runs


@dataclass(frozen=True)
class IUScore:
    score: float | None
    status: str
    reason: str = ""
    level: int | None = None
    components: dict = field(default_factory=dict)
    collectors: Mapping[str, CollectorRun] = field(default_factory=no_collectors)

    @functools.cached_property
    def terms(self) -> ScoreTerms:
        """The declared components, typed (not on the wire: read from ``components``, once)."""
        return ScoreTerms.of(self.components)[0]

    def to_json(self) -> dict:
        entry = {
            "score": self.score,
            "level": self.level,
            "status": self.status,
            "reason": self.reason,
            "components": self.components,
        }
        if self.collectors:  # optional: a body without them reads as before
            entry["collectors"] = {name: run.to_json() for name, run in self.collectors.items()}
        return entry

    @classmethod
    def from_json(cls, obj, blank_bad_score: bool = False, counts: Counter | None = None) -> IUScore:
        """Raises :class:`BodyError` naming the first bad field. ``blank_bad_score``: a score that is not null
        or a finite number >= 0 is read as unknown (status warning, the reason says what was ignored) instead.
        A declared component outside its range (:class:`ScoreTerms`) is dropped, one ``component_invalid``
        in ``counts`` each."""
        if not isinstance(obj, dict):
            raise BodyError(f"entry is {type(obj).__name__}, not an object", "iu_malformed")
        score = obj.get("score")
        problem = score_problem(score)
        if problem and not blank_bad_score:
            raise BodyError(f"score {score!r} is not null or a finite number >= 0", problem)
        if problem:
            obj = {**obj, "score": None, "status": "warning", "reason": f"ignored {problem}: {score!r}"[:MAX_REASON]}
            score = None
        status = obj.get("status", "warning")
        if status not in STATUSES:
            raise BodyError(f"status {status!r} is not one of {', '.join(STATUSES)}", "status_invalid")
        level = obj.get("level")
        if level is not None and (not isinstance(level, int) or isinstance(level, bool)):
            raise BodyError(f"level {level!r} is not null or an integer", "level_invalid")
        reason = obj.get("reason")
        reason = "" if reason is None else reason
        if not isinstance(reason, str):
            raise BodyError(f"reason {str(reason)[:80]!r} is not a string", "reason_invalid")
        components = obj.get("components")
        components = {} if components is None else components
        if not isinstance(components, dict):
            raise BodyError(f"components {str(components)[:80]!r} is not an object", "components_invalid")
        kept = {str(k): v for k, v in components.items() if v is None or _finite(v)}
        terms, bad = ScoreTerms.of(kept)
        for name in bad:
            del kept[name]
        collectors = collectors_from_json(obj.get("collectors"))
        if bad and counts is not None:
            counts["component_invalid"] += len(bad)
        entry = cls(float(score) if score is not None else None, status, reason[:MAX_REASON], level, kept, collectors)
        entry.__dict__["terms"] = terms  # what the cached property would compute from ``kept``, computed once
        return entry


@dataclass(frozen=True)
class ScoreBody:
    node: str
    ts: float
    ius: dict[str, IUScore]
    rack: str = ""
    profile: str = "drain"
    seq: int = 0
    clock_offset_s: float | None = None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    published_seq: int | None = None  # /scores only: the seq of the body last written to the KV
    # /scores only: edge id -> the last of its announce sequence numbers this body's scores count
    # (docs/contracts/announce.md); None: the agent has no announce channel (or this is the KV's body)
    announced: Mapping[str, int] | None = None
    # /scores only: prompts the announce channel says were sent to this node's IUs within the last
    # RELAY_WINDOW_S, with a few block hashes each (eas_wire/placed.py); every edge's prefix index learns them
    placed: tuple[Placement, ...] = ()

    def to_json(self) -> dict:
        body = {
            "node": self.node,
            "rack": self.rack,
            "profile": self.profile,
            "seq": self.seq,
            "ts": self.ts,
            "clock_offset_s": self.clock_offset_s,
            "heartbeat_s": self.heartbeat_s,
            "ius": {iu: entry.to_json() for iu, entry in self.ius.items()},
        }
        if self.published_seq is not None:
            body["published_seq"] = self.published_seq
        if self.announced is not None:
            body["announced"] = dict(self.announced)
        if self.placed:
            body["placed"] = [p.to_json() for p in self.placed]
        return body

    def dumps(self) -> str:
        return dumps(self.to_json())

    @classmethod
    def from_json(
        cls, obj, *, blank_bad_scores: bool = False, counts: Counter | None = None, placed_after: int = 0
    ) -> tuple[ScoreBody, list[str]]:
        """(body, problems): the problems name each IU entry that was dropped. Raises :class:`BodyError`
        when the body as a whole is unusable.

        ``blank_bad_scores`` (the edge): an IU whose score is nonsense is kept with an unknown score (out of
        the power-of-two choice, still usable by the fail-open path) instead of being dropped. ``counts`` gets
        one count per ignored score or dropped entry, by :attr:`BodyError.reason`. ``placed_after``: the last
        relay number the reader holds from this node (its ``placed`` up to it are skipped unread)."""
        if not isinstance(obj, dict):
            raise BodyError(f"body is {type(obj).__name__}, not an object")
        ius = obj.get("ius")
        if not isinstance(ius, dict):
            raise BodyError(f"ius is {type(ius).__name__}, not an object")
        ts = obj.get("ts")
        if not (_finite(ts) and ts > 0):
            raise BodyError(f"ts {str(ts)[:40]!r} is not a finite timestamp", "ts_invalid")
        node = obj.get("node")
        if not isinstance(node, str) or not _NODE.fullmatch(node):
            raise BodyError(f"node {str(node)[:80]!r} is not a host name", "node_invalid")
        offset = obj.get("clock_offset_s")
        if offset is not None and not (_finite(offset) and abs(offset) <= MAX_CLOCK_OFFSET_S):
            raise BodyError(f"clock_offset_s {offset!r} is not null or within +-{MAX_CLOCK_OFFSET_S:g} s",
                            "clock_offset_invalid")
        heartbeat = obj.get("heartbeat_s", DEFAULT_HEARTBEAT_S)
        if not _finite(heartbeat):
            raise BodyError(f"heartbeat_s {heartbeat!r} is not a finite number", "heartbeat_invalid")
        if len(ius) > MAX_IUS:
            raise BodyError(f"ius has {len(ius)} entries (more than {MAX_IUS})")
        counts = counts if counts is not None else Counter()
        rack, profile, seq = obj.get("rack", ""), obj.get("profile", "drain"), obj.get("seq", 0)
        entries: dict[str, IUScore] = {}
        problems: list[str] = []
        for iu_id, entry in ius.items():
            problem = score_problem(entry.get("score")) if isinstance(entry, dict) else None
            try:
                entries[iu_id] = IUScore.from_json(entry, blank_bad_scores, counts)
            except BodyError as exc:
                counts[exc.reason] += 1
                problems.append(f"node {node} IU {iu_id[:80]!r}: {exc}")
                continue
            if problem:
                counts[problem] += 1
        published = obj.get("published_seq")
        announced = obj.get("announced")
        if announced is not None:
            try:
                announced = announced_from_json(announced)
            except BodyError as exc:  # the scores stay usable: without acknowledgements, read as from the KV
                counts[exc.reason] += 1
                problems.append(f"node {node}: {exc}")
                announced = None
        placed: tuple[Placement, ...] = ()
        if obj.get("placed") is not None:
            try:
                placed, dropped = placed_from_json(obj["placed"], entries, MAX_SEQ, placed_after)
            except PlacedError as exc:  # the scores stay usable: only the relay of placements is lost
                placed, dropped = (), 1
                problems.append(f"node {node}: {exc}")
            if dropped:
                counts["placed_invalid"] += dropped
        body = cls(
            placed=placed,
            announced=announced,
            published_seq=published if isinstance(published, int) and not isinstance(published, bool) else None,
            node=node,
            ts=float(ts),
            ius=entries,
            rack=rack if isinstance(rack, str) else "",
            profile=profile if isinstance(profile, str) else "drain",
            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
            clock_offset_s=float(offset) if offset is not None else None,
            heartbeat_s=min(MAX_HEARTBEAT_S, max(MIN_HEARTBEAT_S, float(heartbeat))),
        )
        return body, problems


def announced_from_json(obj) -> dict[str, int]:
    """A body's ``announced``: at most :data:`MAX_ANNOUNCED_EDGES` edge ids -> sequence numbers in
    [0, 2**53). Raises :class:`BodyError` (``announced_invalid``) naming the first bad entry."""
    if not isinstance(obj, dict):
        raise BodyError(f"announced {str(obj)[:80]!r} is not an object", "announced_invalid")
    if len(obj) > MAX_ANNOUNCED_EDGES:
        raise BodyError(f"announced has {len(obj)} entries (more than {MAX_ANNOUNCED_EDGES})", "announced_invalid")
    for edge, seq in obj.items():
        if not EDGE_ID.fullmatch(edge):
            raise BodyError(f"announced key {edge[:80]!r} is not an edge id", "announced_invalid")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
            raise BodyError(f"announced.{edge} {str(seq)[:40]!r} is not an integer in [0, 2**53)",
                            "announced_invalid")
    return dict(obj)


def dumps(obj, **kwargs) -> str:
    """Strict, compact JSON (raises ValueError on NaN/Infinity instead of writing invalid JSON)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":"), **kwargs)
