"""A provisioned virtual cluster shared by the provisioning tests of one module.

`clusterctl virtual create` (3 nodes in 2 racks, the last rack RoCE) + `up` in a tmp dir; one host gets a
different CPU topology so that CPU lists provably come from the host's sysfs. The eas-agent token is a
vault-encrypted variable on r01n01. site.yml runs once in --check --diff (must change nothing), then for real,
then again (must change nothing). `down` always runs in teardown.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sim.hosts import simulate
from tests.provision.helpers import (
    MACHINE_BOOKKEEPING,
    PYTHON,
    RUNNING_SERVICES_STATE,
    TOKEN,
    VAULT_PASSWORD,
    clusterctl,
)


@dataclass
class VirtualCluster:
    inventory: Path
    hosts: tuple[str, ...]
    env: dict
    runs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    run_dirs: dict[str, Path] = field(default_factory=dict)
    snapshots: dict[str, dict[str, tuple]] = field(default_factory=dict)

    def upper(self, host: str) -> Path:
        """The machine's overlay upper dir: every file it has written."""
        return simulate.layout(self.inventory).host(host).upper

    def on_host(self, host: str, *argv: str) -> subprocess.CompletedProcess:
        """argv on the machine over SSH, as root through sudo (the way Ansible reaches it)."""
        return simulate.run_on(self.inventory, host, *argv)

    def read(self, host: str, path: str) -> str:
        result = self.on_host(host, "cat", path)
        assert result.returncode == 0, f"{host}:{path}: {result.stderr}"
        return result.stdout

    def exists(self, host: str, path: str) -> bool:
        return self.on_host(host, "test", "-e", path).returncode == 0

    def stat(self, host: str, path: str) -> str:
        return self.on_host(host, "stat", "-c", "%a %U %G", path).stdout.strip()

    def upper_snapshot(self) -> dict[str, tuple]:
        """Every file the machines have written (overlay upper dirs): path -> (size, mtime), except the
        machine's own bookkeeping that every SSH login or sudo changes (login records, systemd's state) and
        what the running services write on their own."""
        snap = {}
        for host in self.hosts:
            upper = self.upper(host)
            for path in upper.rglob("*"):
                if str(path.relative_to(upper)).startswith(MACHINE_BOOKKEEPING + RUNNING_SERVICES_STATE):
                    continue
                if path.is_file() or path.is_symlink():
                    st = path.lstat()
                    snap[str(path.relative_to(self.inventory))] = (st.st_size, st.st_mtime_ns)
        return snap

    def provision(self, name: str, *args: str) -> subprocess.CompletedProcess:
        run_dir = self.inventory.parent / f"run-{name}"
        result = clusterctl("provision", "-i", str(self.inventory), "--run-dir", str(run_dir), *args, env=self.env)
        self.runs[name], self.run_dirs[name] = result, run_dir
        return result


def _write_inventory(inventory: Path) -> None:
    created = clusterctl("virtual", "create", str(inventory), "--nodes", "3", "--racks", "2", "--fabric", "mixed",
                         "--faults", "none")
    assert created.returncode == 0, created.stderr
    # The agents' cycle: these tests read no load scores, and at the default 0.2 s each idle node's agent and
    # its IUs' /metrics answers cost ~18% of a core (measured with /proc): ~55% of one of CI's two cores for
    # the whole module. Their timing is tested in tests/eas_agent and the demo.
    with (inventory / "group_vars" / "all.yml").open("a") as f:
        f.write("eas_agent_interval_s: 1.0\n")
    host_vars = inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    # A host with 56-core sockets: its IUs' CPUAffinity must differ from the 48-core hosts'.
    with (host_vars / "r01n02.yml").open("a") as f:
        f.write("sim_hardware: {cores_per_socket: 56}\n")
    password_file = inventory.parent / "vault-password"
    password_file.write_text(VAULT_PASSWORD + "\n")
    password_file.chmod(0o600)
    encrypted = subprocess.run(
        [str(Path(PYTHON).with_name("ansible-vault")), "encrypt_string", "--vault-password-file", str(password_file),
         "--stdin-name", "eas_agent_consul_token"],
        input=TOKEN, capture_output=True, text=True, check=True,
    ).stdout
    # One host's: each node's eas-agent token is its own (its policy writes only that node's keys; one
    # secret on three nodes would be re-pointed by each node's run), and the inventory's group_vars
    # already derive the others'.
    with (host_vars / "r01n01.yml").open("a") as f:
        f.write("# The agent's Consul ACL token, vault-encrypted.\n" + encrypted)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory) -> VirtualCluster:
    inventory = tmp_path_factory.mktemp("provision") / "inventory"
    _write_inventory(inventory)
    env = dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(inventory.parent / "vault-password"))
    cluster = VirtualCluster(inventory, ("r01n01", "r01n02", "r02n01"), env)
    up = clusterctl("virtual", "up", str(inventory))
    assert up.returncode == 0, up.stderr
    try:
        cluster.snapshots["fresh"] = cluster.upper_snapshot()
        cluster.provision("check", "--check", "--diff", "--batches", "100%")
        cluster.snapshots["after-check"] = cluster.upper_snapshot()
        cluster.provision("first", "--batches", "100%")
        cluster.provision("second", "--batches", "100%")
        yield cluster
    finally:
        down = clusterctl("virtual", "down", str(inventory))
        assert down.returncode == 0, down.stderr
