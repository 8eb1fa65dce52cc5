"""One edge's routing decisions: ``pick()`` over the pool view, minus IUs this edge cannot use right now.

:class:`Router` is pure given its arguments (time and randomness are parameters), so ``bench/route_sim.py``
runs this very class in simulated time and the proxy runs it in real time: what the benchmark's ``ours``
rows measure is what ships.

Per request: the IUs at this edge's per-IU concurrency cap, ejected for their results (:mod:`edge.ejection`),
silent (:mod:`edge.liveness`: the proxy's relayed streams, on the monotonic clock; never in a simulation,
which relays none) or already tried for this request are removed from the snapshot's candidates; then
``pick()`` with the request's prompt size; the chosen IU's ledger entry is the request's prefill seconds on
that IU (prompt tokens / its measured ``prefill_tps``). A streamed request is also awaited until its first
byte (``sent(..., handle, expected_s)`` then ``first_byte``): while one is overdue past the TTFT pick
predicted for it, its IU costs that much more (``EdgeLedger.overdue_s``). Outcomes:

- an IU (``p2c``, ``single`` or ``fail_open``: pick's rules, fail-open = least in-flight of the routable);
- ``saturated``: routable IUs exist but every one is at the cap or excluded: the caller queues;
- ``none``: no routable IU at all (none registered, all critical or in maintenance): 503 at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from edge.ejection import Outliers
from edge.liveness import Liveness
from edge.pool import EdgeLedger, IUEntry, Snapshot, pick
from edge.pool.pick import prefill_cost_s
from edge.pool.prefix import NO_PREFIX, Cached, HomeRing, PrefixIndex, PromptPrefix, cached_tokens


@dataclass(frozen=True)
class Decision:
    iu_id: str | None
    mode: str  # p2c | single | fail_open | saturated | none
    entry: IUEntry | None = None
    cost_s: float | None = None  # this request's prefill seconds on the chosen IU (None: unknown)
    expected_s: float | None = None  # its predicted TTFT there (pick's cost; None: fail-open, no score)
    queued_as_s: float | None = None  # what the IU's score counts a request waiting there as (its mean request)
    cached_tokens: int = 0  # of the prompt, tokens estimated in the chosen IU's prefix cache

    def prefill_tokens(self, prompt_tokens: int) -> int:
        """Of a ``prompt_tokens`` prompt, the tokens the chosen IU is expected to prefill: those not estimated
        in its prefix cache, at least one (vLLM always computes a prompt's last token)."""
        return max(1, prompt_tokens - self.cached_tokens)


# Pushed scores are at most ~0.22 s old at pick (200 ms agent cycle + transit + the 20 ms apply interval).
QUEUED_RULE_MAX_AGE_S = 0.3


def _by_id(snapshot: Snapshot) -> dict[str, IUEntry]:
    by_id = snapshot.memo.get("by_id")
    if by_id is None:
        by_id = snapshot.memo["by_id"] = snapshot.by_id()
    return by_id


def without(snapshot: Snapshot, blocked: set[str]) -> Snapshot:
    """The snapshot with ``blocked`` IUs removed from the candidates (entries stay, for display)."""
    scored = tuple(e for e in snapshot.scored if e.iu_id not in blocked)
    healthy = tuple(e for e in snapshot.healthy if e.iu_id not in blocked)
    fresh_until = min((e.stale_after for e in scored), default=float("inf"))
    return Snapshot(snapshot.entries, scored, healthy, fresh_until, snapshot.built)


class Router:
    def __init__(self, rng: random.Random, max_inflight_per_iu: int = 1 << 30, eject_s: float = 2.0,
                 announcing: bool = False, prefix: PrefixIndex | None = None):
        """``announcing``: this edge announces its requests to the node agents (edge/announce.py): the ledger
        numbers them and leaves the ones a score acknowledges out of their IU's cost. ``prefix``: the index of
        prompts sent per IU (edge/pool/prefix.py); None: routing ignores prefix caches."""
        self.rng, self.cap, self.eject_s = rng, max_inflight_per_iu, eject_s
        self.prefix = prefix
        self._home_ring: HomeRing | None = None
        self.ledger = EdgeLedger(announcing)
        self.outliers = Outliers(eject_s)
        self.liveness = Liveness()  # IUs whose streams all went silent (a stalled engine's first sign)
        self.full: set[str] = set()  # IUs at the cap (kept on sent/done: no scan of every IU per request)

    def blocked(self, now: float, exclude: set[str] | frozenset = frozenset(), pool_size: int = 0) -> set[str]:
        blocked = set(exclude)
        if self.liveness.relaying:
            blocked.update(self.liveness.silent(pool_size))
        if self.outliers.ejected or self.outliers.records:
            blocked.update(self.outliers.blocked(now))
        blocked.update(self.full)
        return blocked

    def cached(self, snapshot: Snapshot, prompt_tokens: int | None, hashes,
               home_key: int = 0, context_tokens: int = 0) -> Cached | None:
        """IU -> tokens of the prompt estimated cached there (None: nothing known, or no index).

        Three sources: the prompts this edge sent (the index), a prefix common to many IUs (cached on all),
        and the conversation's home IU (``home_key``: edge/pool/prefix.py's rendezvous hash, the same at
        every edge), presumed to hold the conversation so far (``context_tokens``, the messages before the
        last) unless it publishes prefix caching off (hit rate -1) or the index knows an IU holding at least
        half of that context: with every edge's placements relayed (:meth:`learn`) the index knows where the
        previous turn went (the previous prompt; the reply after it is never in the index, hence half), and
        a presumed home would outbid the IU that really holds it."""
        if self.prefix is None or not prompt_tokens:
            return None
        by_id = _by_id(snapshot)
        blocks, common = self.prefix.match(hashes) if hashes else ({}, 0)
        per_block = self.prefix.tokens_per_block
        cached = Cached(cached_tokens(common, prompt_tokens, None, per_block))
        for iu_id, n in blocks.items():
            entry = by_id.get(iu_id)
            hit = cached_tokens(n, prompt_tokens, entry.terms.prefix_hit_rate if entry is not None else None,
                                per_block)
            if hit > cached.default:
                cached[iu_id] = hit
        if home_key and context_tokens > 0:
            home = self._ring(snapshot).home(home_key)
            entry = by_id.get(home)
            rate = entry.terms.prefix_hit_rate if entry is not None else None
            presumed = min(context_tokens, prompt_tokens - 1) if rate is None or rate >= 0 else 0
            known = max(cached.values(), default=0)  # the deepest of the prompt the index places on an IU
            if home is not None and presumed > cached[home] and 2 * known < presumed:
                cached.presumed = (home, cached[home])
                cached[home] = presumed
        return cached if cached or cached.default else None

    def _ring(self, snapshot: Snapshot) -> HomeRing:
        """The home ring of the snapshot's routable IUs (rebuilt only when they change)."""
        ring = snapshot.memo.get("home_ring")
        if ring is None:
            ids = tuple(sorted(e.iu_id for e in snapshot.healthy))
            if self._home_ring is None or self._home_ring.iu_ids != ids:
                self._home_ring = HomeRing(ids)
            ring = snapshot.memo["home_ring"] = self._home_ring
        return ring

    @property
    def ejected(self) -> dict[str, float]:
        """IU -> until: the IUs ejected for their results (:mod:`edge.ejection`)."""
        return self.outliers.ejected

    @ejected.setter
    def ejected(self, ejected: dict[str, float]) -> None:
        self.outliers.ejected = ejected

    def choose(self, snapshot: Snapshot, now: float, prompt_tokens: int | None,
               exclude: set[str] | frozenset = frozenset(), prefix: PromptPrefix = NO_PREFIX) -> Decision:
        """Decide (no side effect on the ledger: :meth:`sent` records the request once it is sent).
        ``prefix``: the prompt's block hashes, its conversation's key and the tokens before its last message
        (edge/pool/prefix.py; :meth:`cached`)."""
        if not snapshot.healthy:
            return Decision(None, "none")
        blocked = self.blocked(now, exclude, len(snapshot.healthy))
        usable = without(snapshot, blocked) if blocked else snapshot
        if not usable.healthy:
            routable_left = any(e.iu_id not in exclude and e.iu_id not in self.ejected for e in snapshot.healthy)
            return Decision(None, "saturated" if routable_left else "none")
        cached = self.cached(snapshot, prompt_tokens, *prefix)
        choice = pick(usable, self.ledger, now, self.rng, prompt_tokens=prompt_tokens, cached=cached)
        entry = _by_id(snapshot).get(choice.iu_id)
        # What the request adds to the IU (the ledger's cost, the announced prefill) counts only the cache the
        # index backs: a presumed home's context may not be there, and charging it as cached makes the IU look
        # idle to every edge at once while the request prefills the whole conversation.
        hit = cached.backed(choice.iu_id) if cached is not None and choice.iu_id is not None else 0  # a Cached
        cost = prefill_cost_s(entry, prompt_tokens - hit) if prompt_tokens and entry is not None else None
        # The queued-prompt rule trusts pick's predicted queue wait, which is only as good as the score it
        # came from: on scores as old as Consul's (median ~0.5 s at pick) it measured worse (Consul only,
        # seeds 1-6: +93 ms mean p99, worse on 5 of 6), so it applies to fresh, pushed-age scores only.
        fresh = entry is not None and entry.score is not None and now - entry.ts <= QUEUED_RULE_MAX_AGE_S
        queued_as = entry.request_cost_s if fresh else None
        return Decision(choice.iu_id, choice.mode, entry, cost, choice.expected_s, queued_as, hit)

    def learn(self, placements) -> None:
        """Prompts other edges sent (the agents' relay, edge/pool/prefix.py's ``RelayedPlacements``): (IU,
        (depth, hash) blocks) each, into the prefix index."""
        if self.prefix is not None:
            record = self.prefix.record_blocks
            for iu_id, blocks in placements:
                record(iu_id, blocks)

    def sent(self, iu_id: str, now: float, cost_s: float | None = None, handle=None,
             expected_s: float | None = None, queued_as_s: float | None = None, prefix_hashes=None) -> int:
        """Record a request sent to ``iu_id``; returns its announce sequence number (0 when not announcing).

        ``handle`` (any hashable naming the request) and ``expected_s`` (Decision.expected_s): the ledger
        awaits its first byte (:meth:`first_byte`), so an overdue request marks its IU busier than scored.
        ``queued_as_s`` (Decision.queued_as_s): while the request is predicted to wait in the IU's queue,
        scores newer than its send still undercount a long prompt (EdgeLedger.on_sent)."""
        if self.prefix is not None and prefix_hashes:
            self.prefix.record(iu_id, prefix_hashes)
        seq = self.ledger.on_sent(iu_id, now, cost_s, handle, expected_s, queued_as_s)
        if self.ledger.inflight[iu_id] >= self.cap:
            self.full.add(iu_id)
        return seq

    def first_byte(self, iu_id: str, handle) -> None:
        self.ledger.on_first_byte(iu_id, handle)

    def done(self, iu_id: str, handle=None) -> None:
        self.ledger.on_done(iu_id, handle)
        if self.ledger.inflight.get(iu_id, 0) < self.cap:
            self.full.discard(iu_id)

    def eject(self, iu_id: str, now: float) -> None:
        """Eject at once (a definitive failure), within the cap on the ejected share."""
        self.outcome(iu_id, now, "definitive", 1 << 30)

    def outcome(self, iu_id: str, now: float, result: str, pool_size: int) -> bool:
        """A request's end on ``iu_id``: ``ok``, ``failed``, ``definitive`` (:mod:`edge.ejection`) or
        ``neutral`` (the edge's own fault, the client left). True when the IU was ejected by it."""
        if result == "ok":
            self.outliers.succeeded(iu_id)
        elif result == "neutral":
            self.outliers.released(iu_id)
        else:
            return self.outliers.failed(iu_id, now, pool_size, definitive=result == "definitive")
        return False

    def inflight(self, iu_id: str) -> int:
        return self.ledger.inflight.get(iu_id, 0)
