"""The edges and their load balancers: the inventory groups ``edges`` and ``balancers``.

An edge (eas-edge, the roles' ``eas_edge``) runs on a host of the ``edges`` group and listens for clients on
``eas_edge_listen`` (``HOST:PORT``; default the host's address, port :data:`DEFAULT_EDGE_PORT`). A load
balancer (HAProxy, the roles' ``edge_balancer``) runs on a host of the ``balancers`` group, listens on
``edge_balancer_listen`` (required there: an address no host of the inventory has, since an edge on the same
host holds the host's address) and sends to every edge of the ``edges`` group.

Both groups name hosts of the inventory (GPU nodes: the edges share their machines; see
docs/decisions/0020-edges-on-the-nodes.md). The rules here relate them to the rest: an edge's port must not
be one its node already serves (an IU's vLLM, the agent, Consul), a balancer needs edges to send to and an
address of its own. Each problem names the host, the variable and the value.

Clients (``clusterctl loadtest``, ``edge calibrate``, ``drill``) reach the edges where :func:`client_endpoint`
says: the balancer when there is one, else an edge. Each balancer answers about its edges on HAProxy's stats
socket (:func:`stats_socket`), which ``playbooks/edges.yml`` asks before it restarts the next edge.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster import model, spec
from cluster.spec import Problem

EDGES_GROUP = "edges"
BALANCERS_GROUP = "balancers"
DEFAULT_EDGE_PORT = 8080
DEFAULT_ADMIN_LISTEN = "127.0.0.1:9180"  # the eas_edge role's eas_edge_admin_listen
DEFAULT_AGENT_PORT = 9105  # the eas_agent role's eas_agent_listen port
# Consul's agent ports (server RPC, LAN and WAN serf, HTTP, HTTPS, gRPC, gRPC-TLS, DNS): the host_firewall
# role's list; every node runs a Consul agent.
CONSUL_PORTS = (8300, 8301, 8302, 8500, 8501, 8502, 8503, 8600)
WILDCARDS = ("0.0.0.0", "::")
# Where a balancer's HAProxy answers ``show servers state`` (its ``stats socket``, read-only ``level user``):
# the directory is the Debian package's own (/usr/lib/tmpfiles.d/haproxy.conf creates /run/haproxy).
DEFAULT_STATS_SOCKET = "/run/haproxy/stats.sock"
BALANCER_BACKEND = "edges"  # the HAProxy backend holding the edges, one server per edge host


@dataclass(frozen=True)
class Endpoint:
    """One edge or balancer: its inventory host, where it listens, and the address others reach it at (a
    wildcard listen is reached at the host's own address)."""

    host: str
    listen: str
    address: str
    port: int

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "listen": self.listen, "address": self.address, "port": self.port}


def in_group(hv: Mapping[str, Any], group: str) -> bool:
    return group in (hv.get("group_names") or [])


def _hostport(raw: Any) -> tuple[str, int] | None:
    """``HOST:PORT`` (an IPv6 host in brackets) -> (host, port); None when it is not one."""
    if not isinstance(raw, str):
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if ":" in host and not bracketed:
        return None
    if not (spec.is_host_name(host) or _is_ip(host)):
        return None
    return host, int(port)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _node_address(name: str, hv: Mapping[str, Any]) -> str:
    return str(hv.get("ansible_host") or name)


def edge_listen(name: str, hv: Mapping[str, Any]) -> str:
    """The edge's ``eas_edge_listen``, else the host's address at :data:`DEFAULT_EDGE_PORT`."""
    raw = hv.get("eas_edge_listen")
    if raw is not None:
        return str(raw)
    address = _node_address(name, hv)
    return f"[{address}]:{DEFAULT_EDGE_PORT}" if ":" in address else f"{address}:{DEFAULT_EDGE_PORT}"


def admin_url(name: str, hv: Mapping[str, Any]) -> str:
    """``http://HOST:PORT`` of the edge's ``/metrics`` (its own listener, never the client port): the edge's
    ``eas_edge_admin_listen``, else the role's default, which answers on the edge's host only."""
    listen = str(hv.get("eas_edge_admin_listen") or DEFAULT_ADMIN_LISTEN)
    return url_of(_endpoint(name, hv, listen))


def _endpoint(name: str, hv: Mapping[str, Any], listen: str) -> Endpoint:
    parsed = _hostport(listen)
    if parsed is None:
        raise ValueError(f"{name}: {listen!r} is not HOST:PORT (validate the inventory first)")
    host, port = parsed
    return Endpoint(name, listen, _node_address(name, hv) if host in WILDCARDS else host, port)


def edges_of(hosts: Mapping[str, Mapping[str, Any]]) -> tuple[Endpoint, ...]:
    """Every host of the ``edges`` group, in host-name order (call after validation)."""
    return tuple(_endpoint(name, hosts[name], edge_listen(name, hosts[name]))
                 for name in sorted(hosts) if in_group(hosts[name], EDGES_GROUP))


def balancers_of(hosts: Mapping[str, Mapping[str, Any]]) -> tuple[Endpoint, ...]:
    """Every host of the ``balancers`` group, in host-name order (call after validation)."""
    return tuple(_endpoint(name, hosts[name], str(hosts[name]["edge_balancer_listen"]))
                 for name in sorted(hosts) if in_group(hosts[name], BALANCERS_GROUP))


def client_endpoint(hosts: Mapping[str, Mapping[str, Any]]) -> tuple[str, Endpoint] | None:
    """Where clients reach the edges, as ("balancer" or "edge", its endpoint): the first balancer (host-name
    order) when the ``balancers`` group has a host, else the first edge; None when the inventory has neither
    group (call after validation)."""
    for kind, found in (("balancer", balancers_of(hosts)), ("edge", edges_of(hosts))):
        if found:
            return kind, found[0]
    return None


def url_of(endpoint: Endpoint) -> str:
    """``http://ADDRESS:PORT`` (an IPv6 address in brackets): the edges serve plain HTTP."""
    address = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
    return f"http://{address}:{endpoint.port}"


def stats_socket(hv: Mapping[str, Any]) -> str:
    """The balancer's ``edge_balancer_stats_socket``, else :data:`DEFAULT_STATS_SOCKET`."""
    return str(hv.get("edge_balancer_stats_socket") or DEFAULT_STATS_SOCKET)


def _served_ports(name: str, hv: Mapping[str, Any]) -> dict[int, str]:
    """Ports the node already serves -> what serves them (an unreadable layout is another rule's problem)."""
    served = dict.fromkeys(CONSUL_PORTS, "Consul")
    agent = _hostport(hv.get("eas_agent_listen"))
    served[agent[1] if agent else DEFAULT_AGENT_PORT] = "the eas-agent (eas_agent_listen)"
    try:
        ports = model.iu_ports(hv, len(model.iu_layout({**spec.DEFAULTS, **hv})))
    except (TypeError, ValueError):
        ports = []
    served.update({int(port): "an IU's vLLM" for port in ports})
    return served


def check_edge_host(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """A host of ``edges`` or ``balancers``: its listen address is HOST:PORT and free on its node."""
    problems: list[Problem] = []
    listens = []
    if in_group(hv, EDGES_GROUP):
        listens.append(("eas_edge_listen", edge_listen(host, hv)))
    if in_group(hv, BALANCERS_GROUP):
        if hv.get("edge_balancer_listen") is None:
            problems.append(Problem(host, "edge_balancer_listen", None,
                                    f"required on a host of the {BALANCERS_GROUP} group: the IP:PORT clients "
                                    "reach the edges at, on an address no host of the inventory has"))
        else:
            listens.append(("edge_balancer_listen", hv["edge_balancer_listen"]))
        socket = hv.get("edge_balancer_stats_socket")
        if socket is not None and not (isinstance(socket, str) and socket.startswith("/") and len(socket) <= 107):
            problems.append(Problem(host, "edge_balancer_stats_socket", socket,
                                    "expected an absolute path of at most 107 characters (a UNIX socket's limit)"))
    served = _served_ports(host, hv)
    for variable, listen in listens:
        parsed = _hostport(listen)
        if parsed is None:
            problems.append(Problem(host, variable, listen, "expected HOST:PORT (port 1-65535; an IPv6 host in [])"))
        elif parsed[1] in served:
            problems.append(Problem(host, variable, listen,
                                    f"port {parsed[1]} is {served[parsed[1]]}'s on this node: pick another port"))
        elif variable == "edge_balancer_listen" and not _is_ip(parsed[0]):
            problems.append(Problem(host, variable, listen, "the balancer binds this address: an IP address, "
                                    "not a host name"))
    both = [_hostport(listen) for _, listen in listens]
    if len(both) == 2 and None not in both and both[0][1] == both[1][1] and (
            both[0][0] == both[1][0] or WILDCARDS.count(both[0][0]) or WILDCARDS.count(both[1][0])):
        problems.append(Problem(host, "edge_balancer_listen", listens[1][1],
                                f"the edge on this host listens on {listens[0][1]}: both cannot bind it"))
    return problems


def check_groups(hosts: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """Across the inventory: balancers have edges to send to, and addresses of their own."""
    problems: list[Problem] = []
    balancers = [name for name in sorted(hosts) if in_group(hosts[name], BALANCERS_GROUP)]
    if not balancers:
        return problems
    if not any(in_group(hv, EDGES_GROUP) for hv in hosts.values()):
        problems += [Problem(name, "group_names", BALANCERS_GROUP,
                             f"a balancer sends to the hosts of the {EDGES_GROUP} group, and it has none: add the "
                             f"hosts that run an edge to a group '{EDGES_GROUP}'") for name in balancers]
    addresses = {_node_address(name, hv): name for name, hv in hosts.items()}
    for name in balancers:
        parsed = _hostport(hosts[name].get("edge_balancer_listen"))
        if parsed is not None and parsed[0] in addresses:
            problems.append(Problem(name, "edge_balancer_listen", hosts[name]["edge_balancer_listen"],
                                    f"{parsed[0]} is the address of host {addresses[parsed[0]]}: the balancer "
                                    "needs an address of its own (an edge there holds the host's address)"))
    return problems
