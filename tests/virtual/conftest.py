"""Fixtures for simulated machines: inventories written by ``virtual create`` in a tmp dir, always torn down.

Bringing machines up needs root, systemd-nspawn and the machine image (built on first use, cached under
/var/cache/clusterctl/images); run these tests under ``flock /tmp/clusterctl-virtual.lock`` when others
share the machine (machines bind fixed 127.0.R.N addresses).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.hosts import create
from sim.hosts import lifecycle as simulate
from tests.virtual.helpers import leftovers


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
