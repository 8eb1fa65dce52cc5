"""Change notification for blocking queries.

Consul's blocking queries park on memdb watch channels of the data they read and re-run the query when
one fires (https://developer.hashicorp.com/consul/api-docs/features/blocking). Here each waiting
request registers a ``Watcher`` under a filter (what it reads: one key, a key prefix, one service, the
whole catalog); a write wakes only the watchers whose filter matches a topic it touched, so parked
readers of one prefix cost nothing when other keys or health checks change, and the match is decided
once per filter, not once per watcher. Waiting is ``threading.Event.wait`` (a Condition underneath),
never polling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

# A topic is ("kv", key) for a KV write, or ("catalog", service name or "") for a catalog write
# ("" = a node-level change that touches every service on the node).
Topic = tuple[str, str]
# A filter is ("kv-key", key), ("kv-prefix", prefix), ("service", name) or ("catalog", "").
Filter = tuple[str, str]


def kv_key(key: str) -> Filter:
    return ("kv-key", key)


def kv_prefix(prefix: str) -> Filter:
    return ("kv-prefix", prefix)


def service(name: str) -> Filter:
    return ("service", name)


ANY_CATALOG: Filter = ("catalog", "")


def matches(flt: Filter, topic: Topic) -> bool:
    kind, arg = flt
    if kind == "kv-key":
        return topic == ("kv", arg)
    if kind == "kv-prefix":
        return topic[0] == "kv" and topic[1].startswith(arg)
    if kind == "service":
        return topic[0] == "catalog" and topic[1] in (arg, "")
    return topic[0] == "catalog"


class Watcher:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


class ChangeFeed:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[Filter, set[Watcher]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, topics: Iterable[Topic]) -> None:
        topics = list(topics)
        if not topics:
            return
        woken: list[Watcher] = []
        with self._lock:
            for flt, group in self._groups.items():
                if any(matches(flt, t) for t in topics):
                    woken.extend(group)
        for watcher in woken:
            watcher.event.set()

    def close(self) -> None:
        """Wake every parked request so shutdown never waits for a blocking query's timeout."""
        with self._lock:
            self._closed = True
            woken = [w for group in self._groups.values() for w in group]
        for watcher in woken:
            watcher.event.set()

    def block(self, current_index: Callable[[], int], min_index: int, timeout: float, flt: Filter) -> None:
        """Return once ``current_index()`` exceeds ``min_index``, at ``timeout``, or on close.

        ``current_index`` is evaluated under the store lock by the caller's closure; the watcher is
        registered before the first evaluation so a write landing in between still wakes it.
        """
        deadline = time.monotonic() + timeout
        watcher = Watcher()
        with self._lock:
            if self._closed:
                return
            self._groups.setdefault(flt, set()).add(watcher)
        try:
            while current_index() <= min_index:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return
                watcher.event.wait(remaining)
                watcher.event.clear()
        finally:
            with self._lock:
                group = self._groups.get(flt)
                if group is not None:
                    group.discard(watcher)
                    if not group:
                        del self._groups[flt]

    def watcher_count(self) -> int:
        with self._lock:
            return sum(len(g) for g in self._groups.values())
