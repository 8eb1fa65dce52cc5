"""Fixtures for simulated machines: inventories written by ``virtual create`` in a tmp dir, always torn down.

Bringing machines up needs root, systemd-nspawn and the machine image (built on first use, cached under
/var/cache/clusterctl/images); run these tests under ``flock /tmp/clusterctl-virtual.lock`` when others
share the machine (machines bind fixed 127.0.R.N addresses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.hosts import create, machines, simulate

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
    reason="simulated machines need root and systemd-nspawn (apt-get install systemd-container)",
)


def leftovers(inventory_dir: Path) -> list[str]:
    """What a torn-down inventory must not have: its processes, mounts, overlays, cgroups (machines.leftovers)."""
    return machines.leftovers(machines.state_dir_of(inventory_dir))


def run_on(inventory_dir: Path, host: str, *argv: str, become: bool = True,
           timeout: float = 60) -> subprocess.CompletedProcess:
    """Run argv on a machine over SSH as the inventory does (deploy, sudo unless become=False)."""
    return simulate.run_on(inventory_dir, host, *argv, become=become, timeout=timeout)


def calls_of(inventory_dir: Path, host: str) -> list[dict]:
    log = simulate.layout(inventory_dir).host(host).calls_log
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def make_inventory(tmp_path):
    """make_inventory(nodes, racks, **create options) -> inventory dir (hosts not up)."""

    def make(nodes: int = 4, racks: int = 2, **options) -> Path:
        directory = tmp_path / f"inv{len(list(tmp_path.iterdir()))}"
        create.write(directory, nodes, racks, **options)
        return directory

    return make


@pytest.fixture
def up_inventory(make_inventory):
    """up_inventory(...) -> inventory dir with its machines up; every one brought up is torn down after."""
    brought_up: list[Path] = []

    def up(nodes: int = 4, racks: int = 2, host_vars: dict[str, str] | None = None, **options) -> Path:
        directory = make_inventory(nodes, racks, **options)
        for host, text in (host_vars or {}).items():
            (directory / "host_vars").mkdir(exist_ok=True)
            (directory / "host_vars" / f"{host}.yml").write_text(text)
        brought_up.append(directory)
        simulate.up(directory)
        return directory

    yield up
    for directory in brought_up:
        simulate.down(directory)
        assert leftovers(directory) == [], f"left behind under {directory}"
