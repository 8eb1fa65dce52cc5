"""Helpers of the simulated-machine tests (tests/virtual/conftest.py declares the fixtures)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.hosts import lifecycle as simulate
from sim.hosts import machines

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
