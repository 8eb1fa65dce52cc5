"""The traffic rollout document: what ``clusterctl rollout`` writes to Consul KV and every edge follows.

One JSON object per datacenter (key: ``consul_io.layout.rollout_key``)::

    {"version": 1, "name": "vllm-0.7", "stable": "<revision>", "canary": "<revision>", "weight": 0.05,
     "state": "progressing", "step": 0, "updated": 1767225600.0, "reason": "",
     "session_salt": "<32 hex digits>",
     "history": [{"ts": 1767225600.0, "event": "start", "weight": 0.05, "reason": "", "evidence": {}}]}

A revision is an IU's ``Meta.revision`` (what it runs: vLLM version, model, driver). ``weight`` is the share of
requests the edges send to the canary's IUs; an IU whose revision is not the canary's serves the rest. The
state's weight is fixed where the state says so: ``aborted`` is 0 (every request on stable), ``promoted`` is 1.
``session_salt`` (optional) keys the hash that places sessions; ``clusterctl rollout start`` draws it.

:func:`parse` is strict: the first field that is missing, of the wrong type or out of range is one
:class:`RolloutError` naming the field and its value. The edge keeps its last good document on an error, the
CLI refuses to write one. :class:`CanaryCounter` is how an edge turns the weight into per-request choices;
:func:`session_on_canary` how it places a request that carries a session key (decision 0028), and one that
carries none by :func:`request_digest` (decision 0034).

Standard library only: the edge and the CLI import it (tests/guards/test_import_lint.py: ``eas_wire`` is the
ground floor).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field

VERSION = 1
STATES = ("progressing", "paused", "aborted", "promoted")
# Consul meta values are at most 512 characters; a revision names a build, so a narrow alphabet keeps it a
# token in tables, logs and shell commands
REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:/@-]{0,199}")
MAX_HISTORY = 200  # events kept in the document (a 4-step rollout writes ~10)
MAX_DOCUMENT_BYTES = 256 << 10
SESSION_SALT_RE = re.compile(r"[0-9a-f]{32}")  # 16 random bytes, hex: written by ``clusterctl rollout start``
SESSION_DIGEST_BYTES = 32


class RolloutError(ValueError):
    def __init__(self, field_name: str, value: object, why: str):
        self.field, self.value, self.why = field_name, value, why
        shown = repr(value)
        super().__init__(f"rollout document: {field_name} = {shown[:120]}: {why}")


@dataclass(frozen=True)
class Event:
    ts: float
    event: str  # start | step | pause | resume | abort | promote | gate | resume_controller
    weight: float
    reason: str = ""
    evidence: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        return {"ts": self.ts, "event": self.event, "weight": self.weight, "reason": self.reason,
                "evidence": self.evidence}


@dataclass(frozen=True)
class RolloutDoc:
    name: str
    stable: str
    canary: str
    weight: float
    state: str
    step: int = 0
    updated: float = 0.0
    reason: str = ""
    history: tuple[Event, ...] = ()
    step_started: float = 0.0  # when the current step's weight was first applied (its hold counts from here)
    steps: tuple[tuple[float, float], ...] = ()  # the plan's (weight, hold seconds): any controller's status shows them
    session_salt: str = ""  # the key of the sessions' hash (hex); "": derived from the name and the revisions

    @property
    def effective_weight(self) -> float:
        """The canary's share the edges apply."""
        return 0.0 if self.state == "aborted" else 1.0 if self.state == "promoted" else self.weight

    def session_key(self) -> bytes:
        """The key of :func:`session_point` under this rollout: the same on every edge (it is in the document),
        another for the next rollout, so the sessions that meet a canary first differ from rollout to rollout."""
        if self.session_salt:
            return bytes.fromhex(self.session_salt)
        named = "\0".join((self.name, self.stable, self.canary)).encode("utf-8", "surrogatepass")
        return hashlib.blake2b(named, digest_size=32, person=b"eas-rollout-salt").digest()

    def to_json(self) -> dict:
        doc = {"version": VERSION, "name": self.name, "stable": self.stable, "canary": self.canary,
               "weight": self.weight, "state": self.state, "step": self.step, "updated": self.updated,
               "step_started": self.step_started, "reason": self.reason, "steps": [list(x) for x in self.steps],
               "history": [e.to_json() for e in self.history[-MAX_HISTORY:]]}
        if self.session_salt:
            doc["session_salt"] = self.session_salt
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def _number(raw: dict, name: str, low: float, high: float, where: str = "") -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RolloutError(where + name, value, "not a finite number")
    if not low <= value <= high:
        raise RolloutError(where + name, value, f"not in [{low:g}, {high:g}]")
    return float(value)


def _text(raw: dict, name: str, where: str = "", required: bool = True) -> str:
    value = raw.get(name, None if required else "")
    if not isinstance(value, str):
        raise RolloutError(where + name, value, "not a string")
    if len(value) > 2000:
        raise RolloutError(where + name, value[:40] + "...", "longer than 2000 characters")
    return value


def check_revision(name: str, value: object) -> str:
    if not isinstance(value, str) or not REVISION_RE.fullmatch(value):
        raise RolloutError(name, value, "not a revision (1-200 of A-Z a-z 0-9 . _ + : / @ -, starting with a "
                                        "letter or digit)")
    return value


def _event(raw: object, n: int) -> Event:
    where = f"history[{n}]."
    if not isinstance(raw, dict):
        raise RolloutError(f"history[{n}]", raw, "not an object")
    evidence = raw.get("evidence", {})
    if not isinstance(evidence, dict):
        raise RolloutError(where + "evidence", evidence, "not an object")
    return Event(_number(raw, "ts", 0, 1e11, where), _text(raw, "event", where), _number(raw, "weight", 0, 1, where),
                 _text(raw, "reason", where, required=False), evidence)


def parse(raw: object) -> RolloutDoc:
    """The document of decoded JSON ``raw``; :class:`RolloutError` at the first bad field."""
    if not isinstance(raw, dict):
        raise RolloutError("(document)", type(raw).__name__, "not a JSON object")
    if raw.get("version") != VERSION:
        raise RolloutError("version", raw.get("version"), f"this reader knows version {VERSION}")
    name = _text(raw, "name")
    stable = check_revision("stable", raw.get("stable"))
    canary = check_revision("canary", raw.get("canary"))
    if canary == stable:
        raise RolloutError("canary", canary, "the same revision as stable")
    weight = _number(raw, "weight", 0, 1)
    state = raw.get("state")
    if state not in STATES:
        raise RolloutError("state", state, f"not one of {', '.join(STATES)}")
    if state == "aborted" and weight != 0:
        raise RolloutError("weight", weight, "an aborted rollout's weight is 0")
    if state == "promoted" and weight != 1:
        raise RolloutError("weight", weight, "a promoted rollout's weight is 1")
    step = raw.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1000:
        raise RolloutError("step", step, "not a whole number in [0, 999]")
    history = raw.get("history", [])
    if not isinstance(history, list):
        raise RolloutError("history", history, "not a list")
    updated = _number(raw, "updated", 0, 1e11)
    step_started = _number(raw, "step_started", 0, 1e11) if "step_started" in raw else updated
    salt = raw.get("session_salt", "")
    if salt != "" and (not isinstance(salt, str) or not SESSION_SALT_RE.fullmatch(salt)):
        raise RolloutError("session_salt", salt, "not 32 lowercase hex digits")
    return RolloutDoc(name, stable, canary, weight, state, step, updated, _text(raw, "reason", required=False),
                      tuple(_event(e, n) for n, e in enumerate(history)), step_started, _steps(raw.get("steps", [])),
                      salt)


def _steps(raw: object) -> tuple[tuple[float, float], ...]:
    if not isinstance(raw, list) or len(raw) > 1000:
        raise RolloutError("steps", raw, "not a list of [weight, hold seconds]")
    steps = []
    for n, item in enumerate(raw):
        if not isinstance(item, list) or len(item) != 2:
            raise RolloutError(f"steps[{n}]", item, "not a [weight, hold seconds] pair")
        pair = {"weight": item[0], "hold": item[1]}
        steps.append((_number(pair, "weight", 0, 1, f"steps[{n}]."), _number(pair, "hold", 0, 1e9, f"steps[{n}].")))
    return tuple(steps)


def loads(text: str | bytes) -> RolloutDoc:
    """:func:`parse` of a KV value (JSON text)."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise RolloutError("(document)", f"{len(text)} bytes", f"more than {MAX_DOCUMENT_BYTES}")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RolloutError("(document)", str(text)[:40], f"not JSON ({exc})") from None
    return parse(raw)


class CanaryCounter:
    """Per-request choice of the canary at share ``weight``, by credit (smooth weighted round robin): each
    request adds ``weight`` to the credit and goes to the canary when the credit reaches 1, which takes 1.

    Deterministic and exact: after n requests at one weight the canary had floor(n * weight) or one more, on
    each edge, so E edges together are within E requests of the weight at any moment, where random draws
    stray by ~sqrt(n * w * (1 - w)) (at 5% and 1,000 requests: 7). A weight change keeps the credit, clamped
    below 1, so no burst follows it."""

    def __init__(self):
        self.credit = 0.0

    def take(self, weight: float) -> bool:
        if weight <= 0.0:
            return False
        if weight >= 1.0:
            return True
        self.credit = min(self.credit, 1.0) + weight
        if self.credit >= 1.0 - 1e-12:
            self.credit -= 1.0
            return True
        return False


def session_digest(key: bytes) -> bytes:
    """A session's identity from the client's key (its ``X-Session-Id`` or the body's ``user``): a fixed-size
    hash, so the key itself is neither kept nor passed on, whatever its length or bytes."""
    return hashlib.blake2b(key, digest_size=SESSION_DIGEST_BYTES, person=b"eas-session").digest()


def session_point(rollout_key: bytes, digest: bytes) -> float:
    """Where a session falls in [0, 1) under one rollout: a hash keyed with the rollout's
    :meth:`RolloutDoc.session_key`, uniform over sessions; a client that does not know the key cannot pick a
    session id for a side, and the key differs from rollout to rollout."""
    mac = hashlib.blake2b(digest, key=rollout_key, digest_size=8).digest()
    return (int.from_bytes(mac, "big") >> 11) / 2.0 ** 53  # 53 bits: every point is a float below 1


def session_on_canary(point: float, weight: float) -> bool:
    """A session's side at ``weight``: the canary when its point is below the weight. Every turn of a session
    lands on one side at a fixed weight; as the weight rises the canary's sessions stay on it (the set only
    grows); at 0 (abort) every session is on stable and at 1 every one on the canary (points are below 1).
    Over n sessions the canary's share is binomial: within 4 * sqrt(w * (1 - w) / n) of the weight but for
    about 6 in 100,000 rollouts."""
    return point < weight


def body_digest(raw: bytes) -> bytes:
    """The digest of a request body's bytes, as the client sent them: a client's retry of one request sends
    the same bytes (the OpenAI SDKs serialise the same arguments again; only headers such as
    ``x-stainless-retry-count`` change between attempts)."""
    return hashlib.blake2b(raw, digest_size=SESSION_DIGEST_BYTES, person=b"eas-body").digest()


def request_digest(credential: bytes, path: str, body: bytes, idempotency_key: bytes | None = None) -> bytes:
    """The identity of one request that carries no session key, for :func:`session_point`: who sent it
    (``credential``: its ``Authorization`` value), to which endpoint (``path``) and what: its
    ``Idempotency-Key`` when it has one, else ``body`` (:func:`body_digest` of its body). Every attempt of a
    request that a client retries has the same three, so it lands on the same side at a fixed weight; distinct
    requests fall independently, so their canary share is binomial around the weight.

    Its own hash (personalisation ``eas-request``, fields length-prefixed and the last one tagged), apart from
    :func:`session_digest`: no ``X-Session-Id`` or ``user`` value, and no Idempotency-Key, hashes to the
    digest of another request. The credential goes in, so two clients' identical bodies fall independently;
    only the digest comes out."""
    what = b"body\0" + body if idempotency_key is None else b"idempotency-key\0" + idempotency_key
    mac = hashlib.blake2b(digest_size=SESSION_DIGEST_BYTES, person=b"eas-request")
    for value in (credential, path.encode("utf-8", "surrogatepass"), what):
        mac.update(len(value).to_bytes(8, "big"))
        mac.update(value)
    return mac.digest()
