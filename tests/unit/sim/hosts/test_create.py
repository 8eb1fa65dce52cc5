"""Where `virtual create` puts the edges and their balancer, and that the written inventory's groups are what
the cluster model reads."""

import pytest
import yaml

from cluster import edges
from sim.hosts import create

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("nodes", "racks", "expected"), [
    (1, 1, ["r01n01"]),
    (2, 1, ["r01n01", "r01n02"]),
    (3, 2, ["r01n01", "r02n01"]),  # the provisioning tests' inventory
    (4, 2, ["r01n01", "r02n01"]),  # inventory/virtual
    (128, 16, ["r01n01", "r16n01"]),
])
def test_two_edges_on_the_first_nodes_of_the_first_and_last_racks(nodes, racks, expected):
    placed, balancer = create.edge_placement(create.plan(nodes, racks, "ib", "none"))
    assert [h.name for h in placed] == expected
    assert balancer == "127.0.1.5:8080"


def test_the_written_groups_are_what_the_model_reads():
    files = create.render(3, 2, fabric="mixed", faults="none", net=42)
    children = yaml.safe_load(files["hosts.yml"])["all"]["children"]
    assert list(children["edges"]["hosts"]) == ["r01n01", "r02n01"]
    assert children["balancers"]["hosts"] == {"r01n01": {"edge_balancer_listen": "127.42.1.5:8080"}}
    addresses = {name: spec["ansible_host"] for group, members in children.items() if group.startswith("rack_")
                 for name, spec in members["hosts"].items()}
    hosts = {name: {"ansible_host": address,
                    "group_names": [group for group, members in children.items() if name in members["hosts"]],
                    **(children["balancers"]["hosts"].get(name) or {})} for name, address in addresses.items()}
    assert [(e.host, e.address, e.port) for e in edges.edges_of(hosts)] == [
        ("r01n01", "127.42.1.11", 8080), ("r02n01", "127.42.2.11", 8080)]
    assert edges.check_groups(hosts) == []
    assert not [p for name, hv in hosts.items() for p in edges.check_edge_host(name, hv)]
