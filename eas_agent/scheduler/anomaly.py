"""Robust anomaly verdicts over a time window (median / MAD, not mean / standard deviation).

The design article de-weights an IU whose score is "3 readings below mean - 2 sigma" (a hung vLLM looks
idle). Mean and sigma are dragged by the very outliers they should find, so here the centre is the pool's
median score and the spread 1.4826 x MAD (the normal-consistent MAD), with a floor so a pool of identical
scores does not flag everything. Verdicts:

- ``frozen``: the IU's token counters (prompt + generation) have not moved for ``frozen_s`` while it reports
  running or waiting requests (a live engine produces tokens every step). De-weighted to ``frozen_weight``,
  and to ``hung_weight`` when it also had ``min_low_readings`` readings below median - ``low_k`` x spread
  in the window: the design's rule, done robustly.
- ``high_outlier``: score above median + ``high_k`` x spread (and twice the median): gated (weight 0) while it
  lasts, so one implausible reading cannot attract or repel traffic on its own.
- ``ramp``: an IU seen for the first time after the first observation, or back from critical / maintenance /
  missing, is sampled with a weight rising linearly from ``ramp_floor`` to 1 over ``ramp_s`` (a cold IU
  should not receive a herd the moment it appears). ``pick`` computes the ramp from ``ramp_start``.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Verdict:
    flag: str | None
    weight: float
    ramp_start: float | None = None


@dataclass
class _History:
    readings: deque  # (ts, score, tokens_total, low)
    ramp_start: float | None = None
    routable: bool = False


def robust_center_spread(values: list[float], floor: float) -> tuple[float, float]:
    median = statistics.median(values)
    mad = statistics.median([abs(v - median) for v in values])
    return median, max(1.4826 * mad, floor, 0.05 * abs(median))


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
        # Judged on the scrape's score: what the edges announced since (``announced_s``, eas_agent/announce.py)
        # is known work, not an outlier (judging the announced score gated IUs a long prompt had just
        # raised: edge/README.md, "The announce channel").
        entries = [e if e.score is None or not e.components.get("announced_s") else
                   replace(e, score=max(0.0, e.score - e.components["announced_s"])) for e in entries]
        scores = [e.score for e in entries if e.score is not None and e.routable and now <= e.stale_after]
        baseline = not self.baseline_done and bool(scores)
        self.baseline_done = self.baseline_done or baseline
        center, spread = robust_center_spread(scores, self.spread_floor) if len(scores) >= 3 else (None, None)
        verdicts: dict[str, Verdict] = {}
        for entry in entries:
            history = self.history.get(entry.iu_id)
            # a momentary unknown score (one failed scrape) is a gap, not a recovery: only critical,
            # maintenance or a stale key count as being away
            routable = entry.routable and now <= entry.stale_after
            if history is None:
                history = self.history[entry.iu_id] = _History(deque())
            if routable and not history.routable:  # new or recovered: ramp up (except the baseline)
                history.ramp_start = None if baseline else now
                history.readings.clear()
            history.routable = routable
            if (
                routable
                and entry.score is not None
                and (not history.readings or history.readings[-1][0] != entry.ts)
            ):
                low = center is not None and entry.score < center - self.low_k * spread
                history.readings.append((entry.ts, entry.score, entry.components.get("tokens_total"), low))
            while history.readings and history.readings[0][0] < now - self.window_s:
                history.readings.popleft()
            if history.ramp_start is not None and now - history.ramp_start >= self.ramp_s:
                history.ramp_start = None
            verdicts[entry.iu_id] = self._verdict(entry, history, center, spread)
        return verdicts

    def _frozen(self, entry, history: _History) -> bool:
        pending = (entry.components.get("running") or 0) + (entry.components.get("waiting") or 0)
        if pending <= 0 or len(history.readings) < 2:
            return False
        latest_tokens = history.readings[-1][2]
        if latest_tokens is None:
            return False
        since = history.readings[-1][0]
        for ts, _score, tokens, _low in reversed(history.readings):
            if tokens != latest_tokens:
                break
            since = ts
        return history.readings[-1][0] - since >= self.frozen_s

    def _verdict(self, entry, history: _History, center, spread) -> Verdict:
        if self._frozen(entry, history):
            lows = sum(1 for r in history.readings if r[3])
            weight = self.hung_weight if lows >= self.min_low_readings else self.frozen_weight
            return Verdict("frozen", weight, history.ramp_start)
        if (
            center is not None
            and entry.score is not None
            and entry.score > center + self.high_k * spread
            and entry.score > 2 * center
        ):
            return Verdict("high_outlier", 0.0, history.ramp_start)
        if history.ramp_start is not None:
            return Verdict("ramp", 1.0, history.ramp_start)
        return Verdict(None, 1.0, None)
