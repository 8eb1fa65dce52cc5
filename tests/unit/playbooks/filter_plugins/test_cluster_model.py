"""The ``cluster_balancer`` filter of playbooks/filter_plugins/cluster_model.py: what the edge_balancer role's
template and the eas_edge role's wait for the balancers both read, from the cluster model: where HAProxy
listens, its stats socket and backend, and the edges it sends to."""

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
