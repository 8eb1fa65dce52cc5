"""Inventory loading the way Ansible resolves it: INI and YAML, group_vars, host_vars, patterns."""

import json

import pytest

from cluster import InventoryError, load_cluster
from tests.helpers import run_cli, write_tree
from tests.helpers.cluster import HOSTS

pytestmark = pytest.mark.unit

INI = {
    "hosts.ini": """
        [rack_a]
        a1 ansible_host=127.0.77.11
        a2 ansible_host=127.0.77.12 iu_size=2

        [rack_b]
        b1 ansible_host=127.0.77.21

        [gpu:children]
        rack_a
        rack_b
    """,
    "group_vars/all.yml": """
        gpu_model: h100-sxm
    """,
    "group_vars/rack_b.yml": """
        gpu_model: h200-sxm
        iu_port_base: 9000
    """,
    "host_vars/b1.yml": """
        gpu_numa_nodes: [0, 0, 0, 0, 1, 1, 1, 1]
        rdma_nics:
          - {device: mlx5_0, netdev: ibp24s0, numa_node: 0, gpu: 0}
          - {device: mlx5_4, netdev: ibp154s0, numa_node: 1}
    """,
}

YAML = {
    "hosts.yml": """
        all:
          vars:
            gpu_model: a100-sxm
            site_port_base: 8100
          children:
            gpu_nodes:
              hosts:
                n1: {rack: r7, ansible_host: 127.0.78.1}
                n2: {rack: r7, ansible_host: 127.0.78.2, iu_port_base: "{{ site_port_base }}"}
    """,
    "host_vars/n2.yml": """
        gpu_count: 4
        iu_size: 4
    """,
}


def test_ini_with_group_and_host_vars(tmp_path):
    cluster = load_cluster(write_tree(tmp_path, INI))
    assert [r.name for r in cluster.racks] == ["a", "b"]
    a2 = cluster.node("a2")
    assert a2.address == "127.0.77.12"
    assert [iu.gpus for iu in a2.ius] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [iu.port for iu in a2.ius] == [8000, 8001, 8002, 8003]
    b1 = cluster.node("b1")
    assert b1.gpu_model == "h200-sxm"  # group_vars/rack_b.yml overrides group_vars/all.yml
    assert [(iu.id, iu.port, iu.numa_node, iu.nics) for iu in b1.ius] == [
        ("b1-iu0", 9000, 0, ("mlx5_0",)),  # paired with GPU0
        ("b1-iu1", 9001, 1, ("mlx5_4",)),  # no pairing: the NIC on its NUMA node
    ]


def test_yaml_with_rack_variable_templates_and_limit(tmp_path):
    root = write_tree(tmp_path, YAML)
    cluster = load_cluster(root)
    assert [r.name for r in cluster.racks] == ["r7"]
    n2 = cluster.node("n2")
    assert n2.gpu_count == 4 and len(n2.ius) == 1
    assert n2.ius[0].port == 8100  # "{{ site_port_base }}" templated by Ansible's Templar
    limited = load_cluster(root, limit="n1")
    assert [n.name for n in limited.nodes()] == ["n1"]


def test_default_numa_map_follows_hgx_boards(tmp_path):
    cluster = load_cluster(write_tree(tmp_path, INI))
    assert [iu.numa_node for iu in cluster.node("a1").ius] == [0, 1]
    assert [iu.numa_node for iu in cluster.node("a2").ius] == [0, 0, 1, 1]


def test_missing_and_unparseable_inventory_are_clear_errors(tmp_path):
    with pytest.raises(InventoryError, match="inventory not found"):
        load_cluster(tmp_path / "nope")
    bad = write_tree(tmp_path, {"bad.yml": "all:\n  hosts: [unclosed\n"})
    with pytest.raises(InventoryError, match="bad.yml"):
        load_cluster(bad / "bad.yml")


def test_limit_matching_nothing_is_an_inventory_error(tmp_path):
    with pytest.raises(InventoryError, match=r"--limit .rack_zzz. matches no host in .*; did you mean 'rack_b'\? \(groups: gpu, rack_a, rack_b; hosts: a1, a2, b1\)"):
        load_cluster(write_tree(tmp_path, INI), limit="rack_zzz")


def test_show_json_shape(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "inventory", "show", "-i", str(write_tree(tmp_path, INI)), "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["racks", "consul_servers"] and data["consul_servers"] == []
    rack = data["racks"][1]
    assert set(rack) == {"name", "nodes"} and rack["name"] == "b"
    node = rack["nodes"][0]
    assert set(node) == {"name", "address", "gpu_model", "gpu_count", "iu_size", "ius"}
    assert node["gpu_model"] == "h200-sxm"  # group_vars/rack_b.yml: what the tree draws, a script reads too
    assert node["ius"][0] == {"id": "b1-iu0", "gpus": [0, 1, 2, 3], "numa_node": 0, "port": 9000, "nics": ["mlx5_0"]}


def test_show_tree_draws_the_virtual_inventory(capsys):
    code, out, _ = run_cli(capsys, "inventory", "show", "-i", "inventory/virtual")
    assert code == 0
    assert "2 racks, 4 nodes, 8 IUs" in out
    for rack in ("rack r01", "rack r02"):
        assert rack in out
    assert out.count("-iu0") == 4 and out.count("-iu1") == 4


def test_an_undefined_template_variable_is_reported_with_every_other_problem(tmp_path, capsys):
    """A template that cannot render names its file and comes with the other problems, not alone and first."""
    inventory = write_tree(tmp_path / "inv", {
        "hosts.yml": HOSTS,
        "group_vars/all.yml": 'gpu_model: h100-sxm\nconsul_http_addr: "{{ ansible_hots }}:8500"\n',
        "host_vars/n2.yml": "ansible_host: 127.0.77.2\niu_size: 3\n"})
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"{inventory}: n1, n2 (2 hosts): consul_http_addr: cannot be templated: 'ansible_hots' is undefined "
        "(group_vars/all.yml:2)",
        f"{inventory}: n2: iu_size=3: must be one of 1/2/4/8 (host_vars/n2.yml:2)",
        f"3 problems (2 distinct) in {inventory}"], err


def test_a_directory_of_inventories_is_named_as_such(tmp_path, capsys):
    """``-i inventory`` (the parent of sample/ and virtual/) was merged by Ansible into one inventory whose
    hosts lacked their group_vars, reported as a missing gpu_model on every host."""
    for name in ("prod", "staging"):
        write_tree(tmp_path / "inventories" / name, {"hosts.yml": HOSTS, "group_vars/all.yml": "gpu_model: h100-sxm\n"})
    code, out, err = run_cli(capsys, "inventory", "show", "-i", str(tmp_path / "inventories"))
    assert (code, out) == (2, "")
    assert err == (f"error: {tmp_path}/inventories: a directory of inventories (prod, staging), not one: pass one "
                   f"of them, e.g. -i {tmp_path}/inventories/prod\n")
