"""The roles' one Python surface onto the cluster model: ``cluster_node``, ``cluster_host``, ``cluster_consul``,
``eas_agent_config``, ``consul_iu_services``, ``kernel_args``; ``cluster_edges`` and ``cluster_balancer``
(the ``edges`` and ``balancers`` groups, :mod:`cluster.edges`).

Each takes the host's name and its hostvars and builds the node with the same code as clusterctl
(:func:`cluster.model.build_node`), after the same per-host validation (:mod:`cluster.validate`): a
direct ``ansible-playbook`` run (no ``clusterctl provision`` in front) stops on a bad inventory too,
with one line per problem naming host, variable and value. (The duplicate-address rule needs every
host and stays with ``clusterctl inventory validate`` / ``provision``.)

Usage in a role::

    _inference_unit_node: "{{ inventory_hostname | cluster_node(hostvars[inventory_hostname]) }}"

``cluster_node`` returns the node as JSON-friendly data::

    {"name": "r01n01", "address": "127.0.1.11", "rack": "r01", "gpu_model": "h100-sxm",
     "gpu_count": 8, "iu_size": 4, "gpu_numa_nodes": [0, 0, 0, 0, 1, 1, 1, 1], "numa_nodes": [0, 1],
     "nics": [{"device": "mlx5_0", "netdev": "ibp24s0", "port": 1, "link_layer": "infiniband", ...}],
     "ius": [{"id": "r01n01-iu0", "index": 0, "gpus": [0, 1, 2, 3], "cuda_visible_devices": "0,1,2,3",
              "numa_node": 0, "port": 8000, "nics": ["mlx5_0", "mlx5_1"],
              "netdevs": ["ibp24s0", "ibp41s0"]}, ...],
     "nccl_socket_ifname": "^lo,docker",
     "consul": {"address": "127.0.1.11:8500", "scheme": "http", "url": "http://127.0.1.11:8500",
                "datacenter": <consul_datacenter>, "kv_prefix": <consul_io.layout.EAS_PREFIX>}}

``cluster_node`` is for the GPU roles: on a host of ``dedicated_consul_servers`` (no GPUs, no IUs:
:mod:`cluster.servers`) it fails naming the host, so a play that forgot to leave those hosts out stops before
it installs a driver there. ``host | cluster_host(hostvars[host])`` is for the roles every Consul host runs
(consul_agent, host_firewall) and the reboot's drain: ``{name, address, dedicated_consul_server, ius, consul}``,
the node's values on a GPU node (``dedicated_consul_server`` false), no IUs on a dedicated server.

``consul`` is the node's Consul agent as every caller reaches it (:class:`cluster.settings.Consul`:
``consul_http_addr``, ``consul_scheme``, ``consul_datacenter`` with the spec's defaults) and the score KV
prefix (``consul_io.layout``): the roles build their Consul URLs from ``url``, never ``http://`` by hand.
``host | cluster_consul(hostvars[host])`` is the same block from those three variables alone, validated
alike: for a role default (templated on every use) and for a host that need not be a GPU node (the Consul
server the ACL tasks talk to).

A role default that needs one of the model's variables (``gpu_model``, ``nccl_socket_ifname``, ...) reads it
from here too, not from the raw host variable: a default is templated before the role's first task (by its
argument-spec check), so it calls the filter itself::

    nvidia_stack_nvswitch: "{{ (inventory_hostname | cluster_node(hostvars[inventory_hostname])).gpu_model ... }}"

``eas_agent_config`` returns the agent config's ``ius`` list and ``consul_iu_services(interval, timeout)``
IU id -> Consul service definition (:mod:`cluster.services`). There is no second implementation of the
layout here. ``cpu_cstates_extra_kernel_args | kernel_args(inventory_hostname)`` is the list itself once
:mod:`cluster.spec`'s rule passed it (a role that needs no other variable of the model).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from cluster import edges, model, servers, services, settings, spec, validate
except ImportError:  # ansible-playbook run from a checkout whose venv lacks the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cluster import edges, model, servers, services, settings, spec, validate
from consul_io import layout  # noqa: E402 (found through the same path as cluster)


def _model_vars(hostvars: Any) -> dict[str, Any]:
    # Only the variables clusterctl reads (and the BMC ones validation checks for presence): touching
    # every host variable would template (and decrypt) values such as vault secrets it never needs.
    wanted = {key: hostvars[key] for key in (*spec.NAMES, *validate.ROLE_VARS_READ) if key in hostvars}
    wanted["group_names"] = list(hostvars.get("group_names", []))
    return wanted


def node_of(hostname: Any, hostvars: Any) -> model.Node:
    """The validated model node, or AnsibleFilterError with one line per problem (a dedicated Consul server
    is no node: one problem naming it)."""
    name, variables = str(hostname), _model_vars(hostvars)
    if servers.is_dedicated(variables):
        _stop_on([spec.Problem(name, "group_names", servers.DEDICATED_GROUP,
                               "a dedicated Consul server has no GPUs, IUs or NICs for this role: the play must "
                               f"leave it out (hosts: all:!{servers.DEDICATED_GROUP})")])
    _stop_on([p for rule in validate.HOST_RULES for p in rule(name, variables)])
    return model.build_node(name, variables)


def _stop_on(problems: list[spec.Problem]) -> None:
    if problems:
        raise AnsibleFilterError(f"inventory: {len(problems)} problem(s):\n{validate.format_problems(problems)}")


def cluster_node(hostname: str, hostvars: Any) -> dict[str, Any]:
    node = node_of(hostname, hostvars)
    netdev_of = {nic.device: nic.netdev for nic in node.nics}
    ius = []
    for iu in node.ius:
        data = iu.to_json()
        data["index"] = iu.index
        data["cuda_visible_devices"] = iu.cuda_visible_devices
        data["netdevs"] = [netdev_of[d] for d in iu.nics if netdev_of.get(d)]
        ius.append(data)
    return {
        "name": node.name,
        "address": node.address,
        "rack": node.rack,
        "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count,
        "iu_size": node.iu_size,
        "gpu_numa_nodes": list(node.gpu_numa_nodes),
        "numa_nodes": sorted({iu.numa_node for iu in node.ius if iu.numa_node is not None}),
        "nics": [nic.to_json() for nic in node.nics],
        "ius": ius,
        "nccl_socket_ifname": node.nccl_socket_ifname,
        "consul": _consul_block(node.settings.consul),
    }


def cluster_host(hostname: str, hostvars: Any) -> dict[str, Any]:
    """What the roles of every Consul host read: the node's name, address, IUs and Consul block, or a
    dedicated server's (no IUs), each after its own rules (cluster.validate.host_rules)."""
    name, variables = str(hostname), _model_vars(hostvars)
    if not servers.is_dedicated(variables):
        node = cluster_node(name, hostvars)
        return {"name": node["name"], "address": node["address"], "dedicated_consul_server": False,
                "ius": node["ius"], "consul": node["consul"]}
    _stop_on([p for rule in validate.DEDICATED_SERVER_RULES for p in rule(name, variables)])
    server = servers.servers_of({name: variables})[0]
    return {"name": name, "address": server.address, "dedicated_consul_server": True, "ius": [],
            "consul": _consul_block(settings.node_settings(variables, name).consul)}


# The Consul settings (cluster.settings.Consul) without the token: a URL never needs the secret.
CONSUL_VARS = ("consul_http_addr", "consul_scheme", "consul_datacenter")


def cluster_consul(hostname: str, hostvars: Any) -> dict[str, str]:
    name, variables = str(hostname), {key: hostvars[key] for key in CONSUL_VARS if key in hostvars}
    _stop_on(spec.check_settings(name, variables))
    return _consul_block(settings.node_settings(variables, name).consul)


def _consul_block(consul: settings.Consul) -> dict[str, str]:
    return {"address": consul.address, "scheme": consul.scheme, "url": consul.url, "datacenter": consul.datacenter,
            "kv_prefix": layout.EAS_PREFIX}


def eas_agent_config(hostname: str, hostvars: Any) -> list[dict[str, Any]]:
    return services.agent_ius(node_of(hostname, hostvars))


def consul_iu_services(hostname: str, hostvars: Any, interval: str, timeout: str,
                       revision: str = "") -> dict[str, dict[str, Any]]:
    """The IU definitions; ``revision`` empty: composed from the node's inventory values (services.iu_revision)."""
    return services.iu_service_definitions(node_of(hostname, hostvars), interval, timeout,
                                           services.iu_revision(hostvars, str(revision or "")))


def kernel_args(value: Any, hostname: str) -> list[str]:
    """``cpu_cstates_extra_kernel_args`` when :mod:`cluster.spec`'s rule passes it, else AnsibleFilterError
    naming host, variable and value (update-grub sources the drop-in it goes into as shell)."""
    _stop_on(spec.check_settings(str(hostname), {"cpu_cstates_extra_kernel_args": value}))
    return list(value or [])


def cluster_edges(names: Any, hostvars: Any, listen: str | None = None) -> list[dict[str, Any]]:
    """The edges among ``names`` (``groups['edges']``, or one host's ``[inventory_hostname]``) as
    :func:`cluster.edges.edges_of` reads them: {host, listen, address, port}, each host's variables checked.
    ``listen``: the edge role's ``eas_edge_listen`` for the one host named (a role default or ``-e`` value
    that is no inventory variable)."""
    hosts = {str(name): _model_vars(hostvars[name]) for name in names or []}
    if listen is not None:
        hosts = {name: {**variables, "eas_edge_listen": listen} for name, variables in hosts.items()}
    _stop_on([p for name, variables in hosts.items() for p in edges.check_edge_host(name, variables)])
    return [edge.to_json() for edge in edges.edges_of(hosts)]


def cluster_balancer(hostname: str, hostvars: Any, everyone: Any) -> dict[str, Any]:
    """This balancer ({host, listen, address, port}), its HAProxy stats socket (``stats_socket``) and backend
    (``backend``) and the edges it sends to (``edges``), after the rules of :mod:`cluster.edges` over every host
    (``groups['all']``): a balancer needs edges and an address of its own."""
    hosts = {str(name): _model_vars(hostvars[name]) for name in everyone}
    name = str(hostname)
    _stop_on(edges.check_edge_host(name, hosts[name]) + [p for p in edges.check_groups(hosts) if p.host == name])
    balancer = next(b for b in edges.balancers_of(hosts) if b.host == name)
    return {**balancer.to_json(), "stats_socket": edges.stats_socket(hosts[name]), "backend": edges.BALANCER_BACKEND,
            "edges": [edge.to_json() for edge in edges.edges_of(hosts)]}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"cluster_node": cluster_node, "cluster_host": cluster_host, "cluster_consul": cluster_consul, "eas_agent_config": eas_agent_config,
                "consul_iu_services": consul_iu_services, "kernel_args": kernel_args, "cluster_edges": cluster_edges,
                "cluster_balancer": cluster_balancer}
