"""Crash-safe persistence of the whole state to ``<data-dir>/state.json``.

Each flush writes a temporary file in the same directory, fsyncs it, ``os.replace``s it over the old
one and fsyncs the directory, so a crash leaves either the previous or the new complete file, never a
torn one. Writes are group-committed: a writer's HTTP response waits (``State.wait_durable``) until a
flush that includes its change has reached the disk, so an acknowledged write survives a crash, while
a burst of writes shares one fsync. The file holds every index, so ``X-Consul-Index`` continues where
it stopped after a restart.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from devconsul.state import State

log = logging.getLogger("devconsul.persist")
FORMAT_VERSION = 1
STATE_FILE = "state.json"
RETRY_S = 1.0
LOG_EVERY_S = 60.0


def load(data_dir: Path) -> dict | None:
    path = data_dir / STATE_FILE
    for leftover in data_dir.glob(f".{STATE_FILE}.*"):  # a flush cut short by a crash
        leftover.unlink(missing_ok=True)
    if not path.exists():
        return None
    snap = json.loads(path.read_text())
    if snap.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: unknown state format {snap.get('format')!r}")
    return snap


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Persister:
    """Flushes ``snapshot()`` whenever ``State`` reports a write; one background thread."""

    def __init__(self, state: State, data_dir: Path, snapshot: Callable[[], dict]):
        self.state = state
        self.path = data_dir / STATE_FILE
        self.snapshot = snapshot
        self._cond = threading.Condition()
        self._dirty = False
        self._stopped = False
        self.problem: str | None = None  # why the last flush failed; None once one succeeds
        self._thread = threading.Thread(target=self._run, name="devconsul-persist", daemon=True)

    def start(self) -> None:
        self.state.persistent = True
        self.state.on_dirty = self.mark_dirty
        self._thread.start()

    def mark_dirty(self) -> None:
        with self._cond:
            self._dirty = True
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(10)
        try:
            self.flush()  # whatever arrived after the thread's last pass
        except OSError as exc:  # a full disk at exit: say so in one line, not a traceback
            log.error("could not write %s at exit; the last writes are lost: %s", self.path, exc)

    def flush(self) -> None:
        # The copy is taken under the state lock; the JSON encoding (the expensive part with MBs of values)
        # happens outside it, so writers and readers are not held up by it.
        with self.state.lock:
            version = self.state.version
            snap = self.snapshot()
        text = json.dumps({"format": FORMAT_VERSION, **snap}, separators=(",", ":"))
        try:
            write_atomically(self.path, text)
        except OSError as exc:
            self.problem = f"{type(exc).__name__}: {exc.strerror or exc}"
            self.state.mark_failed(True)
            raise
        self.problem = None
        self.state.mark_durable(version)
        if self.state.durable_failed:
            self.state.mark_failed(False)

    def _run(self) -> None:
        failing_since: float | None = None
        last_log = 0.0
        while True:
            with self._cond:
                while not self._dirty and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                self._dirty = False
            try:
                self.flush()
                if failing_since is not None:
                    log.warning("%s written again after %.0f s of failures", self.path, time.monotonic() - failing_since)
                    failing_since = None
            except OSError as exc:
                now = time.monotonic()
                if failing_since is None or now - last_log >= LOG_EVERY_S:  # once a minute, not every retry
                    log.error("could not write %s (%s); writes are refused until it can be written", self.path, exc)
                    last_log = now
                failing_since = failing_since or now
                with self._cond:
                    self._cond.wait(RETRY_S)
                    self._dirty = True
