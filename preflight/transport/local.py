"""Running argv on this machine (preflight on the node it checks): never through a shell, each command in its
own process group, both streams read up to the cap and the group killed on timeout or truncation."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from cluster.model import Node
from preflight.transport.command import OUTPUT_CAP_BYTES, READ_CHUNK, CommandResult

KILL_GRACE_S = 2.0


def _spawn(argv: list[str], text: bool = True) -> subprocess.Popen:
    """A child in its own session (a timeout kills its whole group), no stdin; text output, or bytes for
    :func:`_read_capped`."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=text,
        errors="replace" if text else None,
    )


class LocalTransport:
    """Runs argv on this machine (the node itself); on timeout the whole process group dies."""

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        full = [str(a) for a in argv]
        started = time.monotonic()
        try:
            proc = _spawn(full, text=False)
        except OSError as exc:  # the program itself is missing: a failed command, not an unreachable host
            return CommandResult(None, "", str(exc), time.monotonic() - started, argv=tuple(argv))
        out, err, timed_out, truncated = _read_capped(proc, started + timeout, OUTPUT_CAP_BYTES)
        rc = None if timed_out or truncated else proc.returncode
        return CommandResult(rc, _local_text(out), _local_text(err), time.monotonic() - started, timed_out, False,
                             tuple(argv), truncated)

    def start(self, host: Node, argv: Sequence[str], limit: float) -> LocalBackground:
        proc = _spawn([str(a) for a in argv])
        return LocalBackground(proc, tuple(argv), limit)


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """(stdout, stderr, timed out, truncated) of a child spawned with bytes pipes, both drained as they come.

    A stream over ``cap`` bytes stops the read (memory stays bounded): it keeps its first ``cap`` bytes and the
    group is killed. On the deadline the group is killed too. After a kill, what the pipes still hold is read
    for at most ``KILL_GRACE_S`` (a descendant that left the group may keep them open), then they
    are closed."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    data = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    timed_out = truncated = False
    with selectors.DefaultSelector() as selector:
        for pipe in (proc.stdout, proc.stderr):
            selector.register(pipe, selectors.EVENT_READ)

        def read_ready(wait: float) -> bool:
            """Read what is ready within ``wait`` s; True once a stream went over the cap."""
            over = False
            for key, _ in selector.select(wait):
                chunk = os.read(key.fd, READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = data[key.fd]
                buffer += chunk[: max(0, cap - len(buffer) + 1)]
                if len(buffer) > cap:
                    del buffer[cap:]
                    over = True
            return over

        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if read_ready(left):
                truncated = True
                break
        if not timed_out and not truncated:
            try:  # both streams ended: the status, within what is left of the limit
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out or truncated:
            _kill_group(proc)
            grace = time.monotonic() + KILL_GRACE_S
            while selector.get_map() and (left := grace - time.monotonic()) > 0:
                truncated = read_ready(left) or truncated
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    proc.wait()
    return bytes(out), bytes(err), timed_out, truncated


def _local_text(data: bytes) -> str:
    """As text-mode pipes decoded it: UTF-8 with replacement, universal newlines (CRLF and CR -> LF)."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _output_after_kill(proc: subprocess.Popen) -> tuple[str, str]:
    """What a killed group wrote. A descendant that left the group (``setsid``, a daemon) still holds the
    pipes open, and ``communicate()`` would wait for it as long as it lives: wait up to
    ``KILL_GRACE_S`` for the end of output, then close the pipes and keep what came."""
    try:
        return proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired as exc:
        out, err = exc.output, exc.stderr
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()

    def text(data: bytes | str | None) -> str:
        if isinstance(data, bytes):
            return data.decode("utf-8", errors="replace")
        return data or ""

    return text(out), text(err)


class LocalBackground:
    def __init__(self, proc: subprocess.Popen, argv: tuple[str, ...], limit: float):
        self.proc = proc
        self.argv = argv
        self.started = time.monotonic()
        # Even if stop() is never reached (the run is interrupted), the server does not outlive its limit.
        self._timer = threading.Timer(limit, _kill_group, (proc,))
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> CommandResult:
        self._timer.cancel()
        if self.proc.poll() is None:
            _kill_group(self.proc, signal.SIGTERM)
            try:
                out, err = self.proc.communicate(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
                out, err = _output_after_kill(self.proc)
        else:
            out, err = self.proc.communicate()
        return CommandResult(self.proc.returncode, out, err, time.monotonic() - self.started, argv=self.argv)
