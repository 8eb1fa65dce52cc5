"""A simulated IU is registered in Consul exactly as the consul_agent role's definition file registers a
provisioned one: both come from cluster.services (they were two copies, and an IU without one NUMA node had
meta numa_node "None" in the role's file and "" from the simulators)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.model import build_node
from cluster.services import iu_service_definitions
from sim.vllm.registration import IUService, register_iu_service

pytestmark = pytest.mark.unit


class Recording:
    """Stands in for ConsulIO: what register_iu_service sends to the agent."""

    def register_service(self, name, service_id, address, port, *, tags, meta, http_check=None):
        self.sent = {"name": name, "id": service_id, "address": address, "port": port, "tags": tags, "meta": meta}
        self.http_check = http_check


@pytest.mark.parametrize("numa_node", [1, None])
def test_a_simulated_iu_is_registered_as_the_roles_definition_file_defines_it(numa_node):
    node = build_node("r01n01", {"ansible_host": "127.0.1.11", "rack": "r01", "gpu_model": "h100-sxm"})
    node = replace(node, ius=(replace(node.ius[1], numa_node=numa_node),))
    iu = node.ius[0]
    definition = iu_service_definitions(node, "10s", "2s")[iu.id]["service"]
    io = Recording()
    register_iu_service(io, IUService(iu.id, node.name, node.rack, node.address, iu.port, iu.gpus, iu.numa_node))
    assert io.sent == {key: definition[key] for key in ("name", "id", "address", "port", "tags", "meta")}
    assert definition["name"] == "vllm-iu-r01n01"
    assert io.http_check == definition["checks"][0]["http"] == "http://127.0.1.11:8001/health"
    assert definition["meta"]["numa_node"] == ("1" if numa_node is not None else "")
