"""Running argv on a node over SSH (fabric to connect, paramiko channels to run): ``shlex.join(argv)``
under the host's coreutils ``timeout``, host keys verified against known_hosts, one connection per host."""

from __future__ import annotations

import math
import os
import select
import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.model import Node
from preflight.transport.command import OUTPUT_CAP_BYTES, READ_CHUNK, CommandResult

SSH_UNREACHABLE_RC = 255  # what ssh(1) exits with when it could not connect
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_SSH_IMPORT_LOCK = threading.Lock()


def known_hosts_files(host: Node) -> list[Path]:
    """The ``UserKnownHostsFile`` paths of the node's ``ansible_ssh_common_args`` and
    ``ansible_ssh_extra_args`` (``-o UserKnownHostsFile=A`` or ``-oUserKnownHostsFile A B``)."""
    files: list[Path] = []
    for words in (host.settings.connection.ssh_common_args, host.settings.connection.ssh_extra_args):
        options = [w[2:] if w.startswith("-o") and len(w) > 2 else None for w in words]
        for index, word in enumerate(words):
            option = options[index] if options[index] is not None else (
                words[index + 1] if word == "-o" and index + 1 < len(words) else None)
            if option is None:
                continue
            key, _, value = option.replace(" ", "=", 1).partition("=")
            if key.lower() == "userknownhostsfile" and value:
                files += [Path(os.path.expanduser(v)) for v in value.split()]
    return files


def _ssh_libraries() -> tuple[Any, Any, Any]:
    """(fabric, paramiko, invoke.exceptions), imported once under a lock (fabric opens the connections,
    commands run on paramiko channels: :func:`exec_on`).

    They load lazily (a run with only local nodes never pays for them), so the first import happens on the
    runner's worker threads, one per node. paramiko's package import is circular (paramiko -> transport ->
    ecdsakey -> pkey), and two threads importing it at once see a partially initialised module: "cannot
    import name 'PKey' from partially initialized module 'paramiko.pkey'" crashed preflight in CI. The lock
    makes the first import complete before any other thread looks.
    """
    with _SSH_IMPORT_LOCK:
        import fabric
        import invoke.exceptions
        import paramiko
    return fabric, paramiko, invoke.exceptions


def _unreachable_reason(exc: BaseException, address: str, connect_timeout: float | None = None) -> str:
    _, paramiko, _ = _ssh_libraries()
    if isinstance(exc, paramiko.SSHException) and str(exc) == "No existing session":
        # paramiko's words when the handshake never finished within the connect timeout (an sshd that took
        # the TCP connection and never answered, or something that is not SSH on that port)
        within = f" within {connect_timeout:g} s" if connect_timeout is not None else ""
        return f"ssh: {address} took the connection but no SSH handshake came{within} (sshd hung, or not SSH)"

    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"ssh: host key for {address} changed: got {exc.key.get_name()} "
                f"{exc.key.get_fingerprint().hex()}, known_hosts has {exc.expected_key.get_fingerprint().hex()}")
    if isinstance(exc, paramiko.AuthenticationException):
        return f"ssh: key rejected by {address}: {exc}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        # paramiko's own text is "[Errno None] Unable to connect to port 1 on 127.0.0.1"
        (host, port, *_), _ = next(iter(exc.errors.items()))
        why = sorted({(e.strerror or str(e) or type(e).__name__).lower() for e in exc.errors.values()})
        return f"ssh: cannot connect to {host} port {port}: {'; '.join(why)}"
    return f"ssh: {exc or type(exc).__name__}"  # EOFError() and TimeoutError() have no message


SESSION_RETRY_S = 0.5  # before the one more try of a command whose connection failed under it
# A command's own limit on the host: closing the channel on our timeout leaves a hung
# nvidia-smi running there, one more with every run. coreutils `timeout` ends it (its process group: TERM,
# then KILL after REMOTE_KILL_S) REMOTE_GRACE_S after our deadline, so our timeout still decides the verdict.
REMOTE_GRACE_S = 5
REMOTE_KILL_S = 5


def remote_command(argv: Sequence[str], timeout: float) -> str:
    """The line run on the host: ``sh -c 'timeout -k K L "$@"; exit $?' sh ARGV...``, each word quoted once.

    ``timeout``: the command's own limit on the host (above). ``sh -c`` with the argv as its positional
    parameters: the login shell (whatever it is: bash for deploy, as on Ubuntu; fish or csh elsewhere) only
    splits quoted words, as Ansible's own ``/bin/sh -c`` lines rely on, and the script is a constant. ``; exit
    $?``: a shell execs a lone command in its own place, so a command killed by a signal ended the session
    with an SSH exit-signal, which paramiko does not read (its exit status stays -1); with a second command
    the shell stays, waits and exits with the status it saw, 128 + the signal's number for a kill, so "no
    exit status" is left to a channel that really closed first (sshd or the connection gone).
    """
    limit = math.ceil(timeout) + REMOTE_GRACE_S
    script = f'timeout -k {REMOTE_KILL_S} {limit} "$@"; exit $?'
    return shlex.join(["sh", "-c", script, "sh", *(str(a) for a in argv)])


def exec_on(transport: Any, command: str, timeout: float,
            cap: int = OUTPUT_CAP_BYTES) -> tuple[int | None, str, str, bool, bool]:
    """Run ``command`` in a new session channel of an open paramiko ``transport``; returns (exit status or
    None on timeout or truncation, stdout, stderr, timed out, truncated). stdin is closed at once (as
    ``</dev/null``).

    Why not fabric's ``Connection.run``: invoke's runner starts three threads per command, builds its config
    and polls every 10 ms until the command ends. That cost ~17.5 ms of controller CPU per command against
    ~3 ms for this loop (measured side by side on one connection, 2-core machine), and preflight runs ~30
    commands per node: at 128 nodes it was a third of the run's CPU floor. Here the calling thread waits
    in select() on the channel's pipe, which paramiko sets when stdout or stderr data arrives or the
    channel gets EOF/closes; both streams are drained as they come, so neither can fill the channel's
    window and stall the other. Output is decoded as UTF-8 with replacement (hostile bytes never raise).
    On timeout the channel is closed (as fabric did) and what came so far is returned. A stream over
    ``cap`` bytes (memory stays bounded) stops the read the same way, keeping its first ``cap`` bytes: the
    channel is closed, so sshd closes the command's pipes and its next write ends it (SIGPIPE), and the
    host's ``timeout`` wrapper (:func:`remote_command`) bounds it in any case.
    """
    deadline = time.monotonic() + timeout
    channel = transport.open_session(timeout=max(0.1, timeout))
    out: list[bytes] = []
    err: list[bytes] = []
    sizes = [0, 0]
    try:
        channel.exec_command(command)
        channel.shutdown_write()
        waker = channel.fileno()
        while True:
            if channel.recv_ready():
                out.append(channel.recv(READ_CHUNK))
                sizes[0] += len(out[-1])
            elif channel.recv_stderr_ready():
                err.append(channel.recv_stderr(READ_CHUNK))
                sizes[1] += len(err[-1])
            elif channel.eof_received or channel.closed:  # one EOF ends both streams (RFC 4254 5.3)
                break
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([waker], [], [], remaining)[0]:
                    return None, _text(out), _text(err), True, False
            if max(sizes) > cap:
                return None, _text(out, cap), _text(err, cap), False, True
        # The exit status follows the EOF (OpenSSH sends EOF, exit-status, close).
        if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
            return None, _text(out), _text(err), True, False
        return channel.exit_status, _text(out), _text(err), False, False
    finally:
        channel.close()


def _text(chunks: list[bytes], cap: int | None = None) -> str:
    return b"".join(chunks)[:cap].decode("utf-8", errors="replace")


class SshTransport:
    """SSH (fabric) to ``ansible_host`` with the inventory's connection settings; one connection per host,
    reused by every command of the run; host keys verified against known_hosts (unknown or changed:
    unreachable)."""

    def __init__(self, connect_timeout: float = 10.0):
        self.connect_timeout = connect_timeout
        self._connections: dict[str, Any] = {}
        self._host_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def _connection(self, host: Node):
        """The host's open connection; opened once (under a per-host lock, so hosts connect in parallel)."""
        fabric, paramiko, _ = _ssh_libraries()
        with self._lock:
            host_lock = self._host_locks.setdefault(host.name, threading.Lock())
        with host_lock:
            conn = self._connections.get(host.name)
            if conn is None:
                port, key_file = host.settings.connection.port, host.settings.connection.key_file
                connect_kwargs: dict[str, Any] = {"look_for_keys": key_file is None, "allow_agent": key_file is None}
                if key_file:
                    connect_kwargs["key_filename"] = [os.path.expanduser(str(key_file))]
                conn = fabric.Connection(
                    host=host.address,
                    user=host.settings.connection.user,
                    port=port,
                    connect_timeout=self.connect_timeout,
                    connect_kwargs=connect_kwargs,
                )
                # fabric installs AutoAddPolicy and loads no known_hosts: verify like ssh(1) instead, with
                # ~/.ssh/known_hosts (paramiko's default), /etc/ssh/ssh_known_hosts and the inventory's files.
                conn.client.load_system_host_keys()
                if Path(SYSTEM_KNOWN_HOSTS).is_file():
                    conn.client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
                for known in known_hosts_files(host):
                    if known.is_file():
                        conn.client.load_host_keys(str(known))
                conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
                conn.open()  # raises (-> unreachable) before it is shared with other threads
                self._connections[host.name] = conn
            elif not conn.is_connected:  # dropped since (sshd restarted): reconnect once, as fabric's run() did
                conn.open()
            return conn

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        _, paramiko, _ = _ssh_libraries()
        command = remote_command(argv, timeout)
        started = time.monotonic()
        for attempt in (1, 2):
            try:
                rc, out, err, timed_out, truncated = exec_on(
                    self._connection(host).client.get_transport(), command, timeout)
                break
            except (paramiko.SSHException, OSError, EOFError) as exc:  # OSError covers socket timeouts
                # A failure after the host connected gets one more try, on the connection opened again if it
                # died: sshd refusing a channel on a live connection ("administratively prohibited": its
                # MaxSessions counts channels still closing on a loaded host), or a connection that died under
                # the command (paramiko raises the EOFError that ended the transport, with no message). Both
                # were seen once in the 18-machine fault matrix under load, as an unreachable ib_pairs client. A
                # host that never connected, or fails twice, is unreachable.
                if attempt == 1 and host.name in self._connections:
                    time.sleep(SESSION_RETRY_S)
                    continue
                reason = _unreachable_reason(exc, host.address, self.connect_timeout)
                return CommandResult(None, "", reason, time.monotonic() - started, unreachable=True, argv=tuple(argv))
        return CommandResult(
            None if rc == -1 else rc,  # paramiko's -1: the channel closed with no exit status
            out,
            err,
            time.monotonic() - started,
            timed_out=timed_out,
            unreachable=rc == SSH_UNREACHABLE_RC and not out,
            argv=tuple(argv),
            truncated=truncated,
            no_exit_status=rc == -1,
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
