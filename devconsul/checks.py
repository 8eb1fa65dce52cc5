"""The check runner: TTL expiry, HTTP/TCP probes, deferred output syncs and critical-service reaping.

Timings follow Consul (``agent/checks/check.go``, ``agent/agent.go``): a TTL check that is not updated
within its TTL turns critical with ``TTL expired`` (plus the last output); HTTP/TCP checks first run
after a random stagger within one interval and then every interval; services whose check has been
critical longer than ``DeregisterCriticalServiceAfter`` (never less than ``deregister_min``, 1 minute
in Consul) are removed by a reaper that runs every ``reap_interval`` (30 s in Consul).

One scheduler thread waits on a Condition for the next deadline; each HTTP/TCP check has its own
thread (a probe may block for its timeout). ``stop`` wakes and joins them all.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time

from devconsul.catalog import Catalog
from devconsul.probes import run_probe
from devconsul.records import Check
from devconsul.state import State

log = logging.getLogger("devconsul.checks")


class CheckRunner:
    def __init__(self, state: State, catalog: Catalog, reap_interval: float = 30.0, deregister_min: float = 60.0):
        self.state = state
        self.catalog = catalog
        self.reap_interval = reap_interval
        self.deregister_min = deregister_min
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str, str]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._probes: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._probes_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="devconsul-checks", daemon=True)
        self._thread.start()
        self._schedule(time.time() + self.reap_interval, "reap", "")
        with self.state.lock:
            existing = list(self.catalog.checks.values())
        for check in existing:  # restored from disk
            self.check_added(check)
            if check.sync_due is not None:
                self.sync_deferred(check)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        with self._probes_lock:
            probes = list(self._probes.values())
            self._probes.clear()
        for _, stop in probes:
            stop.set()
        deadline = time.monotonic() + 3.0
        for thread, _ in probes:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))

    # -- CheckHooks -----------------------------------------------------------------------------
    def check_added(self, check: Check) -> None:
        self.check_removed(check.check_id)
        if check.type == "ttl" and check.ttl_deadline is not None:
            self._schedule(check.ttl_deadline, "ttl", check.check_id)
        elif check.type in ("http", "tcp") and check.definition is not None:
            self._start_probe(check)

    def check_removed(self, check_id: str) -> None:
        with self._probes_lock:
            probe = self._probes.pop(check_id, None)
        if probe is not None:
            probe[1].set()

    def ttl_reset(self, check: Check) -> None:
        self._schedule(check.ttl_deadline, "ttl", check.check_id)

    def sync_deferred(self, check: Check) -> None:
        self._schedule(check.sync_due, "sync", check.check_id)

    # -- scheduler ------------------------------------------------------------------------------
    def _schedule(self, when: float, kind: str, check_id: str) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), kind, check_id))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0][0] <= time.time():
                        _, _, kind, check_id = heapq.heappop(self._heap)
                        break
                    timeout = self._heap[0][0] - time.time() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
            try:
                self._fire(kind, check_id)
            except Exception:  # a bug in one event must not stop every check
                log.exception("check event %s for %s failed", kind, check_id)

    def _fire(self, kind: str, check_id: str) -> None:
        now = time.time()
        if kind == "reap":
            self._reap(now)
            self._schedule(now + self.reap_interval, "reap", "")
            return
        with self.state.lock:
            check = self.catalog.checks.get(check_id)
            if check is None:
                return
            topics = []
            if kind == "ttl" and check.ttl_deadline is not None and check.ttl_deadline <= now:
                check.ttl_deadline = None
                output = "TTL expired"
                if check.output:
                    output += f" (last output before timeout follows): {check.output}"
                log.warning("check %s missed TTL, is now critical", check_id)
                topics = self.catalog.set_status(check, "critical", output)
            elif kind == "sync" and check.sync_due is not None and check.sync_due <= now:
                topics = self.catalog.sync_check(check)
        self.state.commit(topics)

    def _reap(self, now: float) -> None:
        topics = []
        with self.state.lock:
            doomed = set()
            for check in self.catalog.checks.values():
                defn = check.definition
                if not defn or defn.deregister_after <= 0 or check.critical_since is None:
                    continue
                if check.status == "critical" and now - check.critical_since > max(defn.deregister_after,
                                                                                    self.deregister_min):
                    doomed.add(check.service_id)
            for service_id in doomed:
                svc = self.catalog.services.get(service_id)
                if svc is not None:
                    log.info("reaping service %s: critical past DeregisterCriticalServiceAfter", service_id)
                    topics += self.catalog.remove_service(svc)
        self.state.commit(topics)

    # -- probes ---------------------------------------------------------------------------------
    def _start_probe(self, check: Check) -> None:
        stop = threading.Event()
        thread = threading.Thread(
            target=self._probe_loop, args=(check.check_id, check.definition, stop),
            name=f"devconsul-probe-{check.check_id}", daemon=True,
        )
        with self._probes_lock:
            if self._stopped:
                return
            self._probes[check.check_id] = (thread, stop)
        thread.start()

    def _probe_loop(self, check_id: str, defn, stop: threading.Event) -> None:
        delay = random.uniform(0, defn.interval)
        while not stop.wait(delay):
            try:
                status, output = run_probe(defn)
            except Exception as exc:  # a probe bug or an odd answer: the check goes critical, the loop lives
                log.debug("check %s: probe failed", check_id, exc_info=True)
                status, output = "critical", f"probe error: {type(exc).__name__}: {exc}"
            with self.state.lock:
                check = self.catalog.checks.get(check_id)
                if stop.is_set() or check is None or check.definition is not defn:
                    return
                topics = self.catalog.set_status(check, status, output)
            self.state.commit(topics)
            delay = defn.interval
