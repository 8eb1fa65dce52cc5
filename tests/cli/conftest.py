"""Helpers for the CLI tests: run ``clusterctl`` in-process and capture one line, the exit code."""

from __future__ import annotations

import pytest


@pytest.fixture
def clusterctl(capsys, monkeypatch):
    """``clusterctl(*args)`` -> (exit code, stdout, stderr) at ``columns`` wide, as a shell would run it."""
    from tests.helpers import run_cli

    def run(*args: str, columns: int = 100):
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        return run_cli(capsys, *args)

    return run


@pytest.fixture(scope="session")
def virtual_inventory(tmp_path_factory):
    """A virtual inventory on disk (4 nodes, 2 racks, no faults); no simulated host is brought up."""
    from sim.hosts import create

    path = tmp_path_factory.mktemp("inv") / "mycluster"
    create.write(path, 4, 2, faults="none")
    return path
