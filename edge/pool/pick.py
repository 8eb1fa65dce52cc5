"""Choose an IU for one request: power of two choices on published score + this edge's unseen load.

Rules, in order:

1. Candidates: routable IUs (health passing/warning, not critical, not in maintenance) with a score that is
   fresh (written within 3 heartbeats) and not gated by the anomaly detector.
2. Power of two choices: sample two distinct candidates (a de-weighted or ramping IU is accepted with
   probability equal to its weight) and keep the lower ``score + sent_s (+ own_s)``, where ``sent_s`` is the
   work this edge sent to the IU since that score's timestamp, which the score cannot know about yet: each
   request's prefill seconds when the edge knew its prompt size (prompt tokens / the IU's measured
   ``prefill_tps``), else the IU's ``request_cost_s`` (its mean request), and for scores newer than a long
   prompt's send while that prompt is predicted still queued, what the score misses of it (a score counts
   a waiting request at the mean request: ``EdgeLedger.on_sent``'s ``queued_as_s``;
   docs/decisions/0002-ledger-queued-prompt-excess.md has its measurement); ``own_s`` is this request's own
   prefill on that IU when ``prompt_tokens`` is given (IUs with different prefill rates differ there),
   plus ``overdue_s``: how far this edge's longest-overdue stream on that IU is past the first byte it was
   predicted to get (its chosen cost at send time). Between score updates that is the one first-hand
   sign that other edges' work or a long prefill is holding the IU (bench/route_sim.py, 80% load, 4 edges,
   same publisher settings, seeds 1/2: p99 TTFT push 1,656/1,982 -> 1,578/1,800 ms, Consul only
   2,115/2,244 -> 2,005/2,078 ms). A larger d (3 or 4
   choices) herds 4 edges onto the same IUs: push p99 1,872 / 1,796 ms vs 1,706 (seed 1).
   Sampling, rather than taking the global minimum, keeps many edges reading the same snapshot from herding
   onto one IU.
3. No fresh scored IU: fail open to the least in-flight (from this edge) of the routable IUs, so a Consul or
   agent outage degrades to least-connections instead of dropping traffic.

``pick`` reads only its arguments (time and randomness included): a simulation drives it with its own clock.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from edge.pool.anomaly import BUSY
from edge.pool.view import IUEntry, Snapshot

SAMPLE_TRIES = 8


@dataclass(frozen=True)
class Choice:
    iu_id: str | None
    mode: str  # p2c | single | fail_open | none
    expected_s: float | None = None  # p2c/single: the chosen IU's cost, this request's predicted TTFT


class EdgeLedger:
    """Requests this edge sent (times and, when known, their prefill seconds) and has in flight, per IU.

    Per IU the known costs are kept as a running sum and the unknown ones as a count, so reading the work
    sent since a score is O(1) plus the entries that just aged out, whatever the request rate.

    With ``announcing`` (the edge announces each request to the IU's node agent, eas_agent/announce.py) each
    request gets the next sequence number; a score whose body acknowledges sequence ``acked`` counts this
    edge's requests up to it (the agent added them), so :meth:`sent_cost_since` leaves those out, except the
    ones whose announcement never arrived (:meth:`unannounce`). Without an acknowledgement (a KV body, an
    agent without the channel) the work is counted by time alone, as without announcing: never twice."""

    def __init__(self, announcing: bool = False):
        self.sent: dict[str, deque] = {}  # iu -> (time, cost_s or None, seq) of each request sent
        self.inflight: dict[str, int] = {}
        self._sums: dict[str, list] = {}  # iu -> [sum of known costs, count of unknown costs] in ``sent``
        self.awaiting: dict[str, dict] = {}  # iu -> {handle: time its first byte is due} (first byte not seen)
        self.queued: dict[str, deque] = {}  # iu -> (sent, admitted by, excess_s, seq): see on_sent's queued_as_s
        self.announcing = announcing
        self.seq = 0  # the last sequence number given (announcing only; 0 = never announced)
        self.unannounced: dict[int, None] = {}  # seqs whose announcement was dropped, oldest first

    def on_sent(self, iu_id: str, now: float, cost_s: float | None = None, handle=None,
                expected_s: float | None = None, queued_as_s: float | None = None) -> int:
        """``cost_s``: the request's prefill seconds on that IU (:func:`prefill_cost_s`); None: unknown,
        counted at the IU's ``request_cost_s`` when the cost is read. ``handle`` and ``expected_s`` (its
        predicted TTFT): the request is awaited until :meth:`on_first_byte` or :meth:`on_done` with that
        handle; while it is overdue the IU costs that much more (:meth:`overdue_s`).

        ``queued_as_s``: what the IU's score counts a request waiting in its queue as (its mean request,
        ``request_cost_s``). A score taken after the send but while the request still waits to be admitted
        (until ``expected_s - cost_s``, the queue pick predicted ahead of it) counts a long prompt at that
        mean: vLLM's waiting gauge is a count, not tokens. The ledger keeps the difference for those scores
        (:meth:`queued_excess`); once admitted, the score's admitted-prefill term counts its real tokens.

        Returns the request's announce sequence number (0 when not ``announcing``)."""
        seq = 0
        if self.announcing:
            self.seq = seq = self.seq + 1
        if handle is not None and expected_s is not None:
            self.awaiting.setdefault(iu_id, {})[handle] = now + expected_s
        if queued_as_s is not None and cost_s is not None and expected_s is not None and cost_s > queued_as_s:
            queued = self.queued.setdefault(iu_id, deque())
            queued.append((now, now + max(0.0, expected_s - cost_s), cost_s - queued_as_s, seq))
            if len(queued) > 4096:  # bound memory, as for ``sent``
                queued.popleft()
        times = self.sent.get(iu_id)
        if times is None:
            times = self.sent[iu_id] = deque()
            self._sums[iu_id] = [0.0, 0]
        times.append((now, cost_s, seq))
        sums = self._sums[iu_id]
        if cost_s is None:
            sums[1] += 1
        else:
            sums[0] += cost_s
        if len(times) > 4096:  # bound memory for an IU whose score never advances
            self._drop(times, sums)
        self.inflight[iu_id] = self.inflight.get(iu_id, 0) + 1
        return seq

    def unannounce(self, seqs) -> None:
        """These requests' announcements were dropped (the agent could not be reached): a later
        acknowledgement of a higher number does not cover them."""
        for seq in seqs:
            self.unannounced[seq] = None
        while len(self.unannounced) > 65536:  # older entries aged out of ``sent`` long ago
            del self.unannounced[next(iter(self.unannounced))]

    def _announced(self, seq: int, acked: int) -> bool:
        return 0 < seq <= acked and seq not in self.unannounced

    def on_first_byte(self, iu_id: str, handle) -> None:
        awaited = self.awaiting.get(iu_id)
        if awaited is not None:
            awaited.pop(handle, None)

    def on_done(self, iu_id: str, handle=None) -> None:
        if self.inflight.get(iu_id, 0) > 0:
            self.inflight[iu_id] -= 1
        if handle is not None:
            self.on_first_byte(iu_id, handle)

    def overdue_s(self, iu_id: str, now: float) -> float:
        """How far past its predicted first byte this edge's longest-overdue request on ``iu_id`` is: work
        the score did not show (other edges' requests, a long prefill since the score) is holding that IU,
        and it is still holding it now. Seen between score updates at no cost: the edge's own streams."""
        awaited = self.awaiting.get(iu_id)
        if not awaited:
            return 0.0
        return max(0.0, now - min(awaited.values()))

    @staticmethod
    def _drop(times: deque, sums: list) -> None:
        cost = times.popleft()[1]
        if cost is None:
            sums[1] -= 1
        else:
            sums[0] -= cost
        if not times:
            sums[0], sums[1] = 0.0, 0  # no float drift survives an empty ledger

    def _since(self, iu_id: str, ts: float) -> deque | None:
        times = self.sent.get(iu_id)
        if times:
            sums = self._sums[iu_id]
            while times and times[0][0] < ts:
                self._drop(times, sums)
        return times

    def sent_since(self, iu_id: str, ts: float) -> int:
        return len(self._since(iu_id, ts) or ())

    def sent_cost_since(self, iu_id: str, ts: float, default_cost_s: float, acked: int = 0) -> float:
        """Seconds of work sent to ``iu_id`` since ``ts`` (unknown costs at ``default_cost_s`` each) that a
        score taken at ``ts`` and counting this edge's announcements up to ``acked`` does not count."""
        excess = self.queued_excess(iu_id, ts, acked) if self.queued else 0.0
        times = self._since(iu_id, ts)
        if not times:
            return excess
        known, unknown = self._sums[iu_id]
        if acked:
            counted_all = True
            for _sent, cost, seq in times:  # oldest first; seqs grow with send time
                if seq > acked:
                    counted_all = False
                    break
                if not self._announced(seq, acked):
                    counted_all = False
                    continue
                if cost is None:
                    unknown -= 1
                else:
                    known -= cost
            if counted_all:  # every one of them: no float residue of the subtractions
                return excess
        return max(0.0, known) + unknown * default_cost_s + excess

    def queued_excess(self, iu_id: str, ts: float, acked: int = 0) -> float:
        """Seconds a score taken at ``ts`` undercounts this edge's long prompts sent before ``ts`` and
        predicted to be still queued at ``ts`` (:meth:`on_sent`'s ``queued_as_s``); a prompt the score
        counts through its announcement (sequence <= ``acked``) has its real size there."""
        queued = self.queued.get(iu_id)
        if not queued:
            return 0.0
        while queued and queued[0][1] < ts:
            queued.popleft()
        return sum(excess for sent, until, excess, seq in queued
                   if sent < ts <= until and not (acked and self._announced(seq, acked)))


def prefill_tps(entry: IUEntry) -> float | None:
    """The IU's measured prompt tokens/s as its agent published it (drain's ``prefill_tps`` term: > 0 when
    present, checked when the body was read)."""
    return entry.terms.prefill_tps


def prefill_cost_s(entry: IUEntry, prompt_tokens: int) -> float:
    """Seconds of prefill ``prompt_tokens`` cost on this IU; its ``request_cost_s`` when no rate is known."""
    rate = prefill_tps(entry)
    return prompt_tokens / rate if rate else entry.request_cost_s


def _weight(entry: IUEntry, now: float, ramp_s: float, ramp_floor: float) -> float:
    weight = entry.weight
    if entry.ramp_start is not None:
        weight *= min(1.0, ramp_floor + (1 - ramp_floor) * (now - entry.ramp_start) / ramp_s)
    return weight


def _sample(
    candidates, now: float, rng: random.Random, ramp_s: float, ramp_floor: float, skip: int = -1
) -> int:
    """Index of a candidate (never ``skip``), accepted with probability equal to its weight."""
    n = len(candidates) - (1 if skip >= 0 else 0)
    index = 0
    for _ in range(SAMPLE_TRIES):
        index = int(rng.random() * n)
        if 0 <= skip <= index:
            index += 1
        entry = candidates[index]
        if entry.weight >= 1.0 and entry.ramp_start is None:
            return index
        if rng.random() < _weight(entry, now, ramp_s, ramp_floor):
            return index
    return index


def _cost(entry: IUEntry, ledger: EdgeLedger, prompt_tokens: int | None, now: float,
          cached: dict[str, int] | None = None) -> float:
    cost = entry.score + ledger.sent_cost_since(entry.iu_id, entry.ts, entry.request_cost_s, entry.acked)
    cost += ledger.overdue_s(entry.iu_id, now)
    if prompt_tokens is not None:
        hit = cached.get(entry.iu_id, getattr(cached, "default", 0)) if cached is not None else 0
        cost += prefill_cost_s(entry, prompt_tokens - hit)
    return cost


def _fresh(snapshot: Snapshot, now: float) -> tuple[IUEntry, ...]:
    """The still-fresh subset, memoized until the next entry expires (an entry never becomes fresh again)."""
    memo = snapshot.memo.get("fresh")
    if memo is not None and memo[0] <= now <= memo[1]:
        return memo[2]
    fresh = tuple(e for e in snapshot.scored if now <= e.stale_after)
    snapshot.memo["fresh"] = (now, min((e.stale_after for e in fresh), default=float("inf")), fresh)
    return fresh


def pick(
    snapshot: Snapshot,
    ledger: EdgeLedger,
    now: float,
    rng: random.Random,
    *,
    ramp_s: float = 10.0,
    ramp_floor: float = 0.1,
    prompt_tokens: int | None = None,
    cached: dict[str, int] | None = None,
) -> Choice:
    """``cached``: IU -> tokens of this request's prompt estimated in its prefix cache (edge/pool/prefix.py's
    ``Cached``: IUs it does not name hold its default); those tokens cost no prefill there, and the IU holding
    the most of them is a third candidate beside the sampled two (mode ``affinity`` when it wins), even when
    the anomaly detector set it aside as ``busy`` (:func:`_with_affinity`)."""
    candidates = snapshot.scored if now <= snapshot.fresh_until else _fresh(snapshot, now)
    if len(candidates) == 1:
        return Choice(candidates[0].iu_id, "single", _cost(candidates[0], ledger, prompt_tokens, now, cached))
    if candidates:
        i = _sample(candidates, now, rng, ramp_s, ramp_floor)
        a, b = candidates[i], candidates[_sample(candidates, now, rng, ramp_s, ramp_floor, skip=i)]
        cost_a, cost_b = _cost(a, ledger, prompt_tokens, now, cached), _cost(b, ledger, prompt_tokens, now, cached)
        if cost_a < cost_b or (cost_a == cost_b and rng.random() < 0.5):
            choice = Choice(a.iu_id, "p2c", cost_a)
        else:
            choice = Choice(b.iu_id, "p2c", cost_b)
        if cached:  # IUs named: one of them may hold more of the prompt than the sampled two
            return _with_affinity(choice, snapshot, ledger, prompt_tokens, now, cached, (a.iu_id, b.iu_id))
        return choice
    if snapshot.healthy:
        inflight = ledger.inflight
        best = min(inflight.get(e.iu_id, 0) for e in snapshot.healthy)
        ties = [e for e in snapshot.healthy if inflight.get(e.iu_id, 0) == best]
        return Choice(ties[int(rng.random() * len(ties))].iu_id, "fail_open")
    return Choice(None, "none")


def _with_affinity(choice: Choice, snapshot: Snapshot, ledger: EdgeLedger, prompt_tokens: int | None, now: float,
                   cached: dict[str, int], sampled: tuple[str, str]) -> Choice:
    """The sampled pair's winner against the IU holding the most of the prompt: the lower cost wins, so the
    prefix stays where it is cached until that IU's wait outgrows the prefill the hit saves.

    That IU may be out of the draw as ``busy`` (edge/pool/anomaly.py: a score its own admitted prefill
    explains): the gate keeps a busy IU from being sampled for prompts any IU can serve, but for this
    prompt its cost (score, ledger and only the uncached prefill) is the honest comparison; without it a
    conversation's turn leaves the IU holding its context whenever that IU is prefilling a long prompt, and
    recomputes the whole context elsewhere. Not an IU gated for an unexplained score (edge/README.md, "Prefix
    caches", says why), a stale or a blocked one (not routable here: ``snapshot.healthy`` is what this edge
    may use); then the next holder that may be weighed. Each holder is looked up by id in one map per
    snapshot: scanning the routable IUs for it costs up to 34 us a request at 256 IUs when it is gated."""
    best = max(cached, key=cached.__getitem__)
    if best in sampled:
        return choice
    routable = _routable_by_id(snapshot)
    entry = routable.get(best)
    if entry is None or not _weighable(entry, now):  # not a candidate (stale, blocked, gated): the next best
        ranked = sorted((n, iu) for iu, n in cached.items() if iu not in sampled)
        entry = next((e for _, iu in reversed(ranked)
                      if (e := routable.get(iu)) is not None and _weighable(e, now)), None)
        if entry is None:
            return choice
    cost = _cost(entry, ledger, prompt_tokens, now, cached)
    return Choice(entry.iu_id, "affinity", cost) if cost < choice.expected_s else choice


def _routable_by_id(snapshot: Snapshot) -> dict[str, IUEntry]:
    """IU id -> entry of the snapshot's routable IUs (``healthy``), built once per snapshot."""
    by_id = snapshot.memo.get("routable_by_id")
    if by_id is None:
        by_id = snapshot.memo["routable_by_id"] = {e.iu_id: e for e in snapshot.healthy}
    return by_id


def _weighable(entry: IUEntry, now: float) -> bool:
    """A routable entry pick may weigh as the prompt's holder: one of the draw's candidates (``scored`` is
    the routable entries with a score and a weight above 0; fresh) or out of the draw as ``busy`` only, with
    a fresh score."""
    return (entry.score is not None and now <= entry.stale_after
            and (entry.weight > 0 or entry.anomaly == BUSY))
