"""From an inventory to running simulated hosts: the library behind ``clusterctl virtual up|down``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ClusterctlError
from cluster.inventory import load_cluster
from cluster.vault import VaultSecrets
from sim.hosts import faults, hardware, namespaces


@dataclass(frozen=True)
class UpResult:
    hosts: list[str]
    unreachable: list[str]
    seconds: float


def inventory_dir(inventory: str | Path) -> Path:
    """The directory Ansible calls ``inventory_dir`` for this source (the wrappers live under it)."""
    path = Path(inventory).resolve()
    return path if path.is_dir() else path.parent


def simulated_hosts(inventory: str | Path, limit: str | None = None,
                    vault_secrets: VaultSecrets | None = None) -> dict[str, namespaces.SimHost]:
    """Every host of the inventory with its hardware (``sim_faults`` applied), faults and address."""
    cluster = load_cluster(inventory, limit, vault_secrets)
    hosts = {}
    pinned_lids: dict[str, int | None] = {}
    problems = []
    for node in cluster.nodes():
        if node.vars.get("ansible_connection") != "local":
            problems.append(f"{node.name}: ansible_connection={node.vars.get('ansible_connection')!r}: not a "
                            "simulated host (simulated hosts run with ansible_connection: local)")
            continue
        fault_list = list(node.vars.get("sim_faults") or [])
        try:
            hw = hardware.resolve(node.name, node.vars)
            hosts[node.name] = namespaces.SimHost(faults.apply(hw, fault_list), fault_list, node.address)
            pinned_lids[node.name] = ((node.vars.get("sim_hardware") or {}).get("hca") or {}).get("lid_base")
        except (faults.FaultError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"{node.name}: sim_hardware/sim_faults: {exc}")
    if problems:
        raise ClusterctlError("\n".join(problems), exit_code=2)
    _assign_lids(hosts, pinned_lids)
    return hosts


def _assign_lids(hosts: dict[str, namespaces.SimHost], pinned: dict[str, int | None]) -> None:
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


def up(inventory: str | Path, limit: str | None = None, vault_secrets: VaultSecrets | None = None) -> UpResult:
    start = time.monotonic()
    hosts = simulated_hosts(inventory, limit, vault_secrets)
    try:
        with _exclusive(inventory_dir(inventory)):
            namespaces.up(namespaces.state_dir_of(inventory_dir(inventory)), hosts)
    except namespaces.NamespaceError as exc:
        raise ClusterctlError(str(exc)) from None
    return UpResult(
        hosts=list(hosts),
        unreachable=[name for name, sim in hosts.items() if sim.hardware.unreachable],
        seconds=time.monotonic() - start,
    )


def down(inventory: str | Path) -> int:
    state_dir = namespaces.state_dir_of(inventory_dir(inventory))
    if not state_dir.exists():
        return 0
    with _exclusive(inventory_dir(inventory)):
        return namespaces.down(state_dir)


@dataclass(frozen=True)
class HostStatus:
    name: str
    up: bool
    faults: list


def status(inventory: str | Path) -> list[HostStatus]:
    """Which simulated hosts of the inventory are up, and with which faults."""
    state_dir = namespaces.state_dir_of(inventory_dir(inventory))
    mounted = set(namespaces.mounts_under(state_dir / "ns"))
    out = []
    for host_json in sorted(state_dir.glob("*/state/host.json")):
        name = host_json.parts[-3]
        data = json.loads(host_json.read_text())
        unreachable = data["hardware"]["unreachable"]
        up = str(namespaces.HostPaths(state_dir, name).mnt_ns) in mounted or unreachable
        out.append(HostStatus(name, up, data.get("faults") or []))
    return out
