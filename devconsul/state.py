"""The shared core of the dev server's state: one lock, one Raft-like index, one change feed.

Consul orders every write by a single Raft index; KV entries and catalog records carry the index of
the write that created and last modified them, and ``X-Consul-Index`` reports those indexes. The KV
store and the catalog both take their indexes from ``State.next_index`` under ``State.lock`` so the
numbers interleave the way they do in Consul. After each write, ``commit`` wakes the blocking queries
whose topics it touched and hands the new version to the persister (when ``--data-dir`` is set), and
``wait_durable`` holds the HTTP response until that version is on disk.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from devconsul.watch import ChangeFeed, Topic


class State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.feed = ChangeFeed()
        self.index = 0
        self._version = 0
        self._durable = 0
        self._durable_cond = threading.Condition()
        self.durable_failed = False  # set by the persister while the data dir cannot be written
        self.persistent = False
        self.on_dirty = None  # set by the persister: called with no arguments after a write
        self._batch_index: int | None = None

    def next_index(self) -> int:
        """The index for a write; call with ``lock`` held. Inside ``batch`` every write shares one."""
        self._version += 1
        if self._batch_index is not None:
            if self._batch_index == 0:
                self.index += 1
                self._batch_index = self.index
            return self._batch_index
        self.index += 1
        return self.index

    def begin_batch(self) -> None:
        """Start a transaction: its writes share one index, as one Raft entry does (lock held)."""
        self._batch_index = 0

    def end_batch(self) -> None:
        self._batch_index = None

    def touch(self) -> None:
        """A change that must be persisted but moves no index (a check's timer state); lock held."""
        self._version += 1

    @property
    def version(self) -> int:
        return self._version

    def commit(self, topics: Iterable[Topic]) -> int:
        """Wake watchers of ``topics`` and schedule persistence; returns the version to wait on."""
        version = self._version
        self.feed.publish(topics)
        if self.on_dirty is not None:
            self.on_dirty()
        return version

    def mark_durable(self, version: int) -> None:
        with self._durable_cond:
            if version > self._durable:
                self._durable = version
            self._durable_cond.notify_all()

    def mark_failed(self, failed: bool) -> None:
        with self._durable_cond:
            self.durable_failed = failed
            self._durable_cond.notify_all()

    def wait_durable(self, version: int, timeout: float = 10.0) -> bool:
        """Block until ``version`` is on disk (a no-op in memory); False if the persister is stuck or a
        flush failed (no point waiting 10 s on a full disk)."""
        if not self.persistent:
            return True
        with self._durable_cond:
            self._durable_cond.wait_for(lambda: self._durable >= version or self.durable_failed, timeout)
            return self._durable >= version
