"""Catalog records (node, service instance, health check) and their Consul JSON shapes.

Field names and shapes follow the response examples of
https://developer.hashicorp.com/consul/api-docs/agent/service (``/v1/agent/services``),
https://developer.hashicorp.com/consul/api-docs/health (``/v1/health/service/:service``) and
https://developer.hashicorp.com/consul/api-docs/catalog.

A check keeps two views, as a Consul agent does: ``status``/``output`` is the agent's local state
(``/v1/agent/checks``), ``synced_*`` is what the catalog holds (``/v1/health/*``). A status change syncs
at once; an output-only change is deferred by ``check_update_interval`` (Consul's default: 5 minutes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from devconsul.definitions import CheckDefinition
from devconsul.durations import format_duration

DATACENTER = "dc1"
SERF_CHECK_ID = "serfHealth"
NODE_MAINT_CHECK_ID = "_node_maintenance"
SERVICE_MAINT_PREFIX = "_service_maintenance:"


@dataclass
class Node:
    name: str
    node_id: str
    address: str
    create_index: int = 0
    modify_index: int = 0

    def to_api(self) -> dict:
        return {
            "ID": self.node_id,
            "Node": self.name,
            "Address": self.address,
            "Datacenter": DATACENTER,
            "TaggedAddresses": {
                "lan": self.address, "lan_ipv4": self.address, "wan": self.address, "wan_ipv4": self.address,
            },
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


@dataclass
class Service:
    id: str
    name: str
    tags: list[str] = field(default_factory=list)
    address: str = ""
    port: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=lambda: {"Passing": 1, "Warning": 1})
    enable_tag_override: bool = False
    kind: str = ""
    tagged_addresses: dict = field(default_factory=dict)
    agent_local: bool = True  # False for the "consul" service a server registers itself
    token: str = ""  # ACL token for anti-entropy (never shown by the API)
    source: str = "api"  # "file" for services from the agent's configuration directory
    create_index: int = 0
    modify_index: int = 0

    def same_definition(self, other: Service) -> bool:
        mine, theirs = asdict(self), asdict(other)
        for key in ("create_index", "modify_index", "token", "source"):  # not part of the catalog view
            mine.pop(key), theirs.pop(key)
        return mine == theirs

    def agent_api(self) -> dict:
        out = {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Meta": dict(self.meta),
            "Port": self.port,
            "Address": self.address,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "Datacenter": DATACENTER,
        }
        if self.kind:
            out["Kind"] = self.kind
        if self.tagged_addresses:
            out["TaggedAddresses"] = self.tagged_addresses
        return out

    def node_service_api(self) -> dict:
        """The ``Service`` object of a ``/v1/health/service`` entry."""
        out = {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Address": self.address,
            "Meta": dict(self.meta),
            "Port": self.port,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "PeerName": "",
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }
        if self.kind:
            out["Kind"] = self.kind
        if self.tagged_addresses:
            out["TaggedAddresses"] = self.tagged_addresses
        return out

    def catalog_api(self, node: Node) -> dict:
        """One element of ``/v1/catalog/service/:service``."""
        return {
            "ID": node.node_id,
            "Node": node.name,
            "Address": node.address,
            "Datacenter": DATACENTER,
            "TaggedAddresses": node.to_api()["TaggedAddresses"],
            "NodeMeta": {"consul-network-segment": ""},
            "ServiceKind": self.kind,
            "ServiceID": self.id,
            "ServiceName": self.name,
            "ServiceTags": list(self.tags),
            "ServiceAddress": self.address,
            "ServiceTaggedAddresses": self.tagged_addresses or None,
            "ServiceWeights": dict(self.weights),
            "ServiceMeta": dict(self.meta),
            "ServicePort": self.port,
            "ServiceEnableTagOverride": self.enable_tag_override,
            "ServiceProxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "ServiceConnect": {},
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


@dataclass
class Check:
    check_id: str
    name: str
    node: str
    status: str = "critical"
    output: str = ""
    notes: str = ""
    service_id: str = ""
    service_name: str = ""
    service_tags: list[str] = field(default_factory=list)
    type: str = ""
    definition: CheckDefinition | None = None
    create_index: int = 0
    modify_index: int = 0
    synced_status: str = "critical"
    synced_output: str = ""
    sync_due: float | None = None  # wall clock of a deferred output sync
    ttl_deadline: float | None = None  # wall clock at which a TTL check expires
    critical_since: float | None = None  # wall clock; drives DeregisterCriticalServiceAfter

    def api(self, catalog_view: bool = True) -> dict:
        defn = self.definition
        return {
            "Node": self.node,
            "CheckID": self.check_id,
            "Name": self.name,
            "Status": self.synced_status if catalog_view else self.status,
            "Notes": self.notes,
            "Output": self.synced_output if catalog_view else self.output,
            "ServiceID": self.service_id,
            "ServiceName": self.service_name,
            "ServiceTags": list(self.service_tags),
            "Type": self.type,
            "Interval": format_duration(defn.interval) if defn and defn.interval else "",
            "Timeout": format_duration(defn.timeout) if defn and defn.timeout else "",
            "ExposedPort": 0,
            "Definition": {},
            # The agent's local copy of a check never carries Raft indexes (0 in /v1/agent/checks).
            "CreateIndex": self.create_index if catalog_view else 0,
            "ModifyIndex": self.modify_index if catalog_view else 0,
        }

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, rec: dict) -> Check:
        rec = dict(rec)
        if rec.get("definition") is not None:
            rec["definition"] = CheckDefinition(**rec["definition"])
        return cls(**rec)
