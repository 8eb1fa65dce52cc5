"""``clusterctl virtual create``: inventories that validate, the default inventory is its output."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import load_inventory
from sim.hosts import create
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]


def test_created_inventory_validates_and_has_the_requested_shape(tmp_path, capsys):
    directory = tmp_path / "big"
    code, out, err = run_cli(capsys, "virtual", "create", str(directory), "--nodes", "32", "--racks", "4",
                             "--gpu", "h200-sxm", "--fabric", "roce")
    assert code == 0, err
    assert "32 nodes in 4 racks" in out
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(directory))
    assert code == 0, err
    loaded = load_inventory(directory)
    assert len(loaded.everyone) == 32
    racks = {name[:3] for name in loaded.everyone}
    assert racks == {"r01", "r02", "r03", "r04"}
    hv = loaded.everyone["r04n08"]
    assert hv["ansible_host"] == "127.0.4.18"
    assert hv["gpu_model"] == "h200-sxm"
    assert {nic["link_layer"] for nic in hv["rdma_nics"]} == {"ethernet"}
    faulty = sorted(p.stem for p in (directory / "host_vars").glob("*.yml"))
    assert len(faulty) == 6 and "r01n01" not in faulty  # 32 // 4 scenarios, never the first node


def test_mixed_fabric_puts_the_last_rack_on_roce(make_inventory):
    loaded = load_inventory(make_inventory(6, 3, fabric="mixed"))
    layers = {host: {nic["link_layer"] for nic in hv["rdma_nics"]} for host, hv in loaded.everyone.items()}
    assert layers["r03n01"] == layers["r03n02"] == {"ethernet"}
    assert layers["r01n01"] == layers["r02n02"] == {"infiniband"}


def test_faults_none_writes_no_host_vars(make_inventory):
    assert not (make_inventory(4, 2, faults="none") / "host_vars").exists()


def test_default_faults_are_hardware_faults_on_at_least_three_nodes(make_inventory):
    loaded = load_inventory(make_inventory(4, 2, fabric="mixed"))
    faulty = {host: hv["sim_faults"] for host, hv in loaded.everyone.items() if hv.get("sim_faults")}
    assert len(faulty) >= 3 and len(faulty) < len(loaded.everyone)
    kinds = {f["kind"] for faults in faulty.values() for f in faults}
    assert not kinds & {"unreachable", "hang"}


def test_the_default_virtual_inventory_is_what_create_writes():
    """inventory/virtual is `virtual create --nodes 4 --racks 2 --fabric mixed`: no hand-edited drift."""
    expected = create.render(4, 2, fabric="mixed")
    for rel, text in expected.items():
        # the Consul secrets (sim/consul_security.py) are made fresh by every create: compare all but their values
        assert _unsecret((REPO / "inventory/virtual" / rel).read_text()) == _unsecret(text), rel
    on_disk = {str(p.relative_to(REPO / "inventory/virtual")) for p in (REPO / "inventory/virtual").rglob("*.yml")
               if ".sim" not in p.parts}
    assert on_disk == {rel for rel in expected if rel.endswith(".yml")}


def test_default_inventory_has_a_roce_rack_and_faults(capsys):
    data = yaml.safe_load((REPO / "inventory/virtual/hosts.yml").read_text())
    assert set(data["all"]["children"]["roce"]["hosts"]) == {"r02n01", "r02n02"}
    code, out, _ = run_cli(capsys, "inventory", "show", "-i", str(REPO / "inventory/virtual"))
    assert code == 0 and "2 racks, 4 nodes, 8 IUs" in out


def test_create_refuses_to_overwrite_without_force(tmp_path, capsys):
    directory = tmp_path / "inv"
    assert run_cli(capsys, "virtual", "create", str(directory), "--nodes", "2", "--racks", "1")[0] == 0
    code, _, err = run_cli(capsys, "virtual", "create", str(directory), "--nodes", "2", "--racks", "1")
    assert code == 2 and "--force" in err
    code, _, err = run_cli(capsys, "virtual", "create", str(directory), "--nodes", "2", "--racks", "1",
                           "--faults", "none", "--force")
    assert code == 0, err
    assert not list((directory / "host_vars").glob("*.yml"))


def test_more_racks_than_nodes_is_a_usage_error(tmp_path, capsys):
    code, _, err = run_cli(capsys, "virtual", "create", str(tmp_path / "x"), "--nodes", "2", "--racks", "3")
    assert code == 2 and "racks" in err


def test_lids_are_unique_across_the_fabric(make_inventory):
    from sim.hosts import lifecycle as simulate

    hosts = simulate.simulated_hosts(make_inventory(32, 4))
    lids = [hca.lid for sim in hosts.values() for hca in sim.hardware.hcas if hca.link_layer == "infiniband"]
    assert len(lids) == len(set(lids)) == 32 * 4
    assert min(lids) > 1  # LID 1 is the subnet manager's


def test_the_virtual_inventory_connects_like_production(make_inventory):
    """SSH (Ansible's default connection) as deploy with become, the key and known_hosts of `virtual up`,
    strict host key checking; nothing selects a local transport or a wrapper."""
    import yaml

    from cli.commands.virtual import FABRICS

    all_vars = yaml.safe_load((make_inventory(2, 1) / "group_vars" / "all.yml").read_text())
    assert "ansible_connection" not in all_vars and "clusterctl_exec_prefix" not in all_vars
    assert (all_vars["ansible_user"], all_vars["ansible_become"]) == ("deploy", True)
    assert all_vars["ansible_ssh_private_key_file"] == "{{ inventory_dir }}/.sim/ssh/id_ed25519"
    assert "-o UserKnownHostsFile={{ inventory_dir }}/.sim/ssh/known_hosts" in all_vars["ansible_ssh_common_args"]
    assert "-o StrictHostKeyChecking=yes" in all_vars["ansible_ssh_common_args"]
    assert FABRICS == create.FABRICS  # the CLI's choices, spelled there to keep `sim` out of its imports


def _unsecret(text: str) -> str:
    import re

    text = re.sub(r"(?m)^(consul_agent_gossip_key|consul_agent_acl_management_token|consul_virtual_token_seed|"
                  r"consul_agent_acl_registration_token|consul_token|consul_edge_token|eas_agent_announce_token): \S+$", r"\1: <secret>", text)
    return re.sub(r"(?s)-----BEGIN ([A-Z ]+)-----.*?-----END \1-----", r"<\1 PEM>", text)


def test_an_inventory_on_another_net_has_only_that_nets_addresses(tmp_path):
    """``net`` moves every machine to 127.<net>.R.N (the demo's 42), so two virtual clusters can be up at once;
    the inventory validates and nothing else in it names an address of the default net."""
    directory = tmp_path / "other"
    create.write(directory, 4, 2, fabric="mixed", faults="none", net=42)
    hosts = load_inventory(directory).everyone
    assert sorted(h["ansible_host"] for h in hosts.values()) == ["127.42.1.11", "127.42.1.12", "127.42.2.11",
                                                                "127.42.2.12"]
    default = {h.address for h in create.plan(4, 2, "mixed", "none")}
    text = "".join(p.read_text() for p in directory.rglob("*.yml"))
    assert not any(address in text for address in default)
    for bad in (-1, 255):
        with pytest.raises(ValueError, match=f"net {bad}: the second octet"):
            create.plan(4, 2, "mixed", "none", bad)
