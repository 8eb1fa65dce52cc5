"""What keeps a :class:`~edge.pool.view.PoolView` fresh from this process's side.

:class:`ConsulWatcher` holds blocking queries on the score KV prefix and on the IU services' health (``vllm-iu-<node>``), each
loop waiting at least ``min_interval_s`` between queries so a busy index cannot turn the watch into a busy
loop. :class:`ScoresPoller` optionally overlays bodies polled from the agents' ``GET /scores`` (fresher: every
cycle instead of level changes and heartbeats). Both survive any exception with a (jittered) backoff; what
they fetch is checked by the view, entry by entry.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from consul_io import layout
from consul_io.client import ConsulIO
from eas_wire.fetch import HttpFetcher
from edge.pool.view import MAX_BODY_BYTES, PoolView

log = logging.getLogger("edge.pool")


class ConsulWatcher:
    """Two threads of rate-limited blocking queries feeding a :class:`PoolView`."""

    def __init__(
        self,
        view: PoolView,
        io: ConsulIO,
        *,
        kv_prefix: str = layout.EAS_PREFIX,
        dc: str = layout.DEFAULT_DATACENTER,
        wait_s: float = 5.0,
        min_interval_s: float = 0.1,
        max_backoff_s: float = 5.0,
    ):
        self.view, self.io = view, io
        self.prefix = layout.score_prefix(dc, kv_prefix)
        self.wait_s, self.min_interval_s, self.max_backoff_s = wait_s, min_interval_s, max_backoff_s
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors = 0
        self.updates = 0

    def refresh_once(self) -> None:
        """One non-blocking read of both (the CLI's one-shot table). Raises ConsulUnavailable."""
        _, kv = self.io.kv_list(self.prefix)
        _, health = self.io.health_service()
        self.view.apply_health(health)
        self.view.apply_kv(kv)

    def _loop(self, fetch, apply) -> None:
        index, failures, rng = None, 0, random.Random()
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                new_index, entries = fetch(index)
                if not isinstance(new_index, int) or new_index < (index or 0):
                    # Consul's index went backwards (server restore), or is not a number: start over
                    new_index = 0
                if new_index != index:
                    apply(entries)
                    self.updates += 1
            except Exception as exc:  # Consul down or any bug/garbage: back off and retry, never exit
                if self.stopping.is_set():  # a query cut off by the shutdown (Consul stopped after us)
                    break
                failures += 1
                self.errors += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning(
                        "consul watch failed (%d in a row): %s: %s", failures, type(exc).__name__, exc
                    )
                index = None
                self.stopping.wait(
                    rng.uniform(0.5, 1.0) * min(self.max_backoff_s, 0.2 * 2 ** min(failures, 10))
                )
                continue
            failures = 0
            index = new_index or None
            self.stopping.wait(max(0.0, self.min_interval_s - (time.monotonic() - started)))

    def start(self) -> ConsulWatcher:
        loops = [
            (lambda i: self.io.kv_list(self.prefix, index=i, wait_s=self.wait_s), self.view.apply_kv),
            (lambda i: self.io.health_service(index=i, wait_s=self.wait_s), self.view.apply_health),
        ]
        for n, (fetch, apply) in enumerate(loops):
            thread = threading.Thread(
                target=self._loop, args=(fetch, apply), name=f"eas-watch-{n}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
        return self

    def follow(self, fetch, apply, name: str) -> None:
        """One more rate-limited blocking-query loop on this watcher's terms (``fetch(index)`` -> (index,
        entries), ``apply(entries)`` on each change): another part of Consul the edge reads."""
        thread = threading.Thread(target=self._loop, args=(fetch, apply), name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()


class ScoresPoller:
    """Polls agents' ``GET /scores`` (for edges that want 200 ms freshness; Consul stays the discovery and
    health source). Same numbers as the KV, computed by the same code, just not held back by hysteresis.

    The agents are polled concurrently, each GET within ``timeout_s`` in total (the fetcher the agent scrapes
    vLLM with: a deadline and a byte cap, aborted when late), so one slow or dripping agent costs only its own
    node's freshness (that node falls back to its KV body)."""

    def __init__(self, view: PoolView, agents: list[str], interval_s: float = 0.2, timeout_s: float = 0.15):
        self.view, self.agents = view, list(agents)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.stopping = threading.Event()
        self.errors = 0
        self.fetchers = [HttpFetcher(f"http://{a}/scores", timeout_s, max_body=MAX_BODY_BYTES) for a in self.agents]
        self.executor: ThreadPoolExecutor | None = None
        self.pending: dict[int, Future] = {}

    def _get(self, fetch) -> object:
        return json.loads(fetch())

    def poll_once(self) -> None:
        if self.executor is None:
            self.executor = ThreadPoolExecutor(len(self.fetchers) + 1, thread_name_prefix="eas-scores")
        started = {}
        for n, fetch in enumerate(self.fetchers):
            previous = self.pending.get(n)
            if previous is not None and not previous.done():
                self.errors += 1  # still stuck from an earlier round
                continue
            started[n] = self.pending[n] = self.executor.submit(self._get, fetch)
        _, late = wait_futures(started.values(), timeout=self.timeout_s + 0.05)
        for n, future in started.items():
            if future in late:
                self.fetchers[n].abort()
        wait_futures(late, timeout=0.05)
        bodies = []
        for future in started.values():
            if not future.done():
                self.errors += 1
                continue
            try:
                bodies.append(future.result())
            except Exception:  # whatever one agent answered (or a bug fetching it) costs that agent's node
                self.errors += 1  # its poll, never the round: that node falls back to its KV body
        self.view.apply_polled(bodies)

    def _loop(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
                failures = 0
            except Exception as exc:  # never let one bad answer or bug end polling
                if self.stopping.is_set():  # stop() closed the fetchers under this poll
                    break
                failures += 1
                self.errors += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("scores poll failed (%d in a row): %s: %s", failures, type(exc).__name__, exc)
                self.stopping.wait(min(5.0, 0.2 * 2 ** min(failures, 10)))
                continue
            self.stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> ScoresPoller:
        threading.Thread(target=self._loop, name="eas-scores-poller", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for fetch in self.fetchers:
            fetch.close()
