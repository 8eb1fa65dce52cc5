"""The edge's side of a traffic rollout: which revision each request goes to, and what each revision did.

The rollout document (``eas_wire/rollout.py``, KV ``consul_io.layout.rollout_key``) names a stable and a canary
revision and the canary's share of requests. :class:`RolloutFollower` keeps the last good document (the
watcher's blocking query on its key feeds :meth:`apply_kv`; a single-key read, so a token that may not read it
is an error, where a listing would hide the key):

- the key is absent: no rollout, every IU serves every request;
- the value does not parse, or Consul cannot be read: the last good document stays (counted in
  ``eas_edge_rollout_read_errors``); the controller's abort therefore reaches an edge only through Consul;
- at start the document is read once before serving (``edge/main.py``): an edge whose token may not read it
  does not start, so no edge serves without knowing the split.

Per request, :meth:`split` chooses the side once and adds the other side's IUs to the IUs the request may not
use. A request with a session key (:func:`session_of`: the ``X-Session-Id`` header, else the body's OpenAI
``user``) goes where its session's keyed hash puts it (:func:`~eas_wire.rollout.session_point` against the
weight): every turn of a conversation on one revision, on every edge alike, and a session on the canary stays
there as the weight rises; nothing is kept per session, and the key is reduced to a digest when the request
is read and never logged. A request without one that says it may be retried (an ``Idempotency-Key``, or the
``x-stainless-retry-count`` that the OpenAI Python SDK sends on every attempt, 0 on the first)
is placed the same way by its request key (:func:`placement_of`): the hash of its ``Authorization`` value, its
endpoint and its ``Idempotency-Key``, else its body's bytes (:func:`~eas_wire.rollout.request_digest`). The
SDK's retry of a failed or timed-out request sends the same body again, so it meets the same revision, and a
bad canary's errors stay the canary's rather than being retried onto stable; distinct requests fall
independently, binomially around the weight. Any other request is drawn by the credit counter
(:class:`~eas_wire.rollout.CanaryCounter`: the share is exact within one request per edge), which keyed
requests leave alone: many clients send one body over and over (probes, load generators), and a key would
put every copy on one side. ``rollout_request_key`` (``signalled``, the default; ``always``; ``never``) says
which requests the request key places. The proxy keeps the side's set for
every attempt of the request, so the edge's own retry stays on its revision, and queued requests wait in the
queue of their side. An IU belongs to the canary when its
``Meta.revision`` is the canary's; every other IU (the stable revision, or none declared) is on the stable
side. When the chosen side has no routable IU left for the request, the request is not restricted
(``eas_edge_rollout_fallbacks``): a canary with no unit up costs no request a 503, and a keyed session
moves for that request rather than fail.

The outcome of each request is counted by the revision of the IU that served it (:meth:`finished`,
:meth:`first_byte`): ``eas_edge_rollout_requests``, ``eas_edge_rollout_errors`` and
``eas_edge_rollout_ttft_seconds``, which the controller's gates compare, canary against stable; and the time to
first byte per IU (``eas_edge_rollout_unit_ttft_seconds``, a sum and a count: two series per IU, not a
histogram's dozens), whose means the cross-unit jitter gate spreads out side by side.
"""

from __future__ import annotations

import logging
import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from consul_io import layout
from eas_wire.rollout import (
    CanaryCounter,
    RolloutDoc,
    RolloutError,
    loads,
    request_digest,
    session_digest,
    session_on_canary,
    session_point,
)
from edge.pool.view import Snapshot

log = logging.getLogger("edge.rollout")
# 5 ms .. ~73 s in steps of 25%: a p99 read from these buckets is within 12.5% of the true one, which the
# gates' ratios (canary p99 over stable p99, failing at 1.5x in the shipped examples) need
ROLLOUT_TTFT_BUCKETS = tuple(round(0.005 * 1.25 ** k, 6) for k in range(44))
ERROR_KINDS = ("failed", "status_5xx")  # a connection or stream that failed; an IU's own 5xx answer
SESSION_HEADER = "X-Session-Id"
# the IETF draft (draft-ietf-httpapi-idempotency-key-header) and Stripe's API name it so; the OpenAI Python SDK
# does not send it (its base client's ``_idempotency_header`` is None), so its retries are known by the body
IDEMPOTENCY_HEADER = "Idempotency-Key"
# sent on every attempt by the OpenAI Python SDK (0 on the first; openai 3.63.0 ``_build_headers``, from the
# Stainless-generated base client): a client that will retry, with the same body
RETRY_COUNT_HEADER = "x-stainless-retry-count"


def session_of(header: str | None, user_digest: bytes | None) -> bytes | None:
    """The request's session digest: its ``X-Session-Id`` (not empty), else the digest of its body's ``user``
    (:mod:`edge.body`), else None. Any header value hashes: aiohttp caps a header line at 8 KiB and decodes
    bytes that are not UTF-8 as lone surrogates, which ``surrogatepass`` encodes back."""
    if header:
        return session_digest(header.encode("utf-8", "surrogatepass"))
    return user_digest


def placement_of(headers, path: str, user_digest: bytes | None, body: bytes | None,
                 uses: str = "signalled") -> tuple[bytes | None, str]:
    """What places a request, and how (the ``by`` of ``eas_edge_rollout_choices``): its session key
    (:func:`session_of`), ``"session"``; else its request key (:func:`~eas_wire.rollout.request_digest` of its
    ``Authorization`` value, ``path`` and its ``Idempotency-Key`` or ``body``, its body's digest),
    ``"request"``, when ``uses`` (``rollout_request_key``) is ``always``, or ``signalled`` and the request
    carries ``Idempotency-Key`` or ``x-stainless-retry-count``; else (None, ``"counter"``).

    Nothing here is a choice a client does not already have with a session key: every key is hashed with the
    rollout's salt before it meets the weight, so a client can only try requests and watch where its own
    land (as it can by sending a request again under the counter), and no header names a side or carries a
    digest that would be used as it is."""
    session = session_of(headers.get(SESSION_HEADER), user_digest)
    if session is not None:
        return session, "session"
    idempotency = headers.get(IDEMPOTENCY_HEADER) or None
    signalled = idempotency is not None or RETRY_COUNT_HEADER in headers
    if body is None or uses == "never" or (uses == "signalled" and not signalled):
        return None, "counter"
    credential = headers.get("Authorization") or ""
    return request_digest(credential.encode("utf-8", "surrogatepass"), path, body,
                          None if idempotency is None else idempotency.encode("utf-8", "surrogatepass")), "request"


class RolloutFollower:
    def __init__(self, datacenter: str = layout.DEFAULT_DATACENTER, registry: CollectorRegistry | None = None,
                 clock=time.time):
        self.key = layout.rollout_key(datacenter)
        self.doc: RolloutDoc | None = None
        self.counter = CanaryCounter()
        self._keyed: tuple[RolloutDoc | None, bytes] = (None, b"")  # (document, its key of the sessions' hash)
        self.clock = clock
        self.applied_at = 0.0  # when the current document was taken (this edge's clock)
        self.read_errors = 0
        self.last_error: str | None = None
        self._sides: tuple[object, object, frozenset, frozenset] | None = None  # (snapshot, doc, canary, stable)
        self._side_of: dict[str, str] = {}  # IU -> revision label (the doc's stable or canary)
        registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("eas_edge_rollout_requests", "Requests finished on an IU, by the rollout revision "
                                "of that IU (only while a rollout document is in force).", ["revision"],
                                registry=registry)
        self.errors = Counter("eas_edge_rollout_errors", "Requests that failed on an IU (failed: connection or "
                              "stream; status_5xx: the IU's 5xx answer), by its rollout revision.",
                              ["revision", "kind"], registry=registry)
        self.ttft = Histogram("eas_edge_rollout_ttft_seconds", "Time to the first byte from an IU, by its rollout "
                              "revision.", ["revision"], buckets=ROLLOUT_TTFT_BUCKETS, registry=registry)
        self.unit_ttft = Summary("eas_edge_rollout_unit_ttft_seconds", "Time to the first byte from each IU, by "
                                 "its rollout revision (sum and count).", ["revision", "iu"], registry=registry)
        self.choices = Counter("eas_edge_rollout_choices", "Requests given a side while a rollout document is in "
                               "force, by how (session: the session key's hash; request: the request key's hash; "
                               "counter: no key).", ["by"], registry=registry)
        self.fallbacks = Counter("eas_edge_rollout_fallbacks", "Requests whose drawn revision had no routable IU "
                                 "for them (served by any IU).", registry=registry)
        self.weight = Gauge("eas_edge_rollout_weight", "The canary's share this edge applies (-1: no rollout).",
                            registry=registry)
        self.read_errors_metric = Counter("eas_edge_rollout_read_errors", "Rollout documents that did not parse "
                                          "(the last good one stays).", registry=registry)
        self.weight.set(-1)

    # -- the document ---------------------------------------------------------------------------------
    def apply_kv(self, entries: list) -> None:
        """The document's KV entry as a listing of at most one (``ConsulIO.kv_entry``, through
        :meth:`ConsulWatcher.follow`); an empty listing: no rollout."""
        value = None
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and entry.get("Key") == self.key:
                value = entry.get("Value")
        if not value:
            if self.doc is not None:
                log.info("rollout %s: document removed; every IU serves every request", self.doc.name)
            self._take(None)
            return
        try:
            doc = loads(value)
        except RolloutError as exc:
            self.read_errors += 1
            self.read_errors_metric.inc()
            self.last_error = str(exc)
            log.warning("%s: %s; keeping the last good document", self.key, exc)
            return
        if doc != self.doc:
            log.info("rollout %s: %s, canary %s at %.4g", doc.name, doc.state, doc.canary, doc.effective_weight)
            self._take(doc)

    def _take(self, doc: RolloutDoc | None) -> None:
        self.doc, self.applied_at = doc, self.clock()
        self.weight.set(doc.effective_weight if doc is not None else -1)

    # -- per request ----------------------------------------------------------------------------------
    def sides(self, snapshot: Snapshot) -> tuple[frozenset, frozenset]:
        """(canary IUs, stable-side IUs) of ``snapshot`` under the current document (kept per snapshot)."""
        doc, cached = self.doc, self._sides
        if cached is not None and cached[0] is snapshot and cached[1] is doc:
            return cached[2], cached[3]
        canary = frozenset(e.iu_id for e in snapshot.entries if e.revision == doc.canary)
        stable = frozenset(e.iu_id for e in snapshot.entries if e.iu_id not in canary)
        self._side_of = {**{iu: doc.stable for iu in stable}, **{iu: doc.canary for iu in canary}}
        self._sides = (snapshot, doc, canary, stable)
        return canary, stable

    def split(self, snapshot: Snapshot, not_serving: frozenset[str], session: bytes | None = None,
              by: str = "session") -> frozenset[str]:
        """``not_serving`` plus the IUs of the side this request does not go to; ``session``: its session or
        request digest (:func:`placement_of`, which also gives ``by``), None without a key (see the module
        docstring)."""
        doc = self.doc
        if doc is None:
            return not_serving
        canary, stable = self.sides(snapshot)
        if session is None:
            to_canary = self.counter.take(doc.effective_weight)
            self.choices.labels("counter").inc()
        else:
            to_canary = session_on_canary(session_point(self._session_key(doc), session), doc.effective_weight)
            self.choices.labels(by).inc()
        mine, other = (canary, stable) if to_canary else (stable, canary)
        if not other:
            return not_serving
        if not any(e.iu_id in mine and e.iu_id not in not_serving for e in snapshot.healthy):
            self.fallbacks.inc()
            return not_serving
        return not_serving | other

    def _session_key(self, doc: RolloutDoc) -> bytes:
        """``doc``'s key of the sessions' hash, kept with the document it came from (the watcher's thread
        replaces the document; a key of another document must never be paired with this one)."""
        keyed = self._keyed
        if keyed[0] is not doc:
            keyed = (doc, doc.session_key())
            self._keyed = keyed
        return keyed[1]

    def _revision(self, iu_id: str) -> str | None:
        if self.doc is None:
            return None
        return self._side_of.get(iu_id, self.doc.stable)

    def first_byte(self, iu_id: str, seconds: float) -> None:
        revision = self._revision(iu_id)
        if revision is not None and math.isfinite(seconds):
            self.ttft.labels(revision).observe(seconds)
            self.unit_ttft.labels(revision, iu_id).observe(seconds)

    def finished(self, iu_id: str, failed: bool, status: int = 0) -> None:
        """A request's slot on ``iu_id`` released: ``failed`` (its connection or stream failed) or ``status``
        (the IU's error answer: a 5xx is the IU's failure, a 4xx the client's)."""
        revision = self._revision(iu_id)
        if revision is not None:
            self.requests.labels(revision).inc()
            if failed:
                self.errors.labels(revision, "failed").inc()
            elif status >= 500:
                self.errors.labels(revision, "status_5xx").inc()
