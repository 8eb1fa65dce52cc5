"""Helpers of the provisioning tests (tests/machines/provision/conftest.py declares the shared cluster fixture, a
:class:`VirtualCluster` built by :func:`write_inventory` + ``virtual up``)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from sim.hosts import lifecycle as simulate

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

    def driver_state(self) -> dict[str, tuple]:
        """host -> (loaded NVIDIA module version, Fabric Manager's state, persistenced's state)."""
        state = {}
        for host in self.hosts:
            loaded = self.on_host(host, "cat", "/sys/module/nvidia/version").stdout.strip()
            daemons = self.on_host(host, "systemctl", "is-active", "nvidia-fabricmanager", "nvidia-persistenced")
            state[host] = (loaded, *daemons.stdout.split())
        return state

    def iu_states(self) -> dict[str, str]:
        """host -> `systemctl is-active` of its first IU."""
        return {host: self.on_host(host, "systemctl", "is-active", "vllm-iu@0").stdout.strip() for host in self.hosts}

    def release_every_node(self) -> bool:
        """Every node's Consul agent started and every node released, as after a passed preflight
        (preflight/release.py): the IUs become routable and the edges' /healthz 200. False while an agent has
        not rejoined yet (call again); an IU already released is left as it is."""
        from cluster import load_cluster
        from preflight.release import release_passed
        from preflight.result import CheckResult, Verdict
        from preflight.runner import RunOutcome

        for host in self.hosts:
            assert self.on_host(host, "systemctl", "start", "consul.service").returncode == 0
        for node in load_cluster(self.inventory).nodes():
            passed = CheckResult(node.rack, node.name, None, "consul", Verdict.PASS, "stand-in for a passed run", {})
            if node.name not in release_passed([node], RunOutcome([passed], 0.0, 0.0, None, ["consul"])):
                return False
        return True

    # A bound on one run, not a target: on a loaded two-core host the first run (every role, the driver
    # install) took over 600 s.
    def provision(self, name: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
        run_dir = self.inventory.parent / f"run-{name}"
        # --yes: a run without --limit asks a terminal first, and this one's stdin may be the developer's
        result = clusterctl("provision", "-i", str(self.inventory), "--run-dir", str(run_dir), "--yes", *args,
                            env=self.env, timeout=timeout)
        self.runs[name], self.run_dirs[name] = result, run_dir
        return result


def create_inventory(inventory: Path) -> None:
    """The provisioning tests' virtual inventory as ``virtual create`` writes it (three nodes on two racks, both
    fabrics, no faults): the goldens under tests/fixtures/golden/provision are rendered from it."""
    created = clusterctl("virtual", "create", "-i", str(inventory), "--nodes", "3", "--racks", "2", "--fabric", "mixed",
                         "--faults", "none")
    assert created.returncode == 0, created.stderr


def write_inventory(inventory: Path) -> None:
    create_inventory(inventory)
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
    # One host builds nccl-tests (nvidia_stack's pinned-tarball path, over SSH like the rest): the stand-in
    # source on the controller; make is the one build tool the stand-in needs (a real site: build-essential).
    # Its links go beside the build, not into /usr/local/bin, where the machines' simulated all_reduce_perf
    # answers preflight.
    tarball = inventory.parent / "nccl-tests-2.13.11.tar.gz"
    sha256 = nccl_tests_source(tarball, "2.13.11")
    with (host_vars / "r02n01.yml").open("a") as f:
        f.write(f"nvidia_stack_nccl_tests_src: {tarball}\nnvidia_stack_nccl_tests_sha256: {sha256}\n"
                f"nvidia_stack_nccl_tests_build_packages: [make]\nnvidia_stack_nccl_tests_bin_dir: {NCCL_TESTS_BIN}\n")


NCCL_TESTS_BIN = "/opt/nccl-tests/bin"  # r02n01's nvidia_stack_nccl_tests_bin_dir (write_inventory)
NCCL_TESTS_MAKEFILE = """BUILDDIR ?= build
all:
\tmkdir -p $(BUILDDIR)
\tfor t in all_reduce_perf all_gather_perf reduce_scatter_perf; do \\
\t  printf '#!/bin/sh\\necho "%s from VERSION built with CUDA_HOME=$(CUDA_HOME) MPI=$(MPI)"\\n' $$t > $(BUILDDIR)/$$t; \\
\t  chmod 0755 $(BUILDDIR)/$$t; done
"""


def nccl_tests_source(path: Path, version: str) -> str:
    """A stand-in nccl-tests source tarball laid out as GitHub's (one top directory), its sha256 returned: its
    Makefile takes nccl-tests' own arguments (BUILDDIR, CUDA_HOME, MPI) and writes the three binaries preflight
    knows, each printing which source built it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = NCCL_TESTS_MAKEFILE.replace("VERSION", version).encode()
        info = tarfile.TarInfo(f"nccl-tests-{version}/Makefile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()
