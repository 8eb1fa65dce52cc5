"""The discrete-event loop: a heap of (time, sequence number, callback, argument)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any, float], None], Any]] = []
        self._counter = 0
        self.halted = False

    def schedule(self, when: float, fn: Callable[[Any, float], None], arg: Any = None) -> None:
        """Run fn(arg, when) at `when`; events at the same time run in the order they were scheduled."""
        self._counter += 1
        heapq.heappush(self._heap, (when, self._counter, fn, arg))

    def run(self, until: float | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap:
            if until is not None and heap[0][0] > until:
                self.now = until
                return
            when, _, fn, arg = pop(heap)
            self.now = when
            fn(arg, when)
            if self.halted:
                return

    def halt(self) -> None:
        """Stop run() after the current event (periodic agents would otherwise keep the loop alive)."""
        self.halted = True

    def pending(self) -> int:
        return len(self._heap)
