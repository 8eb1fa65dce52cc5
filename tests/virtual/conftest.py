"""Fixtures for simulated hosts: inventories written by ``virtual create`` in a tmp dir, always torn down."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sim.hosts import create, namespaces, simulate

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root (namespaces, mounts)")


def sim_mounts(inventory_dir: Path) -> list[str]:
    """Mount points under the inventory's state dir, as /proc/self/mountinfo lists them."""
    return namespaces.mounts_under(namespaces.state_dir_of(inventory_dir))


def run_on(inventory_dir: Path, host: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run argv on a simulated host through its ``run`` wrapper (clusterctl_exec_prefix)."""
    wrapper = namespaces.state_dir_of(inventory_dir) / host / "run"
    return subprocess.run([str(wrapper), *argv], capture_output=True, text=True, timeout=timeout)


def calls_of(inventory_dir: Path, host: str) -> list[dict]:
    import json

    log = namespaces.HostPaths(namespaces.state_dir_of(inventory_dir), host).calls_log
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
    """up_inventory(...) -> inventory dir with its hosts up; every one brought up is torn down after the test."""
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
        assert sim_mounts(directory) == [], f"mounts left behind under {directory}"
