"""The demo's inventory step: what it reads from the inventory `virtual create` writes (no machine booted)."""

from __future__ import annotations

import stat

import pytest
import yaml
from rich.console import Console

from demo.scenario import Demo
from sim.hosts import create

pytestmark = pytest.mark.unit


def test_consul_is_configured_from_an_inventory_with_edges_and_a_balancer(tmp_path):
    # the edges and balancers groups list hosts again with their own settings only (no ansible_host)
    inventory = tmp_path / "inventory"
    create.write(inventory, 2, 2, faults="none")
    assert "balancers" in (inventory / "hosts.yml").read_text()
    demo = Demo(inventory, tmp_path, seed=1, console=Console(file=None), evidence=tmp_path)
    demo.configure_inventory("r02n01")
    assert demo.consul_addr == "127.0.1.11:8500"
    token_file = tmp_path / "consul.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert f"consul_token_file: {token_file}" in (inventory / "group_vars" / "all.yml").read_text()


def test_the_clients_go_to_the_provisioned_balancer_with_a_key_the_edges_are_given(tmp_path):
    inventory = tmp_path / "inventory"
    create.write(inventory, 2, 2, faults="none")
    demo = Demo(inventory, tmp_path, seed=1, console=Console(file=None), evidence=tmp_path)
    demo.configure_inventory("r02n01")
    group_vars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    assert group_vars["eas_edge_client_keys"] == [{"tenant": "demo", "key": demo.client_key}] and demo.client_key
    assert group_vars["eas_edge_debug_headers"] is True  # the live table names the IU each answer came from
    # the balancer (HAProxy on the first edge's machine), and each edge's /metrics on its own address
    assert demo.edges() == ("http://127.0.1.5:8080", ["http://127.0.1.11:9180", "http://127.0.2.11:9180"])


def test_the_calibration_step_runs_edge_calibrate_through_the_balancer_with_the_tenants_key(tmp_path, monkeypatch):
    from demo import scenario
    from operate.scenario import load_scenario

    inventory = tmp_path / "inventory"
    create.write(inventory, 2, 2, faults="none")
    demo = Demo(inventory, tmp_path, seed=1, console=Console(file=None), evidence=tmp_path)
    demo.configure_inventory("r02n01")
    ran = []
    monkeypatch.setattr(demo, "clusterctl", lambda *args, **kw: ran.append((args, kw)) or "table\n")
    demo.calibrate(["r01n01-iu0", "r01n01-iu1"])
    ((args, kw),) = ran
    options = dict(zip(args[2::2], args[3::2], strict=False))
    assert args[:2] == ("edge", "calibrate") and options["-i"] == str(inventory)
    assert kw["expect"] == (0, 1)  # a unit flagged is calibrate's finding, shown, not the demo's failure
    key = tmp_path / "client.key"
    assert options["--api-key-file"] == str(key) and key.read_text().strip() == demo.client_key
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (options["--rate"], options["--requests"], options["--max-requests"]) == ("6", "50", "150")
    assert float(options["--detect-scale"]) == scenario.CALIBRATE_DETECT_SCALE
    mix = load_scenario(options["--scenario"])
    assert {k.name for k in mix.classes} == {k.name for k in load_scenario().classes}
    assert all(k.output.mean == 12 for k in mix.classes)
