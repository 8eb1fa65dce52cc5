"""Register a simulated IU as Consul service ``vllm-iu``: what the consul_agent role's definition file
(``/etc/consul.d/vllm-iu-<id>.json``, roles/consul_agent/templates/iu-service.json.j2) does on a real node.

Only simulators, tests and benchmarks register services through the API; production never does (the
role's files do), so this lives here and not in the client.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def register_iu_service(io: ConsulIO, service: IUService, http_check: bool = True) -> None:
    """The same tags and meta as the role's definition file; a 1 s HTTP check on /health unless told not to."""
    io.register_service(
        service.iu_id,
        service.address,
        service.port,
        tags=[f"rack:{service.rack}", f"node:{service.node}"],
        meta={
            "gpus": ",".join(str(g) for g in service.gpus),
            "numa_node": "" if service.numa_node is None else str(service.numa_node),
            "node": service.node,
            "rack": service.rack,
        },
        http_check=f"http://{service.address}:{service.port}/health" if http_check else None,
    )
