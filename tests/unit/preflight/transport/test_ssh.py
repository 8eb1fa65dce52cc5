"""The SSH transport (preflight/transport/ssh.py) over a fake client: every argument quoted, host keys
verified against the inventory's known_hosts, a failed connection is an unreachable host, background servers
bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.transport import (
    SshTransport,
)
from tests.helpers.preflight import node
from tests.helpers.sshserver import client_transport, finish

pytestmark = pytest.mark.unit


def test_ssh_transport_quotes_every_argument(monkeypatch):
    import fabric

    seen = {}

    class FakeConnection:
        def __init__(self, host, user, port, connect_timeout, connect_kwargs):
            seen.update(host=host, user=user, port=port)
            self.client = FakeClient()

        def open(self):
            pass

    def answer(channel, command):
        seen["command"] = command
        channel.sendall(b"ok\n")
        finish(channel, 0)

    monkeypatch.setattr(FakeClient, "handler", staticmethod(answer))

    monkeypatch.setattr(fabric, "Connection", FakeConnection)
    n = node(
        ansible_host="127.0.9.7",
        ansible_user="ops",
        ansible_port=2222,
        rdma_nics=[{"device": "mlx5_0; reboot", "netdev": "ib0"}],
    )
    result = SshTransport().run(n, ["ibping", "-C", n.nics[0].device, "$(id)"], timeout=5)
    assert result.ok
    assert seen == {
        "host": "127.0.9.7",
        "user": "ops",
        "port": 2222,
        # under the host's own limit (5 s + 5), the argv as sh's positional parameters (remote_command)
        "command": """sh -c 'timeout -k 5 10 "$@"; exit $?' sh ibping -C 'mlx5_0; reboot' '$(id)'""",
    }


def test_ssh_connection_failure_is_unreachable(monkeypatch):
    import fabric

    class Refused:
        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            raise OSError("[Errno 113] No route to host")

    monkeypatch.setattr(fabric, "Connection", Refused)
    result = SshTransport().run(node(), ["true"], timeout=5)
    assert result.unreachable and "No route to host" in result.stderr


class FakeClient:
    """The paramiko client of a fake fabric Connection: records what the transport configures; its
    transport is a real SSH connection to an in-process server running ``handler`` (default: exit 0)."""

    handler = staticmethod(lambda channel, command: finish(channel, 0))

    def __init__(self):
        self.host_key_files, self.policy, self.system_keys = [], None, False
        self.transport = None

    def get_transport(self):
        if self.transport is None:
            self.transport = client_transport(self.handler)
        return self.transport

    def load_system_host_keys(self, filename=None):
        self.system_keys = True

    def load_host_keys(self, filename):
        self.host_key_files.append(filename)

    def set_missing_host_key_policy(self, policy):
        self.policy = policy


def test_ssh_transport_verifies_host_keys_with_the_inventorys_known_hosts_and_key(monkeypatch, tmp_path):
    """fabric alone auto-adds any host key. The transport loads the system
    known_hosts and the inventory's UserKnownHostsFile and rejects unknown keys; the key is the
    inventory's ansible_ssh_private_key_file."""
    import fabric
    import paramiko

    made = []

    class Recording:
        def __init__(self, **kwargs):
            self.kwargs, self.client = kwargs, FakeClient()
            made.append(self)

        def open(self):
            pass

    known = tmp_path / "known_hosts"
    known.write_text("")
    monkeypatch.setattr(fabric, "Connection", Recording)
    n = node(ansible_host="127.0.9.7", ansible_ssh_private_key_file=str(tmp_path / "id_ed25519"),
             ansible_ssh_common_args=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes")
    assert SshTransport().run(n, ["true"], timeout=5).ok
    conn = made[0]
    assert conn.client.system_keys and str(known) in conn.client.host_key_files
    assert isinstance(conn.client.policy, paramiko.RejectPolicy)
    assert conn.kwargs["connect_kwargs"]["key_filename"] == [str(tmp_path / "id_ed25519")]
    assert conn.kwargs["connect_kwargs"]["look_for_keys"] is False


@pytest.mark.parametrize(("args", "expected"), [
    ("-o UserKnownHostsFile=/a/kh -o StrictHostKeyChecking=yes", ["/a/kh"]),
    ("-oUserKnownHostsFile=/a/kh", ["/a/kh"]),
    ("-o 'UserKnownHostsFile /a/kh /b/kh'", ["/a/kh", "/b/kh"]),
    ("-o ProxyJump=bastion", []),
])
def test_known_hosts_files_from_ansible_ssh_args(args, expected):

    from preflight.transport import known_hosts_files

    assert known_hosts_files(node(ansible_ssh_common_args=args)) == [Path(p) for p in expected]


def test_ssh_background_server_is_bounded_and_quoted(monkeypatch):
    import shlex

    import fabric

    commands = []

    class FakeConnection:
        is_connected = True  # the second command reuses the connection

        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            pass

    def answer(channel, command):
        commands.append(command)
        channel.sendall(b"4242\n")
        finish(channel, 0)

    monkeypatch.setattr(FakeClient, "handler", staticmethod(answer))
    monkeypatch.setattr(fabric, "Connection", FakeConnection)
    n = node(rdma_nics=[{"device": "mlx5_0; reboot", "netdev": "ib0"}])
    server = SshTransport().start(n, ["ib_write_lat", "-d", n.nics[0].device, "-p", "18515"], limit=90)
    server.stop()
    launch, kill = commands
    # what the remote login shell runs (remote_command): sh -c 'timeout -k 5 35 "$@"; exit $?' sh ARGV, where
    # ARGV is the launcher, itself `sh -c` with the server's command line
    outer = shlex.split(launch)
    assert outer[:6] == ["sh", "-c", 'timeout -k 5 35 "$@"; exit $?', "sh", "sh", "-c"]
    inner = shlex.split(outer[6].removesuffix(" & echo $!").removesuffix(" >/dev/null 2>&1 </dev/null"))
    assert inner == ["nohup", "timeout", "90", "ib_write_lat", "-d", "mlx5_0; reboot", "-p", "18515"]
    assert shlex.split(kill) == ["sh", "-c", 'timeout -k 5 35 "$@"; exit $?', "sh", "kill", "4242"]
