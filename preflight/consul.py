"""What preflight asks of Consul (through the one client, :mod:`consul_io.client`): is the node's agent alive,
which of its IUs are registered, and the release (marker, then maintenance off).

The node's agent is at ``consul_http_addr`` (default ``127.0.0.1:8500``) with ``consul_scheme`` (http); the
token is the inventory's ``consul_token`` (a vault value) or the 0600 ``consul_token_file`` (the token rule,
roles/consul_agent/README.md; never logged or put on a command line).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from consul_io import layout
from consul_io.client import ConsulIO, ConsulUnavailable, TokenError

__all__ = ["ConsulUnavailable", "ServiceState", "address_of", "agent_alive", "client", "iu_services", "release"]

TIMEOUT_S = 10.0

_clients: dict[tuple[str, str, str | None, str], ConsulIO] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class ServiceState:
    id: str
    node: str | None  # the Consul node the instance is registered on
    meta_node: str | None  # Meta.node: the host the IU runs on
    checks: dict[str, str]  # CheckID -> status

    @property
    def in_maintenance(self) -> bool:
        return layout.maintenance_check(self.id) in self.checks


def address_of(node: Node) -> str:
    return node.settings.consul.address


def _datacenter(node: Node) -> str:
    return node.settings.consul.datacenter


def client(node: Node) -> ConsulIO:
    """The node's client (one per address, scheme, token and datacenter; shared by the check threads)."""
    try:
        token = node.settings.consul.operator_token()
    except TokenError as exc:
        raise ConsulUnavailable(f"{node.name}: {exc}") from None
    addr, scheme, dc = address_of(node), node.settings.consul.scheme, _datacenter(node)
    key = (addr, scheme, token, dc)
    with _lock:
        if key not in _clients:
            _clients[key] = ConsulIO(addr, token=token, scheme=scheme, dc=dc, timeout_s=TIMEOUT_S)
        return _clients[key]


def agent_alive(node: Node) -> dict[str, Any]:
    """The agent at the node's address answers; serfHealth of the node if Consul knows it as a node."""
    c = client(node)
    me = c.agent_self()
    checks = c.health_node(node.name)
    serf = next((ch.get("Status") for ch in checks if ch.get("CheckID") == layout.SERF_HEALTH_CHECK), None)
    return {"agent": (me.get("Config") or {}).get("NodeName"), "serf_health": serf}


def iu_services(node: Node) -> dict[str, ServiceState]:
    """IU id -> its registration, for the IUs of this node (its service ``vllm-iu-<node>``, matched by ID)."""
    entries = client(node).node_ius(node.name)
    wanted = {iu.id for iu in node.ius}
    found = {}
    for entry in entries:
        service = entry.get("Service") or {}
        if service.get("ID") in wanted:
            found[service["ID"]] = ServiceState(
                id=service["ID"],
                node=(entry.get("Node") or {}).get("Node"),
                meta_node=(service.get("Meta") or {}).get("node"),
                checks={ch.get("CheckID"): ch.get("Status") for ch in entry.get("Checks") or []},
            )
    return found


def release(node: Node) -> list[str]:
    """Record that preflight passed each registered IU of the node, and take it out of maintenance.

    The record (:func:`consul_io.layout.marker_key`, written first) is what the consul_agent role reads to
    decide that an IU no longer needs maintenance; without it every provisioning run puts the IU back.
    Returns the IDs taken out of maintenance.
    """
    c = client(node)
    dc = _datacenter(node)
    released = []
    for service_id, state in iu_services(node).items():
        record = json.dumps({"released_at": round(time.time(), 3), "by": "clusterctl preflight --release"})
        if not c.kv_put(layout.marker_key(dc, service_id), record):
            raise ConsulUnavailable(f"the release marker of {service_id} was not written")
        if state.in_maintenance:
            c.service_maintenance(service_id, False)
            released.append(service_id)
    return released
