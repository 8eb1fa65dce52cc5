"""One edge's routing decisions: ``pick()`` over the pool view, minus IUs this edge cannot use right now.

:class:`Router` is pure given its arguments (time and randomness are parameters), so ``bench/route_sim.py``
runs this very class in simulated time and the proxy runs it in real time: what the benchmark's ``ours``
rows measure is what ships.

Per request: the IUs at this edge's per-IU concurrency cap, ejected (a failed connection or a stream that
died, for ``eject_s``) or already tried for this request are removed from the snapshot's candidates; then
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

from edge.pool import EdgeLedger, IUEntry, Snapshot, pick
from edge.pool.pick import prefill_cost_s


@dataclass(frozen=True)
class Decision:
    iu_id: str | None
    mode: str  # p2c | single | fail_open | saturated | none
    entry: IUEntry | None = None
    cost_s: float | None = None  # this request's prefill seconds on the chosen IU (None: unknown)
    expected_s: float | None = None  # its predicted TTFT there (pick's cost; None: fail-open, no score)
    queued_as_s: float | None = None  # what the IU's score counts a request waiting there as (its mean request)


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
    def __init__(self, rng: random.Random, max_inflight_per_iu: int = 1 << 30, eject_s: float = 5.0,
                 announcing: bool = False):
        """``announcing``: this edge announces its requests to the node agents (edge/announce.py): the ledger
        numbers them and leaves the ones a score acknowledges out of their IU's cost."""
        self.rng, self.cap, self.eject_s = rng, max_inflight_per_iu, eject_s
        self.ledger = EdgeLedger(announcing)
        self.ejected: dict[str, float] = {}  # iu -> until
        self.full: set[str] = set()  # IUs at the cap (kept on sent/done: no scan of every IU per request)

    def blocked(self, now: float, exclude: set[str] | frozenset = frozenset()) -> set[str]:
        blocked = set(exclude)
        if self.ejected:
            for iu_id, until in list(self.ejected.items()):
                if until <= now:
                    del self.ejected[iu_id]
                else:
                    blocked.add(iu_id)
        blocked.update(self.full)
        return blocked

    def choose(self, snapshot: Snapshot, now: float, prompt_tokens: int | None,
               exclude: set[str] | frozenset = frozenset()) -> Decision:
        """Decide (no side effect on the ledger: :meth:`sent` records the request once it is sent)."""
        if not snapshot.healthy:
            return Decision(None, "none")
        blocked = self.blocked(now, exclude)
        usable = without(snapshot, blocked) if blocked else snapshot
        if not usable.healthy:
            routable_left = any(e.iu_id not in exclude and e.iu_id not in self.ejected for e in snapshot.healthy)
            return Decision(None, "saturated" if routable_left else "none")
        choice = pick(usable, self.ledger, now, self.rng, prompt_tokens=prompt_tokens)
        entry = _by_id(snapshot).get(choice.iu_id)
        cost = prefill_cost_s(entry, prompt_tokens) if prompt_tokens and entry is not None else None
        # The queued-prompt rule trusts pick's predicted queue wait, which is only as good as the score it
        # came from: on scores as old as Consul's (median ~0.5 s at pick) it measured worse (Consul only,
        # seeds 1-6: +93 ms mean p99, worse on 5 of 6), so it applies to fresh, pushed-age scores only.
        fresh = entry is not None and entry.score is not None and now - entry.ts <= QUEUED_RULE_MAX_AGE_S
        queued_as = entry.request_cost_s if fresh else None
        return Decision(choice.iu_id, choice.mode, entry, cost, choice.expected_s, queued_as)

    def sent(self, iu_id: str, now: float, cost_s: float | None = None, handle=None,
             expected_s: float | None = None, queued_as_s: float | None = None) -> int:
        """Record a request sent to ``iu_id``; returns its announce sequence number (0 when not announcing).

        ``handle`` (any hashable naming the request) and ``expected_s`` (Decision.expected_s): the ledger
        awaits its first byte (:meth:`first_byte`), so an overdue request marks its IU busier than scored.
        ``queued_as_s`` (Decision.queued_as_s): while the request is predicted to wait in the IU's queue,
        scores newer than its send still undercount a long prompt (EdgeLedger.on_sent)."""
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
        self.ejected[iu_id] = now + self.eject_s

    def inflight(self, iu_id: str) -> int:
        return self.ledger.inflight.get(iu_id, 0)
