"""What the services on a node are told about its IUs, from the model: the one place that shapes it.

- :func:`agent_ius`: the ``ius`` list of eas-agent's config (schema: ``eas_agent/config.py``), rendered by
  the eas_agent role through the ``eas_agent_config`` filter.
- :func:`iu_service_definitions`: one Consul service definition per IU (the ``vllm-iu`` service, its
  ``/health`` check), rendered by the consul_agent role through the ``consul_iu_services`` filter.

Pure functions of a :class:`cluster.model.Node`: the filters in ``playbooks/filter_plugins`` build the
node with :func:`cluster.model.build_node` and call these, so no template rebuilds the shape by hand.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from consul_io import layout

IU_SERVICE_NAME = layout.SERVICE_NAME


def agent_ius(node: Node) -> list[dict[str, Any]]:
    """eas-agent's ``ius``: id, GPUs, NUMA node, the vLLM metrics URL, the IU's RDMA devices and netdevs."""
    netdev_of = {nic.device: nic.netdev for nic in node.nics}
    return [
        {
            "id": iu.id,
            "gpus": list(iu.gpus),
            "numa_node": iu.numa_node,
            "metrics_url": f"http://{node.address}:{iu.port}/metrics",
            "rdma_devices": list(iu.nics),
            "netdevs": [netdev_of[d] for d in iu.nics if netdev_of.get(d)],
        }
        for iu in node.ius
    ]


def iu_service_definitions(node: Node, interval: str, timeout: str) -> dict[str, dict[str, Any]]:
    """IU id -> its Consul service definition file's content (``{"service": {...}}``).

    ``interval``/``timeout``: the ``/health`` check's, Consul duration strings (``10s``).
    """
    return {
        iu.id: {"service": {
            "name": IU_SERVICE_NAME,
            "id": iu.id,
            "address": node.address,
            "port": iu.port,
            "tags": [f"rack:{node.rack}", f"node:{node.name}"],
            "meta": {
                "gpus": ",".join(str(g) for g in iu.gpus),
                "numa_node": str(iu.numa_node),
                "node": node.name,
                "rack": node.rack,
            },
            "checks": [{
                "id": f"{IU_SERVICE_NAME}:{iu.id}:health",
                "name": f"vLLM /health of {iu.id}",
                "http": f"http://{node.address}:{iu.port}/health",
                "interval": str(interval),
                "timeout": str(timeout),
            }],
        }}
        for iu in node.ius
    }
