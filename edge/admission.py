"""The edge's queue for requests that find every IU at its per-IU cap: first come, first served.

A request that finds a free slot and nobody waiting for the same IUs (one queue per set of IUs requests
compete for: per model) is admitted at once; otherwise it queues at the tail, and nobody overtakes a waiter: a new arrival never takes a slot while others wait, and a freed slot goes to
the oldest waiter (:meth:`Admission.released` wakes it; it keeps its place until it is admitted or gives
up). A woken waiter that cannot use the freed slot (its own exclusions: IUs it already tried) passes the
wake on to the next one while a slot is free.

Busy is not unavailable: a full queue or a wait past ``queue_timeout_s`` is a 429 (:class:`Busy`) whose
``Retry-After`` is the predicted wait, the queue ahead divided by the rate slots were freed over the last
:data:`DRAIN_WINDOW_S`; no routable IU at all is a 503 (:class:`Unavailable`, raised by the caller's attempt).
A waiter whose client left is cancelled with its handler (aiohttp's ``handler_cancellation``) and leaves
the queue without ever being dispatched.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Hashable

DRAIN_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 60


class Unavailable(Exception):
    """No IU can take the request (none routable, or the edge itself cannot): 503 + Retry-After."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Busy(Exception):
    """Every IU that could serve the request is at its cap and the queue is full, or the wait ran out: 429
    with the predicted wait as Retry-After."""

    def __init__(self, reason: str, message: str, retry_after_s: int):
        super().__init__(message)
        self.reason, self.retry_after_s = reason, retry_after_s


class _Waiter:
    __slots__ = ("future", "slot_free")

    def __init__(self, future: asyncio.Future, slot_free: Callable[[], bool]):
        self.future, self.slot_free = future, slot_free


class Admission:
    """The queues, one per set of IUs requests compete for (the caller's ``key``: requests for another
    model never wait behind these), bounded together by ``max_queue``."""

    def __init__(self, max_queue: int, queue_timeout_s: float, clock=time.monotonic):
        self.max_queue, self.queue_timeout_s, self.clock = max_queue, queue_timeout_s, clock
        self.queues: dict[Hashable, deque[_Waiter]] = {}
        self.waiting = 0
        self.freed: deque[float] = deque()  # clock times slots were freed within DRAIN_WINDOW_S

    def __len__(self) -> int:
        return self.waiting

    async def admit(self, attempt: Callable[[bool], object | None], slot_free: Callable[[], bool],
                    key: Hashable = None):
        """``attempt(queued)``: the admitted request's result, None when no slot is free now (it may raise
        Unavailable; ``queued``: the request waited); ``slot_free()``: whether an IU slot is free for a
        request of this queue (a waiter that cannot use it passes the wake on); ``key``: the queue. Returns
        ``attempt()``'s result, or raises Busy."""
        queue = self.queues.get(key)
        if not queue:
            result = attempt(False)
            if result is not None:
                return result
        if self.waiting >= self.max_queue:
            raise Busy("queue_full", f"every IU is at its in-flight cap and {self.waiting} requests are "
                       "queued", self.retry_after_s(len(queue) if queue else 0))
        if queue is None:
            queue = self.queues[key] = deque()
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), slot_free)
        queue.append(waiter)
        self.waiting += 1
        deadline = self.clock() + self.queue_timeout_s
        try:
            if len(queue) == 1 and slot_free():  # a slot freed while nobody could take it
                waiter.future.set_result(None)
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise Busy("queue_timeout", f"no IU slot freed within {self.queue_timeout_s:g} s",
                               self.retry_after_s(_position(queue, waiter)))
                try:
                    await asyncio.wait_for(asyncio.shield(waiter.future), remaining)
                except TimeoutError:
                    continue
                result = attempt(True)
                if result is not None:
                    return result
                waiter.future = loop.create_future()  # not for this one: keep the place, wake the next
                _wake(queue, after=waiter)
        finally:
            self._leave(key, queue, waiter)

    def released(self) -> None:
        """A slot was freed: counted for the drain rate; the oldest waiter of each queue is woken."""
        now = self.clock()
        self.freed.append(now)
        self._forget_before(now - DRAIN_WINDOW_S)
        for queue in list(self.queues.values()):
            _wake(queue)

    def _forget_before(self, since: float) -> None:
        while self.freed and self.freed[0] < since:
            self.freed.popleft()

    def retry_after_s(self, ahead: int) -> int:
        """Seconds until a request behind ``ahead`` waiters would likely be served, from the recent drain
        rate (1..MAX_RETRY_AFTER_S; the queue timeout while nothing has drained lately)."""
        self._forget_before(self.clock() - DRAIN_WINDOW_S)
        recent = len(self.freed)
        if not recent:
            return max(1, min(MAX_RETRY_AFTER_S, math.ceil(self.queue_timeout_s)))
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil((ahead + 1) * DRAIN_WINDOW_S / recent)))

    def _leave(self, key: Hashable, queue: deque[_Waiter], waiter: _Waiter) -> None:
        """``waiter`` leaves its queue (admitted, timed out or cancelled); a wake it got but did not use
        goes to the next waiter."""
        woken_unused = waiter.future.done() and not waiter.future.cancelled()
        try:
            queue.remove(waiter)
        except ValueError:
            return
        self.waiting -= 1
        if not queue:
            if self.queues.get(key) is queue:
                del self.queues[key]
        elif woken_unused and queue[0].slot_free():
            _wake(queue)


def _position(queue: deque[_Waiter], waiter: _Waiter) -> int:
    for index, other in enumerate(queue):
        if other is waiter:
            return index
    return len(queue)


def _wake(queue: deque[_Waiter], after: _Waiter | None = None) -> None:
    """Wake the first waiter of ``queue`` (after ``after``, when given and a slot is still free) not
    already woken."""
    started = after is None
    for waiter in queue:
        if not started:
            started = waiter is after
            continue
        if after is not None and not waiter.slot_free():
            return
        if not waiter.future.done():
            waiter.future.set_result(None)
        return
