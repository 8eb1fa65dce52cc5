"""What the services on a node are told about its IUs, from the model: the one place that shapes it.

- :func:`agent_ius`: the ``ius`` list of eas-agent's config (schema: ``eas_agent/config.py``), rendered by
  the eas_agent role through the ``eas_agent_config`` filter.
- :func:`iu_service_definitions`: one Consul service definition per IU (an instance of the node's
  ``vllm-iu-<node>`` service, its ``/health`` check), rendered by the consul_agent role through the ``consul_iu_services`` filter.
- :func:`iu_registration`: one IU's instance (name, ID, address, port, tags, meta) without its checks:
  the definitions above hold it, and the simulators register it through the API
  (``sim/vllm/registration.py``), so a simulated IU is tagged exactly as a provisioned one.

Pure functions of a :class:`cluster.model.Node`: the filters in ``playbooks/filter_plugins`` build the
node with :func:`cluster.model.build_node` and call these, so no template rebuilds the shape by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cluster.model import Node
from consul_io import layout


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


# The inventory values a revision is composed of (their roles' variables), and what stands for one left unset
REVISION_PARTS = (("vllm-", "inference_unit_vllm_version", "unknown"), ("", "inference_unit_served_model_name", "any"),
                  ("driver-", "nvidia_stack_driver_version", "unknown"))


def iu_revision(hostvars: Mapping[str, Any], explicit: str | None = None) -> str:
    """What a node's IUs run (``Meta.revision``): ``explicit`` when given, else composed from the node's
    inventory values (``vllm-<version>+<served model>+driver-<version>``). Only the inventory's: the roles'
    own defaults are not visible in every play that renders the definitions, and a revision that differed
    between plays would flip on every run."""
    if explicit:
        return explicit
    return "+".join(f"{prefix}{hostvars.get(name) or unset}" for prefix, name, unset in REVISION_PARTS)


def health_url(address: str, port: int) -> str:
    """The IU's vLLM ``/health``, which its Consul check calls."""
    return f"http://{address}:{port}/health"


def iu_registration(iu: str, node: str, rack: str, address: str, port: int, gpus: Sequence[int],
                    numa_node: int | None, model: str | None = None, revision: str | None = None) -> dict[str, Any]:
    """One IU's instance of its node's service ``vllm-iu-<node>`` (``layout.iu_service``): name, ID (the IU
    id), address, port, tags and meta (Consul meta values are strings; an IU without one NUMA node has
    ``numa_node`` ""). ``model``: the name it serves
    (``Meta.model``, which the edge routes a request's ``model`` on); without it the IU takes any model.
    ``revision``: what the IU runs (``Meta.revision``: vLLM version, model, driver), which a traffic rollout
    (``clusterctl rollout``) shifts requests between; without it the IU is on the stable side of any rollout."""
    registration = {
        "name": layout.iu_service(node),
        "id": iu,
        "address": address,
        "port": port,
        "tags": [layout.rack_tag(rack), layout.node_tag(node)],
        "meta": {
            "gpus": ",".join(str(g) for g in gpus),
            "numa_node": "" if numa_node is None else str(numa_node),
            "node": node,
            "rack": rack,
        },
    }
    if model:
        registration["meta"]["model"] = model
    if revision:
        registration["meta"]["revision"] = revision
    return registration


def iu_service_definitions(node: Node, interval: str, timeout: str,
                           revision: str | None = None) -> dict[str, dict[str, Any]]:
    """IU id -> its Consul service definition file's content (``{"service": {...}}``).

    ``interval``/``timeout``: the ``/health`` check's, Consul duration strings (``10s``); ``revision``: what
    the node's IUs run (``Meta.revision``; :func:`iu_registration`).
    """
    return {
        iu.id: {"service": {
            **iu_registration(iu.id, node.name, node.rack, node.address, iu.port, iu.gpus, iu.numa_node,
                               revision=revision),
            "checks": [{
                "id": layout.health_check_id(iu.id),
                "name": f"vLLM /health of {iu.id}",
                "http": health_url(node.address, iu.port),
                "interval": str(interval),
                "timeout": str(timeout),
            }],
        }}
        for iu in node.ius
    }
