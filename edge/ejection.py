"""Results-based outlier ejection: an IU whose requests fail is skipped for a backoff, then probed.

What the edge itself saw decides, not the IU's published score (which a stalled engine may keep serving):

- a *definitive* failure ejects at once: the connection refused (nothing listens: the engine died), a
  stream silent past ``stream_stall_s`` after its first byte, or a first byte far past its predicted time
  (:func:`stalled_first_byte`: the engine is not stepping);
- other failures (a reset or timed-out connection, a stream cut mid-way, a 5xx answer) eject after
  ``consecutive`` of them in a row; any success resets the count;
- at most ``max_share`` of the routable IUs are ejected at once (at least one): beyond that an outlier is
  only a sign that the pool, or the edge's view of it, is wrong, and ejecting more would send the whole
  load onto the rest (Envoy's ``max_ejection_percent``);
- half-open: when the backoff runs out the IU stays out of the draw until one probe answers: the edge's
  own ``GET /health`` to it (:meth:`due` names the IUs to probe; edge/proxy.py sends them), never a
  client's request, so no client waits on an IU that may still be dead or stalled. A probe's success brings
  the IU back (backoff reset), its failure ejects it again for twice the backoff, at most twice ``eject_s``:
  a probe costs no client anything, and a restarted engine should be back within that of answering.

The edge's own failures (out of descriptors, its own deadline, a client that left or reads slowly) are
neutral: :class:`Outliers` never hears of them (edge/upstream.py decides which outcome a request had).
"""

from __future__ import annotations

from dataclasses import dataclass

CONSECUTIVE_ERRORS = 3
MAX_EJECTED_SHARE = 0.5
STALL_FLOOR_S = 5.0  # a first byte later than max(this, STALL_FACTOR x predicted) marks a stalled engine
STALL_FACTOR = 4.0


def stalled_first_byte(expected_s: float | None) -> float:
    """Seconds after sending a request by which its first byte must have come, or its IU is stalled: the
    predicted TTFT (pick's cost) times ``STALL_FACTOR``, never under ``STALL_FLOOR_S`` (a prediction is
    rough; a long prefill queue on a healthy IU must not look like a stall)."""
    return max(STALL_FLOOR_S, STALL_FACTOR * expected_s) if expected_s else STALL_FLOOR_S


@dataclass
class _Record:
    errors: int = 0  # consecutive failures
    backoff_s: float = 0.0  # the last ejection's length (0: never ejected, or recovered)
    probing: bool = False  # the backoff ran out: one request may go (the probe)
    probe_out: bool = False  # that request is in flight


class Outliers:
    def __init__(self, eject_s: float = 2.0, consecutive: int = CONSECUTIVE_ERRORS,
                 max_share: float = MAX_EJECTED_SHARE):
        self.eject_s, self.consecutive, self.max_share = eject_s, consecutive, max_share
        self.max_backoff_s = 2 * eject_s
        self.ejected: dict[str, float] = {}  # iu -> until (wall-clock seconds)
        self.records: dict[str, _Record] = {}
        self.refused_by_cap = 0  # ejections the cap prevented (a metric)

    def blocked(self, now: float) -> set[str]:
        """IUs not to send requests to now: ejected, or waiting for a probe's answer. An ejection that ran
        out turns into probing."""
        blocked = set()
        for iu_id, until in list(self.ejected.items()):
            if until > now:
                blocked.add(iu_id)
                continue
            del self.ejected[iu_id]
            self.records.setdefault(iu_id, _Record()).probing = True
        blocked.update(iu_id for iu_id, record in self.records.items() if record.probing)
        return blocked

    def is_out(self, iu_id: str) -> bool:
        """Whether ``iu_id`` is ejected or awaiting its probe (whatever the clock: a lapsed ejection is
        still out until its probe answers)."""
        record = self.records.get(iu_id)
        return iu_id in self.ejected or (record is not None and record.probing)

    def due(self, now: float) -> list[str]:
        """IUs whose backoff ran out and whose probe is not sent yet; each is marked as probed."""
        self.blocked(now)
        due = [iu_id for iu_id, record in self.records.items() if record.probing and not record.probe_out]
        for iu_id in due:
            self.records[iu_id].probe_out = True
        return due

    def succeeded(self, iu_id: str) -> None:
        record = self.records.get(iu_id)
        if record is not None:
            del self.records[iu_id]  # back in rotation; the next ejection starts at eject_s again

    def failed(self, iu_id: str, now: float, pool_size: int, definitive: bool = False) -> bool:
        """Record a failure of ``iu_id``'s; True when it is ejected by it."""
        record = self.records.setdefault(iu_id, _Record())
        record.errors += 1
        if record.probing:  # the probe failed: longer backoff
            return self._eject(iu_id, record, now, pool_size, min(self.max_backoff_s, 2 * record.backoff_s))
        if definitive or record.errors >= self.consecutive:
            return self._eject(iu_id, record, now, pool_size, self.eject_s)
        return False

    def released(self, iu_id: str) -> None:
        """A probe that told nothing (the edge's own fault): the next :meth:`due` probes again."""
        record = self.records.get(iu_id)
        if record is not None and record.probing:
            record.probe_out = False

    def _eject(self, iu_id: str, record: _Record, now: float, pool_size: int, backoff_s: float) -> bool:
        out = sum(1 for other, until in self.ejected.items() if until > now and other != iu_id)
        if out + 1 > max(1, int(self.max_share * pool_size)):
            self.refused_by_cap += 1
            record.probing = record.probe_out = False
            return False
        record.backoff_s = max(backoff_s, self.eject_s)
        record.probing = record.probe_out = False
        record.errors = 0
        self.ejected[iu_id] = now + record.backoff_s
        return True
