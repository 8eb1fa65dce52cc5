"""``clusterctl dev consul``: loopback by default, ACL token file hygiene, runs until SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from cli.commands.dev import command
from common.errors import UsageError

TOKEN = "b1946ac9-2f0e-4c07-8f8a-1b1b0c3d9a55"


def test_help_says_it_is_not_consul():
    """The issue: the server is documented in its help as a development server that is not Consul."""
    result = CliRunner().invoke(command, ["consul", "--help"])
    assert result.exit_code == 0
    assert "not Consul" in result.output
    for option in ("--addr", "--data-dir", "--acl-token-file", "--log-level", "--allow-remote"):
        assert option in result.output


def test_non_loopback_address_refused_without_allow_remote():
    """Loopback by default; a non-loopback --addr needs --allow-remote."""
    # all interfaces, not loopback: refused before anything binds
    result = CliRunner().invoke(command, ["consul", "--addr", "0.0.0.0:8500"])
    assert isinstance(result.exception, UsageError)
    assert "--allow-remote" in str(result.exception)


def test_group_readable_token_file_refused(tmp_path):
    """A token file readable by group/others is refused, and the token is not echoed."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o640)
    result = CliRunner().invoke(command, ["consul", "--acl-token-file", str(token_file)])
    assert isinstance(result.exception, UsageError)
    assert "chmod 600" in str(result.exception)
    assert TOKEN not in str(result.exception)


def _clusterctl() -> str:
    path = Path(sys.executable).parent / "clusterctl"
    if not path.exists():
        pytest.skip("clusterctl entry point not installed in this environment")
    return str(path)


def _start(args: list[str]) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [_clusterctl(), "dev", "consul", "--addr", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    banner = proc.stderr.readline()
    match = re.search(r"http://(127\.0\.0\.1:\d+)", banner)
    if not match:
        proc.kill()
        raise AssertionError(banner)
    return proc, f"http://{match.group(1)}", banner


def test_acknowledged_writes_survive_kill_9(tmp_path):
    """Crash safety: after SIGKILL, a restart on the same data dir has every write that was answered."""
    data_dir = str(tmp_path / "data")
    proc, base, _ = _start(["--data-dir", data_dir])
    try:
        for i in range(20):
            assert requests.put(f"{base}/v1/kv/crash/{i}", data=str(i).encode(), timeout=5).json() is True
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    proc, base, _ = _start(["--data-dir", data_dir])
    try:
        keys = requests.get(f"{base}/v1/kv/crash/?keys", timeout=5).json()
        assert sorted(keys) == sorted(f"crash/{i}" for i in range(20))
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_runs_with_data_dir_and_acl_until_sigterm(tmp_path):
    """End to end: the server listens, enforces the token from the file, never prints the token, and
    exits cleanly on SIGTERM with its state on disk."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(
        [_clusterctl(), "dev", "consul", "--addr", "127.0.0.1:0", "--data-dir", str(data_dir),
         "--acl-token-file", str(token_file), "--log-level", "debug"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = proc.stderr.readline()
        match = re.search(r"http://(127\.0\.0\.1:\d+)", banner)
        assert match, banner
        base = f"http://{match.group(1)}"
        assert requests.put(f"{base}/v1/kv/k", data=b"v", timeout=5).status_code == 403
        resp = requests.put(f"{base}/v1/kv/k?token={TOKEN}", data=b"v", timeout=5)
        assert resp.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert TOKEN not in banner + out + err
    assert (data_dir / "state.json").exists()
