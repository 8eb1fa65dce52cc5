"""The one shape every collector has for the agent's cycle, and how the cycle runs one.

A collector has a ``name`` (its key in the score body's ``ius.*.collectors``), ``collect(now)`` returning a
reading, and ``failed(now, error)`` returning the reading of a run that could not happen; every reading has
``error`` (None when the run worked). Whatever a collector needs beyond the time comes from what it was built
with (the vLLM fetcher, the node's GPU backend, the node's NIC counters read once per cycle), so the cycle
runs them all the same way (:func:`timed`) and the body says, per IU, whether each worked and how long it took.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Protocol

from eas_wire.scorebody import MAX_COLLECTOR_ERROR, CollectorRun


class Reading(Protocol):
    @property
    def error(self) -> str | None: ...


class Collector(Protocol):
    name: str

    def collect(self, now: float) -> Reading: ...

    def failed(self, now: float, error: str) -> Reading: ...


def timed(collector: Collector, now: float, crashed: Callable[[str, Exception], None] | None = None
          ) -> tuple[Reading, CollectorRun]:
    """``collector.collect(now)`` and how it went. A collector that raises (a bug) gives its ``failed`` reading
    and ``crashed(name, exc)`` is told; the cycle goes on either way."""
    started = perf_counter()
    try:
        reading = collector.collect(now)
    except Exception as exc:  # one collector's bug costs its own reading, never the IU's other collectors
        if crashed is not None:
            crashed(collector.name, exc)
        reading = collector.failed(now, f"agent error: {type(exc).__name__}: {exc}")
    error = reading.error
    return reading, CollectorRun(error is None, perf_counter() - started,
                                 None if error is None else error[:MAX_COLLECTOR_ERROR])
