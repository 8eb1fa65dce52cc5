"""Running commands on a node: over SSH (fabric, :mod:`.ssh`), or locally when preflight runs on the node itself
(:mod:`.local`); what both return is :mod:`.command`'s.

Commands are always argv lists. Locally they go straight to ``subprocess`` (never a shell); over SSH the
remote shell gets ``shlex.join(argv)``, so a value from the inventory is always one quoted word, under
coreutils ``timeout`` so that a hung command does not outlive its limit on the host (:func:`remote_command`).

Both transports read at most ``OUTPUT_CAP_BYTES`` of each stream of a command (a storm of output must not exhaust the controller's memory): past
that, reading stops, the command is ended (locally its process group is killed; over SSH the channel is
closed) and the result says ``truncated``. A truncated output is never judged (``NodeContext.run`` makes it
the check's ERROR), so events past the cap cannot silently vanish.

Which transport a node gets is decided by inventory variables only (see :class:`RoutingTransport`):
``ansible_connection: local`` -> :class:`LocalTransport` (preflight running on the node it checks, as
Ansible's local connection does); otherwise :class:`SshTransport` to ``ansible_host`` with Ansible's
connection settings: ``ansible_user``, ``ansible_port``, ``ansible_ssh_private_key_file`` and the
``UserKnownHostsFile`` of ``ansible_ssh_common_args``/``ansible_ssh_extra_args``. Host keys are always
verified (an impostor host must not receive commands or feed verdicts): the system and user known_hosts files plus that file are loaded and an
unknown or changed host key makes the node UNREACHABLE with the reason, as ``ssh -o
StrictHostKeyChecking=yes`` would.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.model import Node
from preflight.transport.command import (
    OUTPUT_CAP_BYTES,
    READ_CHUNK,
    Background,
    CommandResult,
    Transport,
    how_it_ended,
)
from preflight.transport.local import KILL_GRACE_S, LocalBackground, LocalTransport
from preflight.transport.ssh import (
    REMOTE_GRACE_S,
    REMOTE_KILL_S,
    SESSION_RETRY_S,
    SSH_UNREACHABLE_RC,
    SYSTEM_KNOWN_HOSTS,
    SshBackground,
    SshTransport,
    _ssh_libraries,
    exec_on,
    known_hosts_files,
    remote_command,
)

__all__ = [
    "KILL_GRACE_S", "OUTPUT_CAP_BYTES", "READ_CHUNK", "REMOTE_GRACE_S", "REMOTE_KILL_S", "SESSION_RETRY_S",
    "SSH_UNREACHABLE_RC", "SYSTEM_KNOWN_HOSTS", "Background", "CommandResult", "LocalBackground", "LocalTransport",
    "RoutingTransport", "SshBackground", "SshTransport", "Transport", "_ssh_libraries", "exec_on",
    "how_it_ended", "known_hosts_files", "remote_command",
]


class RoutingTransport:
    """Picks the transport per node from ``ansible_connection``, as Ansible does (no 'is this virtual?')."""

    def __init__(self) -> None:
        # No injection points: tests script whole transports (tests/preflight/helpers.py) instead.
        self.local: Transport = LocalTransport()
        self.ssh: Transport = SshTransport()

    def for_host(self, host: Node) -> Transport:
        return self.local if host.settings.connection.kind == "local" else self.ssh

    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult:
        return self.for_host(host).run(host, argv, timeout)

    def start(self, host: Node, argv: Sequence[str], limit: float) -> Background:
        return self.for_host(host).start(host, argv, limit)

    def close(self) -> None:
        close = getattr(self.ssh, "close", None)
        if close:
            close()
