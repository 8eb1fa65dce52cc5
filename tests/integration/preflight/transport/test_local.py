"""The local transport (preflight/transport/local.py) running real processes: argv without a shell, the
timeout kills the whole process group, output over the cap is cut and the command killed, background servers
killed on stop."""

from __future__ import annotations

import os
import signal
import time

import pytest

from preflight.transport import (
    KILL_GRACE_S,
    OUTPUT_CAP_BYTES,
    LocalTransport,
    RoutingTransport,
    SshTransport,
)
from tests.helpers.preflight import node

pytestmark = pytest.mark.integration


def test_local_transport_runs_argv_without_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    result = LocalTransport().run(node(), ["echo", f"$(touch {marker})", ";", "id"], timeout=5)
    assert result.ok and result.stdout == f"$(touch {marker}) ; id\n"
    assert not marker.exists()


def test_routing_follows_ansible_connection():
    """ansible_connection: local (preflight on the node itself) runs locally; anything else goes over SSH."""
    assert isinstance(RoutingTransport().for_host(node(ansible_connection="local")), LocalTransport)
    assert isinstance(RoutingTransport().for_host(node()), SshTransport)
    assert isinstance(RoutingTransport().for_host(node(ansible_connection="ssh")), SshTransport)


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = LocalTransport().run(node(), ["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout=0.5)
    assert result.timed_out and result.rc is None and time.monotonic() - started < 5
    child = int(pid_file.read_text())
    assert _gone(child)


def test_a_descendant_that_left_the_group_does_not_hold_the_run(tmp_path):
    """after a timeout kills the group, a descendant in its own session (setsid, a daemon) still
    holds stdout/stderr open; the run returns within the kill grace with what came, instead of waiting on it."""
    pid_file = tmp_path / "escaped.pid"
    script = f"echo before; setsid sh -c 'echo $$ > {pid_file}; exec sleep 20' & sleep 30"
    started = time.monotonic()
    try:
        result = LocalTransport().run(node(), ["sh", "-c", script], timeout=0.5)
        assert result.timed_out and result.rc is None
        assert time.monotonic() - started < 0.5 + KILL_GRACE_S + 2
        assert result.stdout == "before\n"
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_local_output_over_the_cap_is_truncated_and_the_command_killed(tmp_path):
    """stdout was read whole (`communicate`). Reading stops at the cap, the result says
    truncated (rc None: we ended it), and the command's group is killed instead of left writing: here it would
    sleep 30 s after its output, so the run returning at once shows it did not wait for it."""
    pid_file = tmp_path / "flood.pid"
    script = f"echo $$ > {pid_file}; head -c {OUTPUT_CAP_BYTES + 2**20} /dev/zero; exec sleep 30"
    started = time.monotonic()
    result = LocalTransport().run(node(), ["sh", "-c", script], timeout=20)
    assert result.truncated and not result.timed_out and result.rc is None and not result.ok
    assert len(result.stdout) == OUTPUT_CAP_BYTES and result.stderr == ""
    assert time.monotonic() - started < 10
    assert _gone(int(pid_file.read_text()))


def test_local_output_under_the_cap_is_read_as_before():
    """A chatty but legal output (under the cap, on both streams) comes back whole, newlines as text mode
    gave them (CRLF -> LF), with its exit status."""
    script = "head -c 3000000 /dev/zero; printf 'a\\r\\nb\\n'; printf 'err\\n' >&2; exit 3"
    result = LocalTransport().run(node(), ["sh", "-c", script], timeout=20)
    assert (result.rc, result.truncated, result.timed_out) == (3, False, False)
    assert result.stdout == "\0" * 3000000 + "a\nb\n" and result.stderr == "err\n"


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_missing_program_is_a_failed_command_not_an_unreachable_host():
    result = LocalTransport().run(node(), ["/nonexistent/clusterctl-test-tool"], timeout=5)
    assert result.rc is None and not result.unreachable and "No such file" in result.stderr


def test_background_server_is_killed_on_stop(tmp_path):
    server = LocalTransport().start(node(), ["sleep", "30"], limit=60)
    pid = server.proc.pid
    server.stop()
    assert _gone(pid)
