"""Running commands on a node: locally through an argv prefix (simulated hosts) or over SSH (real ones).

Commands are always argv lists. Locally they go straight to ``subprocess`` (never a shell); over SSH the
remote shell gets ``shlex.join(argv)``, so a value from the inventory is always one quoted word.

Which transport a node gets is decided by inventory variables only (see :func:`transport_for`):
``clusterctl_exec_prefix`` set -> :class:`LocalTransport` (the prefix, e.g. a simulated host's ``run``
wrapper, is prepended to every argv); otherwise :class:`SshTransport` to ``ansible_host``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cluster.inventory import host_var
from cluster.model import Node

SSH_UNREACHABLE_RC = 255  # what ssh(1) exits with when it could not connect
KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class CommandResult:
    rc: int | None  # None when the process was killed on timeout or never started
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    unreachable: bool = False  # the host itself did not answer (connection failed)
    argv: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.unreachable

    def last_line(self) -> str:
        """The last non-empty line of stderr (else stdout): the usual place for the reason of a failure."""
        for text in (self.stderr, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1][:300]
        return ""


class Background(Protocol):
    def stop(self) -> CommandResult: ...


class Transport(Protocol):
    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult: ...

    def start(self, host: Node, argv: Sequence[str], limit: float) -> Background:
        """Start a long-running command (a perftest server); it dies by itself after ``limit`` s."""
        ...


def exec_prefix(node: Node) -> list[str]:
    """The node's ``clusterctl_exec_prefix`` as an argv list (empty: not a local/simulated host)."""
    prefix = host_var(node, "clusterctl_exec_prefix") or []
    if isinstance(prefix, str):
        prefix = shlex.split(prefix)
    return [str(p) for p in prefix]


class _PrefixCache:
    """exec_prefix per node name, templated once per transport (a run), not once per command (~5 ms each)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def __call__(self, node: Node) -> list[str]:
        with self._lock:
            cached = self._cache.get(node.name)
        if cached is None:
            cached = tuple(exec_prefix(node))
            with self._lock:
                self._cache[node.name] = cached
        return list(cached)


def _spawn(argv: list[str]) -> subprocess.Popen:
    """A child in its own session (a timeout kills its whole group), text output, no stdin."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
        errors="replace",
    )


class LocalTransport:
    """Runs ``clusterctl_exec_prefix + argv`` on this machine; on timeout the whole process group dies."""

    def __init__(self) -> None:
        self.prefix = _PrefixCache()

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        full = self.prefix(host) + [str(a) for a in argv]
        started = time.monotonic()
        try:
            proc = _spawn(full)
        except OSError as exc:  # the prefix (the host's wrapper) itself is missing: the host is not there
            return CommandResult(
                None,
                "",
                str(exc),
                time.monotonic() - started,
                unreachable=bool(full[: -len(argv)]),
                argv=tuple(argv),
            )
        try:
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            timed_out = True
        rc = None if timed_out else proc.returncode
        # The prefix stands in for the connection to the host, so it follows ssh's convention for "no route".
        unreachable = rc == SSH_UNREACHABLE_RC and len(full) > len(argv)
        return CommandResult(rc, out, err, time.monotonic() - started, timed_out, unreachable, tuple(argv))

    def start(self, host: Node, argv: Sequence[str], limit: float) -> LocalBackground:
        full = self.prefix(host) + [str(a) for a in argv]
        proc = _spawn(full)
        return LocalBackground(proc, tuple(argv), limit)


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


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
                out, err = self.proc.communicate()
        else:
            out, err = self.proc.communicate()
        return CommandResult(self.proc.returncode, out, err, time.monotonic() - self.started, argv=self.argv)


class SshTransport:
    """SSH (fabric) to ``ansible_host`` as ``ansible_user`` on ``ansible_port``; one connection per host."""

    def __init__(self, connect_timeout: float = 10.0):
        self.connect_timeout = connect_timeout
        self._connections: dict[str, Any] = {}
        self._host_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def _connection(self, host: Node):
        """The host's open connection; opened once (under a per-host lock, so hosts connect in parallel)."""
        from fabric import Connection

        with self._lock:
            host_lock = self._host_locks.setdefault(host.name, threading.Lock())
        with host_lock:
            conn = self._connections.get(host.name)
            if conn is None:
                port = host_var(host, "ansible_port")
                conn = Connection(
                    host=str(host_var(host, "ansible_host") or host.address),
                    user=host_var(host, "ansible_user"),
                    port=int(port) if port is not None else None,
                    connect_timeout=self.connect_timeout,
                )
                conn.open()  # raises (-> unreachable) before it is shared with other threads
                self._connections[host.name] = conn
            return conn

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        from invoke.exceptions import CommandTimedOut
        from paramiko.ssh_exception import SSHException

        command = shlex.join(str(a) for a in argv)
        started = time.monotonic()
        try:
            result = self._connection(host).run(
                command, hide=True, warn=True, timeout=timeout, in_stream=False
            )
        except CommandTimedOut as exc:
            return CommandResult(
                None,
                exc.result.stdout,
                exc.result.stderr,
                time.monotonic() - started,
                timed_out=True,
                argv=tuple(argv),
            )
        except (SSHException, OSError, EOFError) as exc:  # OSError covers socket timeouts
            return CommandResult(
                None, "", f"ssh: {exc}", time.monotonic() - started, unreachable=True, argv=tuple(argv)
            )
        return CommandResult(
            result.exited,
            result.stdout,
            result.stderr,
            time.monotonic() - started,
            unreachable=result.exited == SSH_UNREACHABLE_RC and not result.stdout,
            argv=tuple(argv),
        )

    def start(self, host: Node, argv: Sequence[str], limit: float) -> SshBackground:
        # `timeout` bounds the server's life on the host even if this process dies before stop().
        inner = shlex.join(["timeout", str(int(limit)), *[str(a) for a in argv]])
        launched = self.run(
            host, ["sh", "-c", f"nohup {inner} >/dev/null 2>&1 </dev/null & echo $!"], timeout=30
        )
        return SshBackground(self, host, launched, tuple(argv))

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


class SshBackground:
    def __init__(self, transport: SshTransport, host: Node, launched: CommandResult, argv: tuple[str, ...]):
        self.transport, self.host, self.launched, self.argv = transport, host, launched, argv
        pid = launched.stdout.strip().splitlines()[-1] if launched.ok and launched.stdout.strip() else ""
        self.pid = pid if pid.isdigit() else None

    def stop(self) -> CommandResult:
        if self.pid is None:
            return self.launched
        # Kill the `timeout` wrapper; it forwards the signal to the server.
        return self.transport.run(self.host, ["kill", self.pid], timeout=30)


class RoutingTransport:
    """Picks the transport per node from its inventory variables (no 'is this virtual?' anywhere)."""

    def __init__(self, local: Transport | None = None, ssh: Transport | None = None):
        self.local = local or LocalTransport()
        self.ssh = ssh or SshTransport()
        self.prefix = _PrefixCache()

    def for_host(self, host: Node) -> Transport:
        return self.local if self.prefix(host) else self.ssh

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        return self.for_host(host).run(host, argv, timeout)

    def start(self, host: Node, argv: Sequence[str], limit: float) -> Background:
        return self.for_host(host).start(host, argv, limit)

    def close(self) -> None:
        close = getattr(self.ssh, "close", None)
        if close:
            close()
