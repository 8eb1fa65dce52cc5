"""Fixtures of the CLI tests (``clusterctl`` itself is in tests/conftest.py, shared with other areas)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def virtual_inventory(tmp_path_factory):
    """A virtual inventory on disk (4 nodes, 2 racks, no faults); no simulated host is brought up."""
    from sim.hosts import create

    path = tmp_path_factory.mktemp("inv") / "mycluster"
    create.write(path, 4, 2, faults="none")
    return path


@pytest.fixture
def brought_up_inventory(tmp_path):
    """A virtual inventory of its own (4 nodes, 2 racks) with the machines' state directory that `virtual up`
    creates (no machine is booted): where a machine's overlay, and the provisioned stamp in it, would be."""
    from sim.hosts import create, state_dir

    path = tmp_path / "brought-up"
    create.write(path, 4, 2, faults="none")
    (path / state_dir.STATE_DIR_NAME).mkdir(mode=0o700)
    return path
