"""cluster/servers.py: a host of dedicated_consul_servers is a Consul server without GPUs, and a Consul server
on a GPU node is refused with ACLs on unless consul_servers_running_ius names it with the reason; validation,
the model and `inventory validate` / `show` / `provision --plan` over both kinds."""

from __future__ import annotations

import json

import pytest

from cluster import model, servers, validate
from cluster.ansible import inventory as inv
from tests.helpers import write_tree

pytestmark = pytest.mark.unit

GPU = {"gpu_model": "h100-sxm", "rack": "r1"}
# What group_vars/all gives every host of a real inventory: the GPU layout, which a dedicated server ignores.
ALL = {"gpu_model": "h100-sxm", "gpu_count": 8, "rdma_nics": [{"device": "mlx5_0", "numa_node": 0}]}


def host(*groups: str, **variables) -> dict:
    return {"group_names": list(groups), **variables}


def messages(problems) -> list[str]:
    return [str(p) for p in problems]


def test_a_dedicated_server_has_no_layout_rules_and_ignores_the_gpu_variables_it_inherits():
    hosts = {"c1": host("consul_servers", "dedicated_consul_servers", **{**ALL, "gpu_count": 7, "iu_size": 3}),
             "n1": host("rack_r1", **ALL)}
    # gpu_count 7 with iu_size 3 would be two problems on a GPU node; on c1 neither is read
    assert validate.validate(hosts) == []
    cluster = model.build_cluster(hosts)
    assert [n.name for n in cluster.nodes()] == ["n1"]
    assert [(s.name, s.address, s.dedicated) for s in cluster.consul_servers] == [("c1", "c1", True)]


def test_a_dedicated_server_keeps_the_rules_every_host_has():
    problems = validate.validate({"c_1": host("consul_servers", "dedicated_consul_servers", ansible_port="ssh",
                                              consul_agent_acl_management_token="not-a-uuid")})
    assert [(p.host, p.variable) for p in problems] == [
        ("c_1", "inventory_hostname"), ("c_1", "consul_agent_acl_management_token"), ("c_1", "ansible_port")]


@pytest.mark.parametrize(("groups", "value", "says"), [
    (("dedicated_consul_servers",), "dedicated_consul_servers", "add it to consul_servers too"),
    (("consul_servers", "dedicated_consul_servers", "rack_r1"), ["rack_r1"], "take it out of the rack group"),
    (("consul_servers", "dedicated_consul_servers", "edges"), ["edges"], "put the edges and balancers on other"),
])
def test_a_dedicated_server_is_only_a_consul_server(groups, value, says):
    [problem] = validate.validate({"c1": host(*groups)})
    assert (problem.host, problem.variable, problem.value) == ("c1", "group_names", value)
    assert says in problem.message


def test_a_server_on_a_gpu_node_is_refused_naming_host_group_and_both_ways_out():
    [problem] = validate.validate({"n1": host("consul_servers", **GPU)})
    assert (problem.host, problem.variable, problem.value) == ("n1", "group_names", "consul_servers")
    assert "reads every ACL token's secret, the management token's included" in problem.message
    assert "move the server to a host of dedicated_consul_servers" in problem.message
    assert "consul_servers_running_ius ({n1: <why>})" in problem.message
    assert "docs/decisions/0038-dedicated-consul-servers.md" in problem.message


def test_a_server_on_a_gpu_node_runs_when_the_inventory_names_it_with_the_reason():
    why = {"n1": "three GPU nodes, no other hosts"}
    hosts = {"n1": host("consul_servers", **GPU, consul_servers_running_ius=why),
             "n2": host("consul_servers", **GPU, consul_servers_running_ius=why)}
    assert messages(validate.validate(hosts)) == [messages(validate.validate({"n2": hosts["n2"]}))[0]]
    [n1, n2] = model.build_cluster(hosts, ["n2", "n1"]).consul_servers[::-1]
    assert (n1.dedicated, n1.runs_ius_because, n2.runs_ius_because) == (False, why["n1"], None)


@pytest.mark.parametrize("off", [False, "false", "no"])
def test_without_acls_there_is_no_token_to_read_and_no_refusal(off):
    # ACLs off is the security warning's business (cluster.validate.check_consul_security)
    assert validate.validate({"n1": host("consul_servers", **GPU, consul_agent_acl_enabled=off)}) == []


def test_a_listed_host_that_is_no_server_on_a_gpu_node_is_refused_on_the_hosts_that_carry_the_list():
    listed = {"n2": "old", "c1": "moved", "gone": "decommissioned", "n1": "on purpose"}
    hosts = {"n1": host("consul_servers", **GPU, consul_servers_running_ius=listed),
             "n2": host(**GPU, consul_servers_running_ius=listed),
             "c1": host("consul_servers", "dedicated_consul_servers", consul_servers_running_ius=listed)}
    found = {(p.host, p.variable, p.message) for p in validate.validate(hosts)}
    assert {(v, m) for _, v, m in found} == {
        ("consul_servers_running_ius.n2", "not in consul_servers: remove it from the list"),
        ("consul_servers_running_ius.c1", "a host of dedicated_consul_servers: it runs no IUs: remove it from the list"),
        ("consul_servers_running_ius.gone", "not a host of this inventory: remove it from the list")}
    assert {h for h, _, _ in found} == {"n1", "n2", "c1"}


@pytest.mark.parametrize(("value", "variable", "message"), [
    (["n1"], "consul_servers_running_ius", "must be a mapping {host: why this GPU node runs a Consul server}"),
    ({"n1": ""}, "consul_servers_running_ius.n1", "the reason must be a non-empty string"),
    ({"n1": None}, "consul_servers_running_ius.n1", "the reason must be a non-empty string"),
])
def test_the_list_is_a_mapping_of_hosts_to_reasons(value, variable, message):
    problems = validate.validate({"n1": host("consul_servers", **GPU, consul_servers_running_ius=value)})
    assert (variable, message) in {(p.variable, p.message) for p in problems}
    # an unreadable list names no host: the server is refused too, not let through
    assert "group_names" in {p.variable for p in problems}


def test_a_dedicated_server_needs_no_registration_token():
    secure = {"consul_agent_gossip_key": "k", "consul_agent_acl_management_token": "t",
              "consul_agent_acl_agent_token": "a", "consul_token": "o", "consul_agent_tls_ca_pem": "p"}
    dedicated = validate.check_consul_security("c1", host("consul_servers", "dedicated_consul_servers", **secure))
    assert dedicated == []
    [node] = validate.check_consul_security("n1", host(**GPU, **secure))
    assert node.variable == "consul_agent_acl_registration_token"


def test_the_summary_groups_the_servers_by_kind_in_their_order():
    found = (servers.ConsulServer("c1", "a1", True), servers.ConsulServer("n1", "a2", False, "small site"),
             servers.ConsulServer("c2", "a3", True), servers.ConsulServer("n2", "a4", False))
    assert servers.summary(found) == "c1, c2 (dedicated); n1 (runs IUs: consul_servers_running_ius); n2 (runs IUs)"
    assert servers.summary(()) == "none"


MIXED = """
all:
  children:
    rack_r1:
      hosts:
        n1: {ansible_host: 127.0.82.11}
        n2: {ansible_host: 127.0.82.12}
    dedicated_consul_servers:
      hosts:
        c1: {ansible_host: 127.0.82.21}
        c2: {ansible_host: 127.0.82.22}
    consul_servers:
      hosts:
        c2:
        c1:
"""


def test_validate_show_and_plan_list_the_servers_in_the_groups_order(tmp_path, clusterctl):
    path = str(write_tree(tmp_path, {"hosts.yml": MIXED, "group_vars/all.yml": "gpu_model: h100-sxm\n"
                                     "consul_agent_acl_enabled: false\n"}))
    code, out, _ = clusterctl("inventory", "validate", "-i", path)
    assert code == 0 and out.splitlines() == [f"{path}: Consul servers: c2, c1 (dedicated)", f"{path}: OK (4 hosts)"]
    code, out, _ = clusterctl("inventory", "show", "-i", path, "--json")
    assert code == 0 and [s["name"] for s in json.loads(out)["consul_servers"]] == ["c2", "c1"]
    code, out, _ = clusterctl("inventory", "show", "-i", path)
    assert "Consul servers (2)" in out and "c2 127.0.82.22  dedicated" in out
    code, out, _ = clusterctl("provision", "-i", path, "--plan", columns=200)
    assert code == 0 and "Consul servers: c2, c1 (dedicated)" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"], ["4"])]
    # consul-servers.yml (both at once), the dedicated servers' play (one at a time), the GPU nodes' play
    assert rows[:4] == [["1", "1", "2", "c2,", "c1"], ["2", "2", "1", "c1"], ["3", "2", "1", "c2"],
                        ["4", "3", "1", "n1"]]


def test_validate_refuses_an_inventory_whose_server_runs_ius_naming_the_host(tmp_path, clusterctl):
    path = str(write_tree(tmp_path, {"hosts.yml": MIXED.replace("        c1:\n", "        c1:\n        n1:\n"),
                                     "group_vars/all.yml": "gpu_model: h100-sxm\n"}))
    code, out, err = clusterctl("inventory", "validate", "-i", path)
    assert (code, out) == (2, "")
    assert err.startswith(f"{path}: n1: group_names='consul_servers': a Consul server on a GPU node"), err
    with pytest.raises(inv.InventoryError, match="n1: group_names='consul_servers'"):
        inv.load_cluster(path)
