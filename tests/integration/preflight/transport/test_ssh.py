"""preflight.transport.exec_on: one command on a paramiko channel, against a real SSH server in-process."""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from preflight.transport import (
    OUTPUT_CAP_BYTES,
    SshTransport,
    exec_on,
)
from tests.helpers.preflight import node
from tests.helpers.sshserver import client_transport, finish
from tests.unit.preflight.transport.test_ssh import FakeClient

pytestmark = pytest.mark.integration

BIG = 3 * 2**20  # more than paramiko's 2 MiB channel window: a reader of one stream only would stall


SEEN: list[str] = []  # every command line the server got
FLOOD_STOPPED = threading.Event()  # set when the "flood" command could write no more (its channel closed)


def handler(channel, command):
    SEEN.append(command)
    words = shlex.split(command)  # SshTransport's line: sh -c 'timeout -k K L "$@"; exit $?' sh ARGV (remote_command)
    if words[:2] == ["sh", "-c"] and re.fullmatch(r'timeout -k \d+ \d+ "\$@"; exit \$\?', words[2]):
        command = " ".join(words[4:])
    if command == "both":
        channel.sendall(b"out\n")
        channel.sendall_stderr(b"err\n")
        finish(channel, 3)
    elif command == "status first":
        channel.sendall(b"x")
        finish(channel, 0, eof_first=False)
    elif command == "big":  # all of stderr before any stdout
        channel.sendall_stderr(b"e" * BIG)
        channel.sendall(b"o" * BIG)
        finish(channel, 0)
    elif command == "hang":
        channel.sendall(b"partial\n")
        time.sleep(30)
    elif command == "bad bytes":
        channel.sendall(b"\xff\xfe ok\n")
        finish(channel, 0)
    elif command == "stdin":  # reached only once EOF came on its stdin (sshserver waits for it), as `cat`
        channel.sendall(b"stdin closed\n")
        finish(channel, 0)
    elif command == "true":
        finish(channel, 0)
    elif command == "flood":  # an XID storm: output without end, until the channel is gone
        try:
            while True:
                channel.sendall(b"x" * 65536)
        except OSError:
            FLOOD_STOPPED.set()
    elif command == "vanish":  # closed with no exit status (killed by a signal)
        channel.sendall(b"half")
        channel.close()


@pytest.fixture(scope="module")
def transport():
    client = client_transport(handler)
    yield client
    client.close()


def test_stdout_stderr_and_the_exit_status_come_back_apart(transport):
    assert exec_on(transport, "both", 10) == (3, "out\n", "err\n", False, False)
    assert exec_on(transport, "status first", 10) == (0, "x", "", False, False)


def test_large_output_on_both_streams_does_not_stall(transport):
    started = time.monotonic()
    rc, out, err, timed_out, truncated = exec_on(transport, "big", 20)
    assert (rc, len(out), len(err), timed_out, truncated) == (0, BIG, BIG, False, False)
    assert time.monotonic() - started < 20


def test_a_timeout_returns_what_came_so_far(transport):
    started = time.monotonic()
    assert exec_on(transport, "hang", 0.5) == (None, "partial\n", "", True, False)
    assert time.monotonic() - started < 5


def test_output_over_the_cap_stops_the_read_and_closes_the_channel(transport):
    """a command that prints without end (an XID storm in `journalctl -k`) was read
    whole into the controller's memory. Reading stops at the cap, the result says truncated, and the channel
    is closed, so the command on the host can write no more (over sshd: SIGPIPE on its next write)."""
    FLOOD_STOPPED.clear()
    started = time.monotonic()
    rc, out, err, timed_out, truncated = exec_on(transport, "flood", 60)
    assert (rc, len(out), err, timed_out, truncated) == (None, OUTPUT_CAP_BYTES, "", False, True)
    assert time.monotonic() - started < 30
    assert FLOOD_STOPPED.wait(10), "the command kept writing into a channel nobody reads"


def test_hostile_bytes_are_replaced_not_raised(transport):
    assert exec_on(transport, "bad bytes", 10) == (0, "\ufffd\ufffd ok\n", "", False, False)


def test_stdin_is_closed_at_once(transport):
    assert exec_on(transport, "stdin", 5) == (0, "stdin closed\n", "", False, False)


def test_a_channel_closed_without_a_status_is_status_minus_one(transport):
    assert exec_on(transport, "vanish", 5) == (-1, "half", "", False, False)


def test_many_commands_at_once_on_one_connection(transport):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: exec_on(transport, "both", 20), range(48)))
    assert results == [(3, "out\n", "err\n", False, False)] * 48


class _FakeClient:  # the parts of paramiko's SSHClient that SshTransport uses
    live = None

    def load_system_host_keys(self, filename=None):
        pass

    def load_host_keys(self, filename):
        pass

    def set_missing_host_key_policy(self, policy):
        pass

    def get_transport(self):
        return self.live


def _fake_fabric(monkeypatch, refuse_sessions: int = 0, always_dropped: bool = False) -> list[int]:
    """fabric.Connection replaced by one whose open() connects to the in-process server (refusing its first
    ``refuse_sessions`` channels); connected while its transport is active, or never (``always_dropped``: every
    command finds it dropped since the last one). Returns the list that each open() appends to."""
    import fabric

    opened: list[int] = []

    class Connection:
        def __init__(self, **kwargs):
            self.client = _FakeClient()

        @property
        def is_connected(self):
            return not always_dropped and self.client.live is not None and self.client.live.is_active()

        def open(self):
            opened.append(1)
            self.client.live = client_transport(handler, refuse_sessions)

    monkeypatch.setattr(fabric, "Connection", Connection)
    return opened


@pytest.mark.parametrize(("refused", "answers"), [(1, True), (2, False)])
def test_a_channel_refused_once_on_a_live_connection_is_asked_for_again(monkeypatch, refused, answers):
    from preflight.transport import SshTransport
    from tests.helpers.preflight import node

    _fake_fabric(monkeypatch, refuse_sessions=refused)
    result = SshTransport().run(node(), ["both"], timeout=10)
    if answers:
        assert (result.rc, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    else:  # refused twice: unreachable, with paramiko's reason
        assert result.unreachable and "prohibited" in result.stderr, result


def test_a_dropped_connection_is_opened_again_for_the_next_command(monkeypatch):
    """fabric's run() reconnected a connection that had dropped (sshd restarted); commands on paramiko
    channels keep that: the next command opens it again instead of failing on the dead transport."""
    from preflight.transport import SshTransport
    from tests.helpers.preflight import node

    opened = _fake_fabric(monkeypatch, always_dropped=True)
    transport = SshTransport()
    assert transport.run(node(), ["true"], timeout=10).ok
    assert transport.run(node(), ["true"], timeout=10).ok
    assert len(opened) == 2


def test_a_connection_that_dies_under_a_command_is_opened_again_for_one_more_try(monkeypatch):
    """A connection that looked up when the command began and died under it: paramiko raises the EOFError that
    ended the transport (no message; preflight reported `ssh: ` and an unreachable host, seen in the 18-machine
    fault matrix under load). The command runs again on a new connection."""
    from preflight.transport import SshTransport
    from tests.helpers.preflight import node

    class DiesOnUse:  # up when looked at, gone when a channel is asked of it
        dead = False

        def open_session(self, timeout=None):
            self.dead = True
            raise EOFError()

        def is_active(self):
            return not self.dead

    opened = _fake_fabric(monkeypatch)
    transport, host = SshTransport(), node()
    assert transport.run(host, ["true"], timeout=10).ok
    transport._connections[host.name].client.live = DiesOnUse()
    result = transport.run(host, ["true"], timeout=10)
    assert result.ok and not result.unreachable and len(opened) == 2, result


def test_a_refused_connection_reads_plainly_without_errno_none():
    # paramiko says "[Errno None] Unable to connect to port 1 on 127.0.0.1"; every
    # check row of an unreachable host carried it
    import socket

    from preflight.transport import SshTransport
    from tests.helpers.preflight import node

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = SshTransport()
    try:
        result = transport.run(node(ansible_host="127.0.0.1", ansible_port=port), ["true"], timeout=5)
    finally:
        transport.close()
    assert result.unreachable
    assert result.stderr == f"ssh: cannot connect to 127.0.0.1 port {port}: connection refused", result.stderr


def test_the_command_has_its_own_limit_on_the_host(monkeypatch):
    """closing the channel on our timeout left a hung command running on the host, one more per run.
    The host's coreutils `timeout` ends it (TERM, then KILL) a grace after our own deadline, which still decides."""
    from preflight.transport import REMOTE_GRACE_S, REMOTE_KILL_S, SshTransport
    from tests.helpers.preflight import node

    _fake_fabric(monkeypatch)
    SEEN.clear()
    result = SshTransport().run(node(), ["both"], timeout=7.2)
    assert result.rc == 3
    assert SEEN == [shlex.join(["sh", "-c", f'timeout -k {REMOTE_KILL_S} {8 + REMOTE_GRACE_S} "$@"; exit $?', "sh",
                                "both"])]
    assert shlex.split(SEEN[0])[4:] == ["both"]  # the argv itself still one quoted word each


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_a_command_killed_by_a_signal_on_the_host_reports_128_plus_its_number(shell):
    # the login shell runs the line as sshd has it do: `$SHELL -c LINE`
    """sshd runs the line with the user's shell. A lone command was exec'd in the shell's place, so its death by
    a signal ended the session with an SSH exit-signal, which paramiko does not read (status -1, which preflight
    printed as "exited -1"); the line keeps the shell waiting, and it exits 128 + the signal's number."""
    import subprocess

    from preflight.transport import remote_command

    killed = subprocess.run([shell, "-c", remote_command(["sh", "-c", "kill -9 $$"], 5)], capture_output=True)
    assert killed.returncode == 137
    exited = subprocess.run([shell, "-c", remote_command(["sh", "-c", "exit 3"], 5)], capture_output=True)
    assert exited.returncode == 3
    words = subprocess.run([shell, "-c", remote_command(["printf", "%s|", "a b", "$(id)", "'; reboot"], 5)],
                           capture_output=True, text=True)
    assert (words.returncode, words.stdout) == (0, "a b|$(id)|'; reboot|")  # each argv word arrives as it was


def test_a_channel_closed_without_a_status_says_so_instead_of_exited_minus_one(monkeypatch):
    from preflight.transport import SshTransport
    from tests.helpers.preflight import node

    _fake_fabric(monkeypatch)
    result = SshTransport().run(node(), ["vanish"], timeout=5)
    assert (result.rc, result.no_exit_status, result.ok, result.stdout) == (None, True, False, "half")
    assert result.ended() == "ended without an exit status (its SSH channel closed first)"


def test_a_changed_host_key_is_unreachable_with_the_reason(monkeypatch):
    import fabric
    import paramiko

    class Changed:
        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            raise paramiko.BadHostKeyException("127.0.9.7", _ed25519(), _ed25519())

    monkeypatch.setattr(fabric, "Connection", Changed)
    result = SshTransport().run(node(ansible_host="127.0.9.7"), ["true"], timeout=5)
    assert result.unreachable and "host key for 127.0.9.7 changed" in result.stderr


def _ed25519():
    import subprocess
    import tempfile
    from pathlib import Path

    import paramiko

    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/k"], check=True)
        return paramiko.Ed25519Key.from_private_key_file(str(Path(d) / "k"))


def test_the_ssh_libraries_load_safely_from_many_threads_at_once(tmp_path):
    """The first SSH use happens on the runner's worker threads. Before the import lock, one thread opening
    a connection (fabric) while another ran a command (paramiko.ssh_exception) failed every time in a fresh
    interpreter with "cannot import name 'PKey' from partially initialized module" (CI crash of the demo)."""
    import subprocess

    script = tmp_path / "race.py"
    script.write_text(
        "import threading\n"
        "from cluster.model import Node\n"
        "from cluster.settings import node_settings\n"
        "from preflight.transport import SshTransport\n"
        "transport = SshTransport(connect_timeout=1)\n"
        "barrier, failures = threading.Barrier(8), []\n"
        "def use(i):\n"
        "    n = Node(f'n{i}', '127.0.0.1', 'r1', 'h100-sxm', 8, 4, (0,) * 8, (), (),\n"
        "             node_settings({'ansible_host': '127.0.0.1', 'ansible_port': 1}))\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        if i % 2:\n"
        "            try:\n"
        "                transport._connection(n)\n"
        "            except OSError:\n"
        "                pass\n"
        "        else:\n"
        "            transport.run(n, ['true'], timeout=2)\n"
        "    except ImportError as exc:\n"
        "        failures.append(repr(exc))\n"
        "threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(failures)\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(script)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_unreachable_and_hung_hosts_are_reported_not_waited_on(tally):
    from cluster.model import Node
    from cluster.settings import node_settings
    from preflight.transport import LocalTransport, SshTransport

    def node(name, **vars_):
        return Node(name, "127.0.0.1", "r1", "h100-sxm", 8, 4, (0,) * 8, (), (), node_settings(vars_))

    started = time.monotonic()
    result = SshTransport(connect_timeout=2).run(node("gone", ansible_host="127.0.0.1", ansible_port=1),
                                                 ["true"], timeout=5)
    assert result.unreachable and not result.ok and time.monotonic() - started < 5
    started = time.monotonic()
    result = LocalTransport().run(node("hung"), ["sleep", "30"], timeout=0.5)
    assert result.timed_out and time.monotonic() - started < 5  # the process group was killed
    tally.fault("unreachable host (ssh refused)")
    tally.fault("hung command on a host (timeout, process group killed)")


def test_a_hung_sshd_is_unreachable_within_the_connect_timeout_and_says_so(tally):
    """A host whose sshd takes the TCP connection and never speaks (wedged, or not SSH on that port): paramiko
    gives up after the connect timeout and then reports only "No existing session"; the reason names the
    address and what happened."""
    from cluster.model import Node
    from cluster.settings import node_settings
    from preflight.transport import SshTransport

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()[0]) for _ in range(4)], daemon=True).start()
    host = Node("wedged", "127.0.0.1", "r1", "h100-sxm", 8, 4, (0,) * 8, (), (),
                node_settings({"ansible_host": "127.0.0.1", "ansible_port": port}))
    try:
        started = time.monotonic()
        result = SshTransport(connect_timeout=2).run(host, ["true"], timeout=5)
        assert result.unreachable and not result.ok and time.monotonic() - started < 2 + 4
        assert "127.0.0.1 took the connection but no SSH handshake came within 2 s" in result.stderr, result.stderr
    finally:
        server.close()
        for sock in held:
            sock.close()
    tally.fault("hung host (sshd takes the connection, never answers)")
