"""The edges and balancers groups: each bad input is one problem naming host, variable and value (exit 2 from
``inventory validate``), and the model's reading of a good one."""

import pytest

from cluster import edges
from tests.helpers import run_cli, write_tree
from tests.helpers.cluster import HOSTS

pytestmark = pytest.mark.unit

GROUP_VARS = "gpu_model: h100-sxm\n"


def with_groups(edge_hosts: str = "n1: {}\n        n2: {}", balancer: str = "n1: {edge_balancer_listen: '127.0.77.5:8080'}") -> str:
    text = HOSTS + "    edges:\n      hosts:\n        " + edge_hosts + "\n" if edge_hosts else HOSTS
    return text + ("    balancers:\n      hosts:\n        " + balancer + "\n" if balancer else "")


def validate(tmp_path, capsys, hosts_yml: str, host_vars: dict | None = None) -> tuple[int, str]:
    files = {"hosts.yml": hosts_yml, "group_vars/all.yml": GROUP_VARS}
    files.update({f"host_vars/{host}.yml": text for host, text in (host_vars or {}).items()})
    code, _out, err = run_cli(capsys, "inventory", "validate", "-i", str(write_tree(tmp_path, files)))
    return code, err


def test_edges_on_two_nodes_behind_a_balancer_of_its_own_address_pass(tmp_path, capsys):
    code, err = validate(tmp_path, capsys, with_groups())
    assert code == 0, err


CASES = {
    "an edge on an IU's port": (
        with_groups(), {"n2": "eas_edge_listen: 127.0.77.2:8001\n"},
        "n2: eas_edge_listen='127.0.77.2:8001': port 8001 is an IU's vLLM's on this node: pick another port"),
    "an edge on the agent's port": (
        with_groups(), {"n2": "eas_edge_listen: 127.0.77.2:9105\n"},
        "n2: eas_edge_listen='127.0.77.2:9105': port 9105 is the eas-agent (eas_agent_listen)'s on this node"),
    "an edge on Consul's port": (
        with_groups(), {"n2": "eas_edge_listen: 127.0.77.2:8500\n"},
        "n2: eas_edge_listen='127.0.77.2:8500': port 8500 is Consul's on this node"),
    "an edge listen that is no HOST:PORT": (
        with_groups(), {"n2": "eas_edge_listen: 'http://127.0.77.2'\n"},
        "n2: eas_edge_listen='http://127.0.77.2': expected HOST:PORT (port 1-65535; an IPv6 host in [])"),
    "a balancer without its address": (
        with_groups(balancer="n1: {}"), {},
        "n1: edge_balancer_listen: required on a host of the balancers group"),
    "a balancer without edges": (
        with_groups(edge_hosts=""), {},
        "n1: group_names='balancers': a balancer sends to the hosts of the edges group, and it has none"),
    "a balancer on a node's address": (
        with_groups(balancer="n1: {edge_balancer_listen: '127.0.77.2:8080'}"), {},
        "n1: edge_balancer_listen='127.0.77.2:8080': 127.0.77.2 is the address of host n2: the balancer needs an "
        "address of its own"),
    "a balancer on a host name": (
        with_groups(balancer="n1: {edge_balancer_listen: 'lb.example:8080'}"), {},
        "n1: edge_balancer_listen='lb.example:8080': the balancer binds this address: an IP address, not a host name"),
    "a balancer on the port its host's wildcard edge holds": (
        with_groups(balancer="n1: {edge_balancer_listen: '127.0.77.5:9000'}"), {"n1": "eas_edge_listen: 0.0.0.0:9000\n"},
        "n1: edge_balancer_listen='127.0.77.5:9000': the edge on this host listens on 0.0.0.0:9000: both cannot bind it"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_group_input_is_one_line_naming_host_variable_value(tmp_path, capsys, case):
    hosts_yml, host_vars, expected = CASES[case]
    code, err = validate(tmp_path, capsys, hosts_yml, host_vars)
    assert code == 2 and expected in err, err


def test_the_model_reads_the_edges_and_the_balancer():
    hosts = {
        "n1": {"ansible_host": "127.0.77.1", "group_names": ["edges", "balancers", "rack_r1"],
               "edge_balancer_listen": "127.0.77.5:8080"},
        "n2": {"ansible_host": "127.0.77.2", "group_names": ["edges", "rack_r1"], "eas_edge_listen": "0.0.0.0:8090"},
        "n3": {"ansible_host": "127.0.77.3", "group_names": ["rack_r1"]},
    }
    assert [e.to_json() for e in edges.edges_of(hosts)] == [
        {"host": "n1", "listen": "127.0.77.1:8080", "address": "127.0.77.1", "port": 8080},  # the default
        {"host": "n2", "listen": "0.0.0.0:8090", "address": "127.0.77.2", "port": 8090},  # a wildcard: the host's
    ]
    assert [b.to_json() for b in edges.balancers_of(hosts)] == [
        {"host": "n1", "listen": "127.0.77.5:8080", "address": "127.0.77.5", "port": 8080}]
    assert edges.check_groups(hosts) == [] and all(edges.check_edge_host(n, hv) == [] for n, hv in hosts.items())


def test_an_edges_metrics_are_at_its_admin_listen_else_the_roles_default():
    hv = {"ansible_host": "127.0.77.1", "group_names": ["edges"]}
    assert edges.admin_url("n1", hv) == "http://127.0.0.1:9180"  # the role's: reachable on the edge's host only
    assert edges.admin_url("n1", {**hv, "eas_edge_admin_listen": "127.0.77.1:9181"}) == "http://127.0.77.1:9181"
    assert edges.admin_url("n1", {**hv, "eas_edge_admin_listen": "0.0.0.0:9180"}) == "http://127.0.77.1:9180"


def test_an_ipv6_edge_is_bracketed_and_a_bare_one_is_refused():
    hv = {"ansible_host": "::1", "group_names": ["edges"]}
    assert edges.edge_listen("n1", hv) == "[::1]:8080"
    assert edges.edges_of({"n1": hv})[0].address == "::1"
    assert edges.check_edge_host("n1", {**hv, "eas_edge_listen": "::1:8080"})[0].message.startswith(
        "expected HOST:PORT")


def test_clients_reach_the_first_balancer_else_the_first_edge():
    hosts = {
        "n1": {"ansible_host": "127.0.76.1", "group_names": ["edges"]},
        "n2": {"ansible_host": "127.0.76.2", "group_names": ["edges", "balancers"],
               "edge_balancer_listen": "0.0.0.0:8081"},
        "n3": {"ansible_host": "127.0.76.3", "group_names": ["balancers"], "edge_balancer_listen": "127.0.76.5:8080"},
    }
    kind, found = edges.client_endpoint(hosts)
    assert (kind, found.host, edges.url_of(found)) == ("balancer", "n2", "http://127.0.76.2:8081")  # a wildcard
    del hosts["n2"]
    kind, found = edges.client_endpoint(hosts)
    assert (kind, found.host, edges.url_of(found)) == ("balancer", "n3", "http://127.0.76.5:8080")
    del hosts["n3"]
    kind, found = edges.client_endpoint(hosts)
    assert (kind, found.host, edges.url_of(found)) == ("edge", "n1", "http://127.0.76.1:8080")
    assert edges.client_endpoint({"n9": {"ansible_host": "127.0.76.9", "group_names": ["rack_r1"]}}) is None


def test_the_balancer_s_stats_socket_is_an_absolute_path_that_fits_a_unix_socket():
    balancer = {"ansible_host": "127.0.76.1", "group_names": ["balancers"], "edge_balancer_listen": "127.0.76.5:80"}
    assert edges.stats_socket(balancer) == "/run/haproxy/stats.sock"
    assert edges.stats_socket({**balancer, "edge_balancer_stats_socket": "/run/lb/s.sock"}) == "/run/lb/s.sock"
    assert edges.check_edge_host("n1", {**balancer, "edge_balancer_stats_socket": "/run/lb/s.sock"}) == []
    for bad in ("run/haproxy/stats.sock", "/" + "s" * 107, 7):
        [problem] = edges.check_edge_host("n1", {**balancer, "edge_balancer_stats_socket": bad})
        assert (problem.variable, problem.value) == ("edge_balancer_stats_socket", bad)
        assert problem.message.startswith("expected an absolute path of at most 107 characters")
