"""Racks -> nodes -> IUs, derived from one host's variables.

Host variables read here (group_vars / host_vars / inline, resolved the way Ansible resolves them):

=====================  ========================================================================
``ansible_host``       address (default: the inventory hostname)
``rack``               rack name; alternative to membership of one ``rack_<name>`` group
``gpu_model``          required: ``h100-sxm`` | ``h200-sxm`` | ``a100-sxm`` (selects preflight profile)
``gpu_count``          GPUs in the node (default 8)
``iu_size``            GPUs per inference unit: 1, 2, 4 or 8 (default 4 = vLLM tensor parallel 4)
``iu_layout``          optional list of GPU-index lists, one per IU (default: consecutive groups)
``gpu_numa_nodes``     optional NUMA map: NUMA node of each GPU index. Without it, GPUs are spread
                       over ``numa_node_count`` (default 2) nodes in order, as on HGX/DGX boards
                       (GPU0-3 on socket 0, GPU4-7 on socket 1)
``iu_port_base``       first IU's vLLM port (default 8000); IU N listens on base + N
``rdma_nics``          list of ``{device, netdev, port, link_layer, rate_gbps, numa_node, gpu}``;
                       an IU uses the NICs paired with its GPUs (``gpu``), else those on its NUMA node
``nccl_socket_ifname`` NCCL's bootstrap/socket interface (default ``^lo,docker``: all but loopback and docker)
=====================  ========================================================================

Defaults and the list of variables are :mod:`cluster.spec`'s; the node's other settings (connection,
Consul, preflight, version pins) are :class:`cluster.settings.NodeSettings`, on ``Node.settings``.

A host of ``dedicated_consul_servers`` is no node: none of the table is read for it, and the cluster lists it
with every other Consul server in ``Cluster.consul_servers`` (:mod:`cluster.servers`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster import spec
from cluster.settings import NodeSettings, node_settings
from cluster.spec import (  # noqa: F401 - the model's constants, re-exported for its readers
    DEFAULT_GPU_COUNT,
    DEFAULT_IU_PORT_BASE,
    DEFAULT_IU_SIZE,
    DEFAULT_NUMA_NODE_COUNT,
    GPU_MODELS,
    NIC_DEFAULTS,
    RACK_GROUP_PREFIX,
    VALID_IU_SIZES,
    value,
)
from consul_io import layout as consul_layout

if TYPE_CHECKING:
    from cluster.servers import ConsulServer


@dataclass(frozen=True)
class Nic:
    device: str  # RDMA device, e.g. mlx5_0
    netdev: str | None  # kernel interface, e.g. ibp24s0 / ens1f0np0
    port: int = NIC_DEFAULTS["port"]
    link_layer: str = NIC_DEFAULTS["link_layer"]  # infiniband | ethernet (RoCE)
    rate_gbps: int | None = None
    numa_node: int | None = None
    gpu: int | None = None  # GPU under the same PCIe switch (PIX), when known

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "netdev": self.netdev,
            "port": self.port,
            "link_layer": self.link_layer,
            "rate_gbps": self.rate_gbps,
            "numa_node": self.numa_node,
            "gpu": self.gpu,
        }


@dataclass(frozen=True)
class IU:
    id: str
    index: int
    node: str
    gpus: tuple[int, ...]
    numa_node: int | None
    port: int
    nics: tuple[str, ...]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "gpus": list(self.gpus),
            "numa_node": self.numa_node,
            "port": self.port,
            "nics": list(self.nics),
        }


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    rack: str
    gpu_model: str
    gpu_count: int
    iu_size: int
    gpu_numa_nodes: tuple[int, ...]
    nics: tuple[Nic, ...]
    ius: tuple[IU, ...]
    settings: NodeSettings = field(default_factory=NodeSettings, compare=False, repr=False)
    nccl_socket_ifname: str | None = spec.DEFAULT_NCCL_SOCKET_IFNAME

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "gpu_model": self.gpu_model,
            "gpu_count": self.gpu_count,
            "iu_size": self.iu_size,
            "ius": [iu.to_json() for iu in self.ius],
        }


@dataclass(frozen=True)
class Rack:
    name: str
    nodes: tuple[Node, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": [n.to_json() for n in self.nodes]}


@dataclass(frozen=True)
class Cluster:
    racks: tuple[Rack, ...]
    consul_servers: tuple[ConsulServer, ...] = ()  # the dedicated ones and the GPU nodes among them

    def nodes(self) -> Iterator[Node]:
        for rack in self.racks:
            yield from rack.nodes

    def node(self, name: str) -> Node:
        for node in self.nodes():
            if node.name == name:
                return node
        raise KeyError(name)

    def ius(self) -> Iterator[IU]:
        for node in self.nodes():
            yield from node.ius

    def to_json(self) -> dict[str, Any]:
        return {"racks": [r.to_json() for r in self.racks],
                "consul_servers": [s.to_json() for s in self.consul_servers]}


def rack_groups(group_names: list[str]) -> list[str]:
    """Rack names from the host's ``rack_<name>`` group memberships."""
    return sorted(g[len(RACK_GROUP_PREFIX) :] for g in group_names if g.startswith(RACK_GROUP_PREFIX))


def rack_of(hostvars: Mapping[str, Any]) -> str:
    racks = rack_groups(list(hostvars.get("group_names", [])))
    if hostvars.get("rack") is not None:
        return str(hostvars["rack"])
    return racks[0]


def default_numa_map(gpu_count: int, numa_node_count: int) -> tuple[int, ...]:
    return tuple(g * numa_node_count // gpu_count for g in range(gpu_count))


def iu_layout(hostvars: Mapping[str, Any]) -> list[list[int]]:
    gpu_count = int(value(hostvars, "gpu_count"))
    iu_size = int(value(hostvars, "iu_size"))
    if hostvars.get("iu_layout") is not None:
        return [[int(g) for g in gpus] for gpus in hostvars["iu_layout"]]
    return [list(range(start, start + iu_size)) for start in range(0, gpu_count, iu_size)]


def numa_map(hostvars: Mapping[str, Any]) -> tuple[int, ...]:
    gpu_count = int(value(hostvars, "gpu_count"))
    if hostvars.get("gpu_numa_nodes") is not None:
        return tuple(int(n) for n in hostvars["gpu_numa_nodes"])
    return default_numa_map(gpu_count, int(value(hostvars, "numa_node_count")))


def nics_of(hostvars: Mapping[str, Any]) -> tuple[Nic, ...]:
    """The NICs of ``rdma_nics`` as :func:`cluster.spec.rdma_nics` coerces it (defaults applied, numbers
    checked; it raises spec.Invalid for entries that are not, which validation reports first)."""
    return tuple(Nic(**nic) for nic in spec.rdma_nics(hostvars.get("rdma_nics")))


def iu_numa_node(gpus: list[int], gpu_numa: tuple[int, ...]) -> int | None:
    """The IU's NUMA node: that of its first GPU (validation rejects IUs spanning NUMA nodes)."""
    return gpu_numa[gpus[0]] if gpus and gpus[0] < len(gpu_numa) else None


def nics_for_iu(gpus: list[int], numa_node: int | None, nics: tuple[Nic, ...]) -> tuple[str, ...]:
    paired = [n.device for n in nics if n.gpu is not None and n.gpu in gpus]
    if paired:
        return tuple(paired)
    return tuple(n.device for n in nics if numa_node is not None and n.numa_node == numa_node)


def iu_ports(hostvars: Mapping[str, Any], count: int) -> list[int]:
    if hostvars.get("iu_ports") is not None:
        return [int(p) for p in hostvars["iu_ports"]]
    base = int(value(hostvars, "iu_port_base"))
    return [base + i for i in range(count)]


def build_node(name: str, hostvars: Mapping[str, Any]) -> Node:
    """Build one node from its resolved variables, through their typed record (:func:`cluster.spec.coerce`
    raises SpecError for a value that is not of its variable's type). Call only after
    :mod:`cluster.validate` passed: the rules are checked there."""
    record = spec.coerce(hostvars, name, rules=False)
    typed = {f.name: getattr(record, f.name) for f in spec.FIELDS}  # every variable, defaults applied
    layout = iu_layout(typed)
    gpu_numa = numa_map(typed)
    nics = nics_of(typed)
    ports = iu_ports(typed, len(layout))
    ius = []
    for index, gpus in enumerate(layout):
        numa = iu_numa_node(gpus, gpu_numa)
        ius.append(
            IU(
                id=consul_layout.iu_id(name, index),
                index=index,
                node=name,
                gpus=tuple(gpus),
                numa_node=numa,
                port=ports[index],
                nics=nics_for_iu(gpus, numa, nics),
            )
        )
    return Node(
        name=name,
        address=str(record.ansible_host or name),
        rack=rack_of(hostvars),
        gpu_model=record.gpu_model,
        gpu_count=record.gpu_count,
        iu_size=record.iu_size,
        gpu_numa_nodes=gpu_numa,
        nics=nics,
        ius=tuple(ius),
        nccl_socket_ifname=record.nccl_socket_ifname,
        settings=node_settings(record),
    )


def build_cluster(hosts: Mapping[str, Mapping[str, Any]], server_order: list[str] | None = None) -> Cluster:
    """The racks of the GPU nodes among ``hosts`` and the Consul servers (``server_order``: the group's)."""
    from cluster import servers  # it reads the edges' groups, and cluster.edges reads this module

    by_rack: dict[str, list[Node]] = {}
    for name in hosts:
        if servers.is_dedicated(hosts[name]):
            continue
        node = build_node(name, hosts[name])
        by_rack.setdefault(node.rack, []).append(node)
    return Cluster(
        racks=tuple(Rack(name=r, nodes=tuple(sorted(ns, key=lambda n: n.name))) for r, ns in sorted(by_rack.items())),
        consul_servers=servers.servers_of(hosts, server_order),
    )
