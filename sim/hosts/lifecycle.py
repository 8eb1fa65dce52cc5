"""From an inventory to running simulated hosts: the library behind ``clusterctl virtual up|down``."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.ansible.inventory import cluster_of, load_inventory
from cluster.ansible.vault import VaultSecrets
from common.errors import ClusterctlError
from sim.hosts import faults, hardware, image, machines, repos


@dataclass(frozen=True)
class UpResult:
    hosts: list[str]
    unreachable: list[str]
    seconds: float


def inventory_dir(inventory: str | Path) -> Path:
    """The directory Ansible calls ``inventory_dir`` for this source (the state dir .sim lives under it)."""
    path = Path(inventory).resolve()
    return path if path.is_dir() else path.parent


def simulated_hosts(inventory: str | Path, limit: str | None = None,
                    vault_secrets: VaultSecrets | None = None) -> dict[str, machines.SimHost]:
    """Every host of the inventory with its hardware (``sim_faults`` applied), faults and address."""
    # The simulator's own variables (sim_faults, sim_hardware) are not node settings: read them from the
    # loaded host variables, next to the validated model.
    loaded = load_inventory(inventory, limit, vault_secrets)
    cluster = cluster_of(loaded)
    hosts = {}
    pinned_lids: dict[str, int | None] = {}
    problems = []
    not_loopback = []
    for node in cluster.nodes():
        try:
            machines.check_hostname(node.name)
            loopback = ipaddress.ip_address(node.address).is_loopback
        except machines.MachineError as exc:
            problems.append(str(exc))
            continue
        except ValueError:
            loopback = False
        if not loopback:
            # Machines share this machine's network: an address outside 127.0.0.0/8 would be a real network.
            not_loopback.append(f"{node.name}: ansible_host={node.address!r}")
            continue
        hostvars = loaded.selected[node.name]
        fault_list = list(hostvars.get("sim_faults") or [])
        try:
            hw = hardware.resolve(node.name, hostvars)
            hosts[node.name] = machines.SimHost(faults.apply(hw, fault_list), fault_list, node.address,
                                                hostvars.get("inference_unit_model_path", _default_model_path()))
            pinned_lids[node.name] = ((hostvars.get("sim_hardware") or {}).get("hca") or {}).get("lid_base")
        except (faults.FaultError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"{node.name}: sim_hardware/sim_faults: {exc}")
    problems += _loopback_problems(not_loopback, sum(1 for _ in cluster.nodes()))
    if problems:
        raise ClusterctlError("\n".join(problems), exit_code=2)
    _assign_lids(hosts, pinned_lids)
    return hosts


def _loopback_problems(not_loopback: list[str], hosts: int) -> list[str]:
    """One line per host outside 127.0.0.0/8 when there are a few; one line in all when there are many (a real
    inventory given to `virtual up` by mistake would otherwise print a line for each of its hosts)."""
    need = "a simulated machine needs a loopback address (127.0.0.0/8)"
    if len(not_loopback) <= 3:
        return [f"{where}: {need}" for where in not_loopback]
    what = ("none of its hosts is on loopback: this is not a virtual inventory"
            if len(not_loopback) == hosts else f"{len(not_loopback)} of {hosts} hosts are not on loopback")
    return [f"{what} ({'; '.join(not_loopback[:3])}; +{len(not_loopback) - 3} more): {need}"]


def _default_model_path() -> str:
    import yaml

    defaults = Path(__file__).resolve().parents[2] / "roles/inference_unit/defaults/main.yml"
    return yaml.safe_load(defaults.read_text())["inference_unit_model_path"]


def _assign_lids(hosts: dict[str, machines.SimHost], pinned: dict[str, int | None]) -> None:
    """Unique LIDs across the fabric, as a subnet manager hands them out: the SM's port is LID 1, then
    8 per host in inventory order (sim_hardware.hca.lid_base pins a host's first LID instead)."""
    for position, (name, sim) in enumerate(hosts.items()):
        base = int(pinned[name]) if pinned.get(name) else 8 * (position + 1)
        for index, hca in enumerate(sim.hardware.hcas):
            hca.lid = base + index


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """One up/down at a time per inventory (two helpers, or CI and a person, on the same directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def state_dir(inventory: str | Path) -> Path:
    return machines.state_dir_of(inventory_dir(inventory))


def layout(inventory: str | Path) -> machines.Layout:
    return machines.Layout(state_dir(inventory))


def up(inventory: str | Path, limit: str | None = None, vault_secrets: VaultSecrets | None = None,
       progress=_stderr_progress) -> UpResult:
    """Boot one machine per host (building the base image first when it is not cached)."""
    start = time.monotonic()
    hosts = simulated_hosts(inventory, limit, vault_secrets)
    image_root = image.ensure(progress)
    try:
        with _exclusive(inventory_dir(inventory)):
            # The package sources first: a machine is provisioned from them as soon as it is up.
            repos.ensure_serving(state_dir(inventory), progress)
            machines.up(state_dir(inventory), image_root, hosts, progress)
    except machines.MachineError as exc:
        raise ClusterctlError(str(exc)) from None
    return UpResult(
        hosts=list(hosts),
        unreachable=[name for name, sim in hosts.items() if sim.hardware.unreachable],
        seconds=time.monotonic() - start,
    )


def down(inventory: str | Path) -> int:
    """Stop the inventory's machines; returns how many were running."""
    directory = state_dir(inventory)
    if not directory.exists():
        return 0
    try:
        with _exclusive(inventory_dir(inventory)):
            stopped = machines.down(directory)
            repos.release(directory)
            return stopped
    except machines.MachineError as exc:
        raise ClusterctlError(str(exc)) from None


def status(inventory: str | Path) -> list[machines.MachineState]:
    """Each machine of the inventory: systemd's state inside it (or stopped), its faults and address."""
    return machines.status(state_dir(inventory))


def address_of(inventory: str | Path, host: str) -> str:
    paths = layout(inventory).host(host)
    return json.loads((paths.state / "host.json").read_text())["address"]


def ssh_argv(inventory: str | Path, host: str, *argv: str, become: bool = True) -> list[str]:
    """ssh argv running ``argv`` on a machine as the inventory reaches it (deploy, key, known_hosts),
    as root through sudo unless ``become`` is false; the remote shell gets one quoted word per argument."""
    remote = shlex.join(["sudo", "-n", *argv] if become else list(argv))
    return machines.ssh_argv(layout(inventory), address_of(inventory, host), remote)


def run_on(inventory: str | Path, host: str, *argv: str, become: bool = True,
           timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(ssh_argv(inventory, host, *argv, become=become), capture_output=True, text=True,
                          timeout=timeout)


def machine_cpu_seconds(inventory: str | Path) -> float:
    """CPU (user + system) used so far by every machine of the inventory: each machine's PID 1 and its
    live descendants, plus what their exited children used (benchmarks take the difference over a run)."""
    import psutil

    total = 0.0
    where = layout(inventory)
    for leader_file in where.machines_dir.glob("*/leader.pid"):
        try:
            leader = psutil.Process(machines.current_leader(where.host(leader_file.parent.name)) or -1)
            tree = [leader, *leader.children(recursive=True)]
        except (psutil.Error, ValueError):
            continue
        for proc in tree:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total
