"""The demo's inventory step: what it reads from the inventory `virtual create` writes (no machine booted)."""

from __future__ import annotations

import stat

import pytest
from rich.console import Console

from demo.scenario import Demo
from sim.hosts import create

pytestmark = pytest.mark.unit


def test_consul_is_configured_from_an_inventory_with_edges_and_a_balancer(tmp_path):
    # the edges and balancers groups list hosts again with their own settings only (no ansible_host)
    inventory = tmp_path / "inventory"
    create.write(inventory, 2, 2, faults="none")
    assert "balancers" in (inventory / "hosts.yml").read_text()
    demo = Demo(inventory, tmp_path, processes=None, seed=1, console=Console(file=None), evidence=tmp_path)
    demo.configure_consul("r02n01")
    assert demo.consul_addr == "127.0.1.11:8500"
    token_file = tmp_path / "consul.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert f"consul_token_file: {token_file}" in (inventory / "group_vars" / "all.yml").read_text()
