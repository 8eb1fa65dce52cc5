"""Filters of playbooks/filter_plugins/cluster_model.py. ``cluster_balancer``: what the edge_balancer role's
template and the eas_edge role's wait for the balancers both read, from the cluster model: where HAProxy
listens, its stats socket and backend, and the edges it sends to. ``cluster_host`` and ``cluster_node`` on a
dedicated Consul server and on a GPU node that is a server."""

from __future__ import annotations

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def _filters():
    spec = importlib.util.spec_from_file_location("cluster_model", REPO / "playbooks/filter_plugins/cluster_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = _filters()
HOSTVARS = {
    "n1": {"ansible_host": "127.0.76.1", "group_names": ["edges", "balancers"],
           "edge_balancer_listen": "127.0.76.5:8080"},
    "n2": {"ansible_host": "127.0.76.2", "group_names": ["edges"]},
}


def test_the_balancer_carries_its_stats_socket_and_backend_for_both_roles():
    balancer = F.cluster_balancer("n1", HOSTVARS, list(HOSTVARS))
    assert (balancer["stats_socket"], balancer["backend"]) == ("/run/haproxy/stats.sock", "edges")
    assert [edge["host"] for edge in balancer["edges"]] == ["n1", "n2"]  # each HAProxy server is named by its host
    moved = {**HOSTVARS, "n1": {**HOSTVARS["n1"], "edge_balancer_stats_socket": "/run/lb/stats.sock"}}
    assert F.cluster_balancer("n1", moved, list(moved))["stats_socket"] == "/run/lb/stats.sock"


def test_a_relative_stats_socket_stops_the_play_naming_host_variable_value():
    bad = {**HOSTVARS, "n1": {**HOSTVARS["n1"], "edge_balancer_stats_socket": "stats.sock"}}
    with pytest.raises(AnsibleFilterError, match="n1: edge_balancer_stats_socket='stats.sock': expected an absolute"):
        F.cluster_balancer("n1", bad, list(bad))


# A dedicated Consul server (cluster.servers) inherits group_vars/all's GPU layout like every host.
DEDICATED = {"ansible_host": "127.0.82.21", "group_names": ["consul_servers", "dedicated_consul_servers"],
             "gpu_model": "h100-sxm", "gpu_count": 8, "consul_http_addr": "127.0.82.21:8500"}
GPU_SERVER = {"ansible_host": "127.0.82.11", "group_names": ["consul_servers", "rack_r1"], "gpu_model": "h100-sxm"}


def test_cluster_host_gives_a_dedicated_server_its_consul_agent_and_no_ius():
    host = F.cluster_host("c1", DEDICATED)
    assert (host["name"], host["address"], host["dedicated_consul_server"], host["ius"]) == (
        "c1", "127.0.82.21", True, [])
    assert host["consul"]["url"] == "http://127.0.82.21:8500"


def test_cluster_host_gives_a_gpu_node_the_nodes_ius():
    accepted = {**GPU_SERVER, "consul_servers_running_ius": {"n1": "a two-node lab"}}
    host = F.cluster_host("n1", accepted)
    assert host["dedicated_consul_server"] is False
    assert [iu["id"] for iu in host["ius"]] == ["n1-iu0", "n1-iu1"] and host["ius"] == F.cluster_node("n1", accepted)["ius"]


def test_a_gpu_role_stops_on_a_dedicated_server_naming_the_pattern_that_leaves_it_out():
    with pytest.raises(AnsibleFilterError, match=r"c1: group_names='dedicated_consul_servers': .*"
                                                 r"hosts: all:!dedicated_consul_servers"):
        F.cluster_node("c1", DEDICATED)
    with pytest.raises(AnsibleFilterError, match="add it to consul_servers too"):
        F.cluster_host("c1", {**DEDICATED, "group_names": ["dedicated_consul_servers"]})


def test_the_roles_refuse_a_server_on_a_gpu_node_as_validate_does_and_read_the_acl_switch():
    with pytest.raises(AnsibleFilterError, match="n1: group_names='consul_servers': a Consul server on a GPU node"):
        F.cluster_host("n1", GPU_SERVER)
    assert F.cluster_host("n1", {**GPU_SERVER, "consul_agent_acl_enabled": False})["ius"]
