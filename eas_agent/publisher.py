"""Publish a node's IU scores with Consul's write load kept bounded.

One KV key per node (``clusterctl/eas/<dc>/<node>``, :func:`consul_io.layout.score_key`) holds every IU's score, level, status, components and
the node's sequence number, timestamp and clock offset. A write happens when

- an IU's score crosses to another quantized level (geometric levels, 25% apart, with hysteresis: the score
  must move 0.5 + ``hysteresis`` levels away from the published level), or its status / known-ness changes;
- or the heartbeat (default 2 s) is due;

and never more often than ``min_write_interval_s`` (a change inside it waits for the next slot), except an
*urgent rise*: an IU whose score rose by ``urgent_rise_s`` or more above the score last written (drain: 0.5
s, two min-changes; a long prompt just landed on an IU that looked free) is written at once. Edges that
read only the KV route on it until the next write, so a rise unwritten for up to a second is what sends
every edge's short requests behind that prompt (bench/route_sim.py's Consul-only rows: of the slowest 2%
of requests, most went to an IU published at ~0 s whose true wait was ~2 s). Every write takes a token
from a bucket refilled at ``write_rate_per_s`` (0.95/s) up to ``write_burst`` (2): a node writes at most
``write_burst + 1 + write_rate_per_s x T`` times in any T seconds, so the rate stays under the budget of 1
write/node/s however often scores rise. A level change that is not urgent also leaves one token for the
next urgent rise (it waits while fewer than 2 are left; a status change needs one); the heartbeat is written even without a token (the key
must not go stale) and leaves the bucket at most one token in debt. Writes use CAS on the key's last
ModifyIndex, so two agents claiming one node cannot silently overwrite each other.

While edges read the node's bodies on its ``/scores`` stream (``streamed``: the agent's HTTP server holds an
edge's signed stream), those edges route on each cycle's body and the KV is what the others fall back to:
a level change that is not urgent then waits for the heartbeat (which writes the current state), while
urgent rises and status changes are still written at once. The KV-only readers lose level moves of less
than ``urgent_rise_s`` for up to a heartbeat; the write rate drops by the share of level writes
(docs/decisions/0024-cache-routing-targets.md).

The key is the agent's only output in Consul: each IU's status in the body is its verdict, and a body older
than three heartbeats tells readers the agent stopped publishing. The agent holds no Consul service rights
(no TTL checks): a token that may update an IU's check may also take the IU out of maintenance, since Consul
requires ``service:write`` on the service for both, and that would let the agent bypass the preflight gate.

Consul unavailable: the caller keeps collecting; this class skips writes during an exponential backoff with
full jitter and, on recovery, catches up with one write of the current state.

Time is explicit (``now`` arguments) so benchmarks drive it with a simulated clock; the store is any
:class:`ScoreStore` (``consul_io.client.ConsulIO`` in production, ``sim.memstore.MemoryStore`` in simulations).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from consul_io.client import ConsulUnavailable
from eas_agent.score import CRITICAL, ScoreResult
from eas_wire.scorebody import IUScore, ScoreBody


def _finite_or_none(value):
    """The body is strict JSON (no NaN/Infinity): a number that is not finite is published as unknown."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ScoreStore(Protocol):
    def kv_read(self, key: str) -> tuple[int, str | None]: ...

    def kv_cas_write(self, key: str, value: str, cas: int) -> int | None: ...


class Quantizer:
    """Geometric score levels (``ratio`` apart above ``base``) with hysteresis against flapping.

    ``min_change``: a score within this much of the published level's value keeps that level, however
    many levels apart it is. Near zero the geometric levels are 50 ms apart, and an idle-ish IU's drain
    score flips every cycle between 0 and one short prompt's prefill in flight (~30-100 ms: vLLM V1 counts
    a prompt's tokens only at its first token, so a cycle that lands mid-prefill sees it admitted, and a
    900-token prompt takes ~70 ms); each flip was a write (bench/consul_load.py on the one engine model:
    1.48 writes/node/s on its realistic trace, over the 1/s budget; 1.09 with 0.25 s). The drain profile
    uses 0.25 s, with a 1 s min write interval (<= 1 write/node/s by construction). The Consul snapshot is
    the fallback: fresh scores come pushed from the agent's /scores, unquantized."""

    def __init__(self, base: float, ratio: float = 1.25, hysteresis: float = 0.3, min_change: float = 0.0):
        self.base, self.log_ratio, self.hysteresis = base, math.log(ratio), hysteresis
        self.min_change = min_change

    def position(self, score: float) -> float:
        return math.log1p(max(score, 0.0) / self.base) / self.log_ratio

    def value(self, level: int) -> float:
        """The score at the centre of ``level`` (inverse of :meth:`position`)."""
        return self.base * math.expm1(level * self.log_ratio)

    def level(self, previous: int | None, score: float | None) -> int | None:
        if score is None or not math.isfinite(score):
            return None
        position = self.position(score)
        if previous is not None and (abs(position - previous) <= 0.5 + self.hysteresis
                                     or abs(score - self.value(previous)) <= self.min_change):
            return previous
        return int(round(position))


# Level base per profile: drain scores are seconds (50 ms resolution near zero); seed's are ~GB + s + MB/s.
QUANTIZER_BASE = {"drain": 0.05, "seed": 1.0}
# Smallest change that is written (Quantizer.min_change): drain seconds; seed's units have no such floor.
QUANTIZER_MIN_CHANGE = {"drain": 0.25, "seed": 0.0}
# A rise this large is written inside min_write_interval_s (token permitting); seed's units: none.
URGENT_RISE = {"drain": 0.5, "seed": None}
WRITE_RATE_PER_S = 0.95  # the budget is 1 write per node per second; 5% for the burst
WRITE_BURST = 2.0


@dataclass
class Backoff:
    base_s: float = 0.25
    cap_s: float = 5.0
    failures: int = 0
    next_attempt: float = 0.0

    def failed(self, now: float, rng: random.Random) -> None:
        self.failures += 1
        delay = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        self.next_attempt = now + rng.uniform(delay / 2, delay)  # jittered so agents do not retry in step

    def succeeded(self) -> None:
        self.failures = 0
        self.next_attempt = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.next_attempt


@dataclass
class PublisherStats:
    writes: int = 0
    skips: int = 0  # cycles with nothing worth writing
    deferred: int = 0  # changes held back by min_write_interval_s or the token bucket
    cas_conflicts: int = 0
    errors: int = 0
    last_error: str = ""
    last_write: float | None = None
    write_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class _Published:
    level: int | None = None
    score: float | None = None  # the score last written (urgent rises are measured from it)
    status: str | None = None


class Publisher:
    def __init__(
        self,
        store: ScoreStore,
        *,
        key: str,
        node: str,
        rack: str,
        iu_ids: list[str],
        profile: str = "drain",
        heartbeat_s: float = 2.0,
        min_write_interval_s: float = 1.0,
        write_rate_per_s: float = WRITE_RATE_PER_S,
        write_burst: float = WRITE_BURST,
        urgent_rise_s: float | None | str = "profile",
        cycle_s: float = 0.2,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock_offset=lambda: None,
        streamed=lambda: False,
    ):
        self.store, self.key, self.node, self.rack = store, key, node, rack
        self.iu_ids = list(iu_ids)
        self.profile, self.heartbeat_s = profile, heartbeat_s
        self.min_write_interval_s = min_write_interval_s
        if write_rate_per_s <= 0 or write_burst < 1:
            raise ValueError(f"write_rate_per_s must be > 0 and write_burst >= 1, got {write_rate_per_s}, {write_burst}")
        self.write_rate_per_s, self.write_burst = write_rate_per_s, write_burst
        self.urgent_rise_s = URGENT_RISE[profile] if urgent_rise_s == "profile" else urgent_rise_s
        self.tokens, self.tokens_at = write_burst, None
        # a change that is not urgent leaves this many tokens for the next urgent rise
        self.reserve = min(1.0, write_burst - 1.0) if self.urgent_rise_s is not None else 0.0
        self.cycle_s = cycle_s  # the heartbeat write happens on the last cycle before the age would pass it
        self.quantizer = Quantizer(QUANTIZER_BASE[profile], min_change=QUANTIZER_MIN_CHANGE[profile])
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.clock_offset = clock_offset
        self.streamed = streamed  # () -> True while an edge reads this node's bodies on its /scores stream
        self.published = {iu: _Published() for iu in self.iu_ids}
        self.levels: dict[str, int | None] = {iu: None for iu in self.iu_ids}
        self.modify_index: int | None = None
        self.seq = 0  # of the last write known to have reached the store; strictly increasing, never reused
        self.catch_up = True  # write the current state at the first cycle, and again after an outage
        self.stats = PublisherStats()
        self.last_body: ScoreBody | None = None
        self.stopped = False  # after stop(): a step still in flight on another thread must not undo it

    # -- decisions (pure) ---------------------------------------------------------------------------
    def levels_for(self, results: dict[str, ScoreResult]) -> dict[str, int | None]:
        return {iu: self.quantizer.level(self.levels.get(iu), results[iu].score) for iu in results}

    def write_reason(
        self, now: float, results: dict[str, ScoreResult], levels: dict[str, int | None]
    ) -> str | None:
        if self.stats.last_write is None or self.catch_up:
            return "first"
        reason = None
        for iu, result in results.items():
            published = self.published[iu]
            if result.status != published.status:
                return "status"
            if levels[iu] != published.level:
                if (self.urgent_rise_s is not None and result.score is not None and published.score is not None
                        and result.score - published.score >= self.urgent_rise_s):
                    return "rise"
                reason = "level"
        if reason is not None and not self.streamed():
            return reason
        if now - self.stats.last_write + self.cycle_s > self.heartbeat_s + 1e-9:
            return "heartbeat"
        return None  # a level change while streamed: the streams carry it, the heartbeat writes it

    def body(
        self,
        now: float,
        results: dict[str, ScoreResult],
        levels: dict[str, int | None],
        seq: int | None = None,
    ) -> ScoreBody:
        score_ok = {iu: _finite_or_none(r.score) for iu, r in results.items()}
        return ScoreBody(
            node=self.node,
            rack=self.rack,
            profile=self.profile,
            seq=self.seq if seq is None else seq,
            ts=round(now, 3),
            clock_offset_s=_finite_or_none(self.clock_offset()),
            heartbeat_s=self.heartbeat_s,
            ius={
                iu: IUScore(
                    score=score_ok[iu],
                    level=levels[iu] if score_ok[iu] is not None else None,
                    status=r.status,
                    reason=r.reason,
                    components={k: _finite_or_none(v) for k, v in r.components.items()},
                    collectors=r.collectors,
                )
                for iu, r in results.items()
            },
        )

    # -- one cycle ------------------------------------------------------------------------------------
    def step(self, now: float, results: dict[str, ScoreResult]) -> bool:
        """Publish what this cycle warrants. True when the KV key was written. Never raises for Consul."""
        if self.stopped or not self.backoff.ready(now):
            self.stats.skips += 1
            return False
        try:
            written = self._maybe_write(now, results)
            self.catch_up = False
            self.backoff.succeeded()
            return written
        except ConsulUnavailable as exc:
            self.stats.errors += 1
            self.stats.last_error = str(exc)
            self.catch_up = True
            self.modify_index = None
            self.backoff.failed(now, self.rng)
            return False

    def _maybe_write(self, now: float, results: dict[str, ScoreResult]) -> bool:
        levels = self.levels_for(results)
        reason = self.write_reason(now, results, levels)
        if reason is None or self.stopped:
            self.stats.skips += 1
            return False
        if self.tokens_at is not None:
            self.tokens = min(self.write_burst, self.tokens + (now - self.tokens_at) * self.write_rate_per_s)
        self.tokens_at = now
        if reason in ("level", "status", "rise"):
            inside = self.stats.last_write is not None and now - self.stats.last_write < self.min_write_interval_s
            needed = 1.0 + self.reserve if reason == "level" else 1.0
            if (inside and reason != "rise") or self.tokens < needed - 1e-9:
                self.stats.deferred += 1
                return False
        self._write(now, results, levels)
        self.tokens = max(-1.0, self.tokens - 1.0)
        self.stats.write_reasons[reason] = self.stats.write_reasons.get(reason, 0) + 1
        return True

    def _write(self, now: float, results: dict[str, ScoreResult], levels: dict[str, int | None]) -> None:
        for _attempt in (1, 2):
            if self.modify_index is None:
                self._sync_from_store()
            body = self.body(now, results, levels, seq=self.seq + 1)
            written = self.store.kv_cas_write(self.key, body.dumps(), self.modify_index)
            if written is not None:
                break
            # Someone else wrote the key (an earlier run, a duplicate agent): re-read, retry once.
            self.stats.cas_conflicts += 1
            self.modify_index = None
        else:
            raise ConsulUnavailable(f"CAS on {self.key} failed twice (another writer?)")
        self.seq = body.seq
        self.stats.writes += 1
        self.stats.last_write = now
        self.last_body = body
        for iu, result in results.items():
            self.published[iu].level, self.published[iu].status = levels[iu], result.status
            self.published[iu].score = result.score
            self.levels[iu] = levels[iu]
        self.modify_index = written  # the next CAS's index: no read after a write

    def _sync_from_store(self) -> None:
        """Index for the CAS, and the sequence number to continue from: a write that reached Consul while its
        answer was lost (or an earlier run of this agent) has already used a number; never reuse one."""
        index, value = self.store.kv_read(self.key)
        self.modify_index = index
        try:
            stored_seq = int(json.loads(value).get("seq", 0)) if value else 0
        except (ValueError, TypeError, AttributeError):
            stored_seq = 0
        self.seq = max(self.seq, stored_seq)

    def stop(self, now: float, results: dict[str, ScoreResult] | None = None) -> None:
        """Mark every IU critical ("agent stopping") in the KV; best effort, never raises."""
        self.stopped = True
        stopping = {
            iu: ScoreResult(
                None,
                CRITICAL,
                "agent stopping",
                (results or {}).get(iu, ScoreResult(None, CRITICAL, "")).components,
            )
            for iu in self.iu_ids
        }
        try:
            self._write(now, stopping, {iu: None for iu in self.iu_ids})
        except ConsulUnavailable as exc:
            self.stats.last_error = str(exc)
