"""Counters -> rates over a short sliding window (a single 200 ms delta of a token counter is too noisy)."""

from __future__ import annotations

from collections import deque


class WindowRate:
    """Rate of a monotonic counter over the last ``window_s`` seconds of samples.

    A counter that goes down was reset (vLLM restarted): the history is dropped and the rate is unknown until
    two new samples arrive. ``last_change`` is when the value last moved (frozen-counter detection).
    """

    def __init__(self, window_s: float = 5.0):
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque()
        self.last_change: float | None = None

    def update(self, now: float, value: float | None) -> float | None:
        if value is None:
            self.samples.clear()
            return None
        if self.samples and value < self.samples[-1][1]:
            self.samples.clear()
        if not self.samples or value != self.samples[-1][1] or self.last_change is None:
            self.last_change = now
        self.samples.append((now, value))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        return self.rate()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return (v1 - v0) / (t1 - t0)
