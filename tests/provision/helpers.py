"""Helpers of the provisioning tests (tests/provision/conftest.py declares the shared cluster fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
VAULT_PASSWORD = "clusterctl-test-vault-password"
TOKEN = "9f1c3e2a-test-token-eas-agent-6b7d"  # a value to look for: it must never be printed
MACHINE_BOOKKEEPING = ("var/log/", "var/lib/systemd/", "var/lib/sudo/", "run/")
# What the services provisioning started write while they run, whoever connects: Consul's data_dir (the
# agent rewrites its state as it syncs), chrony's drift file, the tmp dirs.
RUNNING_SERVICES_STATE = ("opt/consul/", "var/lib/chrony/", "tmp/", "var/tmp/")


def clusterctl(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "cli.main", *args], cwd=REPO, env=env or os.environ.copy(),
        capture_output=True, text=True, timeout=timeout,
    )


def ansible_playbook(inventory: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    run_env = dict(env or os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(Path(PYTHON).with_name("ansible-playbook")), "-i", str(inventory), *args],
        cwd=REPO, env=run_env, capture_output=True, text=True, timeout=300,
    )


def stats_of(events_file: Path) -> dict[str, dict[str, int]]:
    for line in reversed(events_file.read_text().splitlines()):
        event = json.loads(line)
        if event.get("event") == "playbook_on_stats":
            return event["event_data"]
    raise AssertionError(f"{events_file}: no playbook_on_stats event")
