"""Robust anomaly verdicts over a time window (median / MAD, not mean / standard deviation).

A mean / sigma rule would de-weight an IU whose score is "3 readings below mean - 2 sigma" (a hung vLLM looks
idle). Mean and sigma are dragged by the very outliers they should find, so here the centre is the pool's
median score and the spread 1.4826 x MAD (the normal-consistent MAD), with a floor so a pool of identical
scores does not flag everything. Verdicts:

- ``frozen``: the IU's token counters (prompt + generation) have not moved for ``frozen_s`` while it reports
  running or waiting requests (a live engine produces tokens every step). De-weighted to ``frozen_weight``,
  and to ``hung_weight`` when it also had ``min_low_readings`` readings below median - ``low_k`` x spread
  in the window: the design's rule, done robustly.
- ``high_outlier``: score above median + ``high_k`` x spread (and twice the median): gated (weight 0) while it
  lasts, so one implausible reading cannot attract or repel traffic on its own.
- ``busy``: such a score that the IU's own admitted prefill explains (the prompt tokens it has admitted and not
  yet prefilled at its own prefill rate, the declared terms ``admitted_prefill_tokens`` / ``prefill_tps``:
  without them the rest is not an outlier). Nothing is wrong with the IU, a long prompt is being prefilled,
  but it is gated (weight 0) all the same: out of the draw, p2c compares two IUs that can start sooner
  (bench/route_sim.py, 80% load, seeds 1-3: leaving it in the draw raised the default mode's p99 TTFT from
  1.07x to 1.11x the oracle's). For a prompt the IU holds cached, pick still weighs it on its cost beside
  the sampled pair (edge/pool/pick.py's ``_with_affinity``): the gate is about the draw, not about the
  prefill a hit there saves.
- what the edges announced since the scrape (``announced_s``) is known work, not an outlier, up to
  :data:`ANNOUNCED_EXCUSED_REQUESTS` mean requests' prefill (``request_cost_s``); beyond that it is judged
  with the score: a broken or compromised announcer cannot raise an IU without its verdict seeing it.
- ``ramp``: an IU seen for the first time after the first observation, or back from critical / maintenance /
  missing, is sampled with a weight rising linearly from ``ramp_floor`` to 1 over ``ramp_s`` (a cold IU
  should not receive a herd the moment it appears). ``pick`` computes the ramp from ``ramp_start``.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    flag: str | None
    weight: float
    ramp_start: float | None = None


NO_FLAG = Verdict(None, 1.0, None)
BUSY = "busy"  # out of the draw for its load alone: pick() still weighs it for a prompt it holds cached
# Announced work judged as known (not an outlier): a herd of this many mean requests sent to one IU between
# two scrapes, or one prompt at a long context (131072 tokens are ~64 mean requests of 2,000)
ANNOUNCED_EXCUSED_REQUESTS = 64  # most IUs most of the time: one shared object, not one per IU per rebuild


@dataclass
class _History:
    readings: deque  # (ts, score, tokens_total, low)
    ramp_start: float | None = None
    routable: bool = False
    # (the entry, len(readings), first ts, last ts) the memoized frozen verdict was computed on, and it: an
    # edge observes every IU up to 50 times a second while each IU's readings change ~5 times a second
    frozen_key: tuple | None = None
    frozen: bool = False


def robust_center_spread(values: list[float], floor: float) -> tuple[float, float]:
    median = statistics.median(values)
    mad = statistics.median([abs(v - median) for v in values])
    return median, max(1.4826 * mad, floor, 0.05 * abs(median))


def judged_score(score: float | None, terms) -> float | None:
    """The score the verdicts judge: the scrape's (``score`` without what edges announced since), except
    announced work beyond :data:`ANNOUNCED_EXCUSED_REQUESTS` mean requests, which stays in. Without
    ``request_cost_s`` (an older agent, the seed profile) there is no scale: all announced work is excused."""
    announced = terms.announced_s
    if score is None or not announced:
        return score
    if terms.request_cost_s is not None:
        announced = min(announced, ANNOUNCED_EXCUSED_REQUESTS * terms.request_cost_s)
    return max(0.0, score - announced)


def own_prefill_s(terms) -> float:
    """Seconds of prefill the IU has admitted and not yet done, at its own measured rate (0 when its body
    does not carry both terms: an older agent, the seed profile)."""
    if terms.admitted_prefill_tokens and terms.prefill_tps:
        return terms.admitted_prefill_tokens / terms.prefill_tps
    return 0.0


class AnomalyDetector:
    def __init__(
        self,
        window_s: float = 30.0,
        low_k: float = 2.0,
        high_k: float = 4.0,
        min_low_readings: int = 3,
        frozen_s: float = 6.0,
        frozen_weight: float = 0.3,
        hung_weight: float = 0.05,
        ramp_s: float = 10.0,
        ramp_floor: float = 0.1,
        spread_floor: float = 0.02,
    ):
        self.window_s, self.low_k, self.high_k = window_s, low_k, high_k
        self.min_low_readings, self.frozen_s = min_low_readings, frozen_s
        self.frozen_weight, self.hung_weight = frozen_weight, hung_weight
        self.ramp_s, self.ramp_floor, self.spread_floor = ramp_s, ramp_floor, spread_floor
        self.history: dict[str, _History] = {}
        self.baseline_done = False  # IUs routable in the first observation with any score do not ramp

    def observe(self, entries, now: float) -> dict[str, Verdict]:
        # Judged on the scrape's score: what the edges announced since (``announced_s``, the announce channel)
        # is known work, not an outlier (judging the announced score gated IUs a long prompt had just
        # raised: docs/decisions/0003-announce-channel.md), up to a bound (judged_score).
        judged = [(entry, judged_score(entry.score, entry.terms), entry.routable and now <= entry.stale_after)
                  for entry in entries]  # (entry, its judged score, routable now)
        scores = [score for _entry, score, routable in judged if score is not None and routable]
        baseline = not self.baseline_done and bool(scores)
        self.baseline_done = self.baseline_done or baseline
        center, spread = robust_center_spread(scores, self.spread_floor) if len(scores) >= 3 else (None, None)
        verdicts: dict[str, Verdict] = {}
        for entry, score, routable in judged:
            history = self.history.get(entry.iu_id)
            # a momentary unknown score (one failed scrape) is a gap, not a recovery: only critical,
            # maintenance or a stale key count as being away
            if history is None:
                history = self.history[entry.iu_id] = _History(deque())
            readings = history.readings
            if routable and not history.routable:  # new or recovered: ramp up (except the baseline)
                history.ramp_start = None if baseline else now
                readings.clear()
            history.routable = routable
            if routable and score is not None and (not readings or readings[-1][0] != entry.ts):
                low = center is not None and score < center - self.low_k * spread
                readings.append((entry.ts, score, entry.terms.tokens_total, low))
            while readings and readings[0][0] < now - self.window_s:
                readings.popleft()
            if history.ramp_start is not None and now - history.ramp_start >= self.ramp_s:
                history.ramp_start = None
            verdicts[entry.iu_id] = self._verdict(entry, score, history, center, spread)
        return verdicts

    def _frozen(self, entry, history: _History) -> bool:
        readings = history.readings
        key = (entry, len(readings), readings[0][0], readings[-1][0]) if readings else (entry, 0, None, None)
        if history.frozen_key is not None and history.frozen_key[0] is entry and history.frozen_key[1:] == key[1:]:
            return history.frozen
        history.frozen_key, history.frozen = key, self._frozen_now(entry, readings)
        return history.frozen

    def _frozen_now(self, entry, readings: deque) -> bool:
        terms = entry.terms
        pending = (terms.running or 0) + (terms.waiting or 0)
        if pending <= 0 or len(readings) < 2:
            return False
        latest_tokens = readings[-1][2]
        if latest_tokens is None:
            return False
        since = readings[-1][0]
        for ts, _score, tokens, _low in reversed(readings):
            if tokens != latest_tokens:
                break
            since = ts
        return readings[-1][0] - since >= self.frozen_s

    def _high(self, score: float, center: float, spread: float) -> bool:
        return score > center + self.high_k * spread and score > 2 * center

    def _verdict(self, entry, score: float | None, history: _History, center, spread) -> Verdict:
        """``score``: the entry's judged score (the scrape's, without what edges announced since)."""
        if self._frozen(entry, history):
            lows = sum(1 for r in history.readings if r[3])
            weight = self.hung_weight if lows >= self.min_low_readings else self.frozen_weight
            return Verdict("frozen", weight, history.ramp_start)
        if center is not None and score is not None and self._high(score, center, spread):
            unexplained = score - own_prefill_s(entry.terms)
            return Verdict("high_outlier" if self._high(unexplained, center, spread) else BUSY, 0.0,
                           history.ramp_start)
        if history.ramp_start is not None:
            return Verdict("ramp", 1.0, history.ramp_start)
        return NO_FLAG
