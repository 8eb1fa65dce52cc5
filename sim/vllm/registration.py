"""Register a simulated IU as an instance of its node's Consul service ``vllm-iu-<node>``: what the consul_agent role's definition file
(``/etc/consul.d/vllm-iu-<id>.json``, roles/consul_agent/templates/iu-service.json.j2) does on a real node.

Only simulators, tests and benchmarks register services through the API; production never does (the
role's files do), so this lives here and not in the client.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster import services
from consul_io.client import ConsulIO


@dataclass(frozen=True)
class IUService:
    """One IU's service registration."""

    iu_id: str
    node: str
    rack: str
    address: str
    port: int
    gpus: tuple[int, ...]
    numa_node: int | None
    model: str | None = None  # the served model name (Meta.model); None: not declared
    revision: str | None = None  # what it runs (Meta.revision, a rollout's stable or canary); None: not declared


def register_iu_service(io: ConsulIO, service: IUService, http_check: bool = True) -> None:
    """The instance the role's definition file holds (``cluster.services.iu_registration``, the one shape);
    a 1 s HTTP check on /health unless told not to."""
    registration = services.iu_registration(service.iu_id, service.node, service.rack, service.address,
                                            service.port, service.gpus, service.numa_node, service.model, service.revision)
    io.register_service(
        registration["name"],
        registration["id"],
        registration["address"],
        registration["port"],
        tags=registration["tags"],
        meta=registration["meta"],
        http_check=services.health_url(service.address, service.port) if http_check else None,
    )


def register_on_catalog_node(io: ConsulIO, service: IUService, node_address: str) -> None:
    """Put the instance on catalog node ``service.node`` (``PUT /v1/catalog/register``), where that node's own
    agent would sync it: for simulations in which one Consul stands in for every node's agent. The edge takes
    an IU's owner from its catalog node only, so an instance registered on the one agent would belong to that
    agent's node. No agent runs checks for it (the catalog holds no TTL or HTTP runner)."""
    registration = services.iu_registration(service.iu_id, service.node, service.rack, service.address,
                                            service.port, service.gpus, service.numa_node, model=service.model,
                                            revision=service.revision)
    entity = {"Service": registration["name"], "ID": registration["id"], "Address": registration["address"],
              "Port": registration["port"], "Tags": registration["tags"], "Meta": registration["meta"]}
    if not io.client.catalog.register(service.node, node_address, service=entity, token=io.token):
        raise RuntimeError(f"catalog registration of {service.iu_id} on {service.node} refused")
