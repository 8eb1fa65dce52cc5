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
