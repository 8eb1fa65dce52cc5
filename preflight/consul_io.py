"""All of preflight's Consul traffic: read a node's IU services and take them out of maintenance.

Talks to the Consul HTTP API at the node's ``consul_http_addr`` (default ``127.0.0.1:8500``) with
``consul_scheme`` (http) and the ACL token read from ``consul_token_file`` when that file exists (the
token is never logged or put on a command line).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.consul_acl import marker_key
from cluster.inventory import host_var
from cluster.model import Node

SERVICE_NAME = "vllm-iu"
MAINTENANCE_CHECK = "_service_maintenance:{id}"
TIMEOUT_S = 10.0

_clients: dict[tuple[str, str, str | None, str], Any] = {}
_lock = threading.Lock()


class ConsulUnavailable(Exception):
    pass


@dataclass(frozen=True)
class ServiceState:
    id: str
    node: str | None  # the Consul node the instance is registered on
    meta_node: str | None  # Meta.node: the host the IU runs on
    checks: dict[str, str]  # CheckID -> status

    @property
    def in_maintenance(self) -> bool:
        return MAINTENANCE_CHECK.format(id=self.id) in self.checks


def address_of(node: Node) -> str:
    return (
        str(host_var(node, "consul_http_addr", "127.0.0.1:8500"))
        .removeprefix("http://")
        .removeprefix("https://")
    )


def _token(node: Node) -> str | None:
    path = host_var(node, "consul_token_file")
    if path and Path(str(path)).is_file():
        return Path(str(path)).read_text().strip() or None
    return None


def client(node: Node):
    import consul

    addr = address_of(node)
    host, _, port = addr.rpartition(":")
    scheme = str(host_var(node, "consul_scheme", "http"))
    token = _token(node)
    dc = str(host_var(node, "consul_datacenter", "dc1"))
    key = (addr, scheme, token, dc)
    with _lock:
        if key not in _clients:
            _clients[key] = consul.Consul(
                host=host or "127.0.0.1",
                port=int(port or 8500),
                scheme=scheme,
                token=token,
                dc=dc,
                connections_timeout=TIMEOUT_S,
            )
        return _clients[key]


def _call(fn, *args, **kwargs):
    import consul
    import requests

    try:
        return fn(*args, **kwargs)
    except requests.ConnectionError:
        raise ConsulUnavailable("connection refused or no route (is the Consul agent running?)") from None
    except requests.Timeout:
        raise ConsulUnavailable(f"no answer within {TIMEOUT_S:g}s") from None
    except (requests.RequestException, consul.ConsulException, OSError) as exc:
        raise ConsulUnavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None


def agent_alive(node: Node) -> dict[str, Any]:
    """The agent at the node's address answers; serfHealth of the node if Consul knows it as a node."""
    from consul.callback import CB

    c = client(node)
    # py-consul's agent.self() sends no token at all; under default deny /v1/agent/self needs agent:read
    me = _call(c.http.get, CB.json(), "/v1/agent/self", headers=c.prepare_headers(None))
    _, checks = _call(c.health.node, node.name)
    serf = next((ch.get("Status") for ch in checks or [] if ch.get("CheckID") == "serfHealth"), None)
    return {"agent": (me.get("Config") or {}).get("NodeName"), "serf_health": serf}


def iu_services(node: Node) -> dict[str, ServiceState]:
    """IU id -> its registration, for the IUs of this node (matched by service ID)."""
    _, entries = _call(client(node).health.service, SERVICE_NAME)
    wanted = {iu.id for iu in node.ius}
    found = {}
    for entry in entries or []:
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

    The record (``cluster.consul_acl.marker_key``, written first) is what the consul_agent role reads to
    decide that an IU no longer needs maintenance; without it every provisioning run puts the IU back.
    Returns the IDs taken out of maintenance.
    """
    c = client(node)
    dc = str(host_var(node, "consul_datacenter", "dc1"))
    released = []
    for service_id, state in iu_services(node).items():
        record = json.dumps({"released_at": round(time.time(), 3), "by": "clusterctl preflight --release"})
        if not _call(c.kv.put, marker_key(dc, service_id), record):
            raise ConsulUnavailable(f"the release marker of {service_id} was not written")
        if state.in_maintenance:
            _call(c.agent.service.maintenance, service_id, False)
            released.append(service_id)
    return released
