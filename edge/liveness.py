"""Whether an IU's engine is stepping, read from the bytes of its streams: the edge's earliest sign of a stall.

A stalled engine (a hung GPU, a wedged scheduler, a stopped process) still has its connections accepted by
the kernel, so nothing is refused and a request sent there waits for a first byte that never comes. While
an IU has streams being relayed (past their first byte), its engine sends a token on each of them every
step (vLLM's chunked prefill keeps decoding while it prefills), so the bytes of all its streams together are
never apart for long. An IU with streams being relayed and no byte from any of them for
:meth:`Liveness.silence_s` is *silent*:

- the router leaves it out of the draw until a byte from it comes again; nothing is ejected (a long engine
  step ends by itself, and the IU is back with its next byte); a silence that lasts ``stream_stall_s`` is
  judged a stall by the streams' own watch, which ejects the IU (edge/ejection.py, edge/upstream.py);
- a request waiting there for its first byte longer than :func:`first_byte_due` is moved to another IU
  (edge/upstream.py): it was sent to an engine that stopped stepping.

At most ``max_share`` of the pool is silent at once (none of a pool of one: silence only steers among
alternatives): when more IUs look silent together the edge itself stopped reading (its event loop was held
up), not their engines, and none is held silent.
"""

from __future__ import annotations

import time

SILENCE_FLOOR_S = 0.25  # never silent sooner: a long engine step (a large prefill chunk) or a GC pause
SILENCE_FACTOR = 10.0  # x the IU's usual gap between bytes (its engine's step time, under load)
GAP_WEIGHT = 0.05  # of a new gap in the moving average
SCAN_S = 0.05  # the silent set is recomputed at most this often (it is read on every routing decision)
FIRST_BYTE_FLOOR_S = 0.25  # a request on a silent IU is moved after max(this, FIRST_BYTE_FACTOR x predicted)
FIRST_BYTE_FACTOR = 2.0
TTFT_WEIGHT = 0.1  # of a new first-byte time in the IU's moving average


def first_byte_due(expected_s: float | None, recent_ttft_s: float | None) -> float:
    """Seconds after sending by which a request's first byte is due on an IU that has turned silent: its
    predicted TTFT (pick's, or the IU's recent first bytes) times ``FIRST_BYTE_FACTOR``, at least
    ``FIRST_BYTE_FLOOR_S``. A request already prefilling (its prediction says so) is left to finish."""
    predicted = max(expected_s or 0.0, recent_ttft_s or 0.0)
    return max(FIRST_BYTE_FLOOR_S, FIRST_BYTE_FACTOR * predicted)


class Liveness:
    def __init__(self, max_share: float = 0.5, clock=time.monotonic):
        self.max_share, self.clock = max_share, clock
        self.relaying: dict[str, int] = {}  # iu -> streams past their first byte, not ended
        self.last: dict[str, float] = {}  # iu -> the last byte of any of its streams (clock seconds)
        self.gap: dict[str, float] = {}  # iu -> moving average of the gaps between those bytes
        self.ttft: dict[str, float] = {}  # iu -> moving average of its first bytes' times after sending
        self._silent: frozenset[str] = frozenset()
        self._scanned = float("-inf")

    def started(self, iu_id: str, ttft_s: float | None = None) -> None:
        """A stream's first byte came from ``iu_id`` (``ttft_s`` after it was sent)."""
        self.relaying[iu_id] = self.relaying.get(iu_id, 0) + 1
        self.byte(iu_id)
        if ttft_s is not None:
            old = self.ttft.get(iu_id)
            self.ttft[iu_id] = ttft_s if old is None else old + TTFT_WEIGHT * (ttft_s - old)

    def byte(self, iu_id: str) -> None:
        now = self.clock()
        last = self.last.get(iu_id)
        if last is not None:
            old = self.gap.get(iu_id)
            self.gap[iu_id] = now - last if old is None else old + GAP_WEIGHT * (now - last - old)
        self.last[iu_id] = now

    def ended(self, iu_id: str) -> None:
        left = self.relaying.get(iu_id, 0) - 1
        if left > 0:
            self.relaying[iu_id] = left
        else:
            self.relaying.pop(iu_id, None)
            self.last.pop(iu_id, None)  # the next stream's first byte starts the watch afresh

    def silence_s(self, iu_id: str) -> float:
        return max(SILENCE_FLOOR_S, SILENCE_FACTOR * self.gap.get(iu_id, 0.0))

    def silent(self, pool_size: int) -> frozenset[str]:
        """The IUs silent now (module docstring), recomputed at most every ``SCAN_S``."""
        now = self.clock()
        if now - self._scanned < SCAN_S:
            return self._silent
        self._scanned = now
        silent = frozenset(iu_id for iu_id in self.relaying
                           if now - self.last.get(iu_id, now) > self.silence_s(iu_id))
        self._silent = silent if len(silent) <= int(self.max_share * pool_size) else frozenset()
        return self._silent

    def is_silent(self, iu_id: str, pool_size: int) -> bool:
        return iu_id in self.silent(pool_size)
